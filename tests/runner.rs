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

/// The real torch the tests run on (`BATCHFIT_PYTHON`'s), and a second torch package of `version`
/// whose `lib/` is the real one's: another torch as far as batchfit can tell, with libraries that load.
fn another_torch(dir: &Path, version: &str) -> (String, std::path::PathBuf) {
    let real = std::process::Command::new(venv_python())
        .args([
            "-c",
            "import importlib.util as u; print(list(u.find_spec('torch').submodule_search_locations)[0])",
        ])
        .output()
        .unwrap();
    let real = std::path::PathBuf::from(String::from_utf8(real.stdout).unwrap().trim());
    let real_version = batchfit::workload::runner::torch_version(&real).expect("a torch version");
    let t = dir.join("other/site-packages/torch");
    std::fs::create_dir_all(&t).unwrap();
    std::os::unix::fs::symlink(real.join("lib"), t.join("lib")).unwrap();
    std::fs::write(t.join("version.py"), format!("__version__ = '{version}'\n")).unwrap();
    let py = script(
        &dir.join("other"),
        "python3",
        &format!("echo {}", t.display()),
    );
    (real_version, py)
}

/// A small real cpu plan at `plan`, made on the test's torch.
fn small_cpu_plan(plan: &Path) {
    batchfit()
        .args(MODEL_PROBE)
        .args(["--threads", "1", "--quiet", "--out"])
        .arg(plan)
        .assert()
        .success();
}

#[test]
fn the_trainer_refuses_a_plan_made_on_another_torch() {
    let d = tmp();
    let plan = d.path().join("plan.json");
    small_cpu_plan(&plan);
    let (real, other_py) = another_torch(d.path(), "2.11.9+other");
    assert_eq!(
        read_json(&plan)["tool"]["libtorch_version"].as_str(),
        Some(real.as_str())
    );
    trainer()
        .args(["--steps", "1", "--quiet", "--plan"])
        .arg(&plan)
        .env("BATCHFIT_PYTHON", &other_py)
        .assert()
        .code(5)
        .stderr(predicate::str::contains(format!("made on PyTorch {real}")))
        .stderr(predicate::str::contains("2.11.9+other"));
    // under a memory limit too (the trainer starts itself again there)
    trainer()
        .args([
            "--steps",
            "1",
            "--quiet",
            "--memory-limit",
            "plan",
            "--plan",
        ])
        .arg(&plan)
        .env("BATCHFIT_PYTHON", &other_py)
        .assert()
        .code(5);
    // --force trains, saying so
    trainer()
        .args(["--steps", "1", "--quiet", "--force", "--plan"])
        .arg(&plan)
        .env("BATCHFIT_PYTHON", &other_py)
        .assert()
        .success()
        .stderr(predicate::str::contains("warning (--force)"));
    // on its own torch it trains
    trainer()
        .args(["--steps", "1", "--quiet", "--plan"])
        .arg(&plan)
        .assert()
        .success();
}

#[test]
fn verify_on_another_torch_records_that_torch_and_rechecks_the_bracket() {
    let d = tmp();
    let plan = d.path().join("plan.json");
    // a plan with a bracket (a size that fits, the next one that runs out of memory)
    batchfit()
        .args(SMALL_CPU)
        .arg("--out")
        .arg(&plan)
        .assert()
        .success();
    let (real, other_py) = another_torch(d.path(), "2.11.9+other");
    let p = read_json(&plan);
    let first_failing = p["recommendation"]["first_failing_batch"]
        .as_u64()
        .expect("a bracket");
    let trials_before = p["trials"].as_array().unwrap().len();
    let out = d.path().join("verified.json");
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&plan)
        .arg("--out")
        .arg(&out)
        .env("BATCHFIT_PYTHON", &other_py)
        .assert()
        .success();
    let v = read_json(&out);
    assert_eq!(v["verified"], true);
    // its trials ran on the other torch: the plan says so, not the torch it was probed on
    assert_eq!(v["tool"]["libtorch_version"], "2.11.9+other");
    // and the bracket was checked there: the first failing size ran out of memory on it
    assert!(
        v["trials"].as_array().unwrap()[trials_before..]
            .iter()
            .any(|t| t["batch"] == first_failing && t["outcome"] == "oom"),
        "{}",
        v["trials"]
    );
    assert!(
        v["capacity_model"].to_string().contains(&real),
        "{}",
        v["capacity_model"]
    );
    // the verified plan trains on the torch it was verified on, and is refused on the first one
    trainer()
        .args(["--steps", "1", "--quiet", "--plan"])
        .arg(&out)
        .env("BATCHFIT_PYTHON", &other_py)
        .assert()
        .success();
    trainer()
        .args(["--steps", "1", "--quiet", "--plan"])
        .arg(&out)
        .assert()
        .code(5);
}

#[test]
fn a_runner_of_another_batchfit_version_refuses_to_run() {
    // the caller's version reaches the runner; one of another version stops before any trial work
    let out = runner()
        .arg("info")
        .env(
            batchfit::workload::runner::CALLER_VERSION_ENV,
            "0.0.0-other",
        )
        .assert()
        .code(3)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot serve batchfit 0.0.0-other"), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // its own version passes
    runner()
        .arg("info")
        .env(
            batchfit::workload::runner::CALLER_VERSION_ENV,
            batchfit::workload::runner::VERSION,
        )
        .assert()
        .success();
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
