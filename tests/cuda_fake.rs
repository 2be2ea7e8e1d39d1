//! The cuda backend through the real binary, on scripted GPUs (`BATCHFIT_FAKE_GPUS`: NVML answers from
//! a file, trials follow a simulated curve per GPU): budget from NVML's free memory, other processes in
//! the plan, `--gpus` selection and its errors, parallel multi-GPU probing with the smallest answer
//! confirmed on every GPU, the DDP reserve, `retries` outcomes, `--compare-alloc-conf`, `--backend
//! auto`, verify and doctor. What only a real GPU can show is in scripts/gpu-check.sh.

mod common;
use common::*;
use predicates::prelude::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const GIB: u64 = 1 << 30;

/// Two H200s: GPU 0 with another job holding 20 GiB, GPU 1 idle. `sims` per GPU.
fn fake(dir: &tempfile::TempDir, sims: &[&str]) -> PathBuf {
    let total = 141 * GIB;
    let gpu = |i: u32, others: u64| {
        let procs: Vec<Value> = if others > 0 {
            vec![json!({"pid": 4242, "used_bytes": others})]
        } else {
            vec![]
        };
        json!({"index": i, "name": "NVIDIA H200", "uuid": format!("GPU-{i}{i}{i}{i}"),
               "total_bytes": total, "free_bytes": total - others - GIB / 2,
               "used_bytes": others + GIB / 2, "processes": procs})
    };
    let p = dir.path().join("gpus.json");
    write_json(
        &p,
        &json!({"driver": "580.95", "gpus": [gpu(0, 20 * GIB), gpu(1, 0)], "sim": sims}),
    );
    p
}

fn probe(fake: &PathBuf) -> assert_cmd::Command {
    let mut c = batchfit();
    c.env("BATCHFIT_FAKE_GPUS", fake)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args(["probe", "--backend", "cuda", "--quiet"]);
    c
}

fn plan_of(c: &mut assert_cmd::Command) -> Value {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

const CURVE: &str = "base=4GiB,per-sample=300MiB,capacity=141GiB";

#[test]
fn budget_is_free_memory_and_other_processes_are_recorded() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let p = plan_of(probe(&f).args(["--global-batch", "1024"]));
    assert_eq!(p["device"]["kind"], "cuda");
    let free = 141 * GIB - 20 * GIB - GIB / 2;
    assert_eq!(
        p["budget_bytes"], free,
        "budget = NVML free memory, not total"
    );
    assert_eq!(p["gpu"]["other_processes"][0]["pid"], 4242);
    assert_eq!(p["gpu"]["other_processes_bytes"], 20 * GIB);
    assert_eq!(p["gpu"]["uuid"], "GPU-0000");
    assert_eq!(p["gpu"]["driver"], "580.95");
    assert_eq!(p["gpu"]["fake"], true);
    assert_eq!(p["gpu"]["footprint_method"], "nvml-process");
    // one GPU, world size 1: no DDP reserve
    assert_eq!(p["reserve_bytes"], 0);
    assert!(p.get("reserve_note").is_none());
    // (free × 0.95 − 4 GiB) / 300 MiB
    let limit = p["limit_bytes"].as_u64().unwrap();
    let expect = (limit - 4 * GIB) / (300 << 20);
    assert_eq!(p["recommendation"]["max_fitting_batch"], expect);
    for t in p["trials"].as_array().unwrap() {
        if t["outcome"] == "fits" {
            assert_eq!(t["gpu"]["method"], "nvml-process", "{t}");
        }
    }
}

