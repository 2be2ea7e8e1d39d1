//! Inputs a new user and a hostile one give, on the real `batchfit` and `batchfit-train` binaries
//! (mostly the simulated backend, so each runs in milliseconds; a few tiny `--exec` commands on cpu):
//! wrong answers the plan must not give, files it must not clobber or read without end (FIFOs,
//! links, devices), crashes and hangs it must not have, and the words it prints. One test per
//! behaviour, named after it; docs/errors.md has a row for each.

mod common;
use common::*;
use predicates::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

/// 50 MiB a sample on 16 GiB: the largest fit is 290 (limit 15.2 GiB).
const SIM16: &str = "base=1GiB,per-sample=50MiB,capacity=16GiB";
/// The same on 24 GiB: 446.
const SIM24: &str = "base=1GiB,per-sample=50MiB,capacity=24GiB";
/// Gradient accumulation holds 2 GiB more: 250 × 4 does not fit on 16 GiB though 250 × 1 does.
const ACC: &str = ",accumulation=2GiB";

fn sim_probe(sim: &str, extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args(["probe", "--backend", "sim", "--sim", sim, "--quiet"])
        .args(extra);
    c
}

fn json_out(a: &assert_cmd::assert::Assert) -> Value {
    serde_json::from_slice(&a.get_output().stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&a.get_output().stdout)))
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

fn rec(plan: &Value) -> (u64, u64) {
    let r = &plan["recommendation"];
    (
        r["micro_batch"].as_u64().unwrap(),
        r["accumulation"].as_u64().unwrap(),
    )
}

fn probe_out(d: &tempfile::TempDir, name: &str, sim: &str, extra: &[&str]) -> PathBuf {
    let out = path(d, name);
    sim_probe(sim, extra)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    out
}

// ---- 1. accumulation splits are proven with accumulation, in merge and verify too ----

#[test]
fn merge_keeps_below_a_size_that_failed_with_accumulation() {
    let d = tmp();
    let a = probe_out(
        &d,
        "a.json",
        &format!("{SIM16}{ACC}"),
        &["--global-batch", "1000"],
    );
    let b = probe_out(
        &d,
        "b.json",
        &format!("{SIM24}{ACC}"),
        &["--global-batch", "1000"],
    );
    let pa = read_json(&a);
    // the 16 GiB probe found 250 × 4 out of memory and split below it
    assert_eq!(rec(&pa), (200, 5));
    assert!(pa["trials"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["batch"] == 250 && t["accumulation"] == 4 && t["outcome"] == "oom"));
    assert_eq!(rec(&read_json(&b)), (250, 4));
    let m = path(&d, "m.json");
    batchfit()
        .args([
            "merge",
            "--global-batch",
            "1000",
            "--format",
            "json",
            "--out",
        ])
        .arg(&m)
        .arg(&a)
        .arg(&b)
        .assert()
        .success();
    let merged = read_json(&m);
    // not 250 × 4 from max_fitting_batch 290 (measured at accumulation 1)
    assert_eq!(rec(&merged), (200, 5), "{}", merged["recommendation"]);
    assert_eq!(merged["verified"], false);
    assert_eq!(
        merged["sources"][0]["smallest_failing_with_accumulation"],
        250
    );
    assert!(merged["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("stays below 250")));
    // verify confirms 200 with accumulation 5 on the 16 GiB device
    let v = path(&d, "v.json");
    batchfit()
        .args(["verify", "--quiet", "--out"])
        .arg(&v)
        .arg(&m)
        .assert()
        .success();
    let verified = read_json(&v);
    assert_eq!(verified["verified"], true);
    let last = verified["trials"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["batch"].as_u64(), last["accumulation"].as_u64()),
        (Some(200), Some(5))
    );
}

#[test]
fn verify_confirms_each_size_with_the_plans_accumulation() {
    let d = tmp();
    // no source ever ran an accumulation split: the merged 250 × 4 rests on 250 × 1
    let a = probe_out(&d, "a.json", SIM16, &[]);
    let b = probe_out(&d, "b.json", SIM24, &["--global-batch", "1000"]);
    let m = path(&d, "m.json");
    batchfit()
        .args([
            "merge",
            "--global-batch",
            "1000",
            "--format",
            "json",
            "--out",
        ])
        .arg(&m)
        .arg(&a)
        .arg(&b)
        .assert()
        .success();
    assert_eq!(rec(&read_json(&m)), (250, 4));
    // on a device where accumulation costs 2 GiB, verify must run 250 × 4 and see it fail
    let v = path(&d, "v.json");
    batchfit()
        .args([
            "verify",
            "--quiet",
            "--sim",
            &format!("{SIM16}{ACC}"),
            "--out",
        ])
        .arg(&v)
        .arg(&m)
        .assert()
        .code(4)
        .stderr(predicate::str::contains("250 × accumulation 4 did not fit"));
    let plan = read_json(&v);
    assert_eq!(plan["verified"], false);
    let last = plan["trials"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last["batch"].as_u64(),
            last["accumulation"].as_u64(),
            last["outcome"].as_str()
        ),
        (Some(250), Some(4), Some("oom"))
    );
}

// ---- 2. the split stays on --multiple-of and --min-batch ----

#[test]
fn the_split_stays_on_the_search_grid() {
    let a = sim_probe(
        SIM16,
        &[
            "--multiple-of",
            "8",
            "--global-batch",
            "1000",
            "--format",
            "json",
        ],
    )
    .assert()
    .success();
    let plan = json_out(&a);
    assert_eq!(rec(&plan), (200, 5), "250 is not a multiple of 8");
    let a = sim_probe(
        SIM16,
        &[
            "--multiple-of",
            "8",
            "--global-batch",
            "1000",
            "--format",
            "deepspeed",
        ],
    )
    .assert()
    .success();
    assert_eq!(json_out(&a)["train_micro_batch_size_per_gpu"], 200);
    // a per-rank batch below --min-batch, or off the grid: refused before any trial
    for (extra, msg) in [
        (
            vec![
                "--min-batch",
                "64",
                "--multiple-of",
                "64",
                "--global-batch",
                "40",
            ],
            "fewer than --min-batch 64",
        ),
        (
            vec!["--multiple-of", "8", "--global-batch", "1001"],
            "nearest valid global batches: 1000 or 1008",
        ),
    ] {
        sim_probe(SIM16, &extra)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(msg))
            .stderr(predicate::str::contains("trial").not())
            .stdout(predicate::str::is_empty());
    }
}

