//! `batchfit probe --exec -- CMD…`: the user's own command as the workload, through the real binary.
//! Fast: small fake commands of tests/support/exec/ (standard-library Python) with exactly known
//! answers, errors, hangs, lies and interruptions. The real PyTorch script and torchrun are in
//! tests/exec_torch.rs.

mod common;
use common::*;
use predicates::prelude::*;
use std::path::PathBuf;

fn fake(name: &str) -> String {
    repo()
        .join("tests/support/exec")
        .join(name)
        .display()
        .to_string()
}

fn helper_dir() -> String {
    repo().join("python/batchfit").display().to_string()
}

fn py() -> String {
    venv_python().display().to_string()
}

/// `batchfit probe --backend cpu` of a command, plan to `out` (RLIMIT_DATA unless `cgroup`).
fn probe(out: &std::path::Path, flags: &[&str], cmd: &[String]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args([
        "probe",
        "--backend",
        "cpu",
        "--memory-budget",
        "4GiB",
        "--quiet",
    ])
    .args(["--trial-timeout", "60", "--out"])
    .arg(out)
    .args(flags)
    .arg("--exec")
    .arg("--")
    .args(cmd);
    c
}

/// hog.py raising MemoryError above `capacity` MiB: fits exactly while 8 + b ≤ capacity.
fn hog(capacity: u32, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        py(),
        fake("hog.py"),
        "--batch".into(),
        "{batch}".into(),
        "--steps".into(),
        "{steps}".into(),
        "--base-mib".into(),
        "8".into(),
        "--mib-per-sample".into(),
        "1".into(),
        "--capacity-mib".into(),
        capacity.to_string(),
        "--report".into(),
        "--helper".into(),
        helper_dir(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn a_command_is_probed_to_its_exact_answer_with_its_report_checked() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(
        &out,
        &["--cpu-limit", "rlimit", "--global-batch", "600"],
        &hog(200, &[]),
    )
    .assert()
    .success();
    let p = read_json(&out);
    let r = &p["recommendation"];
    assert_eq!(r["max_fitting_batch"], 192, "{r}");
    assert_eq!(r["first_failing_batch"], 193, "{r}");
    assert_eq!(p["status"], "complete");
    assert_eq!(p["model"]["kind"], "exec");
    assert_eq!(p["model"]["argv"][3], "{batch}");
    assert_eq!(p["limit_mechanism"], "rlimit-data");
    // MemoryError above the capacity is proof; the report of every fit was read and matched
    let trials = p["trials"].as_array().unwrap();
    let oom = trials.iter().find(|t| t["batch"] == 193).unwrap();
    assert_eq!(oom["outcome"], "oom");
    assert!(
        oom["message"].as_str().unwrap().contains("MemoryError"),
        "{oom}"
    );
    for t in trials.iter().filter(|t| t["outcome"] == "fits") {
        assert_eq!(t["details"]["report"]["batch"], t["batch"], "{t}");
        assert_eq!(t["details"]["step_time"], "report", "{t}");
        assert!(t["peak_bytes"].as_u64().unwrap() > 0);
    }
    // the split 600 = 150 × 4 was run with accumulation 4; hog does not read it: the plan says so
    assert_eq!(r["micro_batch"], 150);
    assert_eq!(r["accumulation"], 4);
    assert!(trials
        .iter()
        .any(|t| t["batch"] == 150 && t["accumulation"] == 4 && t["outcome"] == "fits"));
    let warnings = p["warnings"].to_string();
    assert!(
        warnings.contains("proven at accumulation 1 only"),
        "{warnings}"
    );
}

#[test]
fn placeholders_and_environment_reach_the_command() {
    // a shell command that records what it got, and fits up to 7
    let d = tmp();
    let out = path(&d, "plan.json");
    let seen = path(&d, "seen.txt");
    let script = format!(
        "echo \"$1 $2 $3 $BATCHFIT_BATCH $BATCHFIT_STEPS $BATCHFIT_ACCUMULATION $BATCHFIT_TRIAL ${{BATCHFIT_RESULT:+result}}\" >> {}; \
         [ \"$1\" -le 7 ] || {}; {}",
        seen.display(),
        run_out_sh(),
        hold_sh("$1")
    );
    let cmd: Vec<String> = [
        "sh",
        "-c",
        &script,
        "sh",
        "{batch}",
        "{steps}",
        "{accumulation}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    probe(&out, &["--cpu-limit", "rlimit", "--max-batch", "64"], &cmd)
        .assert()
        .success();
    assert_eq!(read_json(&out)["recommendation"]["max_fitting_batch"], 7);
    let lines = std::fs::read_to_string(&seen).unwrap();
    let mut numbers = vec![];
    for l in lines.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        assert_eq!(w[0], w[3], "argv and BATCHFIT_BATCH agree: {l}");
        assert_eq!(w[1], w[4], "{l}");
        assert_eq!(w[2], w[5], "{l}");
        numbers.push(w[6].parse::<usize>().unwrap());
        assert_eq!(w[7], "result", "{l}");
    }
    // (trials side by side take their numbers in either order)
    numbers.sort_unstable();
    let all: Vec<usize> = (0..numbers.len()).collect();
    assert_eq!(numbers, all, "BATCHFIT_TRIAL counts trials:\n{lines}");
}

/// PyTorch's CUDA out-of-memory traceback is an out-of-memory where the measurements agree with
/// the limit running out (here the fake's data segment reached RLIMIT_DATA first); at a tiny peak
/// of a cpu probe's limit it is an error that says so: not this budget running out.
#[test]
fn a_cuda_out_of_memory_text_is_an_oom() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let mut cmd = vec![
        py(),
        fake("cuda_oom.py"),
        "--batch".into(),
        "{batch}".into(),
    ];
    probe(&out, &["--cpu-limit", "rlimit"], &cmd)
        .assert()
        .code(4);
    let p = read_json(&path(&d, "plan.partial.json"));
    let t = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["batch"].as_u64() > Some(32))
        .unwrap()
        .clone();
    assert_eq!(t["outcome"], "error", "{t}");
    assert!(
        t["message"]
            .as_str()
            .unwrap()
            .contains("not this budget running out"),
        "{t}"
    );
    cmd.push("--reach-limit".into());
    probe(&out, &["--cpu-limit", "rlimit"], &cmd)
        .assert()
        .success();
    let p = read_json(&out);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 32);
    let oom = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["batch"] == 33)
        .unwrap()
        .clone();
    assert!(
        oom["message"]
            .as_str()
            .unwrap()
            .contains("CUDA out of memory"),
        "{oom}"
    );
    // without a report the step time is the wall clock, and the plan says so
    assert_eq!(oom["outcome"], "oom");
    let fit = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["outcome"] == "fits")
        .unwrap()
        .clone();
    assert_eq!(fit["details"]["step_time"], "wall-clock", "{fit}");
}

