//! The real binaries with real libtorch trials on CPU under a small `RLIMIT_DATA`: the probe, the
//! trainer reading its plan, refusals, and trial processes that hang, crash or get interrupted.

mod common;
use common::*;
use predicates::prelude::*;
use std::time::{Duration, Instant};

/// One small real probe shared by the trainer tests (it takes seconds; run it once).
fn small_plan() -> &'static (tempfile::TempDir, std::path::PathBuf) {
    static PLAN: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    PLAN.get_or_init(|| {
        let d = tmp();
        let out = path(&d, "plan.json");
        batchfit()
            .args(SMALL_CPU)
            // on the --multiple-of 256 grid (102400 = 256 × 400): the split stays on it
            .args(["--global-batch", "102400", "--out"])
            .arg(&out)
            .assert()
            .success();
        (d, out)
    })
}

#[test]
fn cpu_probe_is_proven_by_real_oom() {
    let (_, out) = small_plan();
    let plan = read_json(out);
    assert_eq!(plan["status"], "complete");
    assert_eq!(plan["device"]["kind"], "cpu");
    assert_eq!(plan["stop_reason"], "proven");
    let r = &plan["recommendation"];
    let max = r["max_fitting_batch"].as_u64().unwrap();
    let fail = r["first_failing_batch"].as_u64().unwrap();
    assert_eq!(fail, max + 256);
    assert!(
        max >= 256 * 4,
        "a tiny MLP under ~760 MiB fits thousands of samples, got {max}"
    );
    let trials = plan["trials"].as_array().unwrap();
    // the failure above is a real libtorch allocation failure
    let oom = trials
        .iter()
        .find(|t| t["batch"] == fail && t["outcome"] == "oom")
        .expect("oom trial");
    assert!(
        oom["message"]
            .as_str()
            .unwrap()
            .contains("can't allocate memory"),
        "{oom}"
    );
    // fits report real, non-zero, under-limit footprints, and peak RSS
    let limit = plan["limit_bytes"].as_u64().unwrap();
    for t in trials.iter().filter(|t| t["outcome"] == "fits") {
        let p = t["peak_bytes"].as_u64().unwrap();
        assert!(p > 100 << 20 && p <= limit, "{t}");
        assert!(t["rss_peak_bytes"].as_u64().unwrap() > 50 << 20);
        assert!(t["step_seconds"].as_f64().unwrap() > 0.0);
    }
    // micro × accumulation = global, micro ≤ max, and micro was itself tested
    let micro = r["micro_batch"].as_u64().unwrap();
    assert_eq!(micro * r["accumulation"].as_u64().unwrap(), 102400);
    assert_eq!(micro % 256, 0, "on the search's grid");
    assert!(micro <= max);
    // ... the way the trainer runs it: with the plan's accumulation
    let acc = r["accumulation"].as_u64().unwrap();
    assert!(acc > 1, "the test needs an accumulation split");
    assert!(
        trials.iter().any(|t| t["batch"] == micro
            && t["outcome"] == "fits"
            && t["steps"] == 5
            && t["accumulation"].as_u64().unwrap_or(1) == acc),
        "{trials:?}"
    );
}

#[test]
fn trainer_trains_with_the_plan_under_the_same_limit() {
    let (_, out) = small_plan();
    trainer()
        .args(["--steps", "8", "--memory-limit", "plan", "--plan"])
        .arg(out)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "trained 8 steps of 102400 samples",
        ));
}

#[test]
fn trainer_oom_exits_6_with_advice() {
    let (_, out) = small_plan();
    let plan = read_json(out);
    let fail = plan["recommendation"]["first_failing_batch"]
        .as_u64()
        .unwrap();
    trainer()
        .args([
            "--steps",
            "2",
            "--memory-limit",
            "plan",
            "--micro-batch",
            &(fail * 2).to_string(),
            "--plan",
        ])
        .arg(out)
        .assert()
        .code(6)
        .stderr(
            predicate::str::contains("out of memory during training")
                .and(predicate::str::contains("Re-probe")),
        );
}

#[test]
fn trainer_refuses_mismatched_plans() {
    let (_, out) = small_plan();
    let d = tmp();
    let plan = read_json(out);
    let mut other_model = plan.clone();
    other_model["model"]["config"]["architecture"]["hidden"] = serde_json::json!([129]);
    let mut other_device = plan.clone();
    other_device["device"]["name"] = "Some Other CPU".into();
    let mut partial = plan.clone();
    // a partial plan has no recommendation (a plan that says both contradicts itself: exit 2)
    partial["status"] = "partial".into();
    partial["recommendation"] = serde_json::Value::Null;
    let mut sim = plan.clone();
    sim["device"]["kind"] = "sim".into();
    for (name, v, msg) in [
        ("model", other_model, "another model"),
        ("device", other_device, "another device"),
        ("partial", partial, "partial"),
        ("sim", sim, "sim backend"),
    ] {
        let p = path(&d, &format!("{name}.json"));
        write_json(&p, &v);
        trainer()
            .args(["--steps", "1", "--plan"])
            .arg(&p)
            .assert()
            .code(5)
            .stderr(predicate::str::contains(msg));
        trainer()
            .args([
                "--steps",
                "1",
                "--micro-batch",
                "64",
                "--accumulation",
                "2",
                "--force",
                "--plan",
            ])
            .arg(&p)
            .assert()
            .success();
    }
}

