//! `batchfit probe --exec`: process and file hygiene through the real binary — escaped daemons,
//! `--logs`, leftover state, output floods, paths checked up front, the cache key of a command.
//! Fake commands are small /usr/bin/python3 or sh scripts (tests/support/exec/); the ones that fit
//! sleep 0.1 s, so their memory is sampled (a command that ends before the first sample is an error).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fake(name: &str) -> String {
    repo()
        .join("tests/support/exec")
        .join(name)
        .display()
        .to_string()
}

const PY: &str = "/usr/bin/python3";

/// The batchfit binary as a plain process (for tests that time it or signal it).
fn batchfit_process(marker: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_batchfit"));
    c.env_remove("RUST_BACKTRACE")
        .env("BATCHFIT_CACHE_DIR", fresh_cache_dir())
        .env("BATCHFIT_TEST_MARKER", marker)
        .stdin(Stdio::null());
    c
}

/// Whether process `pid`'s environment holds `needle`.
fn environ_has(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|e| String::from_utf8_lossy(&e).contains(needle))
        .unwrap_or(false)
}

/// Live processes running `needle` that carry this test's `marker`; SIGKILLed so that a failing
/// test leaves nothing behind.
fn survivors(needle: &str, marker: &str) -> Vec<u32> {
    let v: Vec<u32> = processes_with(needle)
        .into_iter()
        .filter(|&p| environ_has(p, marker))
        .collect();
    for &p in &v {
        // SAFETY: signalling a process this test started (it carries the test's marker).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    v
}

fn probe_args(out: &Path, timeout: &str) -> Vec<String> {
    [
        "probe",
        "--backend",
        "cpu",
        "--memory-budget",
        "2GiB",
        "--quiet",
        "--trial-timeout",
        timeout,
        "--max-trials",
        "2",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

/// Under RLIMIT_DATA (no cgroup to hold the tree) a command that double-forks a daemon (setsid,
/// SIGTERM ignored, the stdout pipe held open) must neither hang batchfit (the pipe never closing) nor
/// leak the daemon. The daemon carries the trial's marker: it is found and killed, and the trial ends
/// within its timeout plus a few seconds.
#[test]
fn an_escaped_daemon_is_killed_and_the_trial_ends() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("daemon-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    c.args(probe_args(&out, "5"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .arg(fake("daemon.py"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let (status, secs) = wait_within(&mut child, Duration::from_secs(30));
    let left = survivors("daemon.py", &marker);
    assert!(left.is_empty(), "the trial's daemon survived: {left:?}");
    assert!(matches!(status.code(), Some(4) | Some(5)), "{status:?}");
    assert!(secs < 5.0 + 4.0, "took {secs:.1} s");
    let p = read_json(&d.path().join("plan.partial.json"));
    assert_eq!(p["trials"][0]["outcome"], "error", "{}", p["trials"]);
}

/// The plan batchfit wrote to `out` (or, when the probe did not complete, its partial plan).
fn written_plan(out: &Path) -> serde_json::Value {
    let partial = out.with_file_name("plan.partial.json");
    read_json(if out.exists() { out } else { &partial })
}

/// Under RLIMIT_DATA a command that exits 0 and leaves a detached daemon running (double fork,
/// setsid, its output on /dev/null, SIGTERM ignored) leaves nothing behind once batchfit returns:
/// every process carrying this test's marker is gone, and the plan records, per trial, the processes
/// batchfit found still running after the command exited and killed; the progress says so.
#[test]
fn a_daemon_left_by_a_trial_is_killed_and_recorded_under_rlimit() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("left-daemon-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    let mut args = probe_args(&out, "20");
    args.retain(|a| a != "--quiet");
    c.args(args)
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .args([
            fake("daemon.py"),
            "--exit".into(),
            "0".into(),
            "--detach".into(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let done = child.wait_with_output().unwrap();
    let left = survivors("daemon.py", &marker);
    assert!(
        left.is_empty(),
        "the trials' daemons survived batchfit ({pid}): {left:?}"
    );
    let stderr = String::from_utf8_lossy(&done.stderr);
    let p = written_plan(&out);
    let t = &p["trials"][0];
    assert_eq!(t["details"]["left_behind"]["count"], 1, "{t}");
    assert_eq!(t["details"]["left_behind"]["killed"], true, "{t}");
    // a process left running could still allocate: not a fit
    assert_eq!(t["outcome"], "error", "{t}");
    assert!(
        stderr.contains(
            "trial 1's command exited and left 1 process of the trial running; batchfit killed it"
        ),
        "{stderr}"
    );
}

/// Under RLIMIT_DATA a daemon that the command detached (double fork, setsid), holding 64 MiB and
/// ending by itself 1 s after the command exits 0, is caught every time: batchfit does not wait for a
/// process the job detached, so the trial does not hang on its race with the second batchfit gives
/// the job's own children to end (was: a fit or an error from run to run; a daemon ending half a
/// second after the job was never caught). Three runs at 1 s, one at 0.5 s: the same error each time.
#[test]
fn a_daemon_that_outlives_the_job_by_a_second_is_caught_every_time() {
    for outlive in ["1", "1", "1", "0.5"] {
        let d = tmp();
        let out = d.path().join("plan.json");
        let marker = format!("outlive-{}", std::process::id());
        let mut c = batchfit_process(&marker);
        let mut args = probe_args(&out, "20");
        let n = args.iter().position(|a| a == "--max-trials").unwrap();
        args[n + 1] = "1".into();
        c.args(args)
            .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
            .arg(fake("daemon.py"))
            .args(["--exit", "0", "--detach", "--hold-mib", "64"])
            .args(["--outlive", outlive])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        wait_within(&mut child, Duration::from_secs(30));
        assert!(survivors("daemon.py", &marker).is_empty());
        let t = &written_plan(&out)["trials"][0];
        assert_eq!(t["outcome"], "error", "outlive {outlive}: {t}");
        assert!(
            t["message"]
                .as_str()
                .unwrap()
                .contains("left processes behind"),
            "outlive {outlive}: {t}"
        );
        assert_eq!(t["details"]["left_behind"]["count"], 1, "{t}");
    }
}

/// Under RLIMIT_DATA a daemon the command detached while it runs is part of the job's footprint:
/// the tree's figure of a trial whose daemon holds 160 MiB is above 160 MiB, though the main
/// process itself holds a few MiB.
#[test]
fn a_daemon_holding_memory_counts_in_the_trials_footprint() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("heavy-daemon-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    let mut args = probe_args(&out, "20");
    let n = args.iter().position(|a| a == "--max-trials").unwrap();
    args[n + 1] = "1".into();
    c.args(args)
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .arg(fake("daemon.py"))
        .args([
            "--exit",
            "0",
            "--detach",
            "--hold-mib",
            "160",
            "--wait",
            "1.5",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    wait_within(&mut child, Duration::from_secs(30));
    assert!(survivors("daemon.py", &marker).is_empty());
    let p = written_plan(&out);
    let t = &p["trials"][0];
    let tree = t["details"]["tree_pss_peak_bytes"].as_u64().unwrap_or(0);
    assert!(tree > 160 << 20, "tree figure {tree} B: {t}");
}

/// Under RLIMIT_DATA a daemon that escapes every mark of its trial (a double fork, `setsid`, an
/// empty environment: no session, group, parent or marker to find it by) still comes back to
/// batchfit, the trials' subreaper: it is counted with the trial, killed, recorded as left behind
/// (the trial is an error, never a fit), and nothing of it runs after batchfit returns.
#[test]
fn a_daemon_that_clears_its_environment_is_still_found_and_killed() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("cleared-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    c.args(probe_args(&out, "20"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY])
        .args([fake("daemon.py"), "--clear-env".into(), "--detach".into()])
        .args(["--exit", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let (status, secs) = wait_within(&mut child, Duration::from_secs(30));
    let left = processes_with("daemon.py-cleared");
    for &p in &left {
        // SAFETY: ending what this test's probe left (a failing run must not leave it).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "the cleared daemons survived batchfit: {left:?}"
    );
    assert!(matches!(status.code(), Some(4) | Some(5)), "{status:?}");
    assert!(secs < 20.0, "took {secs:.1} s");
    let p = written_plan(&out);
    let t = &p["trials"][0];
    assert_eq!(t["outcome"], "error", "{t}");
    assert!(
        t["details"]["left_behind"]["count"].as_u64() >= Some(1),
        "{t}"
    );
    assert_eq!(t["details"]["left_behind"]["killed"], true, "{t}");
}

const SIM: &str = "base=1GiB,per-sample=3MiB,capacity=16GiB";

fn sim_plan(out: &Path) {
    batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM,
            "--global-batch",
            "8192",
        ])
        .args(["--quiet", "--out"])
        .arg(out)
        .assert()
        .success();
}

/// `--exec --backend sim` is refused (the simulation would run, the command never).
#[test]
fn exec_with_the_simulator_is_refused() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let a = batchfit()
        .args(["probe", "--backend", "sim", "--sim", SIM, "--out"])
        .arg(&out)
        .args(["--exec", "--", "/bin/sh", "-c", "exit 0"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("--backend sim runs nothing"), "{err}");
    assert!(!out.exists() && !d.path().join("plan.partial.json").exists());
}

/// A simulated plan merged with a real device's plan is refused (exit 2), not a "merged" plan. Two
/// simulated plans still merge, and `--format env` says the merged plan is not verified
/// (`BATCHFIT_VERIFIED=0`; `1` for a probe plan).
#[test]
fn merge_refuses_sim_with_real_and_env_says_verified() {
    let d = tmp();
    let sim = d.path().join("sim.json");
    sim_plan(&sim);
    let real = d.path().join("cpu.json");
    let mut p = read_json(&sim);
    p["device"]["kind"] = "cpu".into();
    p["device"]["name"] = "some cpu".into();
    write_json(&real, &p);
    let merged = d.path().join("merged.json");
    let a = batchfit()
        .args([
            "merge",
            "--global-batch",
            "8192",
            "--format",
            "json",
            "--out",
        ])
        .arg(&merged)
        .arg(&sim)
        .arg(&real)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("is a simulated plan"), "{err}");
    assert!(!merged.exists());
    // two simulated plans merge; the result is not verified
    let sim2 = d.path().join("sim2.json");
    sim_plan(&sim2);
    batchfit()
        .args([
            "merge",
            "--global-batch",
            "8192",
            "--format",
            "json",
            "--out",
        ])
        .arg(&merged)
        .arg(&sim)
        .arg(&sim2)
        .assert()
        .success();
    let env = |plan: &Path| {
        let a = batchfit()
            .arg("show")
            .arg(plan)
            .args(["--format", "env"])
            .assert()
            .success();
        String::from_utf8_lossy(&a.get_output().stdout).into_owned()
    };
    let m = env(&merged);
    assert!(m.contains("export BATCHFIT_VERIFIED=0\n"), "{m}");
    let s = env(&sim);
    assert!(s.contains("export BATCHFIT_VERIFIED=1\n"), "{s}");
}

/// A cpu `--exec` probe of `cmd` with `flags`, plan to `out` (RLIMIT_DATA, small caps).
fn exec_probe(out: &Path, flags: &[&str], cmd: &[&str]) -> assert_cmd::Command {
    let mut c = batchfit();
    c.args([
        "probe",
        "--backend",
        "cpu",
        "--memory-budget",
        "2GiB",
        "--quiet",
    ])
    .args(["--cpu-limit", "rlimit", "--trial-timeout", "20", "--out"])
    .arg(out)
    .args(flags)
    .args(["--exec", "--"])
    .args(cmd);
    c
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

/// `--out` naming the command's own script, a `--fingerprint-file` (through a link), or a trial log's
/// name under `--logs` is refused before any trial (the plan would replace the script at the end),
/// and the file is unchanged.
#[test]
fn out_is_never_one_of_the_probes_own_inputs() {
    let d = tmp();
    let script = d.path().join("train.sh");
    std::fs::write(&script, "exit 0\n").unwrap();
    let s = script.display().to_string();
    let a = exec_probe(&script, &[], &["/bin/sh", &s]).assert().code(2);
    assert!(
        stderr_of(&a).contains("is the command's file"),
        "{}",
        stderr_of(&a)
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), "exit 0\n");
    // the same file through a symbolic link, as a --fingerprint-file
    let data = d.path().join("data.yaml");
    std::fs::write(&data, "x: 1\n").unwrap();
    let link = d.path().join("plan.json");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let a = exec_probe(
        &link,
        &["--fingerprint-file", data.to_str().unwrap()],
        &["/bin/sh", &s],
    )
    .assert()
    .code(2);
    assert!(
        stderr_of(&a).contains("is --fingerprint-file"),
        "{}",
        stderr_of(&a)
    );
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "x: 1\n");
    // a trial log's name under --logs
    let logs = d.path().join("logs");
    let out = logs.join("trial-001-b1-a1.stdout");
    std::fs::create_dir(&logs).unwrap();
    let a = exec_probe(&out, &["--logs", logs.to_str().unwrap()], &["/bin/sh", &s])
        .assert()
        .code(2);
    assert!(
        stderr_of(&a).contains("a trial log's name"),
        "{}",
        stderr_of(&a)
    );
}

/// A FIFO as `--fingerprint-file` is refused at once (exit 2), not opened (which waits for a
/// writer).
#[test]
fn a_fifo_fingerprint_file_is_refused_at_once() {
    let d = tmp();
    let fifo = d.path().join("weights.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let a = exec_probe(
        &d.path().join("plan.json"),
        &["--fingerprint-file", fifo.to_str().unwrap()],
        &["/bin/sh", "-c", "exit 0"],
    )
    .timeout(Duration::from_secs(10))
    .assert()
    .code(2);
    assert!(
        stderr_of(&a).contains("a FIFO, not a regular file"),
        "{}",
        stderr_of(&a)
    );
}

/// A directory or FIFO at the partial plan's path (`plan.partial.json` beside `--out`) is refused
/// before any trial, with its error said once (not found only when the first partial plan is
/// written, after the first trial).
#[test]
fn the_partial_plan_path_is_checked_up_front() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let partial = d.path().join("plan.partial.json");
    let ran = d.path().join("ran");
    let cmd = format!("touch {}; exit 0", ran.display());
    std::fs::create_dir(&partial).unwrap();
    let a = exec_probe(&out, &[], &["/bin/sh", "-c", &cmd])
        .assert()
        .code(2);
    let err = stderr_of(&a);
    assert!(err.contains("its partial plan"), "{err}");
    assert_eq!(err.matches("is a directory").count(), 1, "{err}");
    assert!(!ran.exists(), "a trial ran");
    std::fs::remove_dir(&partial).unwrap();
    let c = std::ffi::CString::new(partial.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "sim",
            "--sim",
            SIM,
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .timeout(Duration::from_secs(10))
        .assert()
        .code(2);
    let err = stderr_of(&a);
    assert_eq!(err.matches("a FIFO").count(), 1, "{err}");
}

/// `--logs` that cannot be created (under /proc), or is a file, is refused before any
/// trial (exit 2); a FIFO or a symbolic link at a trial log's name stops the search (exit 4) instead of
/// blocking on the FIFO or writing through the link.
#[test]
fn logs_are_checked_up_front_and_never_written_through_links_or_fifos() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let ran = d.path().join("ran");
    let cmd = format!("echo hello; touch {}; exit 0", ran.display());
    let sh = ["/bin/sh", "-c", cmd.as_str()];
    let a = exec_probe(&out, &["--logs", "/proc/batchfit-no-such-dir/logs"], &sh)
        .assert()
        .code(2);
    assert!(
        stderr_of(&a).contains("cannot create it"),
        "{}",
        stderr_of(&a)
    );
    let file = d.path().join("afile");
    std::fs::write(&file, "").unwrap();
    let a = exec_probe(&out, &["--logs", file.to_str().unwrap()], &sh)
        .assert()
        .code(2);
    assert!(
        stderr_of(&a).contains("is not a directory"),
        "{}",
        stderr_of(&a)
    );
    assert!(!ran.exists());
    // the first trial (--max-batch 1) logs to trial-001-b1-a1.stdout: a FIFO there (the search stops with
    // trial-errors, exit 4, the reason in the partial plan)
    let logs = d.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let fifo = logs.join("trial-001-b1-a1.stdout");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let flags = ["--max-batch", "1", "--logs", logs.to_str().unwrap()];
    let a = exec_probe(&out, &flags, &sh)
        .timeout(Duration::from_secs(20))
        .assert()
        .code(4);
    let detail = |_: &assert_cmd::assert::Assert| {
        read_json(&d.path().join("plan.partial.json"))["stop_detail"].to_string()
    };
    assert!(
        detail(&a).contains("a FIFO, not a regular file"),
        "{}",
        detail(&a)
    );
    // a symbolic link there to a file outside: not followed, not truncated
    std::fs::remove_file(&fifo).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    std::os::unix::fs::symlink(&victim, &fifo).unwrap();
    let a = exec_probe(&out, &flags, &sh)
        .timeout(Duration::from_secs(20))
        .assert()
        .code(4);
    assert!(detail(&a).contains("symbolic link"), "{}", detail(&a));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
}

/// The directory of this process's memory cgroup where trial groups can be made (v1 or v2), if any
/// (root on a machine with the memory controller); batchfit, started from here, uses the same.
fn memory_cgroup_parent() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next(), parts.next(), parts.next());
        if let (Some(ctrls), Some(path)) = (ctrls, path) {
            if ctrls.split(',').any(|c| c == "memory") {
                let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
                if dir.join("memory.limit_in_bytes").exists() {
                    return Some(dir);
                }
            }
        }
    }
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    dir.join("cgroup.controllers").exists().then_some(dir)
}

fn groups_of(parent: &Path, pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| {
                        n.to_string_lossy().starts_with(&format!("batchfit-{pid}-"))
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

fn reports_dirs(tmpdir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmpdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("batchfit-reports-")
        })
        .collect()
}

/// SIGHUP (a closed terminal or ssh session) is handled as SIGTERM: exit 129, a partial plan,
/// nothing left (by its default action it would end batchfit at once, leaving the trial's processes,
/// its memory cgroup and its /tmp/batchfit-reports-* directory behind).
#[test]
fn sighup_leaves_no_process_no_cgroup_and_no_report_dir() {
    let d = tmp();
    let tmpdir = d.path().join("tmp");
    std::fs::create_dir(&tmpdir).unwrap();
    let out = d.path().join("plan.json");
    let marker = format!("sighup-{}", std::process::id());
    let mut c = batchfit_process(&marker);
    c.env("TMPDIR", &tmpdir)
        .args(probe_args(&out, "60"))
        .args(["--exec", "--", PY])
        .args([fake("hang.py"), "--grandchild-setsid".into()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let parent = memory_cgroup_parent();
    let t0 = Instant::now();
    while processes_with("time.sleep(3600)")
        .into_iter()
        .all(|p| !environ_has(p, &marker))
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        reports_dirs(&tmpdir).len(),
        1,
        "the trial's report directory"
    );
    let in_group = parent
        .as_ref()
        .map(|p| groups_of(p, child.id()))
        .unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    if parent.is_some() && unsafe { libc::geteuid() } == 0 {
        assert!(
            !in_group.is_empty(),
            "as root the trial runs in a memory cgroup"
        );
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let (status, _) = wait_within(&mut child, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let left = survivors("hang.py", &marker);
    let left2 = survivors("time.sleep(3600)", &marker);
    assert_eq!(status.code(), Some(129), "{status:?}");
    assert!(left.is_empty() && left2.is_empty(), "{left:?} {left2:?}");
    assert!(d.path().join("plan.partial.json").exists());
    assert!(
        reports_dirs(&tmpdir).is_empty(),
        "{:?}",
        reports_dirs(&tmpdir)
    );
    // nor the trial's own temporary directory, nor the probe's that held it
    let left: Vec<PathBuf> = std::fs::read_dir(&tmpdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    for g in in_group {
        assert!(!g.exists(), "{} was left", g.display());
    }
}

/// A trial cgroup left by a batchfit that is gone (killed by SIGKILL) is removed by the
/// next batchfit that makes trial groups under the same parent. Where no memory cgroup can be made
/// (not root), there is nothing to test.
#[test]
fn stale_trial_cgroups_of_dead_batchfits_are_removed() {
    let Some(parent) = memory_cgroup_parent() else {
        eprintln!("no memory cgroup here");
        return;
    };
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let stale = parent.join(format!("batchfit-{pid}-7"));
    if std::fs::create_dir(&stale).is_err() {
        eprintln!("cannot make a cgroup under {}", parent.display());
        return;
    }
    let d = tmp();
    let out = d.path().join("plan.json");
    batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "1GiB",
            "--quiet",
        ])
        .args(["--cpu-limit", "cgroup", "--max-trials", "1", "--out"])
        .arg(&out)
        .args(["--exec", "--", "/bin/sh", "-c", "exit 1"])
        .assert()
        .failure();
    let gone = !stale.exists();
    let _ = std::fs::remove_dir(&stale);
    assert!(gone, "{} was left", stale.display());
}

/// The cache key of `--exec` holds the working directory, the environment the command sees, its
/// script's content (without --fingerprint-file), the limit mechanism and `--oom-pattern`, so a
/// changed script or environment is never answered from the cache: each change misses; the
/// unchanged probe still hits.
#[test]
fn the_cache_key_of_a_command_covers_what_it_depends_on() {
    let d = tmp();
    let script = d.path().join("train.sh");
    let fits_to = |n: u32| {
        format!(
            "[ \"$1\" -le {n} ] || {}; exec {}\n",
            run_out_sh(),
            hold_sh("$1")
        )
    };
    std::fs::write(&script, fits_to(5)).unwrap();
    let other_dir = d.path().join("elsewhere");
    std::fs::create_dir(&other_dir).unwrap();
    let cache = fresh_cache_dir();
    let out = d.path().join("plan.json");
    // (env, cwd, flags) → answered from the cache?
    // (the fake runs out under RLIMIT_DATA only: under a memory cgroup its MemoryError comes at a
    // tiny peak, an error, not an out-of-memory, so that probe fails; only whether it came from the
    // cache is asked of it)
    let attempt =
        |env: &[(&str, &str)], cwd: &Path, flags: &[&str]| -> (std::process::Output, bool) {
            let mut c = batchfit();
            c.env("BATCHFIT_CACHE_DIR", &cache)
                .current_dir(cwd)
                .args([
                    "probe",
                    "--backend",
                    "cpu",
                    "--memory-budget",
                    "2GiB",
                    "--quiet",
                ])
                .args(["--max-batch", "8", "--out"])
                .arg(&out)
                // the fake writes no helper report: its cache answer needs a fingerprint file
                .arg("--fingerprint-file")
                .arg(&script)
                .args(flags)
                .args(["--exec", "--", "/bin/sh"])
                .arg(&script)
                .arg("{batch}");
            for (k, v) in env {
                c.env(k, v);
            }
            let o = c.output().unwrap();
            let hit = String::from_utf8_lossy(&o.stderr).contains("plan from cache");
            (o, hit)
        };
    let run = |env: &[(&str, &str)], cwd: &Path, flags: &[&str]| -> bool {
        let (o, hit) = attempt(env, cwd, flags);
        assert!(o.status.success(), "{o:?}");
        hit
    };
    let home = d.path();
    let rl = ["--cpu-limit", "rlimit"];
    assert!(!run(&[], home, &rl), "the first probe");
    assert!(run(&[], home, &rl), "unchanged: a hit");
    let p = read_json(&out);
    let auto = &p["model"]["auto_fingerprint_files"];
    assert_eq!(auto[0]["path"], "/bin/sh", "{auto}");
    assert_eq!(auto[1]["path"], script.display().to_string(), "{auto}");
    // the script's content
    std::fs::write(&script, fits_to(6)).unwrap();
    assert!(!run(&[], home, &rl), "a changed script");
    std::fs::write(&script, fits_to(5)).unwrap();
    assert!(run(&[], home, &rl), "the script as it was");
    // the working directory
    assert!(!run(&[], &other_dir, &rl), "another working directory");
    // the environment the command sees
    for (k, v) in [
        ("PYTHONPATH", "/somewhere"),
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("OMP_NUM_THREADS", "3"),
        ("BATCHFIT_MY_SETTING", "x"),
    ] {
        assert!(!run(&[(k, v)], home, &rl), "{k}={v}");
    }
    let path = format!("/nonexistent:{}", std::env::var("PATH").unwrap_or_default());
    assert!(!run(&[("PATH", &path)], home, &rl), "another PATH");
    // --oom-pattern
    assert!(
        !run(
            &[],
            home,
            &["--cpu-limit", "rlimit", "--oom-pattern", "OOM!"]
        ),
        "--oom-pattern"
    );
    // the limit mechanism (where a memory cgroup can be made)
    if memory_cgroup_parent().is_some() && unsafe { libc::geteuid() } == 0 {
        assert!(
            !attempt(&[], home, &["--cpu-limit", "cgroup"]).1,
            "a cgroup"
        );
    }
    assert!(run(&[], home, &rl), "all as it was: a hit");
}

/// A command printing 200 MB costs about what reading the output costs (a capture that moved half
/// its capacity for every 8 KiB read took 39 s), and the output's last line is still what the
/// trial's record says.
#[test]
fn a_flood_of_output_costs_no_more_than_reading_it() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let cmd = "yes 'a line of training output, step 1234, loss 0.5' | head -c 200000000; \
               echo 'the last line' >&2; exit 1";
    let t0 = Instant::now();
    let o = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--quiet",
        ])
        .args(["--cpu-limit", "rlimit", "--max-trials", "1", "--out"])
        .arg(&out)
        .args(["--exec", "--", "/bin/sh", "-c", cmd])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert!(!o.status.success(), "{o:?}");
    assert!(secs < 10.0, "took {secs:.1} s");
    let p = read_json(&d.path().join("plan.partial.json"));
    let msg = p["trials"][0]["message"].to_string();
    assert!(msg.contains("the last line"), "{msg}");
}

/// With --exec and --global-batch G, the search stops at G / world size by default and says so (no
/// micro-batch above it is ever used; --max-batch's default is 1,000,000), and --max-batch still
/// searches further.
#[test]
fn a_global_batch_caps_the_search_of_a_command() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let script = format!(
        "[ \"$1\" -le 100 ] || {}; exec {}",
        run_out_sh(),
        hold_sh("$1")
    );
    let cmd = ["/bin/sh", "-c", &script, "sh", "{batch}"];
    let run = |flags: &[&str]| {
        let a = batchfit()
            .args(["probe", "--backend", "cpu", "--memory-budget", "2GiB"])
            .args(["--cpu-limit", "rlimit", "--format", "json", "--out"])
            .arg(&out)
            .args(flags)
            .arg("--exec")
            .arg("--")
            .args(cmd)
            .assert()
            .success();
        (read_json(&out), stderr_of(&a))
    };
    let (p, err) = run(&["--global-batch", "16", "--world-size", "2"]);
    assert!(
        err.contains("the search stops at micro-batch 8 (--global-batch 16 / world size 2"),
        "{err}"
    );
    assert_eq!(p["search"]["max_batch"], 8);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 8);
    assert!(p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["batch"].as_u64().unwrap() <= 8));
    let (p, err) = run(&[
        "--global-batch",
        "16",
        "--world-size",
        "2",
        "--max-batch",
        "200",
    ]);
    assert!(!err.contains("the search stops"), "{err}");
    assert_eq!(p["recommendation"]["max_fitting_batch"], 100);
}