#[test]
fn several_gpus_are_probed_in_parallel_and_the_smallest_answer_is_confirmed_on_each() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let out = path(&d, "plan.json");
    let p = plan_of(
        probe(&f)
            .args(["--gpus", "all", "--global-batch", "1024", "--out"])
            .arg(&out),
    );
    assert_eq!(read_json(&out), p);
    let per = p["gpu"]["per_gpu"].as_array().unwrap();
    assert_eq!(per.len(), 2);
    let max0 = per[0]["max_fitting_batch"].as_u64().unwrap();
    let max1 = per[1]["max_fitting_batch"].as_u64().unwrap();
    assert!(
        max0 < max1,
        "GPU 0 has another job's 20 GiB: {max0} vs {max1}"
    );
    assert!(per.iter().all(|g| g["confirmed"] == true));
    let r = &p["recommendation"];
    assert_eq!(r["max_fitting_batch"], max0);
    assert_eq!(
        r["world_size"], 2,
        "--world-size defaults to the number of GPUs"
    );
    let (m, a) = (
        r["micro_batch"].as_u64().unwrap(),
        r["accumulation"].as_u64().unwrap(),
    );
    assert_eq!(m * a * 2, 1024);
    assert!(m <= max0);
    // DDP's gradient buckets: one copy of the gradients (default mlp, f32) reserved and said so
    assert_eq!(
        p["reserve_bytes"],
        p["model"]["parameter_count"].as_u64().unwrap() * 4
    );
    assert!(p["reserve_note"].as_str().unwrap().contains("DDP"));
    // an explicit world size wins, and must divide the global batch
    let p = plan_of(probe(&f).args([
        "--gpus",
        "0,1",
        "--world-size",
        "4",
        "--global-batch",
        "1024",
    ]));
    assert_eq!(p["recommendation"]["world_size"], 4);
    probe(&f)
        .args(["--gpus", "all", "--global-batch", "1023"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("world size"));
}

#[test]
fn gpu_selection_errors_are_usage_errors() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    for (gpus, msg) in [
        ("2", "GPU index 2 does not exist"),
        ("0,x", "expected `all`"),
        ("", "expected `all`"),
    ] {
        probe(&f)
            .args(["--gpus", gpus])
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains(msg));
    }
    // hybrid isolation is cpu-only, whether cuda is asked for or chosen by auto
    for backend in ["cuda", "auto"] {
        batchfit()
            .env("BATCHFIT_FAKE_GPUS", &f)
            .args([
                "probe",
                "--quiet",
                "--isolation",
                "hybrid",
                "--backend",
                backend,
            ])
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains(
                "--isolation hybrid is for the cpu backend",
            ));
    }
    batchfit()
        .args(["probe", "--backend", "cpu", "--gpus", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cuda option"));
}

/// Without a driver (this machine, CI) the cuda backend refuses clearly, naming cpu and sim, and
/// auto falls back to the cpu with a notice.
#[test]
fn no_driver_is_a_clear_environment_error() {
    if torch_sees_cuda() {
        eprintln!("not testing the no-driver path: this machine has a usable GPU");
        return;
    }
    batchfit()
        .env_remove("BATCHFIT_FAKE_GPUS")
        .args(["probe", "--backend", "cuda", "--quiet"])
        .assert()
        .code(3)
        .stderr(
            predicate::str::contains("--backend cpu")
                .and(predicate::str::contains("--backend sim")),
        );
    batchfit()
        .env_remove("BATCHFIT_FAKE_GPUS")
        .args(["probe", "--gpus", "all", "--quiet"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("need CUDA"));
}

#[test]
fn auto_picks_cuda_when_gpus_are_seen() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let out = batchfit()
        .env("BATCHFIT_FAKE_GPUS", &f)
        .args(["probe", "--max-batch", "64"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend auto: using cuda"));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["device"]["kind"], "cuda");
    // mixed precision is accepted on cuda
    let p = plan_of(probe(&f).args(["--precision", "amp-bf16", "--max-batch", "64"]));
    assert_eq!(p["model"]["config"]["precision"], "amp-bf16");
}

/// A size that fits only with allocator retries bounds the search like an OOM, unless
/// --allow-retries counts it as a fit.
#[test]
fn retries_bound_the_search_unless_allowed() {
    let d = tmp();
    let f = fake(
        &d,
        &["base=4GiB,per-sample=300MiB,capacity=141GiB,retries=200"],
    );
    let p = plan_of(&mut probe(&f));
    assert_eq!(p["recommendation"]["max_fitting_batch"], 199);
    assert_eq!(p["recommendation"]["first_failing_batch"], 200);
    let failing: Vec<&Value> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["batch"] == 200)
        .collect();
    assert!(!failing.is_empty() && failing.iter().all(|t| t["outcome"] == "retries"));
    let allowed = plan_of(probe(&f).arg("--allow-retries"));
    assert!(
        allowed["recommendation"]["max_fitting_batch"]
            .as_u64()
            .unwrap()
            > 300
    );
    assert_eq!(allowed["search"]["allow_retries"], true);
    // doctor explains them from the plan
    let plan = path(&d, "plan.json");
    write_json(&plan, &p);
    batchfit()
        .env("BATCHFIT_FAKE_GPUS", &f)
        .args(["doctor", "--plan"])
        .arg(&plan)
        .assert()
        .success()
        .stdout(predicate::str::contains("retried").and(predicate::str::contains("4242")));
}

#[test]
fn alloc_conf_is_recorded_and_compared() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let p = plan_of(
        probe(&f)
            .env(
                "PYTORCH_CUDA_ALLOC_CONF",
                "garbage_collection_threshold:0.8",
            )
            .args(["--compare-alloc-conf", "--max-batch", "300"]),
    );
    assert_eq!(p["gpu"]["alloc_conf"], "garbage_collection_threshold:0.8");
    let c = &p["gpu"]["alloc_conf_comparison"];
    assert_eq!(
        c["alloc_conf"],
        "garbage_collection_threshold:0.8,expandable_segments:True"
    );
    // the simulated curve ignores the allocator setting: no difference
    assert_eq!(c["difference"], 0);
    assert!(c["trials"].as_u64().unwrap() > 0);
}

#[test]
fn verify_and_train_refusal_of_a_cuda_plan() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let plan = path(&d, "plan.json");
    probe(&f)
        .args(["--max-batch", "100", "--out"])
        .arg(&plan)
        .assert()
        .success();
    batchfit()
        .env("BATCHFIT_FAKE_GPUS", &f)
        .args(["verify", "--quiet"])
        .arg(&plan)
        .assert()
        .success();
    assert_eq!(read_json(&plan)["verified"], true);
    // the trainer runs on cpu and refuses a cuda plan
    trainer()
        .args(["--steps", "1", "--plan"])
        .arg(&plan)
        .assert()
        .code(5)
        .stderr(predicate::str::contains("cuda"));
}

