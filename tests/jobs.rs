//! Plans across machines and runs, on the simulated backend: `batchfit merge`, `batchfit verify`,
//! the plan cache (`--no-cache`, `--refresh`, `batchfit cache list|clear`), and the trainer's refusal
//! of an unverified merged plan.

mod common;
use common::*;
use predicates::prelude::*;
use std::path::{Path, PathBuf};

const BIG: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";
const SMALL: &str = "base=1GiB,per-sample=3MiB,capacity=8GiB";

/// A complete sim plan written to `out`.
fn probe_to(sim: &str, out: &Path, extra: &[&str]) {
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
        .arg(out)
        .args(extra)
        .assert()
        .success();
}

fn two_plans(d: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let (a, b) = (path(d, "a.json"), path(d, "b.json"));
    probe_to(BIG, &a, &[]);
    probe_to(SMALL, &b, &[]);
    (a, b)
}

fn merge(d: &tempfile::TempDir, plans: &[&Path], extra: &[&str]) -> assert_cmd::assert::Assert {
    let mut c = batchfit();
    c.arg("merge")
        .args(plans)
        .args(["--out"])
        .arg(path(d, "m.json"))
        .args(extra);
    c.assert()
}

#[test]
fn merge_uses_the_smallest_fit_and_resplits() {
    let d = tmp();
    let (a, b) = two_plans(&d);
    let max_a = read_json(&a)["recommendation"]["max_fitting_batch"]
        .as_u64()
        .unwrap();
    let max_b = read_json(&b)["recommendation"]["max_fitting_batch"]
        .as_u64()
        .unwrap();
    assert!(max_b < max_a, "{max_b} < {max_a}");
    let out = merge(
        &d,
        &[&a, &b],
        &["--global-batch", "8192", "--world-size", "2"],
    )
    .success()
    .stderr(predicate::str::contains("not verified"));
    let m = read_json(&path(&d, "m.json"));
    // stdout is the JSON plan too
    let printed: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(printed, m);
    assert_eq!(m["status"], "complete");
    assert_eq!(m["verified"], false);
    let r = &m["recommendation"];
    assert_eq!(r["max_fitting_batch"].as_u64().unwrap(), max_b);
    let micro = r["micro_batch"].as_u64().unwrap();
    let acc = r["accumulation"].as_u64().unwrap();
    assert!(micro <= max_b);
    assert_eq!(micro * acc * 2, 8192);
    assert_eq!(r["world_size"], 2);
    let sources = m["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 2);
    assert_eq!(sources[0]["path"], a.display().to_string());
    assert_eq!(sources[1]["path"], b.display().to_string());
    assert_eq!(sources[1]["device_name"], read_json(&b)["device"]["name"]);
    assert_eq!(sources[1]["device_kind"], "sim");
    assert_eq!(sources[1]["max_fitting_batch"].as_u64().unwrap(), max_b);
    // the merged plan keeps the smaller device's curve, for verify
    assert_eq!(m["sim_spec"]["capacity"].as_u64().unwrap(), 8 << 30);
    // env format: a merged split never ran with its accumulation, so no size is exported until
    // `batchfit verify` runs it here
    merge(
        &d,
        &[&a, &b],
        &["--global-batch", "8192", "--format", "env"],
    )
    .success()
    .stdout("export BATCHFIT_STATUS=unverified\nexport BATCHFIT_VERIFIED=0\n");
}

#[test]
fn merge_respects_allow_uneven() {
    let d = tmp();
    let (a, b) = two_plans(&d);
    let max_b = read_json(&b)["recommendation"]["max_fitting_batch"]
        .as_u64()
        .unwrap();
    // a prime global batch: only an uneven split gets near the largest fitting size
    merge(
        &d,
        &[&a, &b],
        &["--global-batch", "10007", "--allow-uneven"],
    )
    .success();
    let r = read_json(&path(&d, "m.json"))["recommendation"].clone();
    assert_eq!(r["uneven"], true);
    let sizes: Vec<u64> = r["micro_batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), 10007);
    assert!(sizes.iter().all(|&s| s <= max_b));
}

#[test]
fn merge_refuses_other_models_and_partial_plans() {
    let d = tmp();
    let a = path(&d, "a.json");
    probe_to(BIG, &a, &[]);
    let other = path(&d, "other.json");
    probe_to(BIG, &other, &["--mlp-hidden", "512"]);
    merge(&d, &[&a, &other], &["--global-batch", "8192"])
        .code(2)
        .stderr(predicate::str::contains("different models"));
    assert!(!path(&d, "m.json").exists());
    // a partial plan (stopped by --max-trials)
    let p = path(&d, "p.json");
    batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SMALL,
            "--quiet",
            "--max-trials",
            "2",
            "--out",
        ])
        .arg(&p)
        .assert()
        .code(5);
    merge(
        &d,
        &[&a, &path(&d, "p.partial.json")],
        &["--global-batch", "8192"],
    )
    .code(2)
    .stderr(predicate::str::contains("not a complete plan"));
    // unreadable input
    merge(
        &d,
        &[&a, &path(&d, "missing.json")],
        &["--global-batch", "8192"],
    )
    .code(2);
}