/// Whether this process may make memory cgroups for trials (root, with a memory controller).
fn cgroup_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && batchfit::device::cgroup::parent().is_ok()
}

/// Under a memory cgroup the trial's measured peak and the group's limit reach the classifier: a
/// command that prints CUDA's out-of-memory text while it holds a few MiB of a 4 GiB limit did not
/// run out of that limit, so its trials are errors (exit 4), never the proof that a size does not
/// fit.
#[test]
fn an_out_of_memory_text_far_below_a_cgroup_limit_is_an_error() {
    if !cgroup_available() {
        eprintln!("no memory cgroup can be made here: skipped");
        return;
    }
    let d = tmp();
    let out = path(&d, "plan.json");
    let cmd = vec![
        py(),
        fake("cuda_oom.py"),
        "--batch".into(),
        "{batch}".into(),
        "--threshold".into(),
        "4".into(),
    ];
    probe(&out, &["--cpu-limit", "cgroup", "--max-batch", "16"], &cmd)
        .assert()
        .code(4);
    let p = read_json(&path(&d, "plan.partial.json"));
    assert!(
        p["limit_mechanism"].as_str().unwrap().starts_with("cgroup"),
        "{}",
        p["limit_mechanism"]
    );
    let trials = p["trials"].as_array().unwrap();
    let above: Vec<&serde_json::Value> = trials
        .iter()
        .filter(|t| t["batch"].as_u64().unwrap() > 4)
        .collect();
    assert!(!above.is_empty(), "{p}");
    for t in above {
        assert_eq!(t["outcome"], "error", "{t}");
        assert!(
            t["message"]
                .as_str()
                .unwrap()
                .contains("not counted as out of memory"),
            "{t}"
        );
    }
    assert!(p["recommendation"].is_null());
}

#[test]
fn errors_are_never_proof_and_say_what_went_wrong() {
    for (mode, want) in [
        ("error", "mat1 and mat2 shapes cannot be multiplied"),
        ("segv", "signal 11"),
    ] {
        let d = tmp();
        let out = path(&d, "plan.json");
        let cmd = vec![py(), fake("crash.py"), "--mode".into(), mode.into()];
        let o = probe(&out, &["--cpu-limit", "rlimit"], &cmd)
            .assert()
            .code(4)
            .get_output()
            .clone();
        let p = read_json(&path(&d, "plan.partial.json"));
        assert_eq!(p["status"], "partial", "{mode}");
        assert!(p["recommendation"].is_null());
        let t = &p["trials"][0];
        assert_eq!(t["outcome"], "error", "{mode}: {t}");
        assert!(t["message"].as_str().unwrap().contains(want), "{mode}: {t}");
        assert!(!t["details"]["output_tail"].as_array().unwrap().is_empty() || mode == "segv");
        assert!(!out.exists(), "{o:?}");
    }
}

/// A command that errs from some size up (a shape that stops matching from 700) ends the probe once
/// the error repeated at one size and a second size failed: a few trials, not a bisection down to
/// 700 at two trials a size (measured with guided: 23 trials before, 5 now), and the plan's stop
/// detail (the summary's `stopped:` line) names the smallest size that failed and its exception.
#[test]
fn an_error_from_some_size_up_ends_the_probe_naming_it() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let mut cmd = vec![py(), fake("crash.py"), "--mode".into(), "error".into()];
    cmd.extend(["--from".into(), "700".into()]);
    let flags = ["--cpu-limit", "rlimit", "--max-batch", "2048"];
    probe(&out, &flags, &cmd).assert().code(4);
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["stop_reason"], "trial-errors", "{p}");
    let trials = p["trials"].as_array().unwrap();
    assert!(trials.len() <= 8, "{} trials: {p}", trials.len());
    let failed = trials.iter().filter(|t| t["outcome"] == "error");
    let smallest = failed.map(|t| t["batch"].as_u64().unwrap()).min().unwrap();
    assert!(smallest >= 700, "{p}");
    let detail = p["stop_detail"].as_str().unwrap();
    let said = format!(
        "size {smallest} failed: the command failed (exit code 1): RuntimeError: mat1 and mat2 \
         shapes cannot be multiplied ({smallest}x1024 and 512x10)"
    );
    assert!(detail.starts_with(&said), "{detail}");
}

