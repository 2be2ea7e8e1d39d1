//! `--sweep` and `batchfit predict` through the real binary: on the simulated device (known
//! answers), and one small sweep of a tiny GPT on CPU.

mod common;
use common::*;
use predicates::prelude::*;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// The largest size under `capacity × 0.95` of `base + per × b` (the sim's affine curve).
fn affine_truth(base: f64, per: f64, capacity: f64) -> u64 {
    let limit = (capacity * 0.95).floor();
    ((limit - base) / per).floor() as u64
}

#[test]
fn sim_sweep_proves_every_point_and_seeds_the_next() {
    let d = tmp();
    let out = path(&d, "sweep.json");
    let svg = path(&d, "sweep.svg");
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            "base=2GiB,per-sample=3MiB,capacity=80GiB",
        ])
        .args([
            "--model",
            "gpt",
            "--sweep",
            "seq-len=256,512,1024,2048",
            "--format",
            "text",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--plot")
        .arg(&svg)
        .assert()
        .success();
    let text = String::from_utf8(a.get_output().stdout.clone()).unwrap();
    assert!(text.contains("sweep of seq-len:"), "{text}");
    let plan = read_json(&out);
    assert_eq!(plan["status"], "complete");
    let sw = &plan["sweep"];
    assert_eq!(sw["parameter"], "seq-len");
    // gpt's default seq-len, 256, is a point: the plan is its probe
    assert_eq!(sw["plan_point"], 256);
    let points = sw["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    let mut total = 0;
    for (i, p) in points.iter().enumerate() {
        let v = p["value"].as_u64().unwrap();
        // the sim's per-sample bytes scale with the tokens: 3 MiB at 256
        let truth = affine_truth(2.0 * GIB, 3.0 * MIB * v as f64 / 256.0, 80.0 * GIB);
        let b = p["max_fitting_batch"].as_u64().unwrap();
        let f = p["first_failing_batch"].as_u64().unwrap();
        assert!(b <= truth && f > truth, "{v}: {b}..{f}, truth {truth}");
        assert!(f - b <= ((b as f64 * 0.005) as u64).max(1), "{v}: {b}..{f}");
        assert_eq!(p["tokens_per_micro_batch"].as_u64().unwrap(), b * v);
        // every point proven by its own trials: a 5-step fit at b and an out-of-memory at f
        let trials = p["trial_records"].as_array().unwrap();
        assert_eq!(trials.len() as u64, p["trials"].as_u64().unwrap());
        assert!(trials
            .iter()
            .any(|t| t["batch"] == b && t["outcome"] == "fits" && t["steps"] == 5));
        assert!(trials
            .iter()
            .any(|t| t["batch"] == f && t["outcome"] == "oom"));
        let n = trials.len();
        if i > 0 {
            // seeded by the points before: no trial at 1, at most three trials
            assert!(p["predicted_batch"].as_u64().is_some());
            assert!(trials.iter().all(|t| t["batch"] != 1), "{v}: {trials:?}");
            assert!(n <= 3, "{v}: {n} trials");
        }
        total += n;
    }
    assert!(total <= 12, "{total} trials");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("Sweep of seq-len"));
    assert!(drawn.contains("tokens per micro-batch"));
}

#[test]
fn sweep_refusals() {
    let sim = [
        "probe",
        "--backend",
        "sim",
        "--sim",
        "base=2GiB,per-sample=3MiB,capacity=80GiB",
    ];
    for (args, why) in [
        (
            vec!["--sweep", "seq-len=256,512"],
            "--model mlp has no seq-len",
        ),
        (
            vec!["--model", "vit-b16", "--sweep", "seq-len=196,784"],
            "sweep image-size instead",
        ),
        (
            vec!["--model", "gpt", "--sweep", "seq-len=256"],
            "give 2 to 16 points",
        ),
        (
            vec!["--model", "gpt", "--sweep", "seq-len=256,256"],
            "given twice",
        ),
        (
            vec!["--model", "gpt", "--sweep", "tokens=256,512"],
            "only seq-len",
        ),
        (
            vec![
                "--model",
                "gpt",
                "--seq-len",
                "128",
                "--sweep",
                "seq-len=256,512",
            ],
            "--seq-len 128 is not one of the --sweep points",
        ),
        (
            vec!["--model", "resnet18", "--sweep", "image-size=224,16"],
            "--sweep image-size=16",
        ),
    ] {
        batchfit()
            .args(sim)
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(why));
    }
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--sweep",
            "seq-len=1,2",
            "--exec",
            "--",
            "true",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--sweep seq-len with --exec: the command has no {seq}",
        ));
    // {seq} without its sweep (or with the other one) would reach the command as text
    for sweep in [None, Some("image-size=32,64")] {
        let mut c = batchfit();
        c.args(["probe", "--backend", "cpu"]);
        if let Some(s) = sweep {
            c.args(["--sweep", s]);
        }
        c.args(["--exec", "--", "echo", "{batch}", "{seq}"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(
                "the command has {seq} in its arguments but there is no --sweep seq-len",
            ));
    }
}