// ---- 4. an error or a timeout is never read as out of memory ----

#[test]
fn an_error_in_the_split_is_not_blamed_on_memory() {
    let d = tmp();
    let out = path(&d, "p.json");
    sim_probe(
        &format!("{SIM16},fail-at=250"),
        &["--global-batch", "1000", "--out"],
    )
    .arg(&out)
    .assert()
    .code(4);
    assert!(!out.exists());
    let p = read_json(&path(&d, "p.partial.json"));
    assert_eq!(p["status"], "partial");
    assert!(p["recommendation"].is_null(), "not 200 × 5");
    let detail = p["stop_detail"].as_str().unwrap();
    assert!(
        detail.contains("micro-batch 250 × accumulation 4 failed"),
        "{detail}"
    );
    for w in p["warnings"].as_array().unwrap() {
        assert!(
            !w.as_str().unwrap().contains("ran out of memory"),
            "an error blamed on memory: {w}"
        );
    }
    let errors = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["batch"] == 250 && t["outcome"] == "error")
        .count();
    assert_eq!(errors, 2, "tried and retried, never counted as memory");
}

// ---- 10, 11. files batchfit must not clobber ----

#[test]
fn out_dev_null_is_refused_before_any_trial_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let before = std::fs::metadata("/dev/null").unwrap();
    sim_probe(SIM16, &["--out", "/dev/null"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a regular file"))
        .stdout(predicate::str::is_empty());
    let after = std::fs::metadata("/dev/null").unwrap();
    assert!(after.file_type().is_char_device());
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&before),
        std::os::unix::fs::MetadataExt::ino(&after)
    );
}

#[test]
fn out_fifo_symlink_and_read_only_files() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let d = tmp();
    // a FIFO: refused before any trial (opening it would block, replacing it would break its users)
    let fifo = path(&d, "fifo.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&fifo)
        .timeout(Duration::from_secs(20))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a FIFO"));
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    // --plot a FIFO too
    sim_probe(SIM16, &[])
        .arg("--plot")
        .arg({
            let f = path(&d, "fifo.svg");
            let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            f
        })
        .timeout(Duration::from_secs(20))
        .assert()
        .code(2);

    // a symlink: the target is written, the link stays a link, the target keeps its mode
    let target = path(&d, "real.json");
    std::fs::write(&target, "old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = path(&d, "link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&link)
        .assert()
        .success();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(read_json(&target)["status"], "complete");
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o640
    );
    // a dangling symlink: refused
    let dangling = path(&d, "dangling.json");
    std::os::unix::fs::symlink(path(&d, "nowhere/p.json"), &dangling).unwrap();
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&dangling)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("does not exist"));

    // a read-only file: refused before any trial, left as it was (also when root could write it)
    let ro = path(&d, "ro.json");
    std::fs::write(&ro, "keep").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&ro)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("read-only"));
    assert_eq!(std::fs::read_to_string(&ro).unwrap(), "keep");

    // a new file gets 0666 less the umask, plots as plans
    let new = path(&d, "new.json");
    let svg = path(&d, "new.svg");
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&new)
        .arg("--plot")
        .arg(&svg)
        .assert()
        .success();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&new), mode(&svg), "plans and plots get the same mode");
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    };
    assert_eq!(mode(&new), 0o666 & !umask);
}

#[test]
fn plot_and_out_the_same_file_is_refused() {
    let d = tmp();
    let p = path(&d, "plan.svg");
    sim_probe(SIM16, &[])
        .arg("--out")
        .arg(&p)
        .arg("--plot")
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("the same file"));
    assert!(!p.exists());
    // also through a relative path to the same file
    let out = probe_out(&d, "plan2.svg", SIM16, &[]);
    batchfit()
        .current_dir(d.path())
        .args(["show", "./plan2.svg", "--plot", "plan2.svg"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("the plan file itself"));
    assert_eq!(read_json(&out)["status"], "complete");
}

// ---- 12. a closed stdout is a quiet end, not a panic ----

