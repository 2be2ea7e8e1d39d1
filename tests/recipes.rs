//! The job-script recipes of docs/recipes.md (examples/), run for real by `scripts/recipes-check.sh`:
//! torchrun with 2 CPU processes, DeepSpeed's engine, a Slurm cluster on this host (an array job and a
//! two-node job). Several minutes. The script's output goes straight to the test's stdout, so every
//! NOT RUN stage is listed with its reason in the log; a FAIL fails this test. The stages that need
//! only the binaries and the libtorch venv (`torchrun`, `torchrun-exec`: `batchfit probe --exec` of
//! the torchrun job itself, `deepspeed-merge`) must PASS; the others may be NOT RUN where this machine
//! cannot (no root for apt-get install slurm-wlm munge, no network for pip).

use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn recipes_run_for_real() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_batchfit")).parent().unwrap();
    let summary = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new("bash")
        .arg(root.join("scripts/recipes-check.sh"))
        .env("BATCHFIT_BIN_DIR", bin_dir)
        .env("RECIPES_SUMMARY_FILE", summary.path())
        .env_remove("RECIPES_STAGES")
        .status()
        .expect("bash runs");
    let table = std::fs::read_to_string(summary.path()).unwrap_or_default();
    assert!(status.success(), "recipes-check.sh: {status}\n{table}");
    for stage in ["torchrun", "torchrun-exec", "deepspeed-merge"] {
        let row = table.lines().find(|l| l.starts_with(&format!("{stage}\t")));
        assert!(
            row.is_some_and(|r| r.split('\t').nth(1) == Some("PASS")),
            "stage {stage} did not pass: {row:?}\n{table}"
        );
    }
}