/// `--sweep seq-len=…` of an `--exec` command: each point in `{seq}` and `BATCHFIT_SEQ`, proven
/// exactly (a shell command that fits while 8 + batch × seq ≤ 200).
#[test]
fn exec_sweep_passes_each_point_as_seq() {
    let d = tmp();
    let out = path(&d, "sweep.json");
    let seen = path(&d, "seen.txt");
    let script = format!(
        "echo \"$1 $2 $BATCHFIT_SEQ\" >> {}; \
         [ $((8 + $1 * $2)) -le 200 ] || {}; exec {}",
        seen.display(),
        run_out_sh(),
        hold_sh("$1")
    );
    batchfit()
        .args(["probe", "--backend", "cpu", "--memory-budget", "2GiB"])
        .args(["--cpu-limit", "rlimit", "--max-batch", "256", "--quiet"])
        .args(["--sweep", "seq-len=1,2,4", "--no-cache", "--out"])
        .arg(&out)
        .args([
            "--exec", "--", "sh", "-c", &script, "sh", "{batch}", "{seq}",
        ])
        .assert()
        .success();
    let plan = read_json(&out);
    let points = plan["sweep"]["points"].as_array().unwrap();
    let answers: Vec<(u64, u64)> = points
        .iter()
        .map(|p| {
            (
                p["value"].as_u64().unwrap(),
                p["max_fitting_batch"].as_u64().unwrap(),
            )
        })
        .collect();
    // exact: the sizes are small, so the tolerance's gap is 1
    assert_eq!(answers, [(1, 192), (2, 96), (4, 48)]);
    for p in points {
        assert_eq!(
            p["first_failing_batch"].as_u64().unwrap(),
            p["max_fitting_batch"].as_u64().unwrap() + 1
        );
    }
    // the plan is the first point's: its command with the point substituted, and the variable
    assert_eq!(plan["sweep"]["plan_point"], 1);
    assert_eq!(plan["model"]["argv"][5], "1");
    assert_eq!(plan["model"]["sweep_point"]["variable"], "BATCHFIT_SEQ");
    assert!(plan["model"]["environment"]
        .to_string()
        .contains("BATCHFIT_SEQ"));
    // every trial got the point in its arguments and its environment, and every point was tried
    let lines = std::fs::read_to_string(&seen).unwrap();
    let mut values = std::collections::BTreeSet::new();
    for l in lines.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        assert_eq!(w[1], w[2], "{{seq}} and BATCHFIT_SEQ agree: {l}");
        values.insert(w[1].to_string());
    }
    assert_eq!(values.into_iter().collect::<Vec<_>>(), ["1", "2", "4"]);
}