#[test]
fn a_command_that_trains_another_size_is_an_error() {
    for lie in ["batch", "steps", "schema", "garbage"] {
        let d = tmp();
        let out = path(&d, "plan.json");
        let cmd = vec![
            py(),
            fake("liar.py"),
            "--lie".into(),
            lie.into(),
            "--helper".into(),
            helper_dir(),
        ];
        probe(
            &out,
            &[
                "--cpu-limit",
                "rlimit",
                "--max-trials",
                "2",
                "--min-batch",
                "4",
            ],
            &cmd,
        )
        .assert()
        .code(predicate::in_iter([4, 5]));
        let p = read_json(&path(&d, "plan.partial.json"));
        let t = &p["trials"][0];
        assert_eq!(t["outcome"], "error", "{lie}: {t}");
        let m = t["message"].as_str().unwrap();
        match lie {
            "batch" | "steps" => assert!(m.contains("did not train the size it was given"), "{m}"),
            _ => assert!(m.contains("report"), "{lie}: {m}"),
        }
    }
}

/// `--oom-pattern` adds a signature, held to the same evidence as the built-in ones: a failure in
/// its own wording where the data segment reached the limit is an out-of-memory; a matching line
/// at a tiny peak is an error (not this budget running out).
#[test]
fn oom_patterns_add_signatures() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let cmd = vec![
        "/usr/bin/python3".into(),
        fake("oom.py"),
        "--say".into(),
        "fatal: arena exhausted on core 3".into(),
    ];
    let flags = ["--cpu-limit", "rlimit", "--oom-pattern", "arena exhausted"];
    probe(&out, &flags, &cmd).assert().code(1);
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["status"], "nothing-fits");
    assert_eq!(p["model"]["oom_patterns"][0], "arena exhausted");
    // the user's pattern on a line printed far below the limit
    let cmd = vec![py(), fake("crash.py"), "--mode".into(), "error".into()];
    let flags = [
        "--cpu-limit",
        "rlimit",
        "--oom-pattern",
        "shapes cannot be multiplied",
    ];
    probe(&out, &flags, &cmd).assert().code(4);
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["stop_reason"], "trial-errors");
    assert!(
        p["trials"][0]["message"]
            .as_str()
            .unwrap()
            .contains("not this budget running out"),
        "{p}"
    );
}

/// PIDs of live processes running `hang.py` (or its grandchild, `time.sleep(3600)`), among them
/// those started by this test (`marker` in their command line).
fn leftovers(marker: &str) -> Vec<u32> {
    processes_with(marker)
}

/// A trial that hangs is a timeout, its whole tree goes, and its record keeps what it printed
/// until then: all there is to tell why it hung.
#[test]
fn a_hang_is_a_timeout_and_its_whole_tree_goes() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let marker = format!("hang-{}", std::process::id());
    // the trial's processes inherit the marker in their environment
    let cmd = vec![
        py(),
        fake("hang.py"),
        "--grandchild-setsid".into(),
        "--ignore-sigterm".into(),
    ];
    let mut c = batchfit();
    c.env("BATCHFIT_TEST_MARKER", &marker)
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--quiet",
            "--cpu-limit",
            "rlimit",
        ])
        .args(["--trial-timeout", "2", "--max-trials", "2", "--out"])
        .arg(&out)
        .arg("--exec")
        .arg("--")
        .args(&cmd);
    let o = c.output().unwrap();
    assert!(matches!(o.status.code(), Some(4) | Some(5)), "{o:?}");
    let p = read_json(&path(&d, "plan.partial.json"));
    assert_eq!(p["trials"][0]["outcome"], "timeout");
    let tail = p["trials"][0]["details"]["output_tail"].to_string();
    assert!(tail.contains("hang: pid"), "{}", p["trials"][0]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let left = leftovers("time.sleep(3600)")
        .into_iter()
        .filter(|pid| environ_has(*pid, &marker))
        .collect::<Vec<_>>();
    assert!(left.is_empty(), "processes of the trial survived: {left:?}");
}

/// Whether process `pid`'s environment holds `needle`.
fn environ_has(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|e| String::from_utf8_lossy(&e).contains(needle))
        .unwrap_or(false)
}

