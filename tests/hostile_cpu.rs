//! Hostile inputs on the cpu backend, with real libtorch trials under a real `RLIMIT_DATA`: the trainer
//! starts as the probe's trials did (so the plan's bound is about the same kind of process), it
//! names the measure the limit acts on, it warns about memory the probe never saw, and hybrid
//! isolation proves its answer in fresh processes.

mod common;
use common::*;
use predicates::prelude::*;
use std::time::Duration;

/// A tiny MLP with two threads (so OpenMP starts a worker thread, whose stack is data).
const TWO_THREADS: &[&str] = &[
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
    "2",
    "--quiet",
];

#[test]
fn the_trainer_runs_as_the_probes_trials_did() {
    let d = tmp();
    let out = path(&d, "plan.json");
    // one trial is enough for a plan that records the set-up (partial: the trainer needs --force)
    batchfit()
        .args(TWO_THREADS)
        .args(["--max-trials", "1", "--out"])
        .arg(&out)
        .env_remove("OMP_STACKSIZE")
        .timeout(Duration::from_secs(180))
        .assert()
        .code(5);
    let partial = path(&d, "plan.partial.json");
    let plan = read_json(&partial);
    let setup = &plan["runtime"]["process"];
    assert!(setup.is_object(), "{}", plan["runtime"]);
    assert!(setup["env"].get("OMP_STACKSIZE").is_none());
    // A job whose environment gives OpenMP's threads 512 MiB stacks (data under RLIMIT_DATA): the
    // trainer takes the trials' set-up back, says so, and trains what the probe measured.
    let a = trainer()
        .args([
            "--force",
            "--micro-batch",
            "256",
            "--steps",
            "2",
            "--memory-limit",
            "plan",
            "--plan",
        ])
        .arg(&partial)
        .env("OMP_STACKSIZE", "512M")
        .timeout(Duration::from_secs(180))
        .assert()
        .success()
        .stdout(predicate::str::contains("peak data segment"))
        .stdout(predicate::str::contains("of the plan's"));
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(
        err.contains("running as the probe's trials ran: OMP_STACKSIZE=512M → unset"),
        "{err}"
    );
    // without a memory limit nothing is changed
    let a = trainer()
        .args(["--force", "--micro-batch", "256", "--steps", "1", "--plan"])
        .arg(&partial)
        .env("OMP_STACKSIZE", "512M")
        .timeout(Duration::from_secs(180))
        .assert()
        .success();
    assert!(!String::from_utf8_lossy(&a.get_output().stderr).contains("running as the probe's"));
}

#[test]
fn the_trainer_warns_about_data_the_probe_never_saw() {
    let d = tmp();
    let out = path(&d, "plan.json");
    batchfit()
        .args(TWO_THREADS)
        .args(["--max-trials", "1", "--out"])
        .arg(&out)
        .timeout(Duration::from_secs(180))
        .assert()
        .code(5);
    // 40000 × 64 floats: 10 MiB in memory, more than 1% of the 760 MiB limit, and no --reserve
    let data = path(&d, "data.npz");
    write_npz(&data, 40000, 64, 10);
    trainer()
        .args(["--force", "--micro-batch", "256", "--steps", "1", "--plan"])
        .arg(path(&d, "plan.partial.json"))
        .arg("--data")
        .arg(&data)
        .timeout(Duration::from_secs(180))
        .assert()
        .success()
        .stderr(predicate::str::contains("--data holds 10.07 MiB in memory"))
        .stderr(predicate::str::contains("--reserve"));
}

#[test]
fn hybrid_isolation_proves_in_fresh_processes() {
    let a = batchfit()
        .args(SMALL_CPU)
        .args(["--isolation", "hybrid", "--format", "json"])
        .timeout(Duration::from_secs(600))
        .assert()
        .success();
    let plan: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(plan["stop_reason"], "proven");
    let r = &plan["recommendation"];
    let (max, fail) = (
        r["max_fitting_batch"].as_u64().unwrap(),
        r["first_failing_batch"].as_u64().unwrap(),
    );
    let trials = plan["trials"].as_array().unwrap();
    // exploration ran in the worker ...
    assert!(
        trials.iter().any(|t| t["isolation"] == "worker"),
        "{trials:?}"
    );
    // ... the proof in fresh processes: the answer confirmed, the size above out of memory
    assert!(
        trials.iter().any(|t| t["batch"] == max
            && t["outcome"] == "fits"
            && t["isolation"] == "process"
            && t["steps"] == plan["search"]["confirm_steps"]),
        "{trials:?}"
    );
    assert!(
        trials
            .iter()
            .any(|t| t["batch"] == fail && t["outcome"] == "oom" && t["isolation"] == "process"),
        "{trials:?}"
    );
}

/// An `.npz` of `x` (`rows` × `cols` float32, random) and `y` (`rows` int64 labels below
/// `classes`), written with Python's standard library (the format is a zip of `.npy` files).
fn write_npz(path: &std::path::Path, rows: u64, cols: u64, classes: u64) {
    const NPZ: &str = r#"
import io, random, struct, sys, zipfile
path, rows, cols, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def npy(descr, shape, payload):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload
r = random.Random(0)
x = struct.pack("<%df" % (rows * cols), *(r.gauss(0, 1) for _ in range(rows * cols)))
y = struct.pack("<%dq" % rows, *(r.randrange(classes) for _ in range(rows)))
with zipfile.ZipFile(path, "w") as z:
    z.writestr("x.npy", npy("<f4", "(%d, %d)" % (rows, cols), x))
    z.writestr("y.npy", npy("<i8", "(%d,)" % rows, y))
"#;
    let ok = std::process::Command::new(venv_python())
        .args(["-c", NPZ])
        .arg(path)
        .args([rows, cols, classes].map(|n| n.to_string()))
        .status()
        .unwrap()
        .success();
    assert!(ok, "writing {} failed", path.display());
}
