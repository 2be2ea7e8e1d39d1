//! `scripts/gpu-check.sh`, the prepared script that proves batchfit on a real GPU, kept working by its
//! `--cpu-smoke` mode: the same four stages on CPU with tiny models (doctor, probes and training with
//! each plan; the true maximum by a fine scan; Lightning's and Accelerate's finders in Python; `batchfit
//! probe --exec` of the Python job of a model and that job's own true maximum), writing its table to
//! `--out` only. Takes a few minutes.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_batchfit"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script() -> Command {
    let mut c = Command::new("bash");
    c.arg(root().join("scripts/gpu-check.sh"))
        .current_dir(root())
        .env_remove("BATCHFIT_FAKE_GPUS");
    c
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The script ended with `code` and said `says` on stderr.
fn exits_with(o: &Output, code: i32, says: &str) {
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(says),
        "{}",
        text(o)
    );
}

fn json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The table row of `model` and `tool` in results.md's "## Results" section.
fn row<'a>(results: &'a str, model: &str, tool: &str) -> &'a str {
    let section = results
        .split("## Results")
        .nth(1)
        .expect("a Results section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .find(|l| l.starts_with(&format!("| `{model}` | {tool}")))
        .unwrap_or_else(|| panic!("no row for {model} / {tool} in:\n{section}"))
}

fn cells(row: &str) -> Vec<String> {
    row.trim_matches('|')
        .split(" | ")
        .map(|c| c.trim().to_string())
        .collect()
}

#[test]
fn cpu_smoke_runs_every_stage_and_leaves_the_gpu_results_alone() {
    let doc = root().join("docs/gpu-results.md");
    let doc_before = std::fs::read(&doc).ok();
    let out = tempfile::Builder::new()
        .prefix("gpu-check-smoke-")
        .tempdir()
        .unwrap();
    // the archive goes beside --out (inside it is refused): a sibling temporary folder
    let archive_dir = tempfile::tempdir().unwrap();
    let archive = archive_dir.path().join("gpu-check.tgz");
    let o = script()
        .args(["--cpu-smoke", "--out"])
        .arg(out.path())
        .arg("--bin")
        .arg(bin_dir())
        .arg("--archive")
        .arg(&archive)
        .output()
        .unwrap();
    let dir = out.path().to_path_buf();
    let checked = std::panic::catch_unwind(|| {
        check_smoke(&dir, &o, &doc, &doc_before);
        check_archive(&archive, &dir);
    });
    if let Err(e) = checked {
        // keep the run's files (logs/, plans/, stage*.json) for whoever reads the failure
        let kept = out.keep();
        eprintln!("gpu-check --cpu-smoke output kept in {}", kept.display());
        if let Ok(r) = std::fs::read_to_string(kept.join("results.md")) {
            eprintln!("--- results.md\n{r}");
        }
        std::panic::resume_unwind(e);
    }
}

/// `--archive`: one gzipped tar of OUT (what a machine that returns only a few files brings back),
/// with the results table and the raw data in it.
fn check_archive(archive: &Path, out: &Path) {
    let o = Command::new("tar")
        .arg("tzf")
        .arg(archive)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {}", archive.display(), text(&o));
    let names = String::from_utf8_lossy(&o.stdout);
    let base = out.file_name().unwrap().to_string_lossy();
    for f in [
        "results.md",
        "stage1.json",
        "stage2.json",
        "stage3.json",
        "stage4.json",
    ] {
        assert!(
            names.lines().any(|l| l == format!("{base}/{f}")),
            "{f} not in the archive:\n{names}"
        );
    }
    assert!(
        names
            .lines()
            .any(|l| l.starts_with(&format!("{base}/plans/"))),
        "{names}"
    );
}

