//! The wheel, as users get it: `scripts/wheel-check.sh` builds it (scripts/build-wheel.sh: maturin,
//! in this tree's target directory, so a built tree is reused) or takes `WHEEL`, installs it offline
//! into a fresh venv that sees the libtorch venv's torch, and runs every check from the installed wheel
//! only, in a clean environment (no LIBTORCH, no LD_LIBRARY_PATH): the commands on PATH, no torch
//! requirement, `batchfit --version` under 0.2 s, `import batchfit`, the helper printed = the helper
//! installed, `python -m batchfit`, an `--exec` probe of a torch script that imports the package, a
//! `--model mlp` probe through the runner and `batchfit-train` on its plan, no libtorch in
//! `ldd batchfit`. About two minutes after the build. The script's output goes straight to the
//! test's stdout; every check must print PASS and none FAIL.

use std::path::PathBuf;
use std::process::Command;

const CHECKS: [&str; 10] = [
    "install",
    "metadata",
    "version",
    "import",
    "helper",
    "python-m",
    "exec-probe",
    "model-probe",
    "train",
    "no-libtorch",
];

#[test]
fn the_installed_wheel_passes_every_check() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/wheel-check.sh"))
        // cargo puts build-script library directories on the test's LD_LIBRARY_PATH; the wheel must
        // not need them (the check's own commands run with a clean environment anyway)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("WHEEL_CHECK_KEEP")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{}", tail(&stderr, 60));
    assert!(
        out.status.success(),
        "wheel-check.sh: {}\n{stdout}",
        out.status
    );
    assert!(!stdout.lines().any(|l| l.starts_with("FAIL ")), "{stdout}");
    for check in CHECKS {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("PASS {check}: ")));
        assert!(line.is_some(), "check {check} did not pass:\n{stdout}");
    }
    assert!(
        stdout.contains("wheel-check: all checks passed"),
        "{stdout}"
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
