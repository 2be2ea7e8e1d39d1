//! Job-script integration of the real `batchfit` binary on the simulated backend: `--format
//! json|text|env|deepspeed`, `batchfit show`, throughput advice, completions and the man page.

mod common;
use common::*;
use predicates::prelude::*;
use std::process::Command as StdCommand;

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn probe(extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args(["probe", "--backend", "sim", "--sim", SIM])
        .args(extra);
    c
}

fn stdout_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

#[test]
fn env_format_exports_quoted_values_and_out_holds_json() {
    let d = tmp();
    // a path a shell would split or expand if it were not quoted
    let out = path(&d, "my plan's $HOME.json");
    let a = probe(&["--global-batch", "8192", "--format", "env", "--out"])
        .arg(&out)
        .assert()
        .success()
        // progress and the summary stay on stderr
        .stderr(predicate::str::contains("trial   1: batch"))
        .stderr(predicate::str::contains("micro-batch 4096"));
    let stdout = stdout_of(&a);
    assert!(
        stdout.lines().all(|l| l.starts_with("export BATCHFIT_")),
        "{stdout}"
    );
    // --out always holds the JSON plan
    let plan = read_json(&out);
    assert_eq!(plan["status"], "complete");
    // the shell reads back exactly the values
    let script =
        "set -e\neval \"$1\"\nprintf '%s\\n' \"$BATCHFIT_MICRO_BATCH\" \"$BATCHFIT_ACCUMULATION\" \
         \"$BATCHFIT_GLOBAL_BATCH\" \"$BATCHFIT_WORLD_SIZE\" \"$BATCHFIT_MAX_FITTING_BATCH\" \
         \"$BATCHFIT_STATUS\" \"$BATCHFIT_PLAN\" \"$BATCHFIT_PROVEN_STEPS\"\n";
    let sh = StdCommand::new("sh")
        .args(["-c", script, "sh", &stdout])
        .output()
        .unwrap();
    assert!(
        sh.status.success(),
        "{}",
        String::from_utf8_lossy(&sh.stderr)
    );
    let vals: Vec<String> = String::from_utf8(sh.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        vals,
        vec![
            "4096".to_string(),
            "2".into(),
            "8192".into(),
            "1".into(),
            "4834".into(),
            "complete".into(),
            out.display().to_string(),
            "5".into(),
        ]
    );
}

/// `BATCHFIT_PROVEN_STEPS` (and the summary's "confirmed with N optimizer steps") is what the
/// recommended micro-batch was confirmed with: `--confirm-steps`, read from the plan's trials; a
/// merged plan whose split size never ran here exports none until `verify` runs it.
#[test]
fn proven_steps_are_the_confirmations_and_exported_only_when_a_trial_has_them() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let a = probe(&["--global-batch", "8192", "--confirm-steps", "7"])
        .args(["--format", "env", "--quiet", "--out"])
        .arg(&out)
        .assert()
        .success();
    assert!(
        stdout_of(&a).contains("export BATCHFIT_PROVEN_STEPS=7\n"),
        "{}",
        stdout_of(&a)
    );
    let plan = read_json(&out);
    let confirmed = plan["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["batch"] == 4096 && t["accumulation"] == 2 && t["outcome"] == "fits")
        .map(|t| t["steps"].as_u64().unwrap())
        .max();
    assert_eq!(confirmed, Some(7));
    batchfit()
        .arg("show")
        .arg(&out)
        .args(["--format", "text"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "micro-batch 4096 confirmed with 7 optimizer steps at accumulation 2\n",
        ));
    // merged for another global batch: its micro-batch never ran with its accumulation
    let merged = path(&d, "merged.json");
    batchfit()
        .args([
            "merge",
            "--global-batch",
            "8190",
            "--format",
            "json",
            "--out",
        ])
        .arg(&merged)
        .arg(&out)
        .assert()
        .success();
    let a = batchfit()
        .arg("show")
        .arg(&merged)
        .args(["--format", "env"])
        .assert()
        .success();
    let env = stdout_of(&a);
    assert!(env.contains("export BATCHFIT_VERIFIED=0\n"), "{env}");
    assert!(!env.contains("BATCHFIT_PROVEN_STEPS"), "{env}");
}