/// SIGINT: the trial's processes go, a partial plan is written, exit 130, and the lock files the
/// probe made beside its plan and in its `--logs` directory go with it.
#[test]
fn sigint_leaves_a_partial_plan_and_no_process_nor_lock_file() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let logs = path(&d, "logs");
    let marker = format!("sigint-{}", std::process::id());
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_batchfit"));
    c.env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env("BATCHFIT_TEST_MARKER", &marker)
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--quiet",
        ])
        .args(["--trial-timeout", "60", "--out"])
        .arg(&out)
        .arg("--logs")
        .arg(&logs)
        .args([
            "--exec",
            "--",
            &py(),
            &fake("hang.py"),
            "--grandchild-setsid",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let locks = [
        path(&d, ".plan.json.batchfit-lock"),
        logs.join(".batchfit-logs.lock"),
    ];
    for l in &locks {
        assert!(l.is_file(), "{} while the probe runs", l.display());
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(path(&d, "plan.partial.json").exists());
    assert!(!out.exists());
    for l in &locks {
        assert!(!l.exists(), "{} was left", l.display());
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let left: Vec<u32> = leftovers("hang.py")
        .into_iter()
        .chain(leftovers("time.sleep(3600)"))
        .filter(|pid| environ_has(*pid, &marker))
        .collect();
    assert!(left.is_empty(), "processes of the trial survived: {left:?}");
}

/// The summary of a plan (`batchfit show --format text`).
fn summary_of(plan: &std::path::Path) -> String {
    let o = batchfit()
        .args(["show", "--format", "text"])
        .arg(plan)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Each limit names its own measure in the summary: under a memory cgroup the peak is the cgroup's
/// memory peak (no data segment is measured there); under RLIMIT_DATA it is the largest process's
/// data segment, beside the process tree's proportional set size.
#[test]
fn the_summary_names_the_measure_of_the_limit_it_ran_under() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(
        &out,
        &["--cpu-limit", "rlimit", "--max-batch", "16"],
        &hog(200, &[]),
    )
    .assert()
    .success();
    let s = summary_of(&out);
    assert!(
        s.contains("peak data segment of the largest process"),
        "{s}"
    );
    assert!(s.contains("process tree's Pss_Anon + Pss_Shmem"), "{s}");
    assert!(!s.contains("cgroup"), "{s}");
    if !cgroup_available() {
        eprintln!(
            "NOT TESTED: no memory cgroup can be made here (needs root and a memory controller): \
             the cgroup's wording is not checked"
        );
        return;
    }
    probe(
        &out,
        &["--cpu-limit", "cgroup", "--max-batch", "16"],
        &hog(200, &[]),
    )
    .assert()
    .success();
    let s = summary_of(&out);
    assert!(s.contains("the cgroup's memory peak"), "{s}");
    assert!(!s.contains("data segment"), "{s}");
}

#[test]
fn a_memory_cgroup_limits_the_whole_tree_where_one_can_be_made() {
    // hog.py without a capacity: the kernel's limit decides. Under a cgroup the plan says so and an
    // over-limit trial is the kernel's OOM kill; where no cgroup can be made (not root), auto falls
    // back to RLIMIT_DATA and says why on stderr.
    let d = tmp();
    let out = path(&d, "plan.json");
    let cmd: Vec<String> = [
        py(),
        fake("hog.py"),
        "--batch".into(),
        "{batch}".into(),
        "--mib-per-sample".into(),
        "4".into(),
    ]
    .to_vec();
    let o = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "400MiB",
            "--margin",
            "0",
        ])
        .args(["--multiple-of", "4", "--max-batch", "400", "--out"])
        .arg(&out)
        .arg("--exec")
        .arg("--")
        .args(&cmd)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let p = read_json(&out);
    let max = p["recommendation"]["max_fitting_batch"].as_u64().unwrap();
    let mech = p["limit_mechanism"].as_str().unwrap().to_string();
    // 4 MiB a sample under 400 MiB, less the interpreter: well inside (40, 100)
    assert!((40..100).contains(&max), "{max} under {mech}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && std::path::Path::new("/sys/fs/cgroup").exists() {
        assert!(
            mech.starts_with("cgroup"),
            "root with cgroups got {mech}: {o:?}"
        );
        let oom = p["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["outcome"] == "oom")
            .unwrap()
            .clone();
        assert!(
            oom["message"].as_str().unwrap().contains("OOM killer"),
            "{oom}"
        );
    } else {
        assert_eq!(mech, "rlimit-data");
        assert!(String::from_utf8_lossy(&o.stderr).contains("no memory cgroup for trials"));
    }
}

#[test]
fn usage_errors_cost_nothing() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--exec".into()],
            "needs the command: give it after `--`",
        ),
        (
            vec!["--".into(), "python3".into(), "x.py".into()],
            "only with --exec",
        ),
        (
            vec!["--exec".into(), "--".into(), "no-such-program-xyz".into()],
            "cannot find the program",
        ),
        (
            vec![
                "--model".into(),
                "gpt".into(),
                "--exec".into(),
                "--".into(),
                "sh".into(),
            ],
            "--model describes batchfit's own model",
        ),
        (
            vec![
                "--oom-pattern".into(),
                "(".into(),
                "--exec".into(),
                "--".into(),
                "sh".into(),
            ],
            "not a regular expression",
        ),
        (
            vec![
                "--fingerprint-file".into(),
                "/no/such/file".into(),
                "--exec".into(),
                "--".into(),
                "sh".into(),
            ],
            "--fingerprint-file /no/such/file",
        ),
        (
            vec!["--cpu-limit".into(), "cgroup".into()],
            "--cpu-limit goes with --exec",
        ),
    ];
    for (args, want) in cases {
        batchfit()
            .args(["probe", "--backend", "cpu", "--out"])
            .arg(&out)
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(want));
        assert!(!out.exists() && !path(&d, "plan.partial.json").exists());
    }
}