#[test]
fn trainer_refuses_an_unverified_merged_plan() {
    let d = tmp();
    let (a, b) = two_plans(&d);
    merge(&d, &[&a, &b], &["--global-batch", "8192"]).success();
    trainer()
        .args(["--plan"])
        .arg(path(&d, "m.json"))
        .args(["--steps", "1"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("not verified here"));
}

#[test]
fn verify_marks_a_merged_sim_plan_verified() {
    let d = tmp();
    let (a, b) = two_plans(&d);
    merge(&d, &[&a, &b], &["--global-batch", "8192"]).success();
    let m = path(&d, "m.json");
    let v = path(&d, "v.json");
    batchfit()
        .args(["verify"])
        .arg(&m)
        .args(["--out"])
        .arg(&v)
        .assert()
        .success()
        .stderr(predicate::str::contains("verified"))
        .stderr(predicate::str::contains("confirm"));
    let merged = read_json(&m);
    let plan = read_json(&v);
    assert_eq!(plan["verified"], true);
    let before = merged["trials"].as_array().unwrap().len();
    let trials = plan["trials"].as_array().unwrap();
    let micro = plan["recommendation"]["micro_batch"].as_u64().unwrap();
    let last = trials.last().unwrap();
    assert!(trials.len() > before);
    assert_eq!(last["batch"].as_u64().unwrap(), micro);
    assert_eq!(last["purpose"], "confirm");
    assert_eq!(last["outcome"], "fits");
    assert_eq!(last["steps"], plan["search"]["confirm_steps"]);
    // the trainer no longer refuses it as unverified (only as a sim plan)
    trainer()
        .args(["--plan"])
        .arg(&v)
        .args(["--steps", "1"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("not verified").not())
        .stderr(predicate::str::contains("sim backend"));
}

/// `batchfit verify PLAN` in place (no --out), on a sim device whose samples are larger than those
/// of `BIG`.
fn verify_where_samples_are_larger(plan: &Path) -> assert_cmd::assert::Assert {
    batchfit()
        .args(["verify", "--quiet"])
        .arg(plan)
        .args(["--sim", "base=1GiB,per-sample=4MiB,capacity=16GiB"])
        .assert()
}

#[test]
fn verify_fails_with_exit_4_when_a_size_does_not_fit_here() {
    let d = tmp();
    let a = path(&d, "a.json");
    probe_to(BIG, &a, &["--global-batch", "4096"]);
    verify_where_samples_are_larger(&a)
        .code(4)
        .stderr(predicate::str::contains("did not fit"));
    let plan = read_json(&a);
    assert_eq!(plan["verified"], false);
    let last = plan["trials"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["batch"], 4096);
    assert_eq!(last["outcome"], "oom");
    assert!(plan["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().starts_with("verification failed")));
    trainer()
        .args(["--plan"])
        .arg(&a)
        .assert()
        .code(5)
        .stderr(predicate::str::contains("not verified"));
}

/// A plan whose verification failed is not verified again: a size that did not fit once breaks the
/// promise however often it fits later (a second `verify` whose runs happened to fit marked such a
/// plan verified, and merge then took it).
#[test]
fn a_plan_whose_verification_failed_is_not_verified_again() {
    let d = tmp();
    let a = path(&d, "a.json");
    probe_to(BIG, &a, &["--global-batch", "4096"]);
    verify_where_samples_are_larger(&a).code(4);
    let before = std::fs::read(&a).unwrap();
    // the plan's own device, on which every size fits
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("failed its verification"))
        .stderr(predicate::str::contains("probe this machine again"));
    assert_eq!(std::fs::read(&a).unwrap(), before, "the plan was rewritten");
}

/// A plan proven on one device (fits at 2247, 2258 runs out of memory) and verified on another whose
/// largest size is 2162 must not be marked verified with that device's name and its bracket
/// unchanged (`show` saying "largest fitting micro-batch: 2247 (fits at 2247, 2258 runs out of
/// memory)" of a device where 2247 does not fit, exit 0, when only the recommended 2000 × 5 ran).
/// Elsewhere the bracket is checked too; where it does not hold the verification fails (exit 4),
/// and where it holds (a larger device whose first failing size still fails) it passes.
#[test]
fn verify_elsewhere_checks_the_plans_bracket() {
    let d = tmp();
    let a = path(&d, "a.json");
    let spec = "base=1GiB,per-sample=3MiB,capacity=8GiB,accumulation=100MiB";
    probe_to(spec, &a, &["--global-batch", "10000"]);
    let plan = read_json(&a);
    let r = &plan["recommendation"];
    assert_eq!(r["micro_batch"], 2000, "{r}");
    assert_eq!(r["max_fitting_batch"], 2247, "{r}");
    let v = path(&d, "v.json");
    // 3200 KiB per sample: 2000 × 5 fits, 2247 does not (the largest is 2162)
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .args([
            "--sim",
            "base=1GiB,per-sample=3200KiB,capacity=8GiB,accumulation=100MiB",
        ])
        .args(["--out"])
        .arg(&v)
        .assert()
        .code(4)
        .stderr(predicate::str::contains(
            "largest fitting micro-batch 2247 ran out of memory here",
        ));
    assert_eq!(read_json(&v)["verified"], false);
    // a curve with more memory above 2247: 2258 fits there
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .args([
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=8GiB,accumulation=100MiB,dip=2250:100MiB",
        ])
        .args(["--out"])
        .arg(&v)
        .assert()
        .code(4)
        .stderr(predicate::str::contains(
            "first failing micro-batch 2258 fits here",
        ));
    // the same curve (its sim_spec): verified, bracket kept
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .args(["--out"])
        .arg(&v)
        .assert()
        .success();
    let w = read_json(&v);
    assert_eq!(w["verified"], true);
    assert_eq!(w["recommendation"]["max_fitting_batch"], 2247);
}

/// Two sim devices of 1 GiB, the second with 100 MiB more fixed memory: 800 × 2 fits on the
/// first and runs out of memory on the second.
const ROOMY: &str = "base=100MiB,per-sample=1MiB,capacity=1GiB";
const CRAMPED: &str = "base=200MiB,per-sample=1MiB,capacity=1GiB";

/// A plan whose `verify` failed still names the device it was probed on, with that device's
/// largest fit: merged, it would stand for the machine its sizes did not hold on (a split of 780 × 2
/// merged from it verified on the first device and ran out of memory on the second). `merge`
/// refuses it (exit 2), saying to probe that machine, and writes nothing.
#[test]
fn a_merged_plan_refuses_a_source_whose_verification_failed() {
    let d = tmp();
    let (a, b) = (path(&d, "a.json"), path(&d, "b.json"));
    probe_to(ROOMY, &a, &["--global-batch", "1600"]);
    batchfit()
        .args(["verify", "--quiet", "--sim", CRAMPED, "--out"])
        .arg(&b)
        .arg(&a)
        .assert()
        .code(4);
    assert!(read_json(&b)["verification_failure"].is_string());
    merge(&d, &[&a, &b], &["--global-batch", "1560"])
        .code(2)
        .stderr(predicate::str::contains("b.json failed its verification"))
        .stderr(predicate::str::contains(
            "probe the machine that verified it",
        ));
    assert!(!path(&d, "m.json").exists(), "refused before writing");
    // the source that verified nothing is fine alone
    merge(&d, &[&a], &["--global-batch", "1560"]).success();
}

/// A sim curve on which 750 × 4 fits three times but peaks above the ceiling its measured noise
/// leaves (the probe recomputes its split to 600 × 5 below it).
const NOISY_ACCUMULATION: &str =
    "base=100MiB,per-sample=1MiB,capacity=1GiB,boundary-noise=20MiB,accumulation=70MiB,seed=3";

/// The plan of [`NOISY_ACCUMULATION`] for a global batch of 3000, checked to hold what the tests
/// of it rest on: its split was recomputed below 750 × 4, which fit above its noise ceiling.
fn noisy_accumulation_plan(d: &tempfile::TempDir) -> PathBuf {
    let p = path(d, "p.json");
    probe_to(
        NOISY_ACCUMULATION,
        &p,
        &["--global-batch", "3000", "--repeats", "2", "--no-cache"],
    );
    let plan = read_json(&p);
    assert_eq!(plan["recommendation"]["micro_batch"], 600, "{plan}");
    let warnings = plan["warnings"].to_string();
    assert!(
        warnings.contains("750 × accumulation 4 peaked at"),
        "{warnings}"
    );
    p
}

/// `merge` holds its sources' splits to the probe's one rule: a size whose fresh fits with
/// accumulation break the noise ceiling bounds the split like an out-of-memory, so the merged plan
/// of a plan that recomputed 750 × 4 down to 600 × 5 recommends 600 × 5 (not 750 × 4), records 750
/// as the source's bound and says why.
#[test]
fn merge_keeps_below_a_size_whose_fits_with_accumulation_broke_the_noise_ceiling() {
    let d = tmp();
    let p = noisy_accumulation_plan(&d);
    merge(&d, &[&p], &["--global-batch", "3000"]).success();
    let m = read_json(&path(&d, "m.json"));
    let r = &m["recommendation"];
    assert_eq!(
        (r["micro_batch"].clone(), r["accumulation"].clone()),
        (600.into(), 5.into()),
        "{r}"
    );
    assert_eq!(m["sources"][0]["smallest_failing_with_accumulation"], 750);
    let warnings = m["warnings"].to_string();
    assert!(
        warnings.contains(
            "peaked above the ceiling its measured noise leaves under the limit at micro-batch 750"
        ),
        "{warnings}"
    );
}

/// `verify` on the device a plan was probed on holds each size to the noise of every fresh run of
/// it at its accumulation the plan carries from that device, not only its own: a merged plan
/// recommending 750 × 4, whose probe's runs of it peaked above the ceiling, is not verified there
/// (exit 4) although verify's own three runs happen to stay under it.
#[test]
fn verify_holds_a_size_to_the_noise_of_every_run_of_it_on_this_device() {
    let d = tmp();
    let p = noisy_accumulation_plan(&d);
    merge(&d, &[&p], &["--global-batch", "3000"]).success();
    let (m, edited, v) = (path(&d, "m.json"), path(&d, "e.json"), path(&d, "v.json"));
    let mut plan = read_json(&m);
    let r = &mut plan["recommendation"];
    r["micro_batch"] = 750.into();
    r["accumulation"] = 4.into();
    r["micro_batches"] = serde_json::json!([750, 750, 750, 750]);
    write_json(&edited, &plan);
    batchfit()
        .args(["verify", "--quiet", "--out"])
        .arg(&v)
        .arg(&edited)
        .assert()
        .code(4)
        .stderr(predicate::str::contains(
            "micro-batch 750 × accumulation 4 peaked at",
        ));
    // verify's own run of 750 × 4 fit, lower than the probe's highest: the probe's runs show the
    // excess
    let trials = plan["trials"].as_array().unwrap();
    let top = |ts: &[serde_json::Value]| {
        ts.iter()
            .filter(|t| t["batch"] == 750 && t["accumulation"] == 4 && t["outcome"] == "fits")
            .map(|t| t["peak_bytes"].as_u64().unwrap())
            .max()
    };
    let own = read_json(&v)["trials"].as_array().unwrap()[trials.len()..].to_vec();
    assert!(own.iter().all(|t| t["outcome"] == "fits"), "{own:?}");
    assert!(top(&own) < top(trials), "{own:?}");
}

/// A device with the probe's curve and five times its run-to-run noise.
const NOISIER: &str = "base=100MiB,per-sample=1MiB,capacity=1GiB,boundary-noise=15MiB,seed=3";

/// The plan of 512 on the quiet curve (`boundary-noise=5MiB`): 849 is its largest fit, below a
/// noise band.
fn quiet_noisy_plan(d: &tempfile::TempDir) -> PathBuf {
    let q = path(d, "q.json");
    probe_to(
        "base=100MiB,per-sample=1MiB,capacity=1GiB,boundary-noise=5MiB,seed=7",
        &q,
        &["--global-batch", "512", "--repeats", "2", "--no-cache"],
    );
    assert_eq!(read_json(&q)["recommendation"]["max_fitting_batch"], 849);
    q
}

/// `verify` elsewhere claims the plan's largest fit as this device's, so it holds it as the probe
/// did: run as often as the probe ran its answer, each run under the ceiling the wider of the
/// probe's and this device's noise leaves. On a noisier device 849 fits, but at 958.87 MiB, above
/// that ceiling: not verified (exit 4), where before one run of it sufficed.
#[test]
fn verify_elsewhere_holds_the_largest_fit_to_the_noise_ceiling() {
    let d = tmp();
    let q = quiet_noisy_plan(&d);
    let v = path(&d, "v.json");
    batchfit()
        .args(["verify", "--quiet", "--sim", NOISIER, "--out"])
        .arg(&v)
        .arg(&q)
        .assert()
        .code(4)
        .stderr(predicate::str::contains(
            "its largest fitting micro-batch fit here, but micro-batch 849 peaked at 958.87 MiB (its one \
             run)",
        ));
    // the failed verification's trials ran on the noisier device: the plan, still the quiet
    // device's, counts none of them as its own
    let text = batchfit()
        .args(["show", "--format", "text"])
        .arg(&v)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("micro-batch 849 fit 3 times in fresh runs"),
        "{text}"
    );
}

/// A plan verified on another device describes that device: its measured noise is the wider of
/// the probe's and the verification's own (the probe's rule: the whole range three runs imply),
/// the trials before the verification's are marked as another device's, and the text counts only
/// this device's runs of the largest fit (three, not the probe's three and these).
#[test]
fn a_plan_verified_elsewhere_carries_its_own_noise_and_counts_only_its_own_runs() {
    let d = tmp();
    let q = quiet_noisy_plan(&d);
    let probe = read_json(&q);
    let n = probe["trials"].as_array().unwrap().len();
    let v = path(&d, "v.json");
    batchfit()
        .args(["verify", "--quiet", "--sim"])
        .arg("base=100MiB,per-sample=1MiB,capacity=1GiB,boundary-noise=5MiB,seed=4")
        .arg("--out")
        .arg(&v)
        .arg(&q)
        .assert()
        .success();
    let plan = read_json(&v);
    assert_eq!(plan["trials_elsewhere"], serde_json::json!([[0, n]]));
    let peaks = |b: u64| -> Vec<u64> {
        plan["trials"].as_array().unwrap()[n..]
            .iter()
            .filter(|t| t["batch"] == b && t["outcome"] == "fits")
            .map(|t| t["peak_bytes"].as_u64().unwrap())
            .collect()
    };
    let spread = plan["search"]["noise_spread_bytes"].as_u64().unwrap();
    assert!(spread >= probe["search"]["noise_spread_bytes"].as_u64().unwrap());
    for b in [512, 849] {
        let p = peaks(b);
        assert_eq!(p.len(), 3, "{b}: {p:?}");
        let implied = 2 * (p.iter().max().unwrap() - p.iter().min().unwrap());
        assert!(
            spread >= implied,
            "{b}: {p:?} imply {implied}, the plan says {spread}"
        );
    }
    let text = batchfit()
        .args(["show", "--format", "text"])
        .arg(&v)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("micro-batch 849 fit 3 times in fresh runs"),
        "{text}"
    );
    let top = *peaks(849).iter().max().unwrap() as f64 / (1u64 << 20) as f64;
    assert!(
        text.contains(&format!("peak (simulated) {top:.2} MiB")),
        "{top:.2}: {text}"
    );
}

#[test]
fn verify_of_an_old_sim_plan_needs_sim() {
    let d = tmp();
    let a = path(&d, "a.json");
    probe_to(BIG, &a, &[]);
    let mut v = read_json(&a);
    assert_eq!(
        v.get("verified"),
        None,
        "a probe plan leaves verified absent"
    );
    v.as_object_mut().unwrap().remove("sim_spec");
    write_json(&a, &v);
    // old plans (no verified, sources, sim_spec) still read
    batchfit().args(["show"]).arg(&a).assert().success();
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--sim"));
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&a)
        .args(["--sim", BIG])
        .assert()
        .success();
    assert_eq!(read_json(&a)["verified"], true);
}