#[test]
fn env_format_without_recommendation_prints_only_status() {
    let a = probe(&["--max-trials", "2", "--format", "env", "--quiet"])
        .assert()
        .code(5);
    assert_eq!(stdout_of(&a), "export BATCHFIT_STATUS=partial\n");
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            "base=23GiB,per-sample=1MiB,capacity=24GiB",
            "--format",
            "env",
            "--quiet",
        ])
        .assert()
        .code(1);
    assert_eq!(stdout_of(&a), "export BATCHFIT_STATUS=nothing-fits\n");
}

#[test]
fn deepspeed_format_is_a_config_fragment() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let a = probe(&[
        "--global-batch",
        "16384",
        "--world-size",
        "2",
        "--format",
        "deepspeed",
        "--quiet",
        "--out",
    ])
    .arg(&out)
    .assert()
    .success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "train_micro_batch_size_per_gpu": 4096,
            "gradient_accumulation_steps": 2,
            "train_batch_size": 16384
        })
    );
    assert_eq!(read_json(&out)["recommendation"]["micro_batch"], 4096);
    // no recommendation: nothing on stdout, the exit code says why
    probe(&["--max-trials", "2", "--format", "deepspeed", "--quiet"])
        .assert()
        .code(5)
        .stdout(predicate::str::is_empty());
    // unequal micro-batches cannot be expressed: refused before anything runs
    probe(&[
        "--global-batch",
        "1018",
        "--allow-uneven",
        "--format",
        "deepspeed",
    ])
    .assert()
    .code(2)
    .stdout(predicate::str::is_empty())
    .stderr(
        predicate::str::contains("--allow-uneven").and(predicate::str::contains("trial").not()),
    );
}

#[test]
fn json_and_text_formats_unchanged() {
    let a = probe(&["--quiet"]).assert().success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    probe(&["--format", "text", "--quiet"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "largest fitting micro-batch: 4834",
        ))
        .stderr(predicate::str::is_empty());
}

#[test]
fn show_converts_an_existing_plan() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(&["--global-batch", "8192", "--quiet", "--out"])
        .arg(&out)
        .assert()
        .success();
    let a = batchfit()
        .arg("show")
        .arg(&out)
        .args(["--format", "json"])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(v, read_json(&out));
    batchfit()
        .arg("show")
        .arg(&out)
        .args(["--format", "text"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "micro-batch 4096 × accumulation 2 × world size 1 = global batch 8192",
        ));
    batchfit()
        .arg("show")
        .arg(&out)
        .args(["--format", "env"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "export BATCHFIT_MICRO_BATCH=4096\n",
        ))
        .stdout(predicate::str::contains(format!(
            "export BATCHFIT_PLAN={}\n",
            out.display()
        )));
    let a = batchfit()
        .arg("show")
        .arg(&out)
        .args(["--format", "deepspeed"])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(v["gradient_accumulation_steps"], 2);
}