/// `--exec 'CMD ARG…'`, one argument, is split into words as a POSIX shell would (quotes kept
/// together, nothing expanded) and is the same probe as `--exec -- CMD ARG…`: the same argv in the
/// plan, the same answer, the same cache entry.
#[test]
fn a_command_given_as_one_string_is_split_like_a_shell_and_probed_the_same() {
    let d = tmp();
    let cache = fresh_cache_dir();
    // above 7 the job runs out of memory for real (a text alone is no out-of-memory); the path of
    // oom.py goes unquoted inside the single-quoted script
    let script = format!(
        r#"[ "$1" -le 7 ] || exec /usr/bin/python3 {}; {}"#,
        repo().join("tests/support/exec/oom.py").display(),
        hold_sh("$1")
    );
    // no helper: the cache answers a command only with --fingerprint-file naming what it reads
    let hold = repo().join("tests/support/exec/hold.py");
    let script = script.as_str();
    let words = ["sh", "-c", script, "sh", "{batch}"];
    let line = format!("sh -c '{script}' sh {{batch}}");
    let run = |out: &std::path::Path, form: &[&str]| {
        batchfit()
            .env("BATCHFIT_CACHE_DIR", &cache)
            .args(["probe", "--backend", "cpu", "--memory-budget", "2GiB"])
            .args(["--cpu-limit", "rlimit", "--quiet", "--max-batch", "16"])
            .arg("--fingerprint-file")
            .arg(&hold)
            .arg("--out")
            .arg(out)
            .args(form)
            .assert()
            .success()
    };
    let one = path(&d, "one.json");
    run(&one, &["--exec", &line]);
    let p = read_json(&one);
    assert_eq!(
        p["model"]["argv"],
        serde_json::json!(words),
        "{}",
        p["model"]
    );
    assert_eq!(p["recommendation"]["max_fitting_batch"], 7);
    // the other form: the same command, so the cache answers it
    let many = path(&d, "many.json");
    let mut form = vec!["--exec", "--"];
    form.extend(words);
    let o = run(&many, &form);
    let err = String::from_utf8_lossy(&o.get_output().stderr).into_owned();
    assert!(err.contains("plan from cache"), "{err}");
    let q = read_json(&many);
    assert_eq!(q["model"], p["model"]);
    assert_eq!(q["recommendation"], p["recommendation"]);
}

/// A wrong form of `--exec` (nothing, an unbalanced quote, an empty string, the command twice, or
/// several words unquoted) is refused before any trial, exit 2, with both accepted forms.
#[test]
fn a_wrong_form_of_exec_shows_both_forms_and_exits_2() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--exec"], "--exec needs the command"),
        (
            vec!["--exec", r#"python3 "train.py"#],
            "cannot be split into words",
        ),
        (vec!["--exec", "  "], "empty command"),
        (
            vec!["--exec", "sh x.sh", "--", "sh", "x.sh"],
            "the command twice",
        ),
        (
            vec!["--exec", "python3", "train.py", "{batch}"],
            "takes the command as one argument",
        ),
    ];
    for (args, want) in cases {
        let o = batchfit()
            .args(["probe", "--backend", "cpu", "--out"])
            .arg(&out)
            .args(&args)
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&o.get_output().stderr).into_owned();
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            err.contains("--exec -- python train.py --batch-size {batch}")
                && err.contains("--exec 'python train.py --batch-size {batch}'"),
            "{args:?} does not show both forms: {err}"
        );
        assert!(!out.exists() && !path(&d, "plan.partial.json").exists());
    }
}

/// A job that says how many optimizer steps it runs (the helper's `steps(default=N)`, recorded in its
/// report as `job_steps`) and runs more than the recommendation was confirmed with is warned that
/// later memory is not covered; one that runs no more than that is not. (Above 6 it fills the limit
/// until Python's `MemoryError`: a real out-of-memory, not a text.)
#[test]
fn a_job_that_runs_more_steps_than_were_proven_is_warned() {
    let script = |job_steps: u32| {
        format!(
            "import sys; sys.path.insert(0, {helper:?}); import batchfit_trial as bt\n\
             b = bt.batch_size(default=8); n = bt.steps(default={job_steps})\n\
             if b > 6: hold = [bytearray(16 << 20) for _ in range(1 << 20)]\n\
             with bt.Trial() as t:\n    for _ in range(n): t.step()\n",
            helper = helper_dir()
        )
    };
    for (job_steps, warned) in [(1000, true), (4, false)] {
        let d = tmp();
        let out = path(&d, "plan.json");
        let cmd = vec![py(), "-c".into(), script(job_steps)];
        probe(&out, &["--cpu-limit", "rlimit", "--max-batch", "16"], &cmd)
            .assert()
            .success();
        let p = read_json(&out);
        assert_eq!(p["recommendation"]["max_fitting_batch"], 6, "{p}");
        let fit = p["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["batch"] == 6 && t["steps"] == 5 && t["outcome"] == "fits")
            .expect("the confirmation of 6")
            .clone();
        assert_eq!(fit["details"]["report"]["job_steps"], job_steps, "{fit}");
        let warnings = p["warnings"].to_string();
        let says = warnings.contains(&format!(
            "the job runs {job_steps} optimizer steps (its steps() default), and micro-batch 6 \
             was confirmed with 5"
        ));
        assert_eq!(says, warned, "{warnings}");
    }
}

#[test]
fn a_command_without_batch_is_warned() {
    let d = tmp();
    let out = path(&d, "plan.json");
    // reads BATCHFIT_BATCH itself
    let cmd: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        // (a fit lasts long enough to be measured: only samples after the exec measure a trial)
        format!(
            "[ \"$BATCHFIT_BATCH\" -le 3 ] || {}; {}",
            run_out_sh(),
            hold_sh("$BATCHFIT_BATCH")
        ),
    ];
    let o = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--cpu-limit",
            "rlimit",
        ])
        .args(["--max-batch", "16", "--out"])
        .arg(&out)
        .arg("--exec")
        .arg("--")
        .args(&cmd)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("must read the size from BATCHFIT_BATCH"),
        "{err}"
    );
    let p = read_json(&out);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 3);
    assert!(p["warnings"].to_string().contains("BATCHFIT_BATCH"));
}

#[test]
fn the_python_helper_ships_inside_the_binary() {
    let o = batchfit().arg("python-helper").output().unwrap();
    assert!(o.status.success());
    let shipped = std::fs::read(repo().join("python/batchfit/batchfit_trial.py")).unwrap();
    assert_eq!(o.stdout, shipped);
}

