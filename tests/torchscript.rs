//! TorchScript models (`--model FILE.pt --input SPEC --loss LOSS`) and real training data
//! (`batchfit-train --data FILE`) through the real binaries. The TorchScript files are exported by
//! `scripts/export_torchscript.py` with the libtorch environment's own Python (always present: the
//! libtorch used by the build comes from it).

mod common;
use common::*;
use predicates::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command as Std;

fn python() -> PathBuf {
    venv_python()
}

/// Exports a demo module of scripts/export_torchscript.py.
fn export(demo: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{demo}.pt"));
    let o = Std::new(python())
        .arg(repo().join("scripts/export_torchscript.py"))
        .args(["--demo", demo, "--out"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "export {demo}: {o:?}");
    out
}

fn cpu_probe() -> assert_cmd::Command {
    let mut c = batchfit();
    c.args([
        "probe",
        "--backend",
        "cpu",
        "--memory-budget",
        "800MiB",
        "--threads",
        "1",
        "--steps",
        "1",
        "--confirm-steps",
        "1",
        "--quiet",
    ]);
    c
}

#[test]
fn torchscript_models_probe_and_train() {
    let d = tmp();
    for (demo, inputs, loss, params, mode) in [
        ("mlp", &["f32[B,16]"][..], "cross-entropy:4", 676, "script"),
        ("cnn", &["f32[B,3,32,32]"], "mse", 5418, "trace"),
        (
            "two-input",
            &["i64[B,8]<100", "f32[B,4]"],
            "mean",
            1325,
            "script",
        ),
    ] {
        let file = export(demo, d.path(), &["--mode", mode]);
        let out = d.path().join(format!("{demo}.json"));
        let mut c = cpu_probe();
        c.arg("--model").arg(&file);
        for i in inputs {
            c.args(["--input", i]);
        }
        c.args([
            "--loss",
            loss,
            "--max-batch",
            "64",
            "--global-batch",
            "128",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
        let plan = read_json(&out);
        assert_eq!(plan["status"], "complete", "{demo}");
        assert_eq!(plan["model"]["name"], format!("{demo}.pt"));
        assert_eq!(plan["model"]["parameter_count"], params, "{demo}");
        assert_eq!(plan["model"]["input_spec"], inputs.join(" "));
        let a = &plan["model"]["config"]["architecture"];
        assert_eq!(a["name"], "torchscript");
        assert_eq!(a["sha256"].as_str().unwrap().len(), 64);
        assert_eq!(plan["recommendation"]["micro_batch"], 64, "{demo}");
        trainer()
            .args(["--steps", "2", "--memory-limit", "plan", "--plan"])
            .arg(&out)
            .assert()
            .success()
            .stdout(predicate::str::contains("trained 2 steps of 128 samples"));
    }
}

/// The plan names the file's content: a changed file is refused, a moved one is found with
/// --model-file, a missing one is named.
#[test]
fn trainer_checks_the_torchscript_file() {
    let d = tmp();
    let file = export("mlp", d.path(), &[]);
    let out = d.path().join("plan.json");
    cpu_probe()
        .arg("--model")
        .arg(&file)
        .args(["--input", "f32[B,16]", "--loss", "cross-entropy:4"])
        .args(["--max-batch", "32", "--out"])
        .arg(&out)
        .assert()
        .success();
    let moved = d.path().join("moved.pt");
    std::fs::rename(&file, &moved).unwrap();
    trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("does not exist")
                .and(predicate::str::contains("--model-file")),
        );
    trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&out)
        .arg("--model-file")
        .arg(&moved)
        .assert()
        .success();
    // another export (other seed → other weights) is another model
    let other = export("mlp", d.path(), &["--seed", "1"]);
    trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&out)
        .arg("--model-file")
        .arg(&other)
        .assert()
        .code(5)
        .stderr(predicate::str::contains("changed since the probe"));
}

/// A loss that does not match the model's output fails the trials with a message saying so.
#[test]
fn mismatched_loss_is_reported() {
    let d = tmp();
    let file = export("mlp", d.path(), &[]);
    cpu_probe()
        .arg("--model")
        .arg(&file)
        .args([
            "--input",
            "f32[B,16]",
            "--loss",
            "cross-entropy:5",
            "--max-batch",
            "8",
        ])
        .assert()
        .code(4)
        .stdout(predicate::str::contains("needs logits [B, …, 5]"));
}