#[test]
fn doctor_lists_fake_gpus_as_json() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let out = batchfit()
        .env("BATCHFIT_FAKE_GPUS", &f)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["gpus"].as_array().unwrap().len(), 2);
    assert!(r["findings"][0].as_str().unwrap().contains("other process"));
}

/// A scheduler's CUDA_VISIBLE_DEVICES decides which GPUs the job may use: the default GPU is its first,
/// a hidden one is refused.
#[test]
fn cuda_visible_devices_is_respected() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let p = plan_of(
        probe(&f)
            .env("CUDA_VISIBLE_DEVICES", "GPU-1111")
            .args(["--max-batch", "64"]),
    );
    assert_eq!(p["gpu"]["index"], 1);
    probe(&f)
        .env("CUDA_VISIBLE_DEVICES", "GPU-1111")
        .args(["--gpus", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("hidden by CUDA_VISIBLE_DEVICES"));
    let p = plan_of(probe(&f).env("CUDA_VISIBLE_DEVICES", "1").args([
        "--gpus",
        "all",
        "--max-batch",
        "64",
    ]));
    assert_eq!(p["gpu"]["index"], 1, "all = the visible ones: a single GPU");
    assert!(p["gpu"].get("per_gpu").is_none());
}

/// `--force` cannot make a cuda plan train without CUDA: a clear environment error.
#[test]
fn forced_cuda_plan_without_cuda_is_an_environment_error() {
    if torch_sees_cuda() {
        eprintln!("not testing the no-CUDA path: this machine has a usable GPU");
        return;
    }
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let plan = path(&d, "plan.json");
    probe(&f)
        .args(["--max-batch", "32", "--out"])
        .arg(&plan)
        .assert()
        .success();
    trainer()
        .env("BATCHFIT_FAKE_GPUS", &f)
        .args(["--steps", "1", "--force", "--plan"])
        .arg(&plan)
        .assert()
        .code(3)
        .stderr(predicate::str::contains("libtorch sees no CUDA device"));
}