#[test]
fn the_trainer_refuses_verify_reruns_and_the_cache_knows_the_files() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let script = path(&d, "train.sh");
    std::fs::write(
        &script,
        format!("[ \"$1\" -le 5 ] || {}; {}\n", run_out_sh(), hold_sh("$1")),
    )
    .unwrap();
    let cache = fresh_cache_dir();
    let run = |extra: &[&str]| {
        let mut c = batchfit();
        c.env("BATCHFIT_CACHE_DIR", &cache)
            .args([
                "probe",
                "--backend",
                "cpu",
                "--memory-budget",
                "2GiB",
                "--cpu-limit",
                "rlimit",
            ])
            .args(["--max-batch", "16", "--fingerprint-file"])
            .arg(&script)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .args(["--exec", "--", "sh"])
            .arg(&script)
            .arg("{batch}");
        c.output().unwrap()
    };
    let first = run(&[]);
    assert!(first.status.success(), "{first:?}");
    let p = read_json(&out);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 5);
    assert_eq!(
        p["model"]["fingerprint_files"][0]["path"],
        script.display().to_string()
    );
    // the same command and file: answered from the cache
    let again = run(&[]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("plan from cache"));
    // the trainer cannot run a command: one sentence, usage
    trainer()
        .args(["--plan"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--format env"));
    // verify re-runs the command's sizes here
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&out)
        .assert()
        .success();
    assert_eq!(read_json(&out)["verified"], true);
    // another version of the script: verify refuses, and the cache does not answer for it
    std::fs::write(
        &script,
        format!("[ \"$1\" -le 9 ] || {}; {}\n", run_out_sh(), hold_sh("$1")),
    )
    .unwrap();
    batchfit()
        .args(["verify", "--quiet"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("changed since the plan was made"));
    let third = run(&[]);
    assert!(third.status.success(), "{third:?}");
    assert!(!String::from_utf8_lossy(&third.stderr).contains("plan from cache"));
    assert_eq!(read_json(&out)["recommendation"]["max_fitting_batch"], 9);
}

#[test]
fn logs_keep_every_trials_output() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let logs = path(&d, "logs");
    let cmd = vec![
        py(),
        fake("cuda_oom.py"),
        "--batch".into(),
        "{batch}".into(),
        "--threshold".into(),
        "4".into(),
        "--reach-limit".into(),
    ];
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--cpu-limit",
            "rlimit",
            "--quiet",
        ])
        .args(["--max-batch", "16", "--out"])
        .arg(&out)
        .arg("--logs")
        .arg(&logs)
        .arg("--exec")
        .arg("--")
        .args(&cmd)
        .assert()
        .success();
    let p = read_json(&out);
    let n = p["trials"].as_array().unwrap().len();
    // every trial's stdout and stderr, and nothing else: the lock that kept other probes out while
    // it ran (docs/errors.md, "Trial logs: `--logs`") went with the probe
    let files: Vec<PathBuf> = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!logs.join(".batchfit-logs.lock").exists());
    assert_eq!(files.len(), 2 * n, "{files:?}");
    let oom_log = files
        .iter()
        .find(|f| f.to_string_lossy().contains("-b5-") && f.to_string_lossy().ends_with(".stderr"))
        .expect("the log of the trial at 5");
    assert!(std::fs::read_to_string(oom_log)
        .unwrap()
        .contains("torch.OutOfMemoryError"));
    let t5 = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["batch"] == 5)
        .unwrap()
        .clone();
    assert!(
        t5["details"]["log"].as_str().unwrap().contains("-b5-"),
        "{t5}"
    );
}

#[test]
fn torchruns_failure_report_is_classified_by_its_root_cause() {
    use batchfit::protocol::classify::{classify, Evidence};
    let sample =
        std::fs::read_to_string(repo().join("tests/support/exec/torchrun_failure_sample.txt"))
            .unwrap();
    let v = classify(&Evidence {
        message: &sample,
        ..Default::default()
    });
    assert!(v.is_oom(), "{v:?}");
}

/// A job whose teardown is long (it sleeps after its report, as a checkpoint save or a logger flush
/// can): an exploration trial is ended about a second after its complete report and says so; a
/// trial that can confirm the answer runs to the job's own end. The answer is the exact one.
#[test]
fn an_exploration_trial_ends_a_moment_after_its_report_and_a_confirmation_runs_to_the_end() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(
        &out,
        &["--cpu-limit", "rlimit", "--warm", "off"],
        &hog(40, &["--linger", "4"]),
    )
    .assert()
    .success();
    let p = read_json(&out);
    assert_eq!(
        p["recommendation"]["max_fitting_batch"], 32,
        "{}",
        p["recommendation"]
    );
    let trials = p["trials"].as_array().unwrap();
    let fits: Vec<_> = trials.iter().filter(|t| t["outcome"] == "fits").collect();
    let (explore, confirm): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) =
        fits.iter().copied().partition(|t| t["steps"] == 2);
    assert!(!explore.is_empty() && !confirm.is_empty(), "{p}");
    for t in &explore {
        assert_eq!(t["details"]["ended_after_report"], true, "{t}");
        assert!(t["seconds"].as_f64().unwrap() < 4.0, "{t}");
    }
    for t in &confirm {
        assert!(t["details"].get("ended_after_report").is_none(), "{t}");
        assert!(t["seconds"].as_f64().unwrap() >= 4.0, "{t}");
    }
    // the out-of-memory trials wrote no report: they ended by themselves, as before
    for t in trials.iter().filter(|t| t["outcome"] == "oom") {
        assert!(t["details"].get("ended_after_report").is_none(), "{t}");
    }
}