#[test]
fn trainer_rejects_unreadable_plans_with_exit_2() {
    let (_, out) = small_plan();
    let d = tmp();
    let text = std::fs::read_to_string(out).unwrap();
    let mut newer = read_json(out);
    newer["schema_version"] = 2.into();
    let mut missing = read_json(out);
    missing.as_object_mut().unwrap().remove("model");
    let cases = [
        (
            "truncated",
            text[..text.len() / 2].to_string(),
            "not valid JSON",
        ),
        ("garbage", "hello".to_string(), "not valid JSON"),
        ("newer", newer.to_string(), "newer than this build"),
        ("missing", missing.to_string(), "not a batchfit plan"),
    ];
    for (name, body, msg) in cases {
        let p = path(&d, name);
        std::fs::write(&p, body).unwrap();
        trainer()
            .arg("--plan")
            .arg(&p)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(msg));
    }
    trainer()
        .args(["--plan", "/nonexistent/plan.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("does not exist"));
}

#[test]
fn stuck_trial_is_killed_by_the_timeout() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let t0 = Instant::now();
    batchfit()
        .args(SMALL_CPU)
        .args([
            "--inject-fault",
            "hang@512",
            "--trial-timeout",
            "3",
            "--seed",
            "424242",
            "--out",
        ])
        .arg(&out)
        .assert()
        .code(4);
    // Trials at 256 fit; every trial at 512 or more hangs and is killed after 3 s (the first size
    // retried once).
    assert!(
        t0.elapsed() < Duration::from_secs(90),
        "took {:?}",
        t0.elapsed()
    );
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["status"], "partial");
    assert_eq!(p["stop_reason"], "trial-errors");
    let trials = p["trials"].as_array().unwrap();
    let timeouts: Vec<_> = trials
        .iter()
        .filter(|t| t["outcome"] == "timeout")
        .collect();
    assert!(timeouts.len() >= 2, "{trials:?}");
    assert!(timeouts
        .iter()
        .all(|t| t["batch"].as_u64().unwrap() >= 512 && t["seconds"].as_f64().unwrap() >= 3.0));
    // once a size timed out twice, a second size that times out ends the search, named
    let smallest = timeouts.iter().map(|t| t["batch"].as_u64().unwrap()).min();
    let detail = p["stop_detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "size {} failed: killed after the trial timeout",
            smallest.unwrap()
        )),
        "{detail}"
    );
    assert!(!trials
        .iter()
        .any(|t| t["batch"].as_u64().unwrap() >= 512 && t["outcome"] == "fits"));
    assert!(
        processes_with("424242").is_empty(),
        "no trial process left behind"
    );
}

#[test]
fn crashing_or_silent_trials_are_never_fits() {
    for fault in ["crash@1", "kill@1", "no-result@1", "nan@1"] {
        let o = batchfit()
            .args(SMALL_CPU)
            .args(["--inject-fault", fault])
            .assert()
            .code(4);
        let plan: serde_json::Value = serde_json::from_slice(&o.get_output().stdout).unwrap();
        let trials = plan["trials"].as_array().unwrap();
        assert!(!trials.is_empty());
        assert!(
            trials.iter().all(|t| t["outcome"] == "error"),
            "{fault}: {trials:?}"
        );
        assert!(plan["recommendation"].is_null());
    }
}

/// Starts a probe whose trial at 512 hangs, waits until it runs, sends `sig`, and checks the exit code,
/// the partial plan, the untouched `--out` and that no trial process is left. With `ignored`, the probe
/// starts with SIGINT and SIGTERM ignored, as background jobs of shell scripts do.
fn interrupt_case(sig: i32, ignored: bool, seed: &str) {
    use std::os::unix::process::CommandExt;
    let d = tmp();
    let out = path(&d, "plan.json");
    std::fs::write(&out, "keep me").unwrap();
    let bin = assert_cmd::cargo::cargo_bin("batchfit");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(SMALL_CPU)
        .args([
            "--inject-fault",
            "hang@512",
            "--trial-timeout",
            "100",
            "--seed",
            seed,
            "--out",
        ])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if ignored {
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    while !std::fs::read_to_string(path(&d, "plan.partial.json"))
        .is_ok_and(|t| t.contains("\"batch\": 256"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "probe did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // the hanging trial at 512 is running (in the worker or a fresh process)
    while processes_with(seed).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no trial process");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(child.id() as i32, sig) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + sig),
        "signal {sig}, ignored at start: {ignored}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["status"], "partial");
    assert_eq!(p["stop_reason"], "interrupted");
    assert!(p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["batch"] == 256 && t["outcome"] == "fits"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        processes_with(seed).is_empty(),
        "trial processes were killed"
    );
}

#[test]
fn sigterm_kills_trials_and_writes_partial_plan() {
    interrupt_case(libc::SIGTERM, false, "737373");
}

#[test]
fn sigint_is_handled_even_when_ignored_at_start() {
    interrupt_case(libc::SIGINT, true, "737374");
    interrupt_case(libc::SIGTERM, true, "737375");
}
