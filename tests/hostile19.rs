//! T19 (hostile tester, session 19): what a new user following README and a hostile one found on the
//! real binaries. One test per finding; docs/errors.md, section "T19 (hostile tester, session 19)",
//! has a row for each.

mod common;
use common::*;
use predicates::prelude::*;

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn sim_probe(extra: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args([
        "probe",
        "--backend",
        "sim",
        "--sim",
        SIM,
        "--quiet",
        "--no-cache",
    ])
    .args(extra);
    c
}

/// T19-1: a negative value reached clap as an unknown flag: `error: unexpected argument '-0' found …
/// tip: to pass '-0' as a value, use '-- -0'` (for probe, `--` starts the --exec command), and
/// `--seed -1` (an i64) could not be given at all. Now each value reaches its own check.
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
        sim_probe(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says).and(no_tip()));
    }
    // a negative seed is a seed
    sim_probe(&["--seed", "-1", "--format", "json"])
        .assert()
        .success();
    // `--tolerance -0` is the exact proof, recorded as 0.0 (not -0.0)
    let a = sim_probe(&["--tolerance", "-0", "--format", "json"])
        .assert()
        .success();
    let out = String::from_utf8_lossy(&a.get_output().stdout).to_string();
    assert!(out.contains("\"tolerance\": 0.0"), "{out}");
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim_probe(&["--out"]).arg(&plan).assert().success();
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

/// T19-2: a command that prints an out-of-memory and exits 0 (a job that catches
/// `torch.OutOfMemoryError` and goes on, a wrapper that hides the exit status) was a fit at every
/// size: the plan recommended 76 where every size above 20 said it ran out of memory. Now such a
/// trial is an error (not a fit, and no proof of out-of-memory either): the probe stops unproven.
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

/// T19-3: `batchfit cache list` / `clear` with a cache directory that is a file printed the OS error
/// twice (`cache directory X: Not a directory (os error 20): Not a directory (os error 20)`).
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

/// T19-4: a command that replaced its report (`BATCHFIT_RESULT`) with a symbolic link to /dev/zero
/// got batchfit killed for memory (it read the link's target whole); a FIFO there hung it. Now the
/// report is opened without following links or waiting, only a regular file of at most 4 MiB is
/// read, and anything else is the trial's error.
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

/// T19-5: every plan reader (`show`, `predict`, `verify`, `merge`, `batchfit-train`) read its PLAN
/// whole, whatever it was: a FIFO hung it, `/dev/zero` was read until memory ran out, a directory
/// printed its OS error twice. Now only a regular file is read (opened without waiting), and the
/// error names what the path is.
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

/// T19-6: `batchfit predict plan.json --out plan.json` replaced the plan with the predictions (the
/// next `show`/`merge` said `not a batchfit plan: no schema_version`); `merge a.json b.json --out
/// b.json` replaced a node's proven plan with the unverified merge. Both are refused, the files kept.
#[test]
fn predict_and_merge_never_replace_their_own_input() {
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim_probe(&["--out"]).arg(&plan).assert().success();
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

/// T19-9: `--exec -- ./train.sh` where train.sh has no execute bit was accepted; every trial then
/// failed to start (`cannot start a trial process: Permission denied`), exit 4 and a partial plan of
/// 0 trials. Now it is a usage error before anything runs, saying how to run it.
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

/// T19-10: a plan of no trials printed `0 trials, -0.0 s of trials` (an empty f64 sum is -0.0).
#[test]
fn no_trials_take_zero_seconds_not_minus_zero() {
    let d = tmp();
    let plan = path(&d, "plan.json");
    sim_probe(&["--out"]).arg(&plan).assert().success();
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

/// T19-11: a symbolic link planted at a cache entry's name (a shared plan cache, as the Slurm
/// recipe uses) made root's batchfit write the plan through it, replacing the link's target. Now a
/// cache entry that is not a regular file is not written (a warning says so); the target is kept.
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
            SIM,
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