/// A job whose memory peaks after its last step (an evaluation pass after training, twice the
/// step's memory per sample) a while after its complete report: the answer is the size whose
/// whole job fits (16), not the size whose steps fit (32), and `verify` runs the job to its end.
#[test]
fn memory_after_the_last_step_bounds_the_answer() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(
        &out,
        &["--cpu-limit", "rlimit", "--warm", "off"],
        &hog(40, &["--linger", "1.5", "--evaluate", "2"]),
    )
    .assert()
    .success();
    let p = read_json(&out);
    assert_eq!(
        p["recommendation"]["max_fitting_batch"], 16,
        "{}",
        p["recommendation"]
    );
    let verified = path(&d, "verified.json");
    batchfit()
        .args(["verify", "--quiet", "--out"])
        .arg(&verified)
        .arg(&out)
        .assert()
        .success();
    let v = read_json(&verified);
    assert!(
        v["trials"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["details"].get("ended_after_report").is_none()
                || t["steps"].as_u64() < Some(5))
    );
}

/// A report of fewer steps than asked is not the evidence: the job is not ended early (it runs its
/// teardown to the end) and the trial is an error, as before.
#[test]
fn a_report_of_fewer_steps_than_asked_does_not_end_the_job_early() {
    let d = tmp();
    let out = path(&d, "plan.json");
    probe(
        &out,
        &[
            "--cpu-limit",
            "rlimit",
            "--warm",
            "off",
            "--max-trials",
            "1",
        ],
        &hog(40, &["--report-steps", "0", "--linger", "3"]),
    )
    .assert()
    .code(predicate::in_iter([4, 5]));
    let p = read_json(&path(&d, "plan.partial.json"));
    let first = &p["trials"][0];
    assert_eq!(first["outcome"], "error", "{first}");
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .contains("0 optimizer steps"),
        "{first}"
    );
    assert!(
        first["details"].get("ended_after_report").is_none(),
        "{first}"
    );
    assert!(first["seconds"].as_f64().unwrap() >= 3.0, "{first}");
}

/// `--warm on` is for a Python interpreter running a script or a module: another command is refused
/// before any trial (exit 2), and `--warm` without `--exec` too.
#[test]
fn warm_on_needs_a_python_script_or_module() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let sh = vec!["sh".to_string(), "-c".into(), "exit 0".into()];
    probe(&out, &["--warm", "on"], &sh)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--warm on needs a Python interpreter",
        ));
    let code = vec![py(), "-c".into(), "pass".into()];
    probe(&out, &["--warm", "on"], &code).assert().code(2);
    batchfit()
        .args(["probe", "--backend", "cpu", "--warm", "off", "--out"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--warm goes with --exec"));
    assert!(!out.exists());
}

/// A placeholder mistyped in the command (`{batc}`) is said before the first trial, with the
/// placeholder meant, so the search can be stopped at once instead of read about at its end.
#[test]
fn a_mistyped_placeholder_is_said_before_the_first_trial() {
    let d = tmp();
    let script = format!(
        r#"[ "$BATCHFIT_BATCH" -le 3 ] || {}; {}"#,
        run_out_sh(),
        hold_sh("$BATCHFIT_BATCH")
    );
    let o = batchfit()
        .args(["probe", "--backend", "cpu", "--memory-budget", "2GiB"])
        .args(["--cpu-limit", "rlimit", "--max-batch", "8", "--no-cache"])
        .arg("--out")
        .arg(path(&d, "plan.json"))
        .args(["--exec", "--", "sh", "-c", &script, "sh", "--bs={batc}"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let said = err
        .find("did you mean `{batch}`")
        .unwrap_or_else(|| panic!("{err}"));
    let first_trial = err.find("trial   1:").unwrap_or_else(|| panic!("{err}"));
    assert!(said < first_trial, "{err}");
}

/// A command given as one string with a shell operator in it (`> log`) is refused before any
/// trial runs (no shell would act on it; the job would get `>` as an argument), and the message
/// gives the `sh -c` form.
#[test]
fn a_redirection_in_a_one_string_command_is_refused_with_the_sh_c_form() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let o = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--no-cache",
        ])
        .arg("--out")
        .arg(&out)
        .args(["--exec", "python3 train.py --batch-size {batch} > log.txt"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("sh -c") && err.contains("`>`"), "{err}");
    assert!(!err.contains("trial "), "{err}");
    assert!(!out.exists());
}

/// A command without `{batch}` is told before its first trial how the size reaches it (only
/// through BATCHFIT_BATCH), so a forgotten placeholder can be stopped at once.
#[test]
fn a_command_without_the_batch_placeholder_is_told_before_the_first_trial() {
    let d = tmp();
    let script = format!(
        r#"[ "$BATCHFIT_BATCH" -le 3 ] || {}; {}"#,
        run_out_sh(),
        hold_sh("$BATCHFIT_BATCH")
    );
    let o = batchfit()
        .args(["probe", "--backend", "cpu", "--memory-budget", "2GiB"])
        .args(["--cpu-limit", "rlimit", "--max-batch", "8", "--no-cache"])
        .arg("--out")
        .arg(path(&d, "plan.json"))
        .args(["--exec", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let said = err
        .find("only as BATCHFIT_BATCH")
        .unwrap_or_else(|| panic!("{err}"));
    let first_trial = err.find("trial   1:").unwrap_or_else(|| panic!("{err}"));
    assert!(said < first_trial, "{err}");
}

/// A job that imports an installed module `name` (in the `site-packages` folder of `d`, on the
/// probe's `PYTHONPATH`: its report names it, and the fork server imports it) after running
/// `before` (Python), then runs hog.py under the real `RLIMIT_DATA` (no simulated capacity): a
/// sample costs 1 MiB. The `batchfit probe --exec` of it, plan to `out`.
fn probe_hog_after_import(
    d: &tempfile::TempDir,
    (name, module, before): (&str, &str, &str),
    flags: &[&str],
    out: &std::path::Path,
) -> assert_cmd::assert::Assert {
    let site = d.path().join("site-packages");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join(format!("{name}.py")), module).unwrap();
    let job = d.path().join("job.py");
    std::fs::write(
        &job,
        format!(
            "import runpy, sys\n{before}\nimport {name}\nsys.argv = [{hog:?}] + sys.argv[1:]\n\
             runpy.run_path({hog:?}, run_name='__main__')\n",
            hog = fake("hog.py"),
        ),
    )
    .unwrap();
    let hog = hog(0, &[]);
    batchfit()
        .env("PYTHONPATH", &site)
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "400MiB",
            "--quiet",
        ])
        .args(["--multiple-of", "8", "--cpu-limit", "rlimit"])
        .args(flags)
        .arg("--out")
        .arg(out)
        .args(["--exec", "--", &py()])
        .arg(&job)
        .args(
            hog[2..]
                .iter()
                .filter(|a| *a != "--capacity-mib" && *a != "0"),
        )
        .assert()
}