/// Runs `batchfit ARGS` with a stdout whose reader is gone before it writes; returns (code, stderr).
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let mut c = StdCommand::new(assert_cmd::cargo::cargo_bin("batchfit"));
    c.args(args)
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    drop(child.stdout.take()); // the reader goes away (`| true`, `| head -c 1` after one byte)
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let d = tmp();
    let plan = probe_out(&d, "plan.json", SIM16, &["--global-batch", "1000"]);
    let plan_s = plan.to_str().unwrap();
    let out2 = path(&d, "again.json");
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM16,
            "--quiet",
            "--out",
            out2.to_str().unwrap(),
        ],
        vec!["show", plan_s],
        vec!["show", plan_s, "--format", "json"],
        vec!["show", plan_s, "--format", "env"],
        vec!["man"],
        vec!["completions", "bash"],
        vec!["models"],
    ];
    for args in cases {
        let (code, stderr) = with_closed_stdout(&args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // the probe still wrote its plan
    assert_eq!(read_json(&out2)["status"], "complete");
    // and in real pipelines (the exit code of batchfit, not of head)
    for cmd in [
        format!("'{}' show '{plan_s}' | head -c 1", bin()),
        format!("'{}' man | head -1", bin()),
        format!(
            "'{}' probe --backend sim --sim {SIM16} --quiet | true",
            bin()
        ),
    ] {
        let o = StdCommand::new("bash")
            .args(["-c", &format!("set -o pipefail; {cmd} >/dev/null")])
            .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd}: {:?} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
}

fn bin() -> String {
    assert_cmd::cargo::cargo_bin("batchfit")
        .display()
        .to_string()
}

// ---- 13, 14. durations and global batches at the top of their range ----

#[test]
fn huge_durations_are_refused_not_a_panic() {
    for flag in ["--time-limit", "--trial-timeout"] {
        for v in ["1e300", "inf", "1e10"] {
            sim_probe(SIM16, &[flag, v])
                .assert()
                .code(2)
                .stderr(predicate::str::contains(flag))
                .stderr(predicate::str::contains("panicked").not());
        }
    }
    sim_probe(SIM16, &["--time-limit", "86400", "--trial-timeout", "3600"])
        .assert()
        .success();
}

#[test]
fn huge_global_batches_end_at_once_with_advice() {
    let t = Instant::now();
    // more than --max-batch × 4096 per rank: refused before any trial
    for extra in [
        vec!["--global-batch", "18446744073709551615"],
        vec![
            "--global-batch",
            "18446744073709551615",
            "--world-size",
            "5",
        ],
    ] {
        sim_probe(SIM16, &extra)
            .timeout(Duration::from_secs(20))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("accumulation steps"))
            .stderr(predicate::str::contains(
                "the largest global batch that splits is",
            ));
    }
    // splittable under --max-batch, but not under the proven size: the split says so
    let d = tmp();
    let out = path(&d, "p.json");
    sim_probe(SIM16, &["--global-batch", "1000000007", "--out"])
        .arg(&out)
        .timeout(Duration::from_secs(20))
        .assert()
        .code(4)
        .stderr(predicate::str::contains("panicked").not());
    let p = read_json(&path(&d, "p.partial.json"));
    assert!(p["stop_detail"]
        .as_str()
        .unwrap()
        .contains("the largest global batch that splits is 1187840"));
    // a prime: no exact split; nearby global batches that split, or --allow-uneven
    let out = path(&d, "prime.json");
    sim_probe(SIM16, &["--global-batch", "1000003", "--out"])
        .arg(&out)
        .timeout(Duration::from_secs(20))
        .assert()
        .code(4);
    let p = read_json(&path(&d, "prime.partial.json"));
    let detail = p["stop_detail"].as_str().unwrap();
    assert!(
        detail.contains("no exact split") && detail.contains("--allow-uneven"),
        "{detail}"
    );
    assert!(
        std::fs::metadata(path(&d, "prime.partial.json"))
            .unwrap()
            .len()
            < 100_000
    );
    let a = sim_probe(
        SIM16,
        &[
            "--global-batch",
            "1000003",
            "--allow-uneven",
            "--format",
            "json",
        ],
    )
    .timeout(Duration::from_secs(20))
    .assert()
    .success();
    let plan = json_out(&a);
    assert_eq!(plan["recommendation"]["accumulation"], 3449);
    assert!(a.get_output().stdout.len() < 200_000);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

// ---- 15. plans that contradict themselves are refused by every reader ----

fn edit(src: &Path, dst: &Path, f: impl FnOnce(&mut Value)) {
    let mut v = read_json(src);
    f(&mut v);
    write_json(dst, &v);
}

/// A named edit that makes a plan contradict itself.
type Contradiction = (&'static str, Box<dyn Fn(&mut Value)>);

#[test]
fn contradicting_plans_are_refused_everywhere() {
    let d = tmp();
    let good = probe_out(&d, "good.json", SIM16, &["--global-batch", "1000"]);
    let cases: Vec<Contradiction> = vec![
        (
            "micro-batch 7, micro_batches 60000",
            Box::new(|v| {
                v["recommendation"]["micro_batch"] = 7.into();
                v["recommendation"]["micro_batches"] =
                    serde_json::json!([60000, 60000, 60000, 60000]);
            }),
        ),
        (
            "999 × 4 = 4096",
            Box::new(|v| {
                v["recommendation"]["micro_batch"] = 999.into();
                v["recommendation"]["micro_batches"] = serde_json::json!([999, 999, 999, 999]);
                v["recommendation"]["global_batch"] = 4096.into();
            }),
        ),
        (
            "micro-batch 0",
            Box::new(|v| {
                v["recommendation"]["micro_batch"] = 0.into();
                v["recommendation"]["micro_batches"] = serde_json::json!([0, 0, 0, 0]);
            }),
        ),
        (
            "complete without a recommendation",
            Box::new(|v| v["recommendation"] = Value::Null),
        ),
        (
            "schema_version 0",
            Box::new(|v| v["schema_version"] = 0.into()),
        ),
    ];
    for (what, f) in cases {
        let bad = path(&d, "bad.json");
        edit(&good, &bad, f);
        for args in [
            vec!["show", "--format", "env"],
            vec!["show", "--format", "text"],
            vec!["verify", "--quiet"],
        ] {
            batchfit()
                .args(&args)
                .arg(&bad)
                .assert()
                .code(2)
                .stdout(predicate::str::is_empty())
                .stderr(predicate::str::contains(if what == "schema_version 0" {
                    "schema_version is 0"
                } else {
                    "contradicts itself"
                }));
        }
        batchfit()
            .args(["merge", "--global-batch", "1000", "--out"])
            .arg(path(&d, "m.json"))
            .arg(&bad)
            .assert()
            .code(2);
        trainer()
            .args(["--steps", "1", "--plan"])
            .arg(&bad)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("contradicts itself"));
    }
}

/// A plan edited so that its arithmetic still holds but no recorded trial supports it (the
/// micro-batch, the largest fitting size, the global batch, the micro-batches and the first failing
/// size all doubled) is refused by every reader, exit 2, naming the recommendation no trial backs
/// and saying to probe again; the plan as the probe wrote it is read by each.
#[test]
fn a_recommendation_no_trial_supports_is_refused_by_every_reader() {
    let d = tmp();
    let good = probe_out(&d, "good.json", SIM16, &["--global-batch", "1000"]);
    let g = read_json(&good);
    let (micro, acc) = rec(&g);
    let double = |v: &Value| Value::from(2 * v.as_u64().unwrap());
    let bad = path(&d, "bad.json");
    edit(&good, &bad, |v| {
        let r = &mut v["recommendation"];
        for k in [
            "micro_batch",
            "max_fitting_batch",
            "global_batch",
            "first_failing_batch",
        ] {
            r[k] = double(&r[k]);
        }
        let m: Vec<Value> = r["micro_batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(double)
            .collect();
        r["micro_batches"] = Value::from(m);
    });
    let want = format!(
        "its recommended micro-batch {} (with accumulation {acc}) has no recorded trial that fit",
        2 * micro
    );
    let merge = |plan: &Path, global: &str| {
        let mut c = batchfit();
        c.args([
            "merge",
            "--global-batch",
            global,
            "--format",
            "json",
            "--out",
        ])
        .arg(path(&d, "merged.json"))
        .arg(plan);
        c
    };
    for args in [vec!["show", "--format", "env"], vec!["verify", "--quiet"]] {
        batchfit().args(&args).arg(&good).assert().success();
        let a = batchfit()
            .args(&args)
            .arg(&bad)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty());
        let err = stderr_of(&a);
        assert!(
            err.contains(&want) && err.contains("re-run `batchfit probe`"),
            "{args:?}: {err}"
        );
    }
    merge(&good, "1000").assert().success();
    let a = merge(&bad, "2000").assert().code(2);
    assert!(stderr_of(&a).contains(&want), "{}", stderr_of(&a));
    let a = trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&bad)
        .assert()
        .code(2);
    assert!(stderr_of(&a).contains(&want), "{}", stderr_of(&a));
}

