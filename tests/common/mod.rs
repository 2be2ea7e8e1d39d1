#![allow(dead_code)]
use assert_cmd::Command;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn batchfit() -> Command {
    let mut c = Command::cargo_bin("batchfit").unwrap();
    c.env_remove("RUST_BACKTRACE");
    // Every command gets an empty plan cache of its own, so no test answers from another's cache
    // (tests of the cache set BATCHFIT_CACHE_DIR themselves, after this).
    c.env("BATCHFIT_CACHE_DIR", fresh_cache_dir());
    c
}

/// A new, not yet existing directory under one temporary directory per test binary.
pub fn fresh_cache_dir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;
    static ROOT: OnceLock<tempfile::TempDir> = OnceLock::new();
    static N: AtomicUsize = AtomicUsize::new(0);
    let root = ROOT.get_or_init(|| tempfile::tempdir().unwrap());
    root.path()
        .join(format!("cache-{}", N.fetch_add(1, Ordering::Relaxed)))
}

pub fn trainer() -> Command {
    Command::cargo_bin("batchfit-train").unwrap()
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn read_json(p: &Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

pub fn write_json(p: &Path, v: &Value) {
    std::fs::write(p, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

pub fn path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// A small CPU probe: a tiny MLP under a small real memory limit (seconds, not minutes).
pub const SMALL_CPU: &[&str] = &[
    "probe",
    "--backend",
    "cpu",
    "--memory-budget",
    "800MiB",
    "--mlp-input",
    "64",
    "--mlp-hidden",
    "128",
    "--mlp-classes",
    "10",
    "--multiple-of",
    "256",
    "--threads",
    "1",
    "--quiet",
];

/// PIDs of live processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<u32> {
    let mut v = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                // skip zombies
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if !stat.contains(") Z ") {
                    v.push(pid);
                }
            }
        }
    }
    v
}

/// The Python of the environment whose torch (2.11) the binaries run on: `BATCHFIT_PYTHON`, which
/// `scripts/test.sh` sets to the libtorch venv's interpreter (the runner finds torch through it too).
pub fn venv_python() -> PathBuf {
    let py = std::env::var_os("BATCHFIT_PYTHON")
        .map(PathBuf::from)
        .expect(
            "BATCHFIT_PYTHON is not set: these tests run Python with torch 2.11; run them through \
         scripts/test.sh, or set BATCHFIT_PYTHON to the python of an environment that has it",
        );
    assert!(
        py.exists(),
        "BATCHFIT_PYTHON={} does not exist",
        py.display()
    );
    py
}

/// A shell command that runs out of memory for real: `tests/support/exec/oom.py` takes its data
/// segment to `RLIMIT_DATA`, then raises `MemoryError` (a fake that only printed the word far below
/// the limit would be an error: text alone is no out-of-memory). For a fake `sh -c` job:
/// `[ "$1" -le 7 ] || RUN_OUT`.
pub fn run_out_sh() -> String {
    format!(
        "exec /usr/bin/python3 '{}'",
        repo().join("tests/support/exec/oom.py").display()
    )
}

/// A shell command that holds `mib` MiB (a shell word: `"$1"`) for a moment: the memory of a fake
/// job that grows with its batch (tests/support/exec/hold.py), so the batch is shown to reach it.
pub fn hold_sh(mib: &str) -> String {
    format!(
        "/usr/bin/python3 {} {mib}",
        repo().join("tests/support/exec/hold.py").display()
    )
}

/// This repository's root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the torch the runner uses sees a CUDA device (tests of the cpu path skip a case on a GPU
/// machine, where `--backend auto` picks the GPU, and say so).
pub fn torch_sees_cuda() -> bool {
    batchfit::workload::runner::Runner::locate()
        .and_then(|r| r.info())
        .is_ok_and(|i| i.cuda_available)
}

/// The torch runner cargo built next to `batchfit` (`batchfit-torch`), on the test's torch (its
/// `lib/` on the library path, as the launchers start it).
pub fn runner() -> Command {
    let exe = Path::new(env!("CARGO_BIN_EXE_batchfit"))
        .with_file_name(batchfit::workload::runner::RUNNER_NAME);
    assert!(
        exe.exists(),
        "{} is not built: cargo build --release --workspace (scripts/test.sh does)",
        exe.display()
    );
    std::env::set_var("BATCHFIT_TORCH_RUNNER", &exe);
    let found =
        batchfit::workload::runner::Runner::locate().expect("the runner and torch are found");
    Command::from_std(found.command())
}

/// Waits for `child` up to `limit`; kills it and fails when it takes longer.
pub fn wait_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> (std::process::ExitStatus, f64) {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s, t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("batchfit did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