/// Bad TorchScript input is refused before any trial, whatever the backend.
#[test]
fn bad_torchscript_input_is_a_usage_error() {
    let d = tmp();
    let good = export("mlp", d.path(), &[]);
    let good = good.to_str().unwrap();
    let garbled = d.path().join("garbled.pt");
    std::fs::write(&garbled, b"not a model").unwrap();
    let garbled = garbled.to_str().unwrap();
    let missing = d.path().join("missing.pt");
    let missing = missing.to_str().unwrap();
    let dir = d.path().to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![missing, "--input", "f32[B,16]", "--loss", "mse"],
            "does not exist",
        ),
        (
            vec![garbled, "--input", "f32[B,16]", "--loss", "mse"],
            "not a TorchScript model",
        ),
        (
            vec![dir, "--input", "f32[B,16]", "--loss", "mse"],
            "is a directory",
        ),
        (vec![good, "--loss", "mse"], "give its inputs with --input"),
        (vec![good, "--input", "f32[B,16]"], "--loss"),
        (
            vec![good, "--input", "f32[16]", "--loss", "mse"],
            "no B (batch) dimension",
        ),
        (
            vec![good, "--input", "f32[B,B]", "--loss", "mse"],
            "more than once",
        ),
        (vec![good, "--input", "f32[B,0]", "--loss", "mse"], "is 0"),
        (
            vec![good, "--input", "f32[B,-4]", "--loss", "mse"],
            "negative",
        ),
        (
            vec![good, "--input", "q8[B,4]", "--loss", "mse"],
            "unknown dtype",
        ),
        (
            vec![good, "--input", "i64[B,4]<0", "--loss", "mse"],
            "upper bound is 0",
        ),
        (
            vec![good, "--input", "f32[B,4]x", "--loss", "mse"],
            "unexpected",
        ),
        (
            vec![good, "--input", "f32[B,16]", "--loss", "hinge"],
            "unknown loss",
        ),
        (
            vec![good, "--input", "f32[B,16]", "--loss", "cross-entropy:1"],
            "between 2",
        ),
        (
            vec![
                good,
                "--input",
                "f32[B,16]",
                "--loss",
                "mse",
                "--layers",
                "2",
            ],
            "built-in models",
        ),
    ];
    for backend in ["sim", "cpu"] {
        for (args, msg) in &cases {
            let mut c = batchfit();
            c.args(["probe", "--backend", backend, "--quiet", "--model"])
                .args(args);
            if backend == "sim" {
                c.args(["--sim", "base=1MiB,per-sample=1MiB,capacity=1GiB"]);
            }
            c.assert()
                .code(2)
                .stdout(predicate::str::is_empty())
                .stderr(predicate::str::contains(*msg));
        }
    }
}

/// `batchfit-train --data` trains on the shipped example (four Gaussian blobs in 16 dimensions) and
/// the loss falls; a file that does not match the model is refused before training.
#[test]
fn trains_on_real_data_and_the_loss_falls() {
    let d = tmp();
    let out = d.path().join("plan.json");
    cpu_probe()
        .args([
            "--mlp-input",
            "16",
            "--mlp-hidden",
            "64",
            "--mlp-classes",
            "4",
        ])
        .args(["--max-batch", "64", "--global-batch", "128", "--out"])
        .arg(&out)
        .assert()
        .success();
    let data = repo().join("examples/data/blobs.npz");
    let o = trainer()
        .args(["--steps", "40", "--lr", "0.01", "--plan"])
        .arg(&out)
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let losses: Vec<f64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            l.split("loss ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(losses.len(), 40, "{o:?}");
    assert!(
        losses[39] < losses[0] * 0.2,
        "the loss should fall on separable data: {} → {}",
        losses[0],
        losses[39]
    );
    // safetensors works too, and a file for another model is refused
    let o = trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&out)
        .arg("--data")
        .arg(repo().join("README.md"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains(".safetensors or .npz"));
}

/// bf16 cannot be applied to a TorchScript model's buffers from outside: refused with what to do.
#[test]
fn bf16_torchscript_is_refused_with_advice() {
    let d = tmp();
    let good = export("mlp", d.path(), &[]);
    batchfit()
        .args(["probe", "--backend", "cpu", "--quiet", "--model"])
        .arg(&good)
        .args([
            "--input",
            "f32[B,16]",
            "--loss",
            "mse",
            "--precision",
            "bf16",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("buffers").and(predicate::str::contains("amp-bf16")));
}