#[test]
fn an_edited_cache_entry_is_a_miss_and_said() {
    let d = tmp();
    let cache = path(&d, "cache");
    let probe = || cached_sim_probe(&cache, &["--global-batch", "1000"]);
    let first = json_out(&probe().assert().success());
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("cached");
    // an edit that keeps the arithmetic: 125 × 8, never run
    edit(&entry, &entry, |v| {
        v["recommendation"]["micro_batch"] = 125.into();
        v["recommendation"]["accumulation"] = 8.into();
        v["recommendation"]["micro_batches"] =
            serde_json::json!([125, 125, 125, 125, 125, 125, 125, 125]);
    });
    let a = probe().assert().success();
    assert!(
        stderr_of(&a).contains("cache entry not used, probing again")
            && stderr_of(&a).contains(
                "its recommended micro-batch 125 (with accumulation 8) has no recorded trial"
            ),
        "{}",
        stderr_of(&a)
    );
    assert_eq!(rec(&json_out(&a)), rec(&first));
    // the entry was overwritten by the fresh probe, and is served again
    let a = probe().assert().success();
    assert!(stderr_of(&a).contains("plan from cache"));
    // garbage in the entry: a miss, said
    std::fs::write(&entry, "{").unwrap();
    let a = probe().assert().success();
    assert!(
        stderr_of(&a).contains("cache entry not used"),
        "{}",
        stderr_of(&a)
    );
}

#[test]
fn a_cache_entry_of_another_torch_is_a_miss() {
    let d = tmp();
    let cache = path(&d, "cache");
    let probe = || cached_sim_probe(&cache, &[]);
    probe().assert().success();
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("cached");
    // the entry now says its trials ran on a torch this probe's do not
    edit(&entry, &entry, |v| {
        v["tool"]["libtorch_version"] = "2.11.9+other".into();
    });
    let a = probe().assert().success();
    assert!(
        stderr_of(&a).contains("cache entry not used, probing again")
            && stderr_of(&a).contains("PyTorch version"),
        "{}",
        stderr_of(&a)
    );
    assert!(json_out(&a)["tool"].get("libtorch_version").is_none());
}

// ---- 16. usage errors are exit 2, whatever else is wrong ----

#[test]
fn trainer_usage_errors_come_first() {
    let d = tmp();
    // a sim plan: the trainer refuses it (exit 5), but a bad flag is exit 2 before that
    let plan = probe_out(&d, "plan.json", SIM16, &[]);
    for extra in [
        vec!["--lr", "-1"],
        vec!["--lr", "NaN"],
        vec!["--lr", "inf"],
        vec!["--lr", "0"],
        vec!["--micro-batch", "0"],
        vec!["--accumulation", "0"],
        vec!["--accumulation", "18446744073709551615"],
        vec!["--steps", "0"],
        vec!["--memory-limit", "lots"],
    ] {
        trainer()
            .args(&extra)
            .arg("--plan")
            .arg(&plan)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("panicked").not());
    }
    trainer().arg("--plan").arg(&plan).assert().code(5);
    runner().args(["trial", "garbage"]).assert().code(2);
    // a spec that asks for an unbounded accumulation is refused before it allocates
    runner()
        .args([
            "trial",
            r#"{"model": {"architecture": {"name": "mlp", "input": 4, "hidden": [4], "classes": 2}, "optimizer": "adam", "precision": "fp32"}, "batch": 1, "steps": 1, "threads": 1, "seed": 0, "accumulation": 4000000000}"#,
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("accumulation 4000000000 is more than 4096"));
    runner().args(["worker", "garbage"]).assert().code(2);
    // the runner's own usage: a subcommand it does not know, or a missing argument
    runner().arg("nonsense").assert().code(2);
    runner().arg("trial").assert().code(2);
}