/// `{{batch}}` reaches the command as a literal `{batch}` (not `{<size>}`),
/// and the numbering is the documented one: trial N of the progress lines is logged as
/// `trial-00N-…` and runs with `BATCHFIT_TRIAL=N-1`.
#[test]
fn escaped_placeholders_and_trial_numbers() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let logs = d.path().join("logs");
    let script = format!(
        "echo \"got $1 $2 trial=$BATCHFIT_TRIAL\"; [ \"$1\" -le 3 ] || {}; exec {}",
        run_out_sh(),
        hold_sh("$1")
    );
    let a = batchfit()
        .args([
            "probe",
            "--backend",
            "cpu",
            "--memory-budget",
            "2GiB",
            "--max-batch",
            "8",
        ])
        .args(["--cpu-limit", "rlimit", "--format", "json", "--out"])
        .arg(&out)
        .arg("--logs")
        .arg(&logs)
        .args([
            "--exec",
            "--",
            "/bin/sh",
            "-c",
            &script,
            "sh",
            "{batch}",
            "{{batch}}",
        ])
        .assert()
        .success();
    let err = stderr_of(&a);
    let p = read_json(&out);
    assert_eq!(p["recommendation"]["max_fitting_batch"], 3);
    let trials = p["trials"].as_array().unwrap();
    for (i, t) in trials.iter().enumerate() {
        let n = i + 1;
        let b = t["batch"].as_u64().unwrap();
        assert!(
            err.contains(&format!("trial {n:>3}: batch {b:>8}")),
            "trial {n}, batch {b}: {err}"
        );
        let acc = t["accumulation"].as_u64().unwrap_or(1);
        let log = logs.join(format!("trial-{n:03}-b{b}-a{acc}.stdout"));
        let text =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert_eq!(text.trim(), format!("got {b} {{batch}} trial={}", n - 1));
    }
}