#[test]
fn small_gpt_sweep_on_cpu() {
    // A tiny GPT under a real 900 MiB data-segment limit, 1 and 2 steps: seconds per point.
    let d = tmp();
    let out = path(&d, "sweep.json");
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--model",
            "gpt",
            "--layers",
            "1",
            "--d-model",
            "32",
        ])
        .args([
            "--heads",
            "2",
            "--vocab",
            "512",
            "--memory-budget",
            "900MiB",
            "--margin",
            "0",
        ])
        .args([
            "--steps",
            "1",
            "--confirm-steps",
            "2",
            "--threads",
            "1",
            "--quiet",
        ])
        .args(["--sweep", "seq-len=32,64,128", "--out"])
        .arg(&out)
        .assert()
        .success();
    let plan = read_json(&out);
    let points = plan["sweep"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 3);
    let mut last = u64::MAX;
    for p in points {
        assert_eq!(p["status"], "complete", "{p}");
        let b = p["max_fitting_batch"].as_u64().unwrap();
        let f = p["first_failing_batch"].as_u64().unwrap();
        assert!(
            b < last,
            "the largest micro-batch shrinks as the sequence grows"
        );
        assert!(f > b && f - b <= ((b as f64 * 0.005) as u64).max(1));
        let trials = p["trial_records"].as_array().unwrap();
        assert!(trials
            .iter()
            .any(|t| t["batch"] == b && t["outcome"] == "fits" && t["steps"] == 2));
        assert!(trials
            .iter()
            .any(|t| t["batch"] == f && t["outcome"] == "oom"));
        // A line, or (a point whose prior held: one fit and the out-of-memory above it are its
        // whole proof, or fits too close together for a slope: docs/errors.md, "How the search spends its
        // trials") a model that says
        // why it has none
        let m = &p["capacity_model"];
        // (sizes, not trials: a point's size can fit twice, at the exploration steps and in its
        // confirmation, and one size still makes no line)
        let mut fits: Vec<u64> = trials
            .iter()
            .filter(|t| t["outcome"] == "fits")
            .map(|t| t["batch"].as_u64().unwrap())
            .collect();
        fits.sort_unstable();
        fits.dedup();
        if fits.len() >= 2 {
            assert!(
                m["per_sample_bytes"].as_f64().unwrap() > 0.0
                    || m["refusal"]
                        .as_str()
                        .is_some_and(|r| r.contains("within 2 %")),
                "{p}"
            );
        } else {
            assert!(
                m["refusal"].as_str().unwrap().contains("only one size fit"),
                "{p}"
            );
        }
        last = b;
    }
    eprintln!(
        "trials per point: {:?}",
        points
            .iter()
            .map(|p| (
                p["value"].clone(),
                p["trials"].clone(),
                p["predicted_batch"].clone()
            ))
            .collect::<Vec<_>>()
    );
    // the plan itself is the first point's probe (gpt's default 256 is not a point)
    assert_eq!(plan["sweep"]["plan_point"], 32);
    assert_eq!(plan["model"]["config"]["architecture"]["seq_len"], 32);
}

fn sim_plan(d: &tempfile::TempDir, name: &str, sim: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = path(d, name);
    batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            sim,
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .args(extra)
        .assert()
        .success();
    out
}

#[test]
fn predict_matches_affine_sim_curves() {
    let d = tmp();
    for (sim, base, per) in [
        ("base=1GiB,per-sample=3MiB,capacity=16GiB", GIB, 3.0 * MIB),
        (
            "base=500MiB,per-sample=2395582,capacity=24GiB",
            500.0 * MIB,
            2395582.0,
        ),
        (
            "base=62GiB,per-sample=2004318071,capacity=80GiB",
            62.0 * GIB,
            2004318071.0,
        ),
    ] {
        let plan = sim_plan(&d, "p.json", sim, &["--global-batch", "8192"]);
        let pred = path(&d, "pred.json");
        batchfit()
            .arg("predict")
            .arg(&plan)
            .args([
                "--memory",
                "24GiB,40GiB,80GiB,141GiB",
                "--format",
                "text",
                "--out",
            ])
            .arg(&pred)
            .assert()
            .success()
            .stdout(predicate::str::contains("predicted, not proven"));
        let r = read_json(&pred);
        // without --format, stdout is not a terminal: the JSON that --out holds
        let a = batchfit()
            .arg("predict")
            .arg(&plan)
            .args(["--memory", "24GiB,40GiB,80GiB,141GiB"])
            .assert()
            .success();
        let piped: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
        assert_eq!(piped["predictions"], r["predictions"]);
        for p in r["predictions"].as_array().unwrap() {
            assert_eq!(p["proven"], false);
            let mem = p["memory_bytes"].as_f64().unwrap();
            let truth = affine_truth(base, per, mem);
            let e = &p["max_micro_batch"];
            let b = e["micro_batch"].as_u64().unwrap();
            if truth == 0 {
                // the fixed part alone is over the limit: nothing fits, and no split
                assert_eq!(b, 0);
                assert!(p["split"].is_null());
                continue;
            }
            assert!(
                b.abs_diff(truth) <= 1
                    && e["low"].as_u64().unwrap() <= truth
                    && e["high"].as_u64().unwrap() >= truth,
                "{sim} at {} GiB: {e} vs {truth}",
                mem / GIB
            );
            // the global batch split with it (exact: 8192 = micro × accumulation)
            let s = &p["split"];
            assert_eq!(
                s["micro_batch"].as_u64().unwrap() * s["accumulation"].as_u64().unwrap(),
                8192
            );
        }
    }
}

