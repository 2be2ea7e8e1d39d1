//! `batchfit probe --exec`: process and file hygiene through the real binary — escaped daemons,
//! `--logs`, leftover state, output floods, paths checked up front, the cache key of a command.
//! Fake commands are small /usr/bin/python3 or sh scripts (tests/support/exec/).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fake(name: &str) -> String {
    repo()
        .join("tests/support/exec")
        .join(name)
        .display()
        .to_string()
}

const PY: &str = "/usr/bin/python3";

/// The batchfit binary as a plain process (for tests that time it or signal it).
fn batchfit_process(marker: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_batchfit"));
    c.env_remove("RUST_BACKTRACE")
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env("BATCHFIT_TEST_MARKER", marker)
        .stdin(Stdio::null());
    c
}

/// Waits for `child` up to `limit`; kills it and fails when it takes longer.
fn wait_within(child: &mut std::process::Child, limit: Duration) -> (std::process::ExitStatus, f64) {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s, t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("batchfit did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid`'s environment holds `needle`.
fn environ_has(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|e| String::from_utf8_lossy(&e).contains(needle))
        .unwrap_or(false)
}

/// Live processes running `needle` that carry this test's `marker`; SIGKILLed so that a failing
/// test leaves nothing behind.
fn survivors(needle: &str, marker: &str) -> Vec<u32> {
    let v: Vec<u32> = processes_with(needle)
        .into_iter()
        .filter(|&p| environ_has(p, marker))
        .collect();
    for &p in &v {
        // SAFETY: signalling a process this test started (it carries the test's marker).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    v
}

fn probe_args(out: &Path, timeout: &str) -> Vec<String> {
    [
        "probe",
        "--backend",
        "cpu",
        "--memory-budget",
        "2GiB",
        "--quiet",
        "--trial-timeout",
        timeout,
        "--max-trials",
        "2",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

/// Issue 1: under RLIMIT_DATA (no cgroup to hold the tree) a command that double-forks a daemon
/// (setsid, SIGTERM ignored, the stdout pipe held open) used to hang batchfit forever (the pipe never
/// closed) and leak the daemon. The daemon carries the trial's marker: it is found and killed, and
/// the trial ends within its timeout plus a few seconds.
#[test]
fn an_escaped_daemon_is_killed_and_the_trial_ends() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("daemon-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    c.args(probe_args(&out, "5"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .arg(fake("daemon.py"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let (status, secs) = wait_within(&mut child, Duration::from_secs(30));
    let left = survivors("daemon.py", &marker);
    assert!(left.is_empty(), "the trial's daemon survived: {left:?}");
    assert!(
        matches!(status.code(), Some(4) | Some(5)),
        "{status:?}"
    );
    assert!(secs < 5.0 + 4.0, "took {secs:.1} s");
    let p = read_json(&d.path().join("plan.partial.json"));
    assert_eq!(p["trials"][0]["outcome"], "error", "{}", p["trials"]);
}

/// Issue 1: a daemon that cleared its environment and left the session cannot be found under
/// RLIMIT_DATA, but the pipe it holds no longer hangs batchfit: the output is drained for a bounded
/// time after the trial's processes were ended.
#[test]
fn an_unfindable_daemon_holding_the_pipe_does_not_hang_the_trial() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("cleared-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    c.args(probe_args(&out, "5"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .args([fake("daemon.py"), "--clear-env".into()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let (status, secs) = wait_within(&mut child, Duration::from_secs(18));
    assert!(
        matches!(status.code(), Some(4) | Some(5)),
        "{status:?}"
    );
    assert!(secs < 5.0 + 6.0, "took {secs:.1} s");
    let p = read_json(&d.path().join("plan.partial.json"));
    let tail = p["trials"][0]["details"]["output_tail"].to_string();
    assert!(tail.contains("daemon: started"), "{tail}");
    // the cleared daemon ends itself after 20 s (it cannot be told from any other process)
    let _ = PathBuf::new();
}

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn sim_plan(out: &Path) {
    batchfit()
        .args(["probe", "--backend", "sim", "--sim", SIM, "--global-batch", "8192"])
        .args(["--quiet", "--out"])
        .arg(out)
        .assert()
        .success();
}

/// Issue 6: `--exec --backend sim` used to be accepted (the simulation ran, the command never did).
#[test]
fn exec_with_the_simulator_is_refused() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let a = batchfit()
        .args(["probe", "--backend", "sim", "--sim", SIM, "--out"])
        .arg(&out)
        .args(["--exec", "--", "/bin/sh", "-c", "exit 0"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("--backend sim runs nothing"), "{err}");
    assert!(!out.exists() && !d.path().join("plan.partial.json").exists());
}

/// Issue 6: a simulated plan merged with a real device's plan used to give a "merged" plan; now
/// refused (exit 2). Two simulated plans still merge, and `--format env` says the merged plan is
/// not verified (`BATCHFIT_VERIFIED=0`; `1` for a probe plan).
#[test]
fn merge_refuses_sim_with_real_and_env_says_verified() {
    let d = tmp();
    let sim = d.path().join("sim.json");
    sim_plan(&sim);
    let real = d.path().join("cpu.json");
    let mut p = read_json(&sim);
    p["device"]["kind"] = "cpu".into();
    p["device"]["name"] = "some cpu".into();
    write_json(&real, &p);
    let merged = d.path().join("merged.json");
    let a = batchfit()
        .args(["merge", "--global-batch", "8192", "--format", "json", "--out"])
        .arg(&merged)
        .arg(&sim)
        .arg(&real)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("is a simulated plan"), "{err}");
    assert!(!merged.exists());
    // two simulated plans merge; the result is not verified
    let sim2 = d.path().join("sim2.json");
    sim_plan(&sim2);
    batchfit()
        .args(["merge", "--global-batch", "8192", "--format", "json", "--out"])
        .arg(&merged)
        .arg(&sim)
        .arg(&sim2)
        .assert()
        .success();
    let env = |plan: &Path| {
        let a = batchfit()
            .arg("show")
            .arg(plan)
            .args(["--format", "env"])
            .assert()
            .success();
        String::from_utf8_lossy(&a.get_output().stdout).into_owned()
    };
    let m = env(&merged);
    assert!(m.contains("export BATCHFIT_VERIFIED=0\n"), "{m}");
    let s = env(&sim);
    assert!(s.contains("export BATCHFIT_VERIFIED=1\n"), "{s}");
}