fn cached_probe(cache: &Path, out: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    batchfit()
        .env("BATCHFIT_CACHE_DIR", cache)
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            BIG,
            "--global-batch",
            "8192",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .assert()
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stderr.clone()).unwrap()
}

#[test]
fn a_repeated_probe_is_answered_from_the_cache() {
    let d = tmp();
    let cache = d.path().join("batchfit").join("plans");
    let (p1, p2) = (path(&d, "p1.json"), path(&d, "p2.json"));
    let first = cached_probe(&cache, &p1, &[]).success();
    assert!(stderr_of(&first).contains("trial   1:"));
    assert!(!stderr_of(&first).contains("from cache"));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);

    // same key: no trial runs, the cached plan is written to --out and printed in --format
    let second = cached_probe(&cache, &p2, &["--format", "env"]).success();
    let err = stderr_of(&second);
    assert!(err.contains("batchfit: plan from cache ("), "{err}");
    assert!(!err.contains("trial "), "{err}");
    let stdout = String::from_utf8(second.get_output().stdout.clone()).unwrap();
    assert!(
        stdout.contains("export BATCHFIT_MICRO_BATCH=4096"),
        "{stdout}"
    );
    assert_eq!(read_json(&p1), read_json(&p2));

    // --refresh runs the trials again and overwrites the entry
    let refreshed = cached_probe(&cache, &p2, &["--refresh"]).success();
    let err = stderr_of(&refreshed);
    assert!(
        err.contains("trial   1:") && !err.contains("from cache"),
        "{err}"
    );
    assert_ne!(read_json(&p2)["trials"].as_array().unwrap().len(), 0);
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);

    // another margin is another key: a miss, and a second entry
    let other = cached_probe(&cache, &p2, &["--margin", "0.1"]).success();
    assert!(!stderr_of(&other).contains("from cache"));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2);
    // and so is another global batch
    let other = batchfit()
        .env("BATCHFIT_CACHE_DIR", &cache)
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            BIG,
            "--global-batch",
            "4096",
            "--quiet",
        ])
        .assert()
        .success();
    assert!(!stderr_of(&other).contains("from cache"));

    // --no-cache neither reads nor writes
    let none = cached_probe(&cache, &p2, &["--no-cache"]).success();
    assert!(!stderr_of(&none).contains("from cache"));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 3);
}