#[test]
fn a_cuda_plan_on_a_card_with_less_free_memory_warns() {
    // scripted GPUs: at probe time another process holds 20 GiB, at training time 60 GiB
    let gib = 1u64 << 30;
    let d = tmp();
    let fake = |others: u64| {
        let f = path(&d, &format!("gpus-{}.json", others / gib));
        let total = 141 * gib;
        write_json(
            &f,
            &serde_json::json!({"driver": "580.95", "gpus": [{"index": 0, "name": "NVIDIA H200",
                "uuid": "GPU-0000", "total_bytes": total, "free_bytes": total - others - gib / 2,
                "used_bytes": others + gib / 2,
                "processes": [{"pid": 4242, "used_bytes": others}]}],
                "sim": ["base=4GiB,per-sample=300MiB,capacity=141GiB"]}),
        );
        f
    };
    let plan = path(&d, "plan.json");
    batchfit()
        .env("BATCHFIT_FAKE_GPUS", fake(20 * gib))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args(["probe", "--backend", "cuda", "--quiet", "--out"])
        .arg(&plan)
        .assert()
        .success();
    // the trainer cannot train here (no CUDA for libtorch), but warns first
    let a = trainer()
        .env("BATCHFIT_FAKE_GPUS", fake(60 * gib))
        .args(["--force", "--steps", "1", "--plan"])
        .arg(&plan)
        .assert();
    let err = stderr_of(&a);
    assert!(
        err.contains("is free on GPU 0 (PID 4242 holds 60.00 GiB) now, less than the"),
        "{err}"
    );
    // the same card as at probe time: no warning
    let a = trainer()
        .env("BATCHFIT_FAKE_GPUS", fake(20 * gib))
        .args(["--force", "--steps", "1", "--plan"])
        .arg(&plan)
        .assert();
    assert!(
        !stderr_of(&a).contains("now, less than"),
        "{}",
        stderr_of(&a)
    );
}

// ---- 17. sizes ----

#[test]
fn sizes_say_their_units() {
    sim_probe(SIM16, &["--memory-budget", "12"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is 12 bytes"))
        .stderr(predicate::str::contains("12GiB"));
    for v in ["2gib", "2GiB", "2g", "2G", "2Gi"] {
        let a = sim_probe(SIM16, &["--memory-budget", v, "--format", "json"])
            .assert()
            .success();
        assert_eq!(json_out(&a)["budget_bytes"], 2u64 << 30, "{v}");
    }
    for v in ["2GB", "2gb"] {
        let a = sim_probe(SIM16, &["--memory-budget", v, "--format", "json"])
            .assert()
            .success();
        assert_eq!(json_out(&a)["budget_bytes"], 2_000_000_000u64, "{v}");
    }
    batchfit()
        .args(["probe", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("a bare number is bytes"));
}

// ---- 18, 19. words ----

#[test]
fn words_are_plain_and_plurals_right() {
    let d = tmp();
    // nothing fits: no internal names
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            "base=23GiB,per-sample=1MiB,capacity=24GiB",
            "--format",
            "text",
            "--quiet",
        ])
        .assert()
        .code(1);
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(text.contains("no recommendation: nothing fits"), "{text}");
    assert!(
        !text.contains("NothingFits") && !text.contains("1 trials"),
        "{text}"
    );
    assert!(text.contains("1 trial,"), "{text}");
    // a partial plan
    let a = sim_probe(SIM16, &["--max-trials", "2", "--format", "text"])
        .assert()
        .code(5);
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(
        text.contains("the plan is partial") && !text.contains("Partial"),
        "{text}"
    );
    // a complete one: no " ;"
    let a = sim_probe(SIM16, &["--format", "text"]).assert().success();
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(
        text.contains("largest fitting micro-batch: 290 (fits at 290, 291 runs out of memory); peak (simulated)"),
        "{text}"
    );
    assert!(!text.contains(" ;"), "{text}");
    // merge: one plan, partial plans
    let one = probe_out(&d, "one.json", SIM16, &[]);
    let a = batchfit()
        .args([
            "merge",
            "--global-batch",
            "100",
            "--format",
            "json",
            "--out",
        ])
        .arg(path(&d, "m.json"))
        .arg(&one)
        .assert()
        .success();
    let m = json_out(&a);
    assert!(m["stop_detail"]
        .as_str()
        .unwrap()
        .starts_with("merged from 1 plan:"));
    sim_probe(SIM16, &["--max-trials", "2", "--out"])
        .arg(path(&d, "p.json"))
        .assert()
        .code(5);
    batchfit()
        .args(["merge", "--global-batch", "100", "--out"])
        .arg(path(&d, "m2.json"))
        .arg(path(&d, "p.partial.json"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("(status partial:"));
    // one valid global batch is named once
    sim_probe(SIM16, &["--global-batch", "3", "--world-size", "100000"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "nearest valid global batch: 100000",
        ))
        .stderr(predicate::str::contains("100000 or 100000").not());
}

#[test]
fn an_uneven_split_reads_true_and_scripts_see_it() {
    let a = sim_probe(
        SIM16,
        &[
            "--global-batch",
            "1001",
            "--allow-uneven",
            "--format",
            "text",
        ],
    )
    .assert()
    .success();
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    // 1001 over 4 micro-batches of at most 290: 251 + 250 × 3
    assert!(
        text.contains("micro-batches 251 × 1 + 250 × 3 (uneven: 4 micro-batches per step) per rank × world size 1 = global batch 1001"),
        "{text}"
    );
    let a = sim_probe(
        SIM16,
        &[
            "--global-batch",
            "1001",
            "--allow-uneven",
            "--format",
            "env",
        ],
    )
    .assert()
    .success();
    let env = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(env.contains("export BATCHFIT_UNEVEN=1\n"), "{env}");
    assert!(
        env.contains("export BATCHFIT_MICRO_BATCHES='251 250 250 250'\n"),
        "{env}"
    );
    let a = sim_probe(SIM16, &["--global-batch", "1000", "--format", "env"])
        .assert()
        .success();
    let env = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(env.contains("export BATCHFIT_UNEVEN=0\n"), "{env}");
    assert!(!env.contains("BATCHFIT_MICRO_BATCHES"), "{env}");
}

// ---- 20. first contact ----

#[test]
fn default_format_is_text_on_a_terminal_and_json_in_a_pipe() {
    // piped (as in scripts): JSON, as before
    let a = sim_probe(SIM16, &[]).assert().success();
    assert_eq!(json_out(&a)["status"], "complete");
    let d = tmp();
    let plan = probe_out(&d, "plan.json", SIM16, &[]);
    let a = batchfit().arg("show").arg(&plan).assert().success();
    assert_eq!(json_out(&a)["status"], "complete");
    // on a terminal (script(1) gives the command one): the text summary
    let have_script = StdCommand::new("script").arg("--version").output().is_ok();
    if !have_script {
        eprintln!("skipped the terminal half: no script(1)");
        return;
    }
    for cmd in [
        format!("'{}' probe --backend sim --sim {SIM16} --quiet", bin()),
        format!("'{}' show '{}'", bin(), plan.display()),
    ] {
        let o = StdCommand::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{cmd}: {out}");
        assert!(
            out.contains("largest fitting micro-batch: 290"),
            "{cmd}: {out}"
        );
        assert!(!out.contains("\"schema_version\""), "{cmd}: {out}");
    }
}

#[test]
fn a_cpu_probe_without_a_budget_says_what_it_will_do() {
    // one tiny real trial (--max-trials 1), after the notice
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--mlp-input",
            "16",
            "--mlp-hidden",
            "16",
            "--threads",
            "1",
            "--max-trials",
            "1",
            "--format",
            "json",
        ])
        .timeout(Duration::from_secs(120))
        .assert()
        .code(5);
    let err = stderr_of(&a);
    assert!(
        err.contains("no --memory-budget given, so the budget is 80% of the memory available now"),
        "{err}"
    );
    assert!(err.contains("Ctrl-C"), "{err}");
    // not with a budget
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "1GiB",
            "--mlp-input",
            "16",
            "--mlp-hidden",
            "16",
            "--threads",
            "1",
            "--max-trials",
            "1",
        ])
        .timeout(Duration::from_secs(120))
        .assert()
        .code(5);
    assert!(!stderr_of(&a).contains("no --memory-budget"));
}