/// (purpose is explore, forked) per trial of a plan.
fn forked_flags(p: &serde_json::Value) -> Vec<(bool, bool)> {
    p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["purpose"] == "explore", t["details"]["forked"] == true))
        .collect()
}

/// A library sized by an environment variable that the script sets before importing it: the fork
/// server imported it without the script's setting (8 MiB instead of 160), so a forked trial runs a
/// job lighter than the real one. Forked trials only explore; the answer is proven cold and is the
/// cold probe's.
#[test]
fn a_library_configured_by_the_script_before_its_import_is_proven_cold() {
    let d = tmp();
    let module = "import os\nCACHE = bytearray(int(os.environ.get('CACHELIB_MB', '8')) << 20)\n\
                  for i in range(0, len(CACHE), 4096):\n    CACHE[i] = 1\n";
    let answer = |warm: &str| {
        let out = path(&d, &format!("plan-{warm}.json"));
        let job = (
            "cachelib",
            module,
            "import os; os.environ['CACHELIB_MB'] = '160'",
        );
        probe_hog_after_import(&d, job, &["--warm", warm], &out).success();
        read_json(&out)
    };
    let (forked, cold) = (answer("on"), answer("off"));
    let f = forked_flags(&forked);
    assert!(f.iter().any(|&(_, forked)| forked), "{f:?}");
    assert!(
        f.iter().all(|&(explore, forked)| !forked || explore),
        "{f:?}"
    );
    let a = |p: &serde_json::Value| p["recommendation"]["max_fitting_batch"].as_u64().unwrap();
    assert!(
        a(&forked).abs_diff(a(&cold)) <= 8,
        "forked {} cold {}",
        a(&forked),
        a(&cold)
    );
}

/// A module whose import starts a thread: a fork would keep only the forking thread, so the fork
/// server refuses to serve, and the warm trials are processes started ahead instead (never a fork
/// server started again for every trial).
#[test]
fn a_fork_server_whose_imports_start_a_thread_gives_way_to_warm_processes_started_ahead() {
    let d = tmp();
    let module = "import threading, time\n\
                  threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n";
    let out = path(&d, "plan.json");
    let flags = ["--warm", "on", "--strategy", "bisect"];
    probe_hog_after_import(&d, ("threadlib", module, ""), &flags, &out).success();
    let p = read_json(&out);
    let f = forked_flags(&p);
    assert!(f.iter().all(|&(_, forked)| !forked), "{f:?}");
    assert!(
        p["trials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["details"]["warm"] == true),
        "{p}"
    );
}

/// A script that uses `__builtins__` as the module it is in `python script.py` runs in a warm
/// (forked) trial as it does cold.
#[test]
fn a_script_that_uses_builtins_as_a_module_runs_warm_as_cold() {
    let d = tmp();
    let out = path(&d, "plan.json");
    let job = (
        "plainlib",
        "X = 1\n",
        "__builtins__.__dict__['LOG_EVERY'] = 10",
    );
    probe_hog_after_import(&d, job, &["--warm", "on", "--strategy", "bisect"], &out).success();
    let p = read_json(&out);
    let trials = p["trials"].as_array().unwrap();
    for t in trials {
        assert_ne!(t["outcome"], "error", "{t}");
    }
    let f = forked_flags(&p);
    assert!(f.iter().any(|&(_, forked)| forked), "{f:?}");
}

/// A probe stopped by `--time-limit` says how long a limit would finish it: the trials it may still
/// need at the mean time of those that ran, more than the limit it had.
#[test]
fn a_probe_cut_short_by_time_limit_says_how_long_would_finish_it() {
    let d = tmp();
    let out = path(&d, "plan.json");
    // steps of half a second, a capacity above the budget: the limit passes during the second
    // trial, with no size failing
    let slow = hog(8192, &["--sleep", "0.5"]);
    let run = probe(
        &out,
        &["--time-limit", "1.5", "--format", "text", "--warm", "off"],
        &slow,
    )
    .assert()
    .code(5);
    let text = String::from_utf8(run.get_output().stdout.clone()).unwrap();
    let wanted = regex_lite::Regex::new(r"run the probe again with --time-limit (\d+) or more")
        .unwrap()
        .captures(&text)
        .unwrap_or_else(|| panic!("{text}"))[1]
        .parse::<u64>()
        .unwrap();
    assert!(wanted >= 2, "{text}");
}