#[test]
fn no_cache_writes_nothing_and_partial_plans_are_not_cached() {
    let d = tmp();
    let cache = d.path().join("plans");
    cached_probe(&cache, &path(&d, "p.json"), &["--no-cache", "--quiet"]).success();
    assert!(!cache.exists());
    cached_probe(
        &cache,
        &path(&d, "q.json"),
        &["--max-trials", "2", "--quiet"],
    )
    .code(5);
    assert!(!cache.exists() || std::fs::read_dir(&cache).unwrap().count() == 0);
    // --refresh and --no-cache contradict each other
    cached_probe(&cache, &path(&d, "q.json"), &["--no-cache", "--refresh"]).code(2);
}

#[test]
fn cache_list_and_clear_touch_only_the_plans_folder() {
    let d = tmp();
    // the default location under XDG_CACHE_HOME, next to the libtorch install
    let xdg = d.path().join("xdg");
    let libtorch = xdg.join("batchfit").join("libtorch-2.11.0");
    std::fs::create_dir_all(libtorch.join("lib")).unwrap();
    std::fs::write(libtorch.join("lib").join("marker.json"), "{}").unwrap();
    std::fs::write(libtorch.join("keep.json"), "{}").unwrap();
    let run = |args: &[&str]| {
        let mut c = batchfit();
        c.env_remove("BATCHFIT_CACHE_DIR")
            .env("XDG_CACHE_HOME", &xdg)
            .args(args);
        c.assert()
    };
    run(&[
        "probe",
        "--backend",
        "sim",
        "--sim",
        BIG,
        "--global-batch",
        "8192",
        "--quiet",
    ])
    .success();
    let plans = xdg.join("batchfit").join("plans");
    let entries: Vec<_> = std::fs::read_dir(&plans).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1);
    let key = entries[0]
        .path()
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let list = run(&["cache", "list"]).success();
    let out = String::from_utf8(list.get_output().stdout.clone()).unwrap();
    assert!(out.starts_with("KEY"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with(&key))
        .expect("entry listed");
    assert!(
        row.contains("mlp") && row.contains("sim") && row.contains("4096"),
        "{row}"
    );

    run(&["cache", "clear"])
        .success()
        .stderr(predicate::str::contains("removed 1"));
    assert!(plans.is_dir());
    assert_eq!(std::fs::read_dir(&plans).unwrap().count(), 0);
    assert!(libtorch.join("lib").join("marker.json").is_file());
    assert!(libtorch.join("keep.json").is_file());
    let list = run(&["cache", "list"]).success();
    let out = String::from_utf8(list.get_output().stdout.clone()).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    // clearing an absent cache is fine
    let mut c = batchfit();
    c.env("BATCHFIT_CACHE_DIR", d.path().join("nothing-here"))
        .args(["cache", "clear"])
        .assert()
        .success();
}