// ---- 8. non-monotone memory ----

#[test]
fn a_proof_says_it_is_local_and_contradicting_trials_are_flagged() {
    // a jump at 100 and a dip at 310: 167 is proven (168 runs out of memory), 320 would fit
    let sim = format!("{SIM16},jump=100:6GiB,dip=310:9GiB");
    let a = sim_probe(&sim, &["--format", "json"]).assert().success();
    let p = json_out(&a);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 167);
    let detail = p["stop_detail"].as_str().unwrap();
    assert!(detail.contains("local"), "{detail}");
    // a split size in the hole below a larger fit is re-tested and refused, never recommended
    let a = sim_probe(
        &sim,
        &[
            "--format",
            "json",
            "--strategy",
            "bisect",
            "--min-batch",
            "160",
            "--global-batch",
            "200",
        ],
    )
    .assert()
    .code(4);
    let p = json_out(&a);
    assert!(p["recommendation"].is_null());
    assert!(
        p["stop_detail"].as_str().unwrap().contains("not monotonic"),
        "{}",
        p["stop_detail"]
    );
}

// ---- values, odd files and commands that lie (a 3 MiB-per-sample curve) ----

const SIM3: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn sim3_probe(extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args([
        "probe",
        "--backend",
        "sim",
        "--sim",
        SIM3,
        "--quiet",
        "--no-cache",
    ])
    .args(extra);
    c
}

/// A negative value reaches its flag's own check, never clap as an unknown flag (`error: unexpected
/// argument '-0' found … tip: to pass '-0' as a value, use '-- -0'`; for probe, `--` would start the
/// --exec command), and `--seed -1` (an i64) can be given. docs/errors.md, "Numbers, sizes and
/// durations".
#[test]
fn negative_values_reach_their_own_checks() {
    let no_tip = || predicate::str::contains("use '--").not();
    for (args, says) in [
        (
            vec!["--margin", "-0.1"],
            "--margin -0.1 is outside [0, 0.9]",
        ),
        (
            vec!["--tolerance", "-0.01"],
            "--tolerance -0.01 is outside [0, 0.1]",
        ),
        (
            vec!["--throughput-tolerance", "-1"],
            "--throughput-tolerance -1 is outside",
        ),
        (
            vec!["--memory-budget", "-5GiB"],
            "a size cannot be negative",
        ),
        (vec!["--reserve", "-1GiB"], "a size cannot be negative"),
        (vec!["--time-limit", "-3"], "--time-limit"),
    ] {
        sim3_probe(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says).and(no_tip()));
    }
    // a negative seed is a seed
    sim3_probe(&["--seed", "-1", "--format", "json"])
        .assert()
        .success();
    // `--tolerance -0` is the exact proof, recorded as 0.0 (not -0.0)
    let a = sim3_probe(&["--tolerance", "-0", "--format", "json"])
        .assert()
        .success();
    let out = String::from_utf8_lossy(&a.get_output().stdout).to_string();
    assert!(out.contains("\"tolerance\": 0.0"), "{out}");
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim3_probe(&["--out"]).arg(&plan).assert().success();
    batchfit()
        .args(["predict", "--memory", "-5GiB"])
        .arg(&plan)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a size cannot be negative").and(no_tip()));
    batchfit()
        .args(["predict", "--memory", "24GiB", "--margin", "-0.5"])
        .arg(&plan)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("-0.5").and(no_tip()));
    batchfit()
        .args(["merge", "--global-batch", "-5", "--out"])
        .arg(path(&d, "m.json"))
        .arg(&plan)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid value '-5'").and(no_tip()));
    trainer()
        .args(["--lr", "-1", "--plan"])
        .arg(&plan)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--lr -1 must be a positive number").and(no_tip()));
    trainer()
        .args(["--memory-limit", "-1GiB", "--plan"])
        .arg(&plan)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a size cannot be negative").and(no_tip()));
}