/// `--exec` over several GPUs is one job (a torchrun/DDP command spanning them), not one probe per
/// GPU: every trial sees all of them, the budget is the smallest GPU's free memory, the world size is
/// the number of GPUs, no DDP reserve is guessed (the job's own buckets are in the trial), and each
/// GPU's entry is in the plan. (On scripted GPUs the trials follow GPU 0's curve; NVML's sums over a
/// real process tree run on a GPU machine: scripts/gpu-check.sh.)
#[test]
fn exec_over_several_gpus_is_one_job() {
    let d = tmp();
    let f = fake(&d, &[CURVE, CURVE]);
    let out = d.path().join("plan.json");
    probe(&f)
        .args(["--gpus", "0,1", "--global-batch", "1024", "--out"])
        .arg(&out)
        .args(["--exec", "--", "true", "{batch}"])
        .assert()
        .success();
    let p = read_json(&out);
    assert_eq!(p["model"]["kind"], "exec");
    assert_eq!(p["recommendation"]["world_size"], 2);
    assert!(p.get("reserve_note").is_none(), "{}", p["reserve_note"]);
    let per = p["gpu"]["per_gpu"].as_array().unwrap();
    assert_eq!(per.len(), 2, "{per:?}");
    // GPU 0 has another job's 20 GiB: the budget is its free memory, the smaller one
    let free0 = 141 * GIB - 20 * GIB - GIB / 2;
    assert_eq!(p["budget_bytes"].as_u64().unwrap(), free0);
    // one search, not two: no trial is tagged with a GPU of its own
    assert!(p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("gpu_index").is_none()));
}

/// Several GPUs go through the plan cache like one (the key covers every GPU), write a partial plan
/// with every GPU's trials when stopped early, and refuse `--compare-alloc-conf` with a sentence.
#[test]
fn several_gpus_use_the_cache_write_partial_plans_and_refuse_compare() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let out = path(&d, "plan.json");
    let cache = fresh_cache_dir();
    let run = |extra: &[&str]| {
        let mut c = probe(&f);
        c.env("BATCHFIT_CACHE_DIR", &cache)
            .args(["--gpus", "all", "--global-batch", "1024", "--out"])
            .arg(&out)
            .args(extra);
        c.output().unwrap()
    };
    let first = run(&[]);
    assert!(first.status.success(), "{first:?}");
    let again = run(&[]);
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("plan from cache"),
        "{again:?}"
    );
    // a capped search: the partial plan holds both GPUs' trials, each tagged
    let capped = path(&d, "capped.json");
    let o = probe(&f)
        .args(["--gpus", "all", "--max-trials", "2", "--no-cache", "--out"])
        .arg(&capped)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let p = read_json(&path(&d, "capped.partial.json"));
    assert_eq!(p["status"], "partial");
    let gpus: std::collections::BTreeSet<u64> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["gpu_index"].as_u64())
        .collect();
    assert_eq!(gpus.len(), 2, "{}", p["trials"]);
    // --compare-alloc-conf compares one GPU's two probes
    probe(&f)
        .args(["--gpus", "all", "--compare-alloc-conf"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("give one GPU"));
}

/// `n` identical idle H200s.
fn identical(dir: &tempfile::TempDir, n: u32, sim: &str) -> PathBuf {
    let total = 141 * GIB;
    let gpus: Vec<Value> = (0..n)
        .map(|i| {
            json!({"index": i, "name": "NVIDIA H200", "uuid": format!("GPU-{i}{i}{i}{i}"),
                   "total_bytes": total, "free_bytes": total - GIB / 2,
                   "used_bytes": GIB / 2, "processes": []})
        })
        .collect();
    let p = dir.path().join("identical.json");
    write_json(&p, &json!({"driver": "580.95", "gpus": gpus, "sim": [sim]}));
    p
}

