//! Several trials at once on one machine: `--parallel N` on the sim and cpu devices (each trial its
//! own process under its own limit), through the real binary. Identical GPUs, which run in rounds by
//! themselves, are in tests/cuda_fake.rs.

mod common;
use common::*;
use predicates::prelude::*;
use serde_json::Value;

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn plan_of(c: &mut assert_cmd::Command) -> Value {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Rounds of a plan's trials: trials of one round share its number; a trial without one ran alone.
fn rounds(p: &Value) -> usize {
    let trials = p["trials"].as_array().unwrap();
    let mut numbered: Vec<u64> = trials.iter().filter_map(|t| t["round"].as_u64()).collect();
    numbered.dedup();
    numbered.len() + trials.iter().filter(|t| t.get("round").is_none()).count()
}

fn sim(extra: &[&str]) -> Value {
    plan_of(
        batchfit()
            .args(["probe", "--backend", "sim", "--sim", SIM, "--quiet"])
            .args(["--global-batch", "8192", "--tolerance", "0"])
            .args(extra),
    )
}

#[test]
fn parallel_two_on_the_sim_gives_the_sequential_answer_in_fewer_rounds() {
    let one = sim(&[]);
    for strategy in ["guided", "bisect"] {
        let one = if strategy == "guided" {
            one.clone()
        } else {
            sim(&["--strategy", strategy])
        };
        let two = sim(&["--parallel", "2", "--strategy", strategy]);
        assert_eq!(two["status"], "complete");
        assert_eq!(two["search"]["parallel"], 2);
        assert_eq!(two["recommendation"], one["recommendation"], "{strategy}");
        assert!(
            rounds(&two) < rounds(&one),
            "{strategy}: {} rounds with --parallel 2, {} without",
            rounds(&two),
            rounds(&one)
        );
        // at most two trials per round
        let trials = two["trials"].as_array().unwrap();
        for t in trials {
            let n = trials.iter().filter(|u| u["round"] == t["round"]).count();
            assert!(n <= 2, "{t}");
        }
        assert!(one["search"].get("parallel").is_none());
    }
}

/// A probe of hog.py on the cpu under RLIMIT_DATA with a 1 GiB budget (it fits exactly while
/// 8 + b ≤ 200 MiB), `extra` flags added, its plan written to `out`.
fn hog_probe(out: &std::path::Path, extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args(["probe", "--backend", "cpu", "--memory-budget", "1GiB"])
        .args(["--quiet", "--trial-timeout", "60", "--tolerance", "0"])
        .args(["--cpu-limit", "rlimit"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .arg("--exec")
        .arg("--")
        .arg(venv_python())
        .arg(repo().join("tests/support/exec/hog.py"))
        .args([
            "--batch",
            "{batch}",
            "--steps",
            "{steps}",
            "--base-mib",
            "8",
        ])
        .args(["--mib-per-sample", "1", "--capacity-mib", "200", "--report"])
        .arg("--helper")
        .arg(repo().join("python/batchfit"));
    c
}

/// hog.py under RLIMIT_DATA, each trial its own process with its own limit, two at once: the
/// answer of one at a time (fits exactly while 8 + b ≤ 200 MiB).
#[test]
fn parallel_two_on_the_cpu_runs_each_trial_under_its_own_limit() {
    let d = tmp();
    let probe = |extra: &[&str]| {
        let out = path(&d, &format!("plan{}.json", extra.join("")));
        hog_probe(&out, extra).assert().success();
        read_json(&out)
    };
    let two = probe(&["--parallel", "2"]);
    let one = probe(&["--parallel", "1"]);
    assert!(one["search"].get("parallel").is_none(), "{}", one["search"]);
    assert_eq!(two["recommendation"]["max_fitting_batch"], 192);
    assert_eq!(
        two["recommendation"]["max_fitting_batch"],
        one["recommendation"]["max_fitting_batch"]
    );
    assert_eq!(two["limit_mechanism"], "rlimit-data");
    assert!(
        rounds(&two) < rounds(&one),
        "{} vs {}",
        rounds(&two),
        rounds(&one)
    );
    // a round of two ran two processes, each with its own report of its own size
    let trials = two["trials"].as_array().unwrap();
    let pair = trials
        .iter()
        .find(|t| trials.iter().filter(|u| u["round"] == t["round"]).count() == 2)
        .expect("a round of two trials");
    for t in trials.iter().filter(|u| u["round"] == pair["round"]) {
        if t["outcome"] == "fits" {
            assert_eq!(t["details"]["report"]["batch"], t["batch"], "{t}");
        }
    }
}

/// `--parallel auto` (the default) on the cpu: exploration one size at a time, the proof's cold
/// trials side by side, as many as the cores and the memory hold (at most the proof's runs: the
/// failure above, the confirmation, two repeats); the answer of one trial at a time.
#[test]
fn parallel_auto_on_the_cpu_explores_alone_and_runs_the_proof_side_by_side() {
    let d = tmp();
    let out = path(&d, "plan.json");
    hog_probe(&out, &[]).assert().success();
    let plan = read_json(&out);
    assert_eq!(plan["recommendation"]["max_fitting_batch"], 192);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available_kib: usize = (meminfo.lines())
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let width = cores.min(available_kib >> 20).min(4);
    let trials = plan["trials"].as_array().unwrap();
    let beside = |t: &Value| trials.iter().filter(|u| u["round"] == t["round"]).count();
    if width == 1 {
        assert!(
            plan["search"].get("parallel").is_none(),
            "{}",
            plan["search"]
        );
        assert!(trials.iter().all(|t| t.get("round").is_none()));
        return;
    }
    assert_eq!(
        plan["search"]["parallel"], width as u64,
        "{}",
        plan["search"]
    );
    for t in trials.iter().filter(|t| t["purpose"] == "explore") {
        assert_eq!(beside(t), 1, "exploration alone: {t}");
    }
    let proof = trials
        .iter()
        .find(|t| beside(t) > 1)
        .expect("a round of the proof");
    for t in trials.iter().filter(|u| u["round"] == proof["round"]) {
        assert_ne!(t["purpose"], "explore", "{t}");
    }
}

#[test]
fn parallel_beyond_the_memory_available_is_refused() {
    // 64 budgets of 1 GiB do not fit in this machine's memory (or a test machine's)
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "1GiB",
            "--parallel",
            "4096",
        ])
        .args(["--exec", "--", "true", "{batch}"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("--parallel 4096 runs 4096 trials at once")
                .and(predicate::str::contains("is available now")),
        );
}

#[test]
fn parallel_zero_or_with_a_shared_worker_is_a_usage_error() {
    for (flags, msg) in [
        (vec!["--parallel", "0"], "--parallel 0"),
        (
            vec!["--parallel", "many"],
            "give `auto` or the number of trials",
        ),
        (
            vec!["--parallel", "2", "--isolation", "hybrid"],
            "--isolation hybrid",
        ),
    ] {
        batchfit()
            .args(["probe", "--backend", "sim", "--sim", SIM, "--quiet"])
            .args(&flags)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains(msg));
    }
}

/// A job that, from 400 samples up, leaves a daemon that double-forks, calls `setsid` and clears its
/// environment (nothing but adoption ties it to its trial), holding 700 MiB for 30 s.
const DAEMON_JOB: &str = r#"import os, sys, time
batch, steps = int(sys.argv[1]), int(sys.argv[2])
if batch >= 400:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, '-c',
                "x = b'\\x01' * (700 << 20)\nimport time; time.sleep(30.17)"], {})
        os._exit(0)
    os.wait()