/// A command that prints an out-of-memory and exits 0 (a job that catches `torch.OutOfMemoryError`
/// and goes on, a wrapper that hides the exit status) must not be a fit at every size (a plan of 76
/// where every size above 20 said it ran out of memory): such a trial is an error (not a fit, and no
/// proof of out-of-memory either), and the probe stops unproven. docs/errors.md, "A job that catches
/// its out-of-memory".
#[test]
fn an_exit_0_that_says_out_of_memory_is_no_fit() {
    let d = tmp();
    let script = path(&d, "caught.py");
    std::fs::write(
        &script,
        "import sys\nb = int(sys.argv[1])\nx = bytearray(b * 1024 * 1024)\n\
         for i in range(0, len(x), 4096): x[i] = 1\n\
         if b > 20:\n    print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', file=sys.stderr)\n\
         sys.exit(0)\n",
    )
    .unwrap();
    let out = path(&d, "plan.json");
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--cpu-limit",
            "rlimit",
            "--memory-budget",
            "100MiB",
            // every size above 20 exits 0 saying out of memory; none reaches the real limit
            // (79 MiB), where Python's MemoryError would be a true out-of-memory
            "--max-batch",
            "50",
            "--quiet",
            "--no-cache",
            "--format",
            "json",
            "--out",
        ])
        .arg(&out)
        .args(["--exec", "--", "/usr/bin/python3"])
        .arg(&script)
        .arg("{batch}")
        .assert()
        .code(4);
    let p: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let trials = p["trials"].as_array().unwrap();
    let said = trials
        .iter()
        .filter(|t| t["batch"].as_u64().unwrap() > 20)
        .collect::<Vec<_>>();
    assert!(!said.is_empty(), "{p:#}");
    for t in said {
        assert_ne!(t["outcome"], "fits", "{t:#}");
        if t["outcome"] == "oom" {
            continue; // a real MemoryError (a loaded machine's Python is larger)
        }
        assert_eq!(t["outcome"], "error", "{t:#}");
        assert!(
            t["message"]
                .as_str()
                .unwrap()
                .contains("exited 0, but its output reports an out-of-memory"),
            "{t:#}"
        );
    }
    assert!(p["recommendation"].is_null(), "{p:#}");
}

/// `batchfit cache list` / `clear` with a cache directory that is a file says the OS error once (not
/// `cache directory X: Not a directory (os error 20): Not a directory (os error 20)`), and leaves the
/// file alone.
#[test]
fn a_cache_error_is_said_once() {
    let d = tmp();
    let file = path(&d, "cache");
    std::fs::write(&file, "").unwrap();
    for action in ["list", "clear"] {
        let a = batchfit()
            .env("BATCHFIT_CACHE_DIR", &file)
            .args(["cache", action])
            .assert()
            .code(3);
        let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
        assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"");
}

/// A command that replaces its report (`BATCHFIT_RESULT`) with a symbolic link to /dev/zero, a FIFO
/// or a huge file must not make batchfit read without end or hang: the report is opened without
/// following links or waiting, only a regular file of at most 4 MiB is read, and anything else is the
/// trial's error.
#[test]
fn a_report_that_is_a_link_a_fifo_or_huge_is_an_error() {
    let d = tmp();
    for (what, cmd, says) in [
        (
            "link",
            r#"ln -sf /dev/zero "$BATCHFIT_RESULT"; echo {batch}"#,
            "is a symbolic link",
        ),
        (
            "fifo",
            r#"mkfifo "$BATCHFIT_RESULT"; echo {batch}"#,
            "is not a regular file (a FIFO)",
        ),
        (
            "huge",
            r#"head -c 5000000 /dev/zero > "$BATCHFIT_RESULT"; echo {batch}"#,
            "more than a report's",
        ),
    ] {
        let out = path(&d, &format!("{what}.json"));
        let a = batchfit()
            .args([
                "probe",
                "--backend",
                "cpu",
                "--cpu-limit",
                "rlimit",
                "--memory-budget",
                "100MiB",
                "--max-trials",
                "2",
                "--quiet",
                "--no-cache",
                "--format",
                "json",
                "--out",
            ])
            .arg(&out)
            .args(["--exec", "--", "/bin/sh", "-c", cmd])
            .timeout(std::time::Duration::from_secs(60))
            .assert()
            .code(4);
        let p: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
        let t = &p["trials"][0];
        assert_eq!(t["outcome"], "error", "{what}: {t:#}");
        assert!(
            t["message"].as_str().unwrap().contains(says),
            "{what}: {t:#}"
        );
    }
}

/// Every plan reader (`show`, `predict`, `verify`, `merge`, `batchfit-train`) reads only a regular
/// file (opened without waiting), so a FIFO cannot hang it and `/dev/zero` is not read until memory
/// runs out; the error names what the path is, once.
#[test]
fn a_plan_that_is_not_a_regular_file_is_refused_at_once() {
    let d = tmp();
    let fifo = path(&d, "plan.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dir = path(&d, "adir");
    std::fs::create_dir(&dir).unwrap();
    let t = std::time::Duration::from_secs(20);
    for (plan, what) in [
        (fifo.as_path(), "is a FIFO, not a regular file"),
        (
            std::path::Path::new("/dev/null"),
            "is a character device, not a regular file",
        ),
        (dir.as_path(), "is a directory, not a regular file"),
    ] {
        for args in [
            vec!["show"],
            vec!["predict", "--memory", "1GiB"],
            vec!["verify"],
        ] {
            let a = batchfit()
                .args(&args)
                .arg(plan)
                .timeout(t)
                .assert()
                .code(2)
                .stderr(predicate::str::contains(what));
            let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
            assert_eq!(err.matches("plan file").count(), 1, "{err}");
        }
        batchfit()
            .args(["merge", "--global-batch", "10", "--out"])
            .arg(path(&d, "m.json"))
            .arg(plan)
            .timeout(t)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(what));
        trainer()
            .arg("--plan")
            .arg(plan)
            .timeout(t)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(what));
    }
}