/// A merged plan whose `verified` was removed (edited by hand, or by another tool) is read as not
/// verified by every reader: `--format env` exports `BATCHFIT_VERIFIED=0`, `--format deepspeed`
/// refuses it, and the trainer refuses it without `--force`.
#[test]
fn a_merged_plan_without_verified_is_not_verified_anywhere() {
    let d = tmp();
    let (a, b) = two_plans(&d);
    merge(&d, &[&a, &b], &["--global-batch", "8192"]).success();
    let m = path(&d, "m.json");
    let mut plan = read_json(&m);
    plan.as_object_mut().unwrap().remove("verified");
    write_json(&m, &plan);
    let env = batchfit()
        .arg("show")
        .arg(&m)
        .args(["--format", "env"])
        .assert()
        .success();
    let out = String::from_utf8_lossy(&env.get_output().stdout).into_owned();
    assert!(out.contains("export BATCHFIT_VERIFIED=0\n"), "{out}");
    batchfit()
        .arg("show")
        .arg(&m)
        .args(["--format", "deepspeed"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not verified"));
    trainer()
        .args(["--plan"])
        .arg(&m)
        .args(["--steps", "1"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("not verified here"));
}

/// `verify` on the device a plan was probed on passes the plans the probe made there: its runs of
/// the answer are more draws of the same noise, counted with the probe's, and a fresh run may reach
/// the lowest of them plus the noise. (Held to the highest, a run of verify above the probe's
/// highest failed 9 of these 30 right plans.) Only a run that does not fit at all fails one: the
/// sim's answers lie at its limit, with no guard band.
#[test]
fn verify_on_the_probes_own_device_passes_the_plans_the_probe_made_there() {
    let d = tmp();
    for seed in 0..30 {
        let (p, v) = (path(&d, "p.json"), path(&d, "v.json"));
        probe_to(
            &format!("base=100MiB,per-sample=1MiB,capacity=1GiB,boundary-noise=2MiB,seed={seed}"),
            &p,
            &["--repeats", "2", "--no-cache"],
        );
        let o = batchfit()
            .args(["verify", "--quiet", "--out"])
            .arg(&v)
            .arg(&p)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() || err.contains("did not fit under"),
            "seed {seed}: {err}"
        );
    }
}