held = b'\x01' * (batch << 20)
for _ in range(steps):
    time.sleep(0.8)
"#;

/// Two lanes under `RLIMIT_DATA` (no cgroup lists a trial's processes): a daemon adopted while both
/// ran is counted by neither, and a trial that saw one is no fit; a size below 400, which starts no
/// daemon, is never over the budget or out of memory for another lane's daemon.
#[test]
fn a_daemon_from_one_lane_is_never_charged_to_the_other_lanes_trial() {
    let d = tmp();
    let job = d.path().join("job.py");
    std::fs::write(&job, DAEMON_JOB).unwrap();
    let out = path(&d, "plan.json");
    let run = batchfit()
        .args(["probe", "--backend", "cpu", "--cpu-limit", "rlimit"])
        .args(["--memory-budget", "1GiB", "--parallel", "2", "--quiet"])
        .args([
            "--multiple-of",
            "8",
            "--max-batch",
            "1024",
            "--max-trials",
            "16",
        ])
        .args(["--trial-timeout", "60", "--out"])
        .arg(&out)
        .args(["--exec", "--", "/usr/bin/python3"])
        .arg(&job)
        .args(["{batch}", "{steps}"])
        .output()
        .unwrap();
    let written = if out.exists() {
        out.clone()
    } else {
        path(&d, "plan.partial.json")
    };
    let plan = read_json(&written);
    let trials = plan["trials"].as_array().unwrap();
    for t in trials {
        let b = t["batch"].as_u64().unwrap();
        if b < 400 {
            assert!(
                t["outcome"] == "fits" || t["outcome"] == "error",
                "{b} starts no daemon: {t}\n{run:?}"
            );
        } else {
            // its daemon's 700 MiB beside its own b MiB is above the limit
            assert_ne!(t["outcome"], "fits", "{b}: {t}\n{run:?}");
        }
    }
    if let Some(b) = plan["recommendation"]["max_fitting_batch"].as_u64() {
        assert!(b < 400, "{b}");
    }
    // and none of the daemons outlives the probe
    let left = processes_with("time.sleep(30.17)");
    for &p in &left {
        // SAFETY: a daemon of this test's job (its command line is the test's own).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    assert_eq!(left, Vec::<u32>::new(), "daemons left running");
}