#[test]
fn predict_refuses_across_a_jump_or_a_knee() {
    let d = tmp();
    // 8 GiB more from 2000 on: above the measured range the line does not hold.
    let jump = sim_plan(
        &d,
        "jump.json",
        "base=2GiB,per-sample=7443369,capacity=24GiB,jump=2000:8GiB",
        &[],
    );
    let a = batchfit()
        .arg("predict")
        .arg(&jump)
        .args(["--memory", "12GiB,40GiB", "--format", "json"])
        .assert()
        .success();
    let r: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let p = r["predictions"].as_array().unwrap();
    // 12 GiB: inside the range, predicted (the curve below the jump: 1355 exactly)
    assert_eq!(p[0]["max_micro_batch"]["micro_batch"], 1355);
    // 40 GiB: would cross the jump
    assert!(
        p[1]["refused"].as_str().unwrap().contains("jumps"),
        "{}",
        p[1]
    );
    // Flat up to 256 samples (a knee), answer 300 at 16 GiB: at 8 GiB the answer would lie in the
    // flat part, which the line does not describe.
    let knee = sim_plan(
        &d,
        "knee.json",
        "base=2GiB,per-sample=47166030,capacity=16GiB,knee=256",
        &[],
    );
    let a = batchfit()
        .arg("predict")
        .arg(&knee)
        .args(["--memory", "14GiB,24GiB", "--format", "json"])
        .assert()
        .success();
    let r: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let p = r["predictions"].as_array().unwrap();
    assert!(
        p[0]["refused"].as_str().unwrap().contains("knee"),
        "{}",
        p[0]
    );
    let truth = affine_truth(2.0 * GIB, 47166030.0, 24.0 * GIB);
    assert!(
        p[1]["max_micro_batch"]["micro_batch"]
            .as_u64()
            .unwrap()
            .abs_diff(truth)
            <= 1,
        "{} vs {truth}",
        p[1]
    );
}

/// 9951 ran out of memory under the plan's limit only ~50 samples below where the line crosses it
/// (2 GiB more from 9950 on, a miss the model takes for noise near the top): predict for the plan's
/// own memory must stay below it, never at 10000 (9963-10037), sizes the plan saw run out of memory.
#[test]
fn predict_never_reaches_a_size_the_plan_saw_run_out_of_memory() {
    let d = tmp();
    let plan = sim_plan(
        &d,
        "near-jump.json",
        "base=500MiB,per-sample=2395582,capacity=24GiB,jump=9950:2GiB",
        &[],
    );
    let pj = read_json(&plan);
    let oom = pj["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["outcome"] == "oom")
        .map(|t| t["batch"].as_u64().unwrap())
        .min()
        .unwrap();
    let a = batchfit()
        .arg("predict")
        .arg(&plan)
        .args(["--memory", "24GiB,20GiB", "--format", "json"])
        .assert()
        .success();
    let r: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    for p in r["predictions"].as_array().unwrap() {
        let e = &p["max_micro_batch"];
        assert!(
            e["micro_batch"].as_u64().unwrap() < oom && e["high"].as_u64().unwrap() < oom,
            "{oom} ran out of memory under the plan's limit: {p}"
        );
    }
}

#[test]
fn predict_bad_input_exits_2() {
    let d = tmp();
    let plan = sim_plan(
        &d,
        "p.json",
        "base=1GiB,per-sample=3MiB,capacity=16GiB",
        &[],
    );
    for (args, why) in [
        (vec!["--memory", "lots"], "--memory \"lots\""),
        (
            vec!["--memory", "8GiB", "--margin", "2"],
            "outside [0, 0.9]",
        ),
        (
            vec!["--memory", "8GiB", "--reserve", "9GiB"],
            "must be smaller",
        ),
    ] {
        batchfit()
            .arg("predict")
            .arg(&plan)
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(why));
    }
    batchfit()
        .args(["predict", "/nonexistent/plan.json", "--memory", "8GiB"])
        .assert()
        .code(2);
}

