//! Warm trials (`--warm`) against cold ones on a real PyTorch script (tests/support/exec/train_mlp.py,
//! the libtorch venv's Python, CPU): the same probe under the same `RLIMIT_DATA` budget with `--warm
//! off`, `--warm ahead` (processes started ahead) and `--warm on` (forked from a fork server) gives
//! the same answer (or one the run-to-run noise of a peak away: a size at
//! the limit fits in one probe and runs out of memory in the other) and, at the sizes both ran, peaks within the run-to-run noise of a fresh
//! process's heap (glibc's mmap threshold moves it by 4-13 MB; docs/soundness.md). Both wall times
//! are printed (docs/benchmarks.md keeps the measured ones).

mod common;
use common::*;
use std::process::Command;

const GRID: u64 = 16;

/// The run-to-run noise of a fresh trial's peak at one size (the guard band's size: docs/soundness.md,
/// "Where the noise comes from").
const NOISE: u64 = 16 << 20;

/// What a sample of the probed script costs (65536 inputs, float32, its activations and gradients).
const PER_SAMPLE: u64 = 256 << 10;

/// `batchfit probe` of train_mlp.py (65536 → 16 → 10: a sample costs 256 KiB) under 1 GiB of
/// RLIMIT_DATA, trials warm or not; the plan and the wall seconds.
fn probe(warm: &str) -> (serde_json::Value, f64) {
    let d = tmp();
    let out = path(&d, "plan.json");
    let script = repo().join("tests/support/exec/train_mlp.py");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_batchfit"));
    cmd.env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env("PYTHONPATH", repo().join("python/batchfit"))
        .env("OMP_NUM_THREADS", "1")
        .args(["probe", "--backend", "cpu", "--memory-budget", "1GiB"])
        .args(["--quiet", "--cpu-limit", "rlimit", "--warm", warm])
        .args(["--multiple-of", &GRID.to_string(), "--steps", "2"])
        .args(["--confirm-steps", "3", "--out"])
        .arg(&out)
        .arg("--exec")
        .arg("--")
        .arg(venv_python())
        .arg(script)
        .args(["--batch-size", "{batch}", "--steps", "{steps}"])
        .args(["--input", "65536", "--hidden", "16"]);
    let t0 = std::time::Instant::now();
    let o = cmd.output().unwrap();
    let seconds = t0.elapsed().as_secs_f64();
    assert!(o.status.success(), "--warm {warm}: {o:?}");
    (read_json(&out), seconds)
}