/// Rounds of trials before the first confirmation of the answer (its split on every GPU).
fn rounds_before_confirmation(p: &Value) -> usize {
    let mut rounds: Vec<u64> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|t| t["purpose"] != "split" && t["purpose"] != "confirm")
        .map(|t| t["round"].as_u64().expect("every trial has its round"))
        .collect();
    rounds.dedup();
    rounds.len()
}

/// Eight identical GPUs search together, one trial per GPU per round: at most three rounds before
/// the confirmation, the answer the search of one GPU gives under the same limit (the exact proof's,
/// which is one size; within the tolerance, each may stop at another size of its last gap),
/// confirmed on every GPU.
#[test]
fn eight_identical_gpus_search_in_rounds_and_answer_as_one() {
    let d = tmp();
    let curves = [CURVE, "base=4GiB,per-sample=300MiB,capacity=141GiB,knee=16"];
    for (curve, tolerance) in curves.iter().flat_map(|c| [(c, "0"), (c, "0.005")]) {
        let f = identical(&d, 8, curve);
        let p = plan_of(probe(&f).args(["--gpus", "all", "--tolerance", tolerance]));
        assert_eq!(p["search"]["parallel"], 8, "{}", p["search"]);
        assert!(p["search"].get("parallel_fallback").is_none());
        let rounds = rounds_before_confirmation(&p);
        assert!(rounds <= 3, "{rounds} rounds: {}", p["trials"]);
        let trials = p["trials"].as_array().unwrap();
        // each round ran at most one trial per GPU, and more than one GPU explored
        let explored: std::collections::BTreeSet<u64> = trials
            .iter()
            .filter(|t| t["purpose"] != "split")
            .map(|t| t["gpu_index"].as_u64().unwrap())
            .collect();
        assert!(explored.len() > 1, "{explored:?}");
        for t in trials {
            let same: Vec<u64> = trials
                .iter()
                .filter(|u| u["round"] == t["round"])
                .map(|u| u["gpu_index"].as_u64().unwrap())
                .collect();
            let distinct: std::collections::BTreeSet<_> = same.iter().collect();
            assert_eq!(distinct.len(), same.len(), "{same:?}");
        }
        // confirmed on every GPU
        let per = p["gpu"]["per_gpu"].as_array().unwrap();
        assert_eq!(per.len(), 8);
        assert!(per.iter().all(|g| g["confirmed"] == true), "{per:?}");
        // one GPU, searched one trial at a time under the same limit (world size 8: the same DDP
        // reserve), answers the same
        let one =
            plan_of(probe(&f).args(["--gpus", "0", "--world-size", "8", "--tolerance", tolerance]));
        assert_eq!(one["limit_bytes"], p["limit_bytes"]);
        assert!(one["search"].get("parallel").is_none());
        let (ours, theirs) = (
            p["recommendation"]["max_fitting_batch"].as_u64().unwrap(),
            one["recommendation"]["max_fitting_batch"].as_u64().unwrap(),
        );
        if tolerance == "0" {
            assert_eq!(ours, theirs, "{curve}");
        } else {
            assert!(ours.abs_diff(theirs) <= ours / 200, "{ours} vs {theirs}");
        }
        assert!(
            rounds < one["trials"].as_array().unwrap().len(),
            "{rounds} rounds vs {} trials",
            one["trials"]
        );
    }
}

/// GPUs that differ (another job's 20 GiB on GPU 0) search each on their own, and the plan says why.
#[test]
fn gpus_that_differ_search_each_and_the_plan_says_why() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    let p = plan_of(probe(&f).args(["--gpus", "all"]));
    let why = p["search"]["parallel_fallback"].as_str().expect("says why");
    assert!(why.contains("GPU 0 has") && why.contains("free"), "{why}");
    assert!(p["search"].get("parallel").is_none());
    assert!(p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("round").is_none()));
}

/// `--parallel` is for the cpu and sim devices: on cuda, identical GPUs run in rounds by themselves.
#[test]
fn parallel_on_cuda_is_a_usage_error() {
    let d = tmp();
    let f = fake(&d, &[CURVE]);
    probe(&f)
        .args(["--parallel", "2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--gpus"));
}