#[test]
fn show_refuses_unreadable_plans_with_exit_2() {
    let d = tmp();
    batchfit()
        .arg("show")
        .arg(path(&d, "missing.json"))
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("does not exist"));
    let bad = path(&d, "bad.json");
    std::fs::write(&bad, "{\"schema_version\": 1, \"sta").unwrap();
    batchfit()
        .arg("show")
        .arg(&bad)
        .args(["--format", "env"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not valid JSON"));
    let newer = path(&d, "newer.json");
    std::fs::write(&newer, "{\"schema_version\": 99}").unwrap();
    batchfit()
        .arg("show")
        .arg(&newer)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("newer than this build"));
    // a partial plan recommends nothing: an error, not an empty config with exit 0
    let partial_out = path(&d, "stopped.json");
    probe(&["--max-trials", "2", "--quiet", "--out"])
        .arg(&partial_out)
        .assert()
        .code(5);
    let partial = path(&d, "stopped.partial.json");
    batchfit()
        .arg("show")
        .arg(&partial)
        .args(["--format", "deepspeed"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("recommends nothing"));
    // a merged plan nobody verified: refused by merge and by show, nothing on stdout
    let (a, b, m) = (path(&d, "a.json"), path(&d, "b.json"), path(&d, "m.json"));
    for (p, cap) in [(&a, "16GiB"), (&b, "24GiB")] {
        batchfit()
            .args(["probe", "--backend", "sim", "--quiet", "--sim"])
            .arg(format!("base=1GiB,per-sample=50MiB,capacity={cap}"))
            .arg("--out")
            .arg(p)
            .assert()
            .success();
    }
    batchfit()
        .arg("merge")
        .args([&a, &b])
        .args(["--global-batch", "1000", "--format", "deepspeed", "--out"])
        .arg(&m)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("not verified"));
    assert!(!m.exists(), "refused before writing");
    batchfit()
        .arg("merge")
        .args([&a, &b])
        .args(["--global-batch", "1000", "--format", "json", "--out"])
        .arg(&m)
        .assert()
        .success();
    batchfit()
        .arg("show")
        .arg(&m)
        .args(["--format", "deepspeed"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("batchfit verify"));
    // an uneven plan cannot become a DeepSpeed fragment
    let uneven = path(&d, "uneven.json");
    probe(&[
        "--global-batch",
        "1018",
        "--allow-uneven",
        "--quiet",
        "--out",
    ])
    .arg(&uneven)
    .assert()
    .success();
    if read_json(&uneven)["recommendation"]["uneven"] == true {
        batchfit()
            .arg("show")
            .arg(&uneven)
            .args(["--format", "deepspeed"])
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains("differ in size"));
    }
}

/// Bisection tests every power of two on the way up, so smaller sizes have measured samples/s.
fn bisect_plan(d: &tempfile::TempDir, tolerance: &str) -> serde_json::Value {
    let out = path(d, &format!("plan-{tolerance}.json"));
    probe(&[
        "--strategy",
        "bisect",
        "--tolerance",
        "0",
        "--throughput-tolerance",
        tolerance,
        "--quiet",
        "--out",
    ])
    .arg(&out)
    .assert()
    .success();
    read_json(&out)
}