/// `--tolerance` is a fraction in [0, 0.1]: a percentage, a negative or NaN is refused before any trial.
#[test]
fn tolerance_outside_its_range_is_refused() {
    for t in [
        "--tolerance=0.5",
        "--tolerance=-0.01",
        "--tolerance=NaN",
        "--tolerance=5",
    ] {
        batchfit()
            .args([
                "probe",
                "--backend",
                "sim",
                "--sim",
                "base=1GiB,per-sample=3MiB,capacity=16GiB",
            ])
            .arg(t)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("is outside [0, 0.1]"));
    }
}

/// A sweep interrupted before its plan point (`--seq-len 128` of 32,64,128) writes the plan of the
/// last point run, and its `sweep.plan_point` names that point (64, whose model, trials and
/// recommendation it holds), not the point never run.
#[test]
fn an_interrupted_sweep_names_the_point_its_plan_is_of() {
    use std::io::BufRead;
    let d = tmp();
    let out = path(&d, "sweep.json");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_batchfit"));
    c.env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .args([
            "probe",
            "--backend",
            "cpu",
            "--model",
            "gpt",
            "--layers",
            "1",
        ])
        .args(["--d-model", "32", "--heads", "2", "--vocab", "512"])
        .args(["--memory-budget", "900MiB", "--margin", "0", "--steps", "1"])
        .args(["--confirm-steps", "2", "--threads", "1", "--format", "json"])
        .args(["--sweep", "seq-len=32,64,128", "--seq-len", "128", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = vec![];
    let (mut in_second, mut sent) = (false, false);
    for line in stderr.lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("sweep seq-len=64 (2 of 3)") {
            in_second = true;
        }
        if in_second && !sent && line.contains("trial") && line.contains("batch") {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            sent = true;
        }
        // (reading on to the end: a closed pipe would fail batchfit's own writes)
    }
    assert!(in_second, "{seen:?}");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    let plan = read_json(&path(&d, "sweep.partial.json"));
    let seq = plan["model"]["config"]["architecture"]["seq_len"].clone();
    assert_eq!(seq, 64);
    assert_eq!(plan["sweep"]["plan_point"], seq, "{}", plan["sweep"]);
    assert!(plan["warnings"]
        .to_string()
        .contains("stopped before seq-len=128"));
}

/// A plan verified on another device does not keep the capacity model of the device it was probed
/// on, so `batchfit predict` refuses rather than print that line under the new device's name (3 MiB a
/// sample on a device of 2 MiB a sample: 25600 at 80 GiB where the line there gives 38400).
#[test]
fn a_plan_verified_elsewhere_predicts_nothing_from_the_old_line() {
    let d = tmp();
    let plan = sim_plan(
        &d,
        "a.json",
        "base=1GiB,per-sample=3MiB,capacity=16GiB",
        &[],
    );
    let verified = path(&d, "v.json");
    // Another curve (2 MiB per sample) with the same bracket under the same limit: verify checks
    // the plan's bracket on a device that is not the plan's (docs/errors.md, `batchfit verify`), and
    // it holds there.
    let p = read_json(&plan);
    let mf = p["recommendation"]["max_fitting_batch"].as_u64().unwrap();
    let base = p["limit_bytes"].as_u64().unwrap() - 2 * (1 << 20) * mf;
    batchfit()
        .arg("verify")
        .arg(&plan)
        .args([
            "--sim",
            &format!("base={base},per-sample=2MiB,capacity=16GiB"),
            "--quiet",
            "--out",
        ])
        .arg(&verified)
        .assert()
        .success();
    let a = batchfit()
        .arg("predict")
        .arg(&verified)
        .args(["--memory", "80GiB", "--format", "json"])
        .assert()
        .success();
    let r: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let p = &r["predictions"][0];
    assert!(p["max_micro_batch"].is_null(), "{p}");
    assert!(
        p["refused"].as_str().unwrap().contains("was measured on"),
        "{p}"
    );
    // verified on the same device: the line is kept
    let same = path(&d, "same.json");
    batchfit()
        .arg("verify")
        .arg(&plan)
        .args(["--quiet", "--out"])
        .arg(&same)
        .assert()
        .success();
    assert!(read_json(&same)["capacity_model"]["refusal"].is_null());
}

/// The plan point (seq-len 256) completed, a later point was cut short by `--max-trials`: a partial
/// sweep's plan recommends nothing (the point's size stays in the sweep table; a partial plan with a
/// recommendation would be refused by `batchfit show` as "edited or damaged"), and every command
/// reads it.
#[test]
fn a_sweep_cut_short_after_its_plan_point_writes_a_readable_partial_plan() {
    let d = tmp();
    let sweep = |seed: u64, cap: Option<u64>, out: &std::path::Path| {
        let mut c = batchfit();
        c.args(["probe", "--backend", "sim", "--model", "gpt"])
            .arg("--sim")
            .arg(format!(
                "base=2GiB,per-sample=3MiB,capacity=80GiB,noise=0.01,seed={seed}"
            ))
            .args(["--sweep", "seq-len=256,512,1024", "--seq-len", "256"]);
        if let Some(n) = cap {
            c.arg("--max-trials").arg(n.to_string());
        }
        c.args(["--no-cache", "--quiet", "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    // A noise draw whose plan point (the first) takes fewer trials than a later point; a cap of
    // the first point's trials then completes it and cuts the later one short. (Which draw that
    // is depends on the search, so it is looked for, not pinned.)
    let full = path(&d, "full.json");
    let (seed, cap) = (1..=40u64)
        .find_map(|seed| {
            let _ = std::fs::remove_file(&full);
            assert!(sweep(seed, None, &full).status.success());
            let plan = read_json(&full);
            let trials: Vec<u64> = plan["sweep"]["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["trials"].as_u64().unwrap())
                .collect();
            (trials[1..].iter().any(|&t| t > trials[0])).then_some((seed, trials[0]))
        })
        .expect("a noise draw where a later point costs more trials than the first");
    let out = path(&d, "q.json");
    let o = sweep(seed, Some(cap), &out);
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let partial = path(&d, "q.partial.json");
    let plan = read_json(&partial);
    assert_eq!(plan["status"], "partial");
    assert!(
        plan.get("recommendation").is_none_or(|r| r.is_null()),
        "{plan}"
    );
    assert!(
        plan["warnings"].to_string().contains("recommends nothing"),
        "{}",
        plan["warnings"]
    );
    let first = &plan["sweep"]["points"][0];
    assert!(
        first["max_micro_batch"].as_u64().unwrap_or(0) > 0 || first.to_string().contains("micro"),
        "{first}"
    );
    batchfit().arg("show").arg(&partial).assert().success();
}

/// A sweep's later point starts at the size the points before predict, right at the boundary, on a
/// device whose peak moves by 1% from run to run: no fit lies far below to measure the slope, and
/// the steps below the noise ceiling must still reach a proven answer within the trials a noisy
/// boundary allows, whatever the draw.
#[test]
fn a_sweep_point_started_at_a_noisy_boundary_is_proven_below_its_noise() {
    let d = tmp();
    for seed in 1..=12u64 {
        let out = path(&d, &format!("s{seed}.json"));
        let o = batchfit()
            .args(["probe", "--backend", "sim", "--model", "gpt", "--sim"])
            .arg(format!(
                "base=2GiB,per-sample=3MiB,capacity=80GiB,noise=0.01,seed={seed}"
            ))
            .args(["--sweep", "seq-len=256,512,1024", "--seq-len", "256"])
            .args(["--no-cache", "--quiet", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "seed {seed}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let plan = read_json(&out);
        for p in plan["sweep"]["points"].as_array().unwrap() {
            assert_eq!(p["status"], "complete", "seed {seed}: {p}");
        }
    }
}