fn check_smoke(dir: &Path, o: &Output, doc: &Path, doc_before: &Option<Vec<u8>>) {
    let log = text(o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert_eq!(
        &std::fs::read(doc).ok(),
        doc_before,
        "--cpu-smoke must not write docs/gpu-results.md"
    );

    let results = std::fs::read_to_string(dir.join("results.md")).expect("results.md");
    assert!(results.contains("CPU smoke"), "{results}");
    assert!(results.contains("| commit | `"), "{results}");

    // every stage of the call is recorded as ok, with its wall time
    let stages = json(&dir.join("stages.json"));
    for n in ["1", "2", "3", "4"] {
        assert_eq!(stages[n]["status"], "ok", "stage {n}: {stages}\n{log}");
        assert_eq!(stages[n]["rc"], 0, "stage {n}: {stages}");
        assert!(stages[n]["seconds"].as_f64().unwrap() > 0.0);
    }

    let s1 = json(&dir.join("stage1.json"));
    let s2 = json(&dir.join("stage2.json"));
    let s3 = json(&dir.join("stage3.json"));
    let items1 = s1["items"].as_object().unwrap();
    assert_eq!(items1["doctor"]["status"], "ok", "{s1}");
    let models: Vec<String> = items1
        .keys()
        .filter_map(|k| k.strip_prefix("probe:").map(String::from))
        .collect();
    // the smoke's models stand for the GPU run's: fp32 and bf16, an MLP and a GPT
    assert!(models.len() >= 2, "{models:?}");
    for m in &models {
        // stage 1: a complete plan with a recommendation, and training with it without running out of memory
        let plan = json(&dir.join("plans").join(format!("{m}.json")));
        assert_eq!(plan["status"], "complete", "{m}: {plan}");
        let answer = plan["recommendation"]["max_fitting_batch"]
            .as_u64()
            .unwrap();
        assert!(plan["recommendation"]["micro_batch"].as_u64().unwrap() >= 1);
        let probe = &s1["items"][format!("probe:{m}")];
        assert_eq!(probe["status"], "ok", "{m}: {probe}");
        assert_eq!(probe["answer"].as_u64(), Some(answer));
        let train = &s1["items"][format!("train:{m}")];
        assert_eq!(train["status"], "ok", "{m}: {train}");
        assert_eq!(
            train["rc"], 0,
            "{m}: no out-of-memory (exit 6) allowed: {train}"
        );
        assert_eq!(train["outcome"], "completed");
        assert_eq!(train["steps_done"], train["steps"], "{train}");

        // stage 2: the true maximum is at least batchfit's answer (the answer keeps a margin)
        let scan = &s2["items"][format!("scan:{m}")];
        assert_eq!(scan["status"], "ok", "{m}: {scan}");
        let true_max = scan["true_max"].as_u64().unwrap();
        assert!(
            true_max >= answer,
            "{m}: true max {true_max} < answer {answer}: {scan}"
        );
        assert!(scan["first_fail"].as_u64().unwrap() > true_max, "{scan}");

        // the table: batchfit's row with its answer and the true maximum
        let r = cells(row(&results, m, "batchfit probe"));
        assert_eq!(r[4], answer.to_string(), "{r:?}");
        assert!(r[5].starts_with(&true_max.to_string()), "{r:?}");
        assert!(r[6].parse::<f64>().unwrap() <= 1.0, "{r:?}");
        assert!(r[7].contains('%'), "peak / capacity: {r:?}");

        // stage 3: Lightning and Accelerate answered, or the table says why not
        for (tool, label) in [("lightning", "Lightning"), ("accelerate", "Accelerate")] {
            let it = &s3["items"][format!("{tool}:{m}")];
            let r = cells(row(&results, m, label));
            match it["status"].as_str() {
                Some("ok") => {
                    let a = it["answer"].as_u64().unwrap_or(0);
                    assert!(a >= 1, "{tool} {m}: {it}");
                    assert_eq!(r[4], a.to_string(), "{r:?}");
                    assert!(it["trials"].as_array().unwrap().len() as u64 >= 1);
                }
                Some("skipped") => {
                    let reason = it["reason"].as_str().unwrap();
                    assert!(!reason.is_empty());
                    assert!(r[4].starts_with("skipped: "), "{r:?}");
                }
                other => panic!("{tool} {m}: status {other:?}: {it}\n{log}"),
            }
        }
    }
    assert!(
        matches!(
            s3["items"]["modelcheck"]["status"].as_str(),
            Some("ok" | "skipped")
        ),
        "{}",
        s3["items"]["modelcheck"]
    );
    check_exec_stage(dir, &results, &s1);
}

/// Stage 4: `batchfit probe --exec` of a model's Python job (job.py) and the job's true maximum, beside
/// batchfit's answer for its own model of the same architecture (stage 1).
fn check_exec_stage(dir: &Path, results: &str, s1: &Value) {
    let s4 = json(&dir.join("stage4.json"));
    let items = s4["items"].as_object().unwrap();
    let models: Vec<String> = items
        .keys()
        .filter_map(|k| k.strip_prefix("exec-probe:").map(String::from))
        .collect();
    assert!(!models.is_empty(), "no exec probe in stage 4: {s4}");
    let section = results
        .split("## Your own script")
        .nth(1)
        .expect("a section for stage 4 in results.md")
        .split("\n## ")
        .next()
        .unwrap();
    for m in &models {
        let probe = &s4["items"][format!("exec-probe:{m}")];
        assert_eq!(probe["status"], "ok", "{m}: {probe}");
        // the plan is of the user's command: the job's argv and both files in its fingerprint
        let plan = json(&dir.join("plans").join(format!("{m}.exec.json")));
        assert_eq!(plan["status"], "complete", "{m}: {plan}");
        assert_eq!(plan["model"]["kind"], "exec", "{m}: {}", plan["model"]);
        let argv = plan["model"]["argv"].to_string();
        assert!(
            argv.contains("job.py") && argv.contains("{batch}"),
            "{argv}"
        );
        assert_eq!(
            plan["model"]["fingerprint_files"].as_array().unwrap().len(),
            2,
            "{}",
            plan["model"]
        );
        let mech = plan["limit_mechanism"].as_str().unwrap();
        assert!(
            ["rlimit-data", "cgroup-v1", "cgroup-v2"].contains(&mech),
            "{mech}"
        );
        // every trial that fit was checked against the job's own report (the helper of python-helper)
        let trials = plan["trials"].as_array().unwrap();
        let fits: Vec<&Value> = trials.iter().filter(|t| t["outcome"] == "fits").collect();
        assert!(!fits.is_empty());
        for t in &fits {
            assert_eq!(t["details"]["report"]["batch"], t["batch"], "{t}");
        }
        assert!(
            trials.iter().any(|t| t["outcome"] == "oom"),
            "the search saw no out-of-memory: {plan}"
        );
        let answer = plan["recommendation"]["max_fitting_batch"]
            .as_u64()
            .unwrap();
        assert_eq!(probe["answer"].as_u64(), Some(answer));
        // the job's own true maximum, under the probe's whole budget with the plan's mechanism: at or
        // above the answer (the answer keeps a margin)
        let scan = &s4["items"][format!("exec-scan:{m}")];
        assert_eq!(scan["status"], "ok", "{m}: {scan}");
        let true_max = scan["true_max"].as_u64().unwrap();
        assert!(
            true_max >= answer,
            "{m}: true max {true_max} < --exec answer {answer}: {scan}"
        );
        assert!(scan["first_fail"].as_u64().unwrap() > true_max, "{scan}");
        // the table row: stage 1's answer for batchfit's own model, the --exec answer, the job's true max
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{m}` |")))
            .unwrap_or_else(|| panic!("no stage-4 row for {m} in:\n{section}"));
        let r = cells(row);
        let zoo = s1["items"][format!("probe:{m}")]["answer"]
            .as_u64()
            .unwrap();
        assert_eq!(r[1], zoo.to_string(), "{r:?}");
        assert_eq!(r[3], answer.to_string(), "{r:?}");
        assert!(r[4].starts_with(&true_max.to_string()), "{r:?}");
        assert!(r[5].parse::<f64>().unwrap() <= 1.0, "{r:?}");
        assert!(r[7].starts_with(mech), "{r:?}");
    }
}

#[test]
fn usage_errors_and_help() {
    let o = script().arg("--help").output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--cpu-smoke",
        "--stages",
        "--bin",
        "--out",
        "--time-budget",
        "--archive",
        "train_steps",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    let o = script().args(["--stages", "1,5"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = script().arg("--frobnicate").output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = tempfile::tempdir().unwrap();
    for archive in [
        out.path().join("results.zip"),
        out.path().join("inside.tgz"),
        PathBuf::new(),
    ] {
        let o = script()
            .arg("--cpu-smoke")
            .arg("--out")
            .arg(out.path())
            .arg("--archive")
            .arg(&archive)
            .output()
            .unwrap();
        exits_with(&o, 2, "--archive");
    }
}

/// A GPU run (no --cpu-smoke) where nvidia-smi finds no GPU stops before any stage (exit 3) and leaves
/// docs/gpu-results.md alone.
#[test]
fn gpu_run_without_a_gpu_refuses() {
    let python = common::venv_python();
    let fake = tempfile::tempdir().unwrap();
    let smi = fake.path().join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\necho 'NVIDIA-SMI has failed (fake)' >&2\nexit 9\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let doc = root().join("docs/gpu-results.md");
    let before = std::fs::read(&doc).ok();
    let out = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        fake.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = script()
        .env("PATH", path)
        .arg("--python")
        .arg(&python)
        .arg("--out")
        .arg(out.path())
        .arg("--bin")
        .arg(bin_dir())
        .output()
        .unwrap();
    exits_with(&o, 3, "--cpu-smoke");
    assert_eq!(std::fs::read(&doc).ok(), before);
    assert!(!out.path().join("stage1.json").exists());
}