/// (batch, steps) → peak of every fit.
fn fit_peaks(p: &serde_json::Value) -> std::collections::BTreeMap<(u64, u64), u64> {
    p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["outcome"] == "fits")
        .map(|t| {
            (
                (t["batch"].as_u64().unwrap(), t["steps"].as_u64().unwrap()),
                t["peak_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The (purpose is explore, warm, forked) flags of every trial.
fn flags(p: &serde_json::Value) -> Vec<(bool, bool, bool)> {
    p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["purpose"] == "explore",
                t["details"]["warm"] == true,
                t["details"]["forked"] == true,
            )
        })
        .collect()
}

/// The answer of `warm` is the cold one's (or one the run-to-run noise of a peak away: a size at the
/// limit fits in one probe and runs out of memory in the other) and, at the sizes both ran, its fits
/// peak within the noise of the cold ones: the data segment `RLIMIT_DATA` counts, and the tree's
/// figure (for a forked trial, the pages it shares with the fork server count whole).
fn agrees_with_cold(cold: &serde_json::Value, warm: &serde_json::Value, what: &str) {
    let answer = |p: &serde_json::Value| p["recommendation"]["max_fitting_batch"].as_u64().unwrap();
    let (a_cold, a_warm) = (answer(cold), answer(warm));
    assert!(
        a_cold.abs_diff(a_warm) <= (NOISE / PER_SAMPLE).max(GRID),
        "cold {a_cold}, {what} {a_warm}: further apart than the {} samples of the noise",
        NOISE / PER_SAMPLE
    );
    let tree = |p: &serde_json::Value| -> std::collections::BTreeMap<(u64, u64), u64> {
        p["trials"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["outcome"] == "fits")
            .map(|t| {
                let k = (t["batch"].as_u64().unwrap(), t["steps"].as_u64().unwrap());
                (k, t["details"]["tree_pss_peak_bytes"].as_u64().unwrap())
            })
            .collect()
    };
    let mut compared = 0;
    for (figure, pc, pw) in [
        ("data segment", fit_peaks(cold), fit_peaks(warm)),
        ("tree", tree(cold), tree(warm)),
    ] {
        for (k, c) in &pc {
            if let Some(w) = pw.get(k) {
                eprintln!(
                    "{figure}: batch {} x {} steps: cold {c} B, {what} {w} B",
                    k.0, k.1
                );
                assert!(
                    c.abs_diff(*w) <= NOISE,
                    "{figure} {k:?}: cold {c}, {what} {w}"
                );
                compared += 1;
            }
        }
    }
    assert!(compared > 0, "no size ran both ways");
}

/// Cold, warm processes started ahead (`--warm ahead`) and trials forked from a fork server
/// (`--warm on`, under `RLIMIT_DATA`): the same answer and peaks. Either way only exploration runs
/// warm; every trial that proves runs cold. Forked trials run once the server has imported (a trial
/// before runs cold).
#[test]
fn warm_and_forked_trials_give_the_cold_answer_and_peaks() {
    let (cold, cold_s) = probe("off");
    let (ahead, ahead_s) = probe("ahead");
    let (forked, forked_s) = probe("on");
    let n = |p: &serde_json::Value| p["trials"].as_array().unwrap().len();
    eprintln!(
        "cold: {} trials in {cold_s:.1} s; started ahead: {} in {ahead_s:.1} s; forked: {} in \
         {forked_s:.1} s",
        n(&cold),
        n(&ahead),
        n(&forked)
    );
    assert!(flags(&cold).iter().all(|&(_, w, _)| !w));
    let a = flags(&ahead);
    assert!(!a[0].1, "the first trial is cold");
    assert!(
        a[1..]
            .iter()
            .all(|&(explore, warm, forked)| explore == warm && !forked),
        "{a:?}"
    );
    assert!(a[1..].iter().any(|&(_, warm, _)| warm), "{a:?}");
    let f = flags(&forked);
    assert!(!f[0].1, "the first trial is cold");
    assert!(
        f.iter()
            .all(|&(explore, warm, forked)| warm == forked && (!warm || explore)),
        "{f:?}"
    );
    assert!(f.iter().any(|&(_, _, forked)| forked), "{f:?}");
    agrees_with_cold(&cold, &ahead, "started ahead");
    agrees_with_cold(&cold, &forked, "forked");
}

/// The plan of `batchfit probe` (1 GiB of `RLIMIT_DATA`, `--warm on`, sizes a multiple of 16, and
/// `flags`) of tests/support/exec/`script` with `args`.
fn forked_probe(flags: &[&str], script: &str, args: &[&str]) -> serde_json::Value {
    let d = tmp();
    let out = path(&d, "plan.json");
    let o = Command::new(env!("CARGO_BIN_EXE_batchfit"))
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env("PYTHONPATH", repo().join("python/batchfit"))
        .env("OMP_NUM_THREADS", "1")
        .args(["probe", "--backend", "cpu", "--memory-budget", "1GiB"])
        .args(["--quiet", "--cpu-limit", "rlimit", "--warm", "on"])
        .args(["--multiple-of", "16"])
        .args(flags)
        .arg("--out")
        .arg(&out)
        .arg("--exec")
        .arg("--")
        .arg(venv_python())
        .arg(repo().join("tests/support/exec").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    read_json(&out)
}

/// A warm trial's DataLoader is watched as a cold one's: the watcher is in the warm process before
/// it imports torch, and the hand-off gives it the trial's own folder (tests/support/exec/
/// train_dataset.py with the helper's report, which names torch for the warm process to import).
#[test]
fn a_warm_trial_is_watched_as_a_cold_one() {
    let p = forked_probe(
        &["--max-batch", "128", "--steps", "2", "--confirm-steps", "3"],
        "train_dataset.py",
        &[
            "--batch-size",
            "{batch}",
            "--steps",
            "{steps}",
            "--samples",
            "128",
            "--report",
        ],
    );
    let trials = p["trials"].as_array().unwrap();
    assert!(
        trials[1..].iter().any(|t| t["details"]["warm"] == true),
        "{p}"
    );
    for t in trials {
        assert_eq!(t["details"]["dataloader_batch"], t["batch"], "{t}");
    }
}

/// What a trial of tests/support/exec/preloaded.py printed after `what: ` (`preloaded`, `servers`).
fn said(t: &serde_json::Value, what: &str) -> String {
    let tail = t["details"]["output_tail"].as_array().unwrap();
    let line = tail.iter().filter_map(|l| l.as_str()).find_map(|l| {
        l.strip_prefix(what)
            .and_then(|rest| rest.strip_prefix(": "))
            .map(str::to_string)
    });
    line.unwrap_or_else(|| panic!("no {what} line in {t}"))
}

/// The fork server starts before the first trial, importing the frameworks the script names at its
/// top level (`torch`), and, once that trial's report named what the job imported, imports the rest
/// (`jinja2`, which the script imports only inside a function): every forked trial begins with both,
/// every cold one with neither (tests/support/exec/preloaded.py).
#[test]
fn the_fork_server_imports_the_scripts_frameworks_while_the_first_trial_runs() {
    let p = forked_probe(
        &["--max-batch", "256"],
        "preloaded.py",
        &["--batch", "{batch}", "--steps", "{steps}"],
    );
    let trials = p["trials"].as_array().unwrap();
    assert_eq!(said(&trials[0], "servers"), r#"["torch"]"#, "{p}");
    assert_eq!(said(&trials[0], "preloaded"), "none", "{p}");
    for t in trials {
        let expect = if t["details"]["forked"] == true {
            "torch,jinja2"
        } else {
            "none"
        };
        assert_eq!(said(t, "preloaded"), expect, "{t}");
    }
    assert!(trials.iter().any(|t| t["details"]["forked"] == true), "{p}");
}

/// A job that writes no report gets no fork server after its first trial: the one started on the
/// script's frameworks ends, and no other is started for the trials that follow, which run cold.
#[test]
fn a_guess_that_the_first_trial_did_not_confirm_is_not_made_again() {
    let p = forked_probe(
        &["--max-batch", "256"],
        "preloaded.py",
        &["--batch", "{batch}", "--steps", "{steps}", "--no-report"],
    );
    let trials = p["trials"].as_array().unwrap();
    assert!(trials.len() > 2, "{p}");
    assert_eq!(said(&trials[0], "servers"), r#"["torch"]"#, "{p}");
    for t in &trials[1..] {
        assert_eq!(said(t, "servers"), "none", "{t}");
        assert_ne!(t["details"]["warm"], true, "{t}");
    }
}

/// A script that is a FIFO is not read for its imports (the read would wait for a writer before
/// any trial ran): the trials run, and time out as the interpreter waits on it.
#[test]
fn a_script_that_is_a_fifo_is_not_read_before_the_first_trial() {
    let d = tmp();
    let fifo = path(&d, "train.py");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut probe = Command::new(env!("CARGO_BIN_EXE_batchfit"))
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .args(["probe", "--backend", "cpu", "--memory-budget", "1GiB"])
        .args(["--quiet", "--cpu-limit", "rlimit", "--warm", "on"])
        .args(["--trial-timeout", "2", "--max-trials", "2", "--out"])
        .arg(path(&d, "plan.json"))
        .arg("--exec")
        .arg("--")
        .arg(venv_python())
        .arg(&fifo)
        .args(["--batch", "{batch}"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (status, _) = wait_within(&mut probe, std::time::Duration::from_secs(60));
    assert!(!status.success());
    let p = read_json(&path(&d, "plan.partial.json"));
    let trials = p["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{p}");
    assert!(trials.iter().all(|t| t["outcome"] == "timeout"), "{p}");
}