#[test]
fn throughput_advice_names_only_tested_fitting_sizes() {
    let d = tmp();
    // Sim step time is affine in the batch, so samples/s grows with it; the best is the largest size.
    let plan = bisect_plan(&d, "0.2");
    let r = &plan["recommendation"];
    let fastest = r["fastest_micro_batch"].as_u64().expect("advice at 20%");
    let micro = r["micro_batch"].as_u64().unwrap();
    assert!(fastest < micro);
    // recompute from the trials: smallest fitting size run with the exploration or confirmation
    // steps within 20% of the best
    let trials = plan["trials"].as_array().unwrap();
    let (steps, confirm) = (&plan["search"]["steps"], &plan["search"]["confirm_steps"]);
    assert!(steps.as_u64().is_some() && confirm.as_u64().is_some());
    let sps: Vec<(u64, f64)> = trials
        .iter()
        .filter(|t| t["outcome"] == "fits" && (t["steps"] == *steps || t["steps"] == *confirm))
        .map(|t| {
            let b = t["batch"].as_u64().unwrap();
            (b, b as f64 / t["step_seconds"].as_f64().unwrap())
        })
        .collect();
    let best = sps.iter().map(|x| x.1).fold(0.0, f64::max);
    let expected = sps
        .iter()
        .filter(|(b, s)| *b < micro && *s >= best * 0.8)
        .map(|x| x.0)
        .min()
        .unwrap();
    assert_eq!(fastest, expected);
    assert!(trials
        .iter()
        .any(|t| t["batch"] == fastest && t["outcome"] == "fits"));
    let got = r["fastest_samples_per_second"].as_f64().unwrap();
    assert!((got - sps.iter().find(|x| x.0 == fastest).unwrap().1).abs() < 1e-6 * got);

    // no advice at 0 tolerance (the largest size is the fastest): the field is absent
    let plan = bisect_plan(&d, "0");
    assert!(plan["recommendation"].get("fastest_micro_batch").is_none());

    // the text summary says so
    probe(&[
        "--strategy",
        "bisect",
        "--throughput-tolerance",
        "0.2",
        "--format",
        "text",
        "--quiet",
    ])
    .assert()
    .success()
    .stdout(predicate::str::contains(format!(
        "throughput: micro-batch {fastest} (tested, fits)"
    )));

    // bad tolerance: usage error
    probe(&["--throughput-tolerance", "1.5"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--throughput-tolerance"));
}

#[test]
fn plans_without_throughput_fields_still_read() {
    let d = tmp();
    let plan = bisect_plan(&d, "0.2");
    let mut old = plan.clone();
    let r = old["recommendation"].as_object_mut().unwrap();
    r.remove("fastest_micro_batch");
    r.remove("fastest_samples_per_second");
    let p = path(&d, "old.json");
    write_json(&p, &old);
    batchfit()
        .arg("show")
        .arg(&p)
        .args(["--format", "text"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "largest fitting micro-batch: 4846",
        ))
        .stdout(predicate::str::contains("throughput:").not());
}

#[test]
fn completions_and_man_page() {
    batchfit()
        .args(["completions", "bash"])
        .assert()
        .success()
        .stdout(predicate::str::contains("probe"))
        .stdout(predicate::str::contains("show"));
    for shell in ["zsh", "fish"] {
        batchfit()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicate::str::contains("probe"));
    }
    batchfit().args(["completions", "tcsh"]).assert().code(2);
    batchfit()
        .arg("man")
        .assert()
        .success()
        .stdout(predicate::str::contains(".TH batchfit"))
        .stdout(predicate::str::contains("probe"));
    batchfit()
        .args(["man", "probe"])
        .assert()
        .success()
        .stdout(predicate::str::contains("batchfit\\-probe"))
        .stdout(predicate::str::contains("throughput\\-tolerance"));
    batchfit()
        .args(["man", "nosuch"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no subcommand"));
}

#[test]
fn progress_is_plain_lines_when_stderr_is_not_a_terminal() {
    probe(&["--format", "env"])
        .assert()
        .success()
        .stderr(predicate::str::contains("trial   1: batch        1"))
        // no terminal control sequences from the live line
        .stderr(predicate::str::contains("\u{1b}[").not());
    probe(&["--format", "env", "--quiet"])
        .assert()
        .success()
        .stderr(predicate::str::is_empty());
}

#[test]
fn doctor_without_a_driver_fails_clearly_and_json_stays_valid() {
    // CI machines have no NVIDIA driver; on a GPU machine the report lists the cards instead.
    let o = batchfit().args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("doctor --json prints JSON in every case");
    if v["ok"] == false {
        assert_eq!(o.status.code(), Some(3));
        assert!(v["error"].as_str().unwrap().contains("--backend cpu"));
        assert!(v["gpus"].as_array().unwrap().is_empty());
        let t = batchfit().arg("doctor").output().unwrap();
        assert_eq!(t.status.code(), Some(3));
        let text = String::from_utf8_lossy(&t.stdout);
        assert!(
            text.contains("none usable") && text.contains("expandable_segments"),
            "{text}"
        );
    } else {
        assert!(!v["gpus"].as_array().unwrap().is_empty());
    }
}

/// On a machine without an NVIDIA driver (as the cpu test machines are), `--backend auto` says in
/// one short clause why it uses the cpu, not NVML's search of every library place; `batchfit
/// doctor` keeps that search.
#[test]
fn a_machine_without_a_driver_gets_a_short_cpu_note_not_nvmls_search() {
    let a = batchfit()
        .args(["probe", "--memory-budget", "800MiB", "--mlp-input", "16"])
        .args(["--mlp-hidden", "16", "--min-batch", "8", "--max-batch", "8"])
        .assert()
        .success();
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    let note = err
        .lines()
        .find(|l| l.contains("--backend auto: using the cpu backend"))
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(
        note,
        "batchfit: --backend auto: using the cpu backend (no NVIDIA driver on this machine; \
         `batchfit doctor` says where it looked)"
    );
    assert!(!err.contains("libnvidia-ml"), "{err}");
    let doctor = batchfit().args(["doctor", "--json"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains("libnvidia-ml"),
        "{doctor:?}"
    );
}

#[test]
fn auto_backend_says_why_it_uses_the_cpu() {
    batchfit()
        .args([
            "probe",
            "--memory-budget",
            "800MiB",
            "--mlp-input",
            "16",
            "--mlp-hidden",
            "16",
            "--min-batch",
            "8",
            "--max-batch",
            "8",
        ])
        .assert()
        .success()
        .stderr(predicates::str::contains(
            "--backend auto: using the cpu backend (",
        ));
}

#[test]
fn plot_draws_the_plan_and_refuses_other_formats_before_any_trial() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let svg = path(&d, "plot.svg");
    probe(&["--global-batch", "8192", "--format", "text", "--out"])
        .arg(&out)
        .arg("--plot")
        .arg(&svg)
        .assert()
        .success()
        .stderr(predicate::str::contains("plot drawn to"));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(200)]);
    for label in [
        "peak memory (GiB)",
        "micro-batch size (samples)",
        "samples/s",
        "capacity model: 3.00 MiB/sample + 1.00 GiB",
        "recommended micro-batch 4096",
    ] {
        assert!(text.contains(label), "no {label:?} in the plot");
    }
    // the plan and the plot, no temporary file beside them
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);

    // `show` draws an existing plan; PNG by the extension
    let png = path(&d, "plot.png");
    batchfit()
        .arg("show")
        .arg(&out)
        .arg("--plot")
        .arg(&png)
        .assert()
        .success();
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");

    // a partial plan is drawn too, and says so
    let partial = path(&d, "partial.svg");
    probe(&["--max-trials", "2", "--quiet", "--plot"])
        .arg(&partial)
        .assert()
        .code(5);
    assert!(std::fs::read_to_string(&partial)
        .unwrap()
        .contains("PARTIAL"));

    // another extension: exit 2 before any trial runs, nothing written
    let txt = path(&d, "x.txt");
    let out2 = path(&d, "p2.json");
    probe(&["--out"])
        .arg(&out2)
        .arg("--plot")
        .arg(&txt)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("cannot draw a .txt image"))
        .stderr(predicate::str::contains("trial   1:").not());
    assert!(!txt.exists() && !out2.exists());
    batchfit()
        .arg("show")
        .arg(&out)
        .arg("--plot")
        .arg(&txt)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty());
    assert!(!txt.exists());
}

