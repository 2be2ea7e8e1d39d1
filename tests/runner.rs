//! The torch runner (`batchfit-torch`, which runs `--model` probes and `batchfit-train` on the
//! user's own torch) is found at run time, or one sentence says how to get what is missing; a
//! `--exec` or sim probe never needs it.

mod common;

use common::*;
use predicates::prelude::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

const MODEL_PROBE: &[&str] = &[
    "probe",
    "--backend",
    "cpu",
    "--memory-budget",
    "2GiB",
    "--mlp-input",
    "8",
    "--mlp-hidden",
    "8",
    "--mlp-classes",
    "2",
    "--max-batch",
    "4",
];

/// An executable shell script at `dir/name`.
fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A stand-in Python that says torch lives in `torch_dir` (the runner asks with a `find_spec`).
fn python_with_torch_at(dir: &Path, torch_dir: &Path) -> std::path::PathBuf {
    script(dir, "python3", &format!("echo {}", torch_dir.display()))
}

/// A torch package directory of `version` (what the runner checks: version.py, lib/libtorch_cpu.so).
fn fake_torch(dir: &Path, version: &str) -> std::path::PathBuf {
    let t = dir.join("site-packages/torch");
    std::fs::create_dir_all(t.join("lib")).unwrap();
    std::fs::write(t.join("version.py"), format!("__version__ = '{version}'\n")).unwrap();
    std::fs::write(t.join("lib/libtorch_cpu.so"), "").unwrap();
    t
}

#[test]
fn a_missing_runner_is_one_sentence_saying_how_to_get_it() {
    let d = tmp();
    batchfit()
        .args(MODEL_PROBE)
        .env("BATCHFIT_TORCH_RUNNER", d.path().join("nowhere"))
        .assert()
        .code(3)
        .stderr(predicate::str::contains("BATCHFIT_TORCH_RUNNER="))
        .stderr(predicate::str::contains("is not an executable file"));
    // the trainer launcher says the same before any plan is read
    trainer()
        .args(["--plan", "plan.json"])
        .env("BATCHFIT_TORCH_RUNNER", d.path().join("nowhere"))
        .assert()
        .code(3)
        .stderr(predicate::str::contains("is not an executable file"));
}

#[test]
fn a_python_without_torch_is_named_with_what_to_do() {
    let d = tmp();
    let py = script(d.path(), "python3", "echo");
    batchfit()
        .args(MODEL_PROBE)
        .env("BATCHFIT_PYTHON", &py)
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no PyTorch found"))
        .stderr(predicate::str::contains(py.display().to_string()))
        .stderr(predicate::str::contains("BATCHFIT_PYTHON="));
}

#[test]
fn a_torch_of_another_version_is_refused_naming_both_versions() {
    let d = tmp();
    let torch = fake_torch(d.path(), "2.5.1+cu121");
    let py = python_with_torch_at(d.path(), &torch);
    for cmd in [
        batchfit()
            .args(MODEL_PROBE)
            .env("BATCHFIT_PYTHON", &py)
            .assert(),
        {
            trainer()
                .args(["--plan", "plan.json"])
                .env("BATCHFIT_PYTHON", &py)
                .assert()
        },
    ] {
        cmd.code(3)
            .stderr(predicate::str::contains("version 2.5.1+cu121"))
            .stderr(predicate::str::contains("PyTorch 2.11"));
    }
}

#[test]
fn exec_and_sim_probes_need_no_runner_and_no_torch() {
    let d = tmp();
    let nothing = d.path().join("nowhere");
    let py = script(d.path(), "python3", "exit 1");
    batchfit()
        .args(["probe", "--backend", "sim", "--sim", SIM, "--quiet"])
        .env("BATCHFIT_TORCH_RUNNER", &nothing)
        .env("BATCHFIT_PYTHON", &py)
        .assert()
        .success();
    let job = script(d.path(), "job.sh", "exit 0");
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "256MiB",
            "--max-batch",
            "2",
            "--quiet",
            "--exec",
            "--",
        ])
        .arg(&job)
        .arg("{batch}")
        .env("BATCHFIT_TORCH_RUNNER", &nothing)
        .env("BATCHFIT_PYTHON", &py)
        .assert()
        .stderr(predicate::str::contains("runner").not())
        .stderr(predicate::str::contains("PyTorch").not());
}

#[test]
fn the_trainer_launcher_answers_help_and_usage_errors_without_torch() {
    let d = tmp();
    let nothing = d.path().join("nowhere");
    trainer()
        .arg("--help")
        .env("BATCHFIT_TORCH_RUNNER", &nothing)
        .assert()
        .success()
        .stdout(predicate::str::contains("--memory-limit"));
    trainer()
        .arg("--no-such-flag")
        .env("BATCHFIT_TORCH_RUNNER", &nothing)
        .assert()
        .code(2);
}

#[test]
fn the_runner_reports_the_torch_it_was_built_for() {
    // the runner next to the batchfit binary (where cargo and the wheel put it), on the test's torch
    let runner = Path::new(env!("CARGO_BIN_EXE_batchfit"))
        .with_file_name(batchfit::workload::runner::RUNNER_NAME);
    assert!(
        runner.exists(),
        "{} is not built: build the workspace (cargo build --release --workspace), as scripts/test.sh does",
        runner.display()
    );
    let found = {
        std::env::set_var("BATCHFIT_TORCH_RUNNER", &runner);
        batchfit::workload::runner::Runner::locate().expect("runner and torch found")
    };
    let info = found.info().expect("info answers");
    assert!(
        batchfit::workload::runner::same_minor(
            &info.built_for,
            batchfit::workload::runner::TORCH_MINOR
        ),
        "{info:?}"
    );
    assert!(batchfit::workload::runner::same_minor(
        &found.torch.version,
        batchfit::workload::runner::TORCH_MINOR
    ));
}
