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

#[test]
fn a_python_that_never_answers_is_an_error_not_a_hang() {
    // a Python that hangs (here with a grandchild holding its output open) is given
    // PYTHON_TIMEOUT, then named with what to do, by the probe and by the trainer launcher
    let d = tmp();
    let py = script(d.path(), "python3", "sleep 60");
    let limit = batchfit::workload::runner::PYTHON_TIMEOUT + std::time::Duration::from_secs(30);
    let probe = {
        let py = py.clone();
        std::thread::spawn(move || {
            batchfit()
                .args(MODEL_PROBE)
                .env("BATCHFIT_PYTHON", &py)
                .timeout(limit)
                .assert()
                .code(3)
                .stderr(predicate::str::contains("did not say where torch is"))
                .stderr(predicate::str::contains("BATCHFIT_PYTHON="));
        })
    };
    trainer()
        .args(["--plan", "plan.json"])
        .env("BATCHFIT_PYTHON", &py)
        .timeout(limit)
        .assert()
        .code(3)
        .stderr(predicate::str::contains("did not say where torch is"));
    probe.join().unwrap();
}

#[test]
fn a_batchfit_python_that_is_not_an_executable_file_is_named() {
    let d = tmp();
    for py in [d.path().join("nowhere"), d.path().to_path_buf(), "".into()] {
        batchfit()
            .args(MODEL_PROBE)
            .env("BATCHFIT_PYTHON", &py)
            .assert()
            .code(3)
            .stderr(predicate::str::contains(format!(
                "BATCHFIT_PYTHON={} is not an executable file",
                py.display()
            )));
    }
}

#[test]
fn the_trainer_refuses_a_runner_that_is_another_program() {
    // once the launcher has replaced itself, the program's own status would be batchfit-train's:
    // 0 for one that does nothing, the dynamic loader's 127 for a libtorch that does not load
    let d = tmp();
    let torch = fake_torch(d.path(), "2.11.0");
    let py = python_with_torch_at(d.path(), &torch);
    for (name, body) in [
        ("true", "exit 0"),
        (
            "no-libtorch",
            "echo 'error while loading shared libraries: libtorch_cpu.so: file too short' >&2; exit 127",
        ),
    ] {
        let runner = script(d.path(), name, body);
        trainer()
            .args(["--plan", "plan.json"])
            .env("BATCHFIT_PYTHON", &py)
            .env("BATCHFIT_TORCH_RUNNER", &runner)
            .assert()
            .code(3)
            .stderr(predicate::str::contains("does not work here"))
            .stderr(predicate::str::contains("BATCHFIT_TORCH_RUNNER"));
    }
}

#[test]
fn an_empty_ld_library_path_does_not_put_the_current_directory_on_the_runners_library_path() {
    // the dynamic loader reads an empty entry as the current directory
    let d = tmp();
    let torch = fake_torch(d.path(), "2.11.0");
    let py = python_with_torch_at(d.path(), &torch);
    let runner = script(
        d.path(),
        "runner",
        "echo \"LD=[$LD_LIBRARY_PATH]\" >&2; exit 1",
    );
    let lib = torch.join("lib").display().to_string();
    for (old, new) in [("", lib.clone()), (":/x:", format!("{lib}:/x"))] {
        batchfit()
            .arg("doctor")
            .env("BATCHFIT_PYTHON", &py)
            .env("BATCHFIT_TORCH_RUNNER", &runner)
            .env("LD_LIBRARY_PATH", old)
            .assert()
            .stdout(predicate::str::contains(format!("LD=[{new}]")));
    }
}