/// Two probes given one `--logs DIR` would write the same `trial-001-…` names, each overwriting the
/// other's logs, and a plan's `details.log` could name the other run's output. The first probe holds
/// the directory (`.batchfit-logs.lock`, an exclusive flock, until it exits); the second is refused
/// before any trial, exit 2, and the first goes on.
#[test]
fn two_probes_never_share_one_logs_directory() {
    let d = tmp();
    let logs = d.path().join("logs");
    let marker = format!("logs-lock-{}", std::process::id());
    let out_a = d.path().join("a.json");
    let script = "import time; time.sleep(3)";
    let mut a = batchfit_process(&marker)
        .args(probe_args(&out_a, "30"))
        .args(["--cpu-limit", "rlimit", "--logs"])
        .arg(&logs)
        .args(["--exec", "--", PY, "-c", script, "{batch}"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the first probe's first trial is running: its log exists
    let t0 = Instant::now();
    while !logs.join("trial-001-b1-a1.stdout").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the first probe never started its trial"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out_b = d.path().join("b.json");
    let b = batchfit()
        .args(probe_args(&out_b, "30"))
        .args(["--cpu-limit", "rlimit", "--logs"])
        .arg(&logs)
        .args(["--exec", "--", PY, "-c", script, "{batch}"])
        .assert()
        .code(2);
    let err = stderr_of(&b);
    assert!(err.contains("another batchfit probe"), "{err}");
    assert!(!out_b.exists());
    // the first probe's log is still its own, and it ends on its own
    let (status, _) = wait_within(&mut a, Duration::from_secs(60));
    assert!(status.code().is_some(), "{status:?}");
    assert!(survivors("time.sleep(3)", &marker).is_empty());
    // once it is gone, the directory is free again
    let out_c = d.path().join("c.json");
    let c = batchfit()
        .args(probe_args(&out_c, "30"))
        .args(["--cpu-limit", "rlimit", "--max-batch", "1", "--logs"])
        .arg(&logs)
        .args([
            "--exec",
            "--",
            PY,
            "-c",
            "import time; time.sleep(0.2)",
            "{batch}",
        ])
        .assert();
    let err = stderr_of(&c);
    assert!(!err.contains("another batchfit probe"), "{err}");
}

/// One writer per `--out`: a probe holds `.NAME.batchfit-lock` beside its plan (its pid inside) from
/// before its first trial to its exit, and a second probe given the same `--out` is refused before
/// any trial, exit 2, naming the lock file and its holder; the first goes on, and its lock file goes
/// with it.
#[test]
fn two_probes_never_write_one_out() {
    let d = tmp();
    let marker = format!("out-lock-{}", std::process::id());
    let out = d.path().join("plan.json");
    let lock = d.path().join(".plan.json.batchfit-lock");
    let touch_and_sleep = |name: &str| {
        format!(
            "import pathlib, time; pathlib.Path({:?}).touch(); time.sleep(3)",
            d.path().join(name)
        )
    };
    let mut a = batchfit_process(&marker)
        .args(probe_args(&out, "30"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY, "-c"])
        .args([touch_and_sleep("a-ran"), "{batch}".into()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !d.path().join("a-ran").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the first probe never started its trial"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap().trim(),
        a.id().to_string()
    );
    let b = batchfit()
        .args(probe_args(&out, "30"))
        .args(["--cpu-limit", "rlimit", "--exec", "--", PY, "-c"])
        .args([touch_and_sleep("b-ran"), "{batch}".into()])
        .assert()
        .code(2);
    let err = stderr_of(&b);
    assert!(
        err.contains("another batchfit probe is writing this plan")
            && err.contains(&lock.display().to_string())
            && err.contains(&format!("process {}", a.id())),
        "{err}"
    );
    assert!(
        !d.path().join("b-ran").exists(),
        "the second probe ran a trial"
    );
    let (status, _) = wait_within(&mut a, Duration::from_secs(60));
    assert_eq!(status.code(), Some(5), "--max-trials 2: {status:?}");
    assert!(survivors("time.sleep(3)", &marker).is_empty());
    let left: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!lock.exists(), "the lock file was left: {left:?}");
    assert!(d.path().join("plan.partial.json").exists(), "{left:?}");
}

/// Every trial of a command runs with `TMPDIR` (`TEMP`, `TMP`) set to a fresh directory of its own
/// under a per-probe directory in batchfit's own temporary directory, removed when the trial ends,
/// whatever its end: here a script that leaves a `tempfile.mkdtemp()` directory, a kept
/// `NamedTemporaryFile`, a `multiprocessing.Manager()`'s `pymp-*` directory and a directory it made
/// read-only, then fits (b ≤ 4), exits 3 without cleaning up (b ≤ 8) or runs out of memory. After
/// the probe, the `TMPDIR` batchfit itself was given is empty.
#[test]
fn trials_leave_nothing_in_the_temporary_directory() {
    let d = tmp();
    let tmpdir = d.path().join("tmp");
    std::fs::create_dir(&tmpdir).unwrap();
    let seen = d.path().join("seen.txt");
    let script = format!(
        r#"
import multiprocessing, os, sys, tempfile
b = int(sys.argv[1])
t = tempfile.gettempdir()
with open({seen:?}, "a") as f:
    f.write(t + "\n")
keep = tempfile.mkdtemp()
open(os.path.join(keep, "data"), "w").write("x" * 4096)
tempfile.NamedTemporaryFile(delete=False).write(b"y")
manager = multiprocessing.Manager()
os.makedirs(os.path.join(t, "ro", "inner"))
open(os.path.join(t, "ro", "inner", "f"), "w").write("z")
os.chmod(os.path.join(t, "ro"), 0o500)
if b > 8:
    hog = b"x" * (b << 26)
if b > 4:
    os._exit(3)
"#,
        seen = seen.display().to_string()
    );
    let out = d.path().join("plan.json");
    let o = batchfit()
        .env("TMPDIR", &tmpdir)
        .args(["probe", "--backend", "cpu", "--memory-budget", "512MiB"])
        .args(["--margin", "0", "--quiet", "--max-batch", "16"])
        .args(["--trial-timeout", "60", "--out"])
        .arg(&out)
        .args(["--exec", "--", PY, "-c", &script, "{batch}"])
        .output()
        .unwrap();
    assert!(matches!(o.status.code(), Some(0) | Some(4)), "{o:?}");
    let plan = if out.exists() {
        read_json(&out)
    } else {
        read_json(&d.path().join("plan.partial.json"))
    };
    let trials = plan["trials"].as_array().unwrap();
    let left: Vec<PathBuf> = std::fs::read_dir(&tmpdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    for outcome in ["fits", "oom", "error"] {
        assert!(
            trials.iter().any(|t| t["outcome"] == outcome),
            "no {outcome}: {plan}"
        );
    }
    // each trial had a directory of its own, under batchfit's per-probe directory in TMPDIR
    let dirs: Vec<String> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(dirs.len(), trials.len(), "{dirs:?}");
    let mut distinct = dirs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), dirs.len(), "{dirs:?}");
    for t in &dirs {
        assert!(
            Path::new(t).starts_with(&tmpdir) && t.contains("batchfit-tmp-"),
            "{t}"
        );
    }
}

/// A batchfit killed by SIGKILL runs no clean-up: its running trial dies with it (the kernel's
/// parent-death signal), and the lock files it leaves beside `--out` and in `--logs` (their flock
/// went with the process) do not refuse the next probe of the same plan and logs.
#[test]
fn a_killed_probe_takes_its_trial_with_it_and_leaves_no_lock_held() {
    let d = tmp();
    let logs = d.path().join("logs");
    let marker = format!("killed-probe-{}", std::process::id());
    let out = d.path().join("plan.json");
    let ran = d.path().join("a-ran");
    let script = format!("import pathlib, time; pathlib.Path({ran:?}).touch(); time.sleep(120)");
    let mut a = batchfit_process(&marker)
        .args(probe_args(&out, "300"))
        .args(["--cpu-limit", "rlimit", "--logs"])
        .arg(&logs)
        .args(["--exec", "--", PY, "-c", &script, "{batch}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ran.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the probe never started its trial"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let trial: Vec<u32> = processes_with("time.sleep(120)")
        .into_iter()
        .filter(|&p| p != a.id() && environ_has(p, &marker))
        .collect();
    assert_eq!(trial.len(), 1, "{trial:?}");
    a.kill().unwrap();
    a.wait().unwrap();
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{}", trial[0])).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", trial[0])).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    {
        if t0.elapsed() > Duration::from_secs(2) {
            let left = survivors("time.sleep(120)", &marker);
            panic!("the trial outlived its killed probe by 2 s: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // the killed probe could not remove its lock files; they name a dead process and lock nothing
    let lock = d.path().join(".plan.json.batchfit-lock");
    assert!(lock.exists() && logs.join(".batchfit-logs.lock").exists());
    let b = batchfit()
        .args(probe_args(&out, "30"))
        .args(["--cpu-limit", "rlimit", "--max-batch", "1", "--logs"])
        .arg(&logs)
        .args([
            "--exec",
            "--",
            PY,
            "-c",
            "import time; time.sleep(0.2)",
            "{batch}",
        ])
        .assert();
    let err = stderr_of(&b);
    assert_ne!(b.get_output().status.code(), Some(2), "{err}");
    assert!(!err.contains("another batchfit probe"), "{err}");
    assert!(
        out.exists() || d.path().join("plan.partial.json").exists(),
        "{err}"
    );
}

/// Starts the probe `cmd` and kills it outright (SIGKILL) once its trial has created `ran`.
fn sigkill_once_a_trial_ran(mut cmd: Command, ran: &Path) {
    let mut a = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ran.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no trial started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: killing our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
    a.wait().unwrap();
}

/// A probe killed outright (SIGKILL: a scheduler's time limit, the OOM killer) removes nothing: its
/// `--logs` lock file, its `--out` lock file and its scratch directories in `TMPDIR` stay. The next
/// probe given the same places removes them: after it, nothing of the killed one is left.
#[test]
fn what_a_killed_probe_left_is_removed_by_the_next() {
    let d = tmp();
    let tmpdir = d.path().join("tmp");
    let logs = d.path().join("logs");
    std::fs::create_dir(&tmpdir).unwrap();
    let out = d.path().join("plan.json");
    let marker = format!("sigkill-{}", std::process::id());
    let ran = d.path().join("ran");
    let sleep = format!(
        "import pathlib, time; pathlib.Path({:?}).touch(); time.sleep(30)",
        ran
    );
    let mut a = batchfit_process(&marker);
    a.env("TMPDIR", &tmpdir)
        .args(probe_args(&out, "60"))
        .arg("--logs")
        .arg(&logs)
        .args([
            "--cpu-limit",
            "rlimit",
            "--exec",
            "--",
            PY,
            "-c",
            &sleep,
            "{batch}",
        ]);
    sigkill_once_a_trial_ran(a, &ran);
    survivors("time.sleep(30)", &marker);
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let left = names(&tmpdir);
    assert!(
        left.iter().any(|n| n.starts_with("batchfit-tmp-"))
            && left.iter().any(|n| n.starts_with("batchfit-reports-")),
        "{left:?}"
    );
    assert!(logs.join(".batchfit-logs.lock").exists());
    assert!(d.path().join(".plan.json.batchfit-lock").exists());
    batchfit_process(&marker)
        .env("TMPDIR", &tmpdir)
        .args(probe_args(&out, "60"))
        .arg("--logs")
        .arg(&logs)
        .args([
            "--cpu-limit",
            "rlimit",
            "--exec",
            "--",
            "/bin/sh",
            "-c",
            "exit 1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(names(&tmpdir), Vec::<String>::new(), "left in TMPDIR");
    let logs_left = names(&logs);
    assert!(
        !logs_left.iter().any(|n| n.ends_with(".lock")),
        "{logs_left:?}"
    );
    assert!(!d.path().join(".plan.json.batchfit-lock").exists());
}

/// A probe killed outright leaves its trial's children running (only the trial's root dies with
/// it): the next probe ends every process that a trial of a batchfit that is gone left, before its
/// own first trial.
#[test]
fn the_processes_a_killed_probes_trial_left_are_ended_by_the_next_probe() {
    let d = tmp();
    let out = d.path().join("plan.json");
    let marker = format!("abandoned-{}", std::process::id());
    let ran = d.path().join("ran");
    let job = format!(
        "import os, pathlib, subprocess, sys, time\n\
         subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(67)'])\n\
         pathlib.Path({:?}).touch()\n\
         time.sleep(30)",
        ran
    );
    let mut a = batchfit_process(&marker);
    a.args(probe_args(&out, "60")).args([
        "--cpu-limit",
        "rlimit",
        "--exec",
        "--",
        PY,
        "-c",
        &job,
        "{batch}",
    ]);
    sigkill_once_a_trial_ran(a, &ran);
    let left = || -> Vec<u32> {
        processes_with("time.sleep(67)")
            .into_iter()
            .filter(|&p| environ_has(p, &marker))
            .collect()
    };
    assert!(
        !left().is_empty(),
        "the killed probe's trial left nothing to end"
    );
    batchfit_process(&marker)
        .args(probe_args(&d.path().join("next.json"), "60"))
        .args([
            "--cpu-limit",
            "rlimit",
            "--exec",
            "--",
            "/bin/sh",
            "-c",
            "exit 1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let t0 = Instant::now();
    while !left().is_empty() && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors_left = survivors("time.sleep(67)", &marker);
    survivors("time.sleep(30)", &marker);
    assert_eq!(
        survivors_left,
        Vec::<u32>::new(),
        "left running after the next probe"
    );
}

/// Whether `pid` is gone or a zombie within 2 s.
fn ends_within_2_s(pid: u32) -> bool {
    let t0 = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            return true;
        }
        if t0.elapsed() > Duration::from_secs(2) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Under `RLIMIT_DATA` a Python job's trials after the first are forked from a fork server, and a
/// forked trial is not batchfit's spawn (the parent-death signal a spawn gets is cleared by a fork):
/// a batchfit killed by SIGKILL still takes the forked trial with it, and the fork server too.
#[test]
fn a_killed_probe_takes_its_forked_trial_and_its_fork_server_with_it() {
    let d = tmp();
    let marker = format!("killed-fork-{}", std::process::id());
    let out = d.path().join("plan.json");
    let ran = d.path().join("forked-pid");
    let script = d.path().join("job.py");
    std::fs::write(
        &script,
        format!(
            "import os, pathlib, sys, time\n\
             sys.path.insert(0, {helper:?})\n\
             import batchfit_trial as bt\n\
             b = bt.batch_size()\n\
             if b > 1:\n\
             \x20   pathlib.Path({ran:?}).write_text(str(os.getpid()))\n\
             \x20   time.sleep(120)\n\
             bt.report(batch=b, steps=bt.steps())\n",
            helper = repo().join("python/batchfit"),
        ),
    )
    .unwrap();
    let mut a = batchfit_process(&marker)
        .args(probe_args(&out, "300"))
        .args(["--cpu-limit", "rlimit", "--warm", "on", "--exec", "--", PY])
        .arg(&script)
        .args(["--batch-size", "{batch}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let pid: u32 = loop {
        if let Some(p) = std::fs::read_to_string(&ran)
            .ok()
            .and_then(|s| s.parse().ok())
        {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no second trial started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let cmdline = |p: u32| {
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default())
            .into_owned()
    };
    // forked from the server: the server's command line, batchfit (the subreaper) its parent
    assert!(cmdline(pid).contains("serve"), "{}", cmdline(pid));
    let servers: Vec<u32> = processes_with("serve")
        .into_iter()
        .filter(|&p| p != pid && environ_has(p, &marker) && cmdline(p).contains("_batchfit_warm"))
        .collect();
    assert_eq!(servers.len(), 1, "{servers:?}");
    a.kill().unwrap();
    a.wait().unwrap();
    let trial_ended = ends_within_2_s(pid);
    let server_ended = ends_within_2_s(servers[0]);
    let left = survivors("_batchfit_warm", &marker);
    assert!(trial_ended && server_ended, "left running: {left:?}");
}