/// `batchfit predict plan.json --out plan.json` would replace the plan with the predictions, and
/// `merge a.json b.json --out b.json` a node's proven plan with the unverified merge: both are
/// refused, the files kept (also through a link).
#[test]
fn predict_and_merge_never_replace_their_own_input() {
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim3_probe(&["--out"]).arg(&plan).assert().success();
    let link = path(&d, "link.json");
    std::os::unix::fs::symlink(&plan, &link).unwrap();
    let before = std::fs::read(&plan).unwrap();
    for out in [&plan, &link] {
        batchfit()
            .args(["predict", "--memory", "24GiB", "--out"])
            .arg(out)
            .arg(&plan)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("is the plan file itself"));
    }
    let other = path(&d, "other.json");
    std::fs::copy(&plan, &other).unwrap();
    batchfit()
        .args(["merge", "--global-batch", "100", "--out"])
        .arg(&other)
        .arg(&plan)
        .arg(&other)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("is the plan").and(predicate::str::contains("being merged")),
        );
    assert_eq!(std::fs::read(&plan).unwrap(), before);
    assert_eq!(std::fs::read(&other).unwrap(), before);
    batchfit().arg("show").arg(&plan).assert().success();
}

/// `--exec -- ./train.sh` where train.sh has no execute bit is a usage error before anything runs,
/// saying how to run it (not a probe whose every trial fails to start: `cannot start a trial
/// process: Permission denied`, exit 4 and a partial plan of 0 trials).
#[test]
fn a_program_without_execute_permission_is_refused_before_any_trial() {
    let d = tmp();
    let script = path(&d, "train.sh");
    std::fs::write(&script, "#!/bin/sh\necho {batch}\n").unwrap();
    let out = path(&d, "plan.json");
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--cpu-limit",
            "rlimit",
            "--memory-budget",
            "100MiB",
        ])
        .args(["--quiet", "--no-cache", "--out"])
        .arg(&out)
        .args(["--exec", "--"])
        .arg(&script)
        .arg("{batch}")
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("is not executable").and(predicate::str::contains("chmod +x")),
        );
    assert!(!out.exists() && !path(&d, "plan.partial.json").exists());
}

/// A plan of no trials prints `0 trials, 0.0 s of trials`, not `-0.0 s` (an empty f64 sum is -0.0).
#[test]
fn no_trials_take_zero_seconds_not_minus_zero() {
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim3_probe(&["--out"]).arg(&plan).assert().success();
    let mut v = read_json(&plan);
    v["status"] = "partial".into();
    v["stop_reason"] = "interrupted".into();
    v["recommendation"] = serde_json::Value::Null;
    v["trials"] = serde_json::json!([]);
    v.as_object_mut().unwrap().remove("capacity_model");
    write_json(&plan, &v);
    let a = batchfit()
        .args(["show", "--format", "text"])
        .arg(&plan)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&a.get_output().stdout).to_string();
    assert!(text.contains("0 trials, 0.0 s of trials"), "{text}");
    assert!(!text.contains("-0.0"), "{text}");
}

/// A symbolic link planted at a cache entry's name (a shared plan cache, as the Slurm recipe uses)
/// is never written through, even by root: the plan is not cached (a warning says so), and the link
/// and its target are kept.
#[test]
fn a_link_in_the_plan_cache_is_never_written_through() {
    let d = tmp();
    let cache = path(&d, "cache");
    let probe = || {
        let mut c = batchfit();
        c.env("BATCHFIT_CACHE_DIR", &cache).args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM3,
            "--quiet",
            "--format",
            "json",
        ]);
        c
    };
    probe().assert().success();
    let entries: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1);
    let entry = entries[0].path();
    let victim = path(&d, "victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&victim, &entry).unwrap();
    probe().assert().success().stderr(predicate::str::contains(
        "is a symbolic link, not a file batchfit wrote",
    ));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(std::fs::symlink_metadata(&entry)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// A sim probe (`SIM16`, JSON on stdout) that uses the plan cache in `cache`.
fn cached_sim_probe(cache: &std::path::Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.env("BATCHFIT_CACHE_DIR", cache)
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM16,
            "--format",
            "json",
        ])
        .args(extra);
    c
}

/// `--exec -- "python3 train.py --batch {batch}"` (the whole command quoted as one word after
/// `--`) is a usage error before anything runs that says to pass it unquoted as separate words,
/// not a search for a program named by the whole line; an existing file whose name has a space
/// is still a program.
#[test]
fn a_whole_command_quoted_as_one_word_after_the_separator_is_refused_with_the_fix() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let probe = |cmd: &str| {
        let mut c = batchfit();
        c.current_dir(d.path())
            .args(["probe", "--backend", "cpu", "--cpu-limit", "rlimit"])
            .args([
                "--memory-budget",
                "100MiB",
                "--quiet",
                "--no-cache",
                "--out",
            ])
            .arg(&out)
            .args(["--exec", "--", cmd]);
        c
    };
    probe("python3 train.py --batch {batch}")
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("one quoted word with spaces")
                .and(predicate::str::contains(
                    "pass the command unquoted, as separate words after `--` (batchfit probe \
                     --exec -- python3 train.py --batch {batch})",
                ))
                .and(predicate::str::contains("cannot find the program").not()),
        );
    assert!(!out.exists() && !path(&d, "plan.partial.json").exists());
    // a program whose file name has a space is a program, not a quoted command
    let script = path(&d, "my train.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    probe(script.to_str().unwrap())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not executable"));
}