/// The README's job-script gate: the line of its `--format env` recipe that checks the status.
fn readme_status_gate() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    readme
        .lines()
        .find(|l| l.starts_with("[ \"${BATCHFIT_STATUS:-}\" = complete ]"))
        .expect("README.md's job-script recipe checks BATCHFIT_STATUS")
        .to_string()
}

/// A plan whose `batchfit verify` failed (exit 4) is not exported as complete: `--format env`
/// says `BATCHFIT_STATUS=failed-verification` and `BATCHFIT_VERIFIED=0` and no size to train with,
/// the README's job-script gate refuses it (the probe's own plan passes) and `--format deepspeed`
/// refuses it for what it is.
#[test]
fn a_failed_verification_is_exported_as_a_status_the_readme_gate_refuses() {
    let d = tmp();
    let plan = path(&d, "plan.json");
    probe(&["--global-batch", "8192", "--format", "json", "--out"])
        .arg(&plan)
        .assert()
        .success();
    let failed = path(&d, "failed.json");
    batchfit()
        .args(["verify", "--quiet", "--format", "json"])
        .arg(&plan)
        .args(["--sim", "base=1GiB,per-sample=4MiB,capacity=16GiB", "--out"])
        .arg(&failed)
        .assert()
        .code(4);
    let gate = readme_status_gate();
    let gated = |p: &std::path::Path| {
        let env = batchfit()
            .arg("show")
            .arg(p)
            .args(["--format", "env"])
            .assert()
            .success();
        let env = stdout_of(&env);
        let script = format!("eval \"$1\"\n{gate}\necho \"$BATCHFIT_MICRO_BATCH\"\n");
        let sh = StdCommand::new("sh")
            .args(["-c", &script, "sh", &env])
            .output()
            .unwrap();
        (
            env,
            sh.status.code(),
            String::from_utf8_lossy(&sh.stderr).into_owned(),
        )
    };
    let (env, code, err) = gated(&failed);
    assert_eq!(
        env,
        "export BATCHFIT_STATUS=failed-verification\nexport BATCHFIT_VERIFIED=0\n"
    );
    assert_eq!(code, Some(1), "the gate let it through: {env}");
    assert!(
        err.contains("no usable plan (failed-verification)"),
        "{err}"
    );
    batchfit()
        .arg("show")
        .arg(&failed)
        .args(["--format", "deepspeed"])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains(
            "a `batchfit verify` of this plan failed",
        ));
    let (env, code, _) = gated(&plan);
    assert!(env.contains("export BATCHFIT_STATUS=complete\n"), "{env}");
    assert_eq!(code, Some(0), "{env}");
}

/// When the split rounds the recommended micro-batch below the largest fit (8192 = 4096 × 2, the
/// largest fit 4834), the summary gives each peak beside the size it was measured at: the largest
/// fit's own peak on its line, the recommended size's peak and speed on the next.
#[test]
fn the_summary_puts_each_peak_beside_the_size_it_was_measured_at() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let a = probe(&[
        "--global-batch",
        "8192",
        "--format",
        "text",
        "--quiet",
        "--out",
    ])
    .arg(&out)
    .assert()
    .success();
    let text = stdout_of(&a);
    let plan = read_json(&out);
    let r = &plan["recommendation"];
    assert_eq!(
        (r["micro_batch"].as_u64(), r["max_fitting_batch"].as_u64()),
        (Some(4096), Some(4834))
    );
    let size = |b: u64| batchfit::platform::units::format_size(b);
    let peak_of_largest = plan["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["batch"] == 4834 && t["outcome"] == "fits")
        .filter_map(|t| t["peak_bytes"].as_u64())
        .max()
        .expect("a fitting trial of the largest fit");
    let recommended_peak = size(r["peak_bytes"].as_u64().unwrap());
    let largest_line = text
        .lines()
        .find(|l| l.starts_with("largest fitting micro-batch: 4834"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        largest_line.contains(&format!("peak (simulated) {} of", size(peak_of_largest))),
        "{text}"
    );
    assert!(!largest_line.contains(&recommended_peak), "{text}");
    assert!(!largest_line.contains("samples/s"), "{text}");
    let recommended_line = text
        .lines()
        .find(|l| l.starts_with("recommended micro-batch 4096; "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        recommended_line.contains(&format!("peak (simulated) {recommended_peak} of")),
        "{text}"
    );
    assert!(recommended_line.contains("samples/s"), "{text}");
}

/// A probe whose stderr reader went away (`batchfit probe … 2>&1 | head -3`) finishes as if it
/// had been read: exit 0, the plan written, its lock file gone (a write to a closed stderr
/// panicked with exit 101 and left the lock).
#[test]
fn a_probe_whose_stderr_is_closed_finishes_and_leaves_no_lock() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = std::process::Command::new(assert_cmd::cargo::cargo_bin("batchfit"))
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM,
            "--global-batch",
            "4096",
            "--out",
        ])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(read_json(&out)["status"], "complete");
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["plan.json"], "{left:?}");
}
