//! Running one trial child process: spawn in its own process group with a memory limit, wait with a
//! timeout while watching for SIGINT/SIGTERM, kill the whole group when needed, and classify the result.
//! Shared by the process-isolated backends (cpu now, cuda later).

use super::{BackendError, TrialOutcome};
use crate::trial::{RESULT_PREFIX, STARTED_MARKER};
use crate::{interrupt, oom};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kills a process group.
fn kill_group(pgid: u32) {
    // SAFETY: sending a signal.
    unsafe {
        libc::kill(-(pgid as i32), libc::SIGKILL);
    }
}

fn oom_kills() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/vmstat").ok()?;
    t.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok())
}

fn read_all(mut r: impl Read + Send + 'static, cap: usize) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > cap {
                // keep the head (markers, first error) and the tail
                let tail = buf.split_off(buf.len() - cap / 2);
                buf.truncate(cap / 2);
                buf.extend_from_slice(b"\n[...]\n");
                buf.extend_from_slice(&tail);
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Runs `cmd` as a trial child under `RLIMIT_DATA = data_limit` (if any) and classifies its report.
pub fn run_trial_child(
    mut cmd: Command,
    data_limit: Option<u64>,
    timeout: Duration,
) -> Result<TrialOutcome, BackendError> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.env("RUST_BACKTRACE", "0").env("RUST_LIB_BACKTRACE", "0");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &core);
            if let Some(l) = data_limit {
                let lim = libc::rlimit { rlim_cur: l as libc::rlim_t, rlim_max: l as libc::rlim_t };
                if libc::setrlimit(libc::RLIMIT_DATA, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let kills_before = oom_kills();
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| BackendError::Environment(format!("cannot start a trial process: {e}")))?;
    let pid = child.id();
    let out = read_all(child.stdout.take().expect("piped"), 1 << 20);
    let err = read_all(child.stderr.take().expect("piped"), 64 << 10);
    let status = loop {
        if let Some(sig) = interrupt::pending() {
            kill_group(pid);
            let _ = child.wait();
            return Err(BackendError::Interrupted(sig));
        }
        if t0.elapsed() >= timeout {
            kill_group(pid);
            let _ = child.wait();
            let _ = (out.join(), err.join());
            return Ok(TrialOutcome::Timeout { seconds: t0.elapsed().as_secs_f64() });
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(BackendError::Environment(format!("waiting for a trial process: {e}"))),
        }
    };
    // Anything the child left in its group goes too.
    kill_group(pid);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let started = stdout.lines().any(|l| l == STARTED_MARKER);
    let result = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
    if status.success() {
        if let Some(json) = result {
            return Ok(serde_json::from_str(json).unwrap_or_else(|e| TrialOutcome::Error {
                message: format!("unreadable trial result ({e}): {json}"),
            }));
        }
        return Ok(TrialOutcome::Error {
            message: format!("the trial process exited without a result; stderr: {}", oom::first_line(&stderr)),
        });
    }
    let what = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    };
    if status.signal() == Some(libc::SIGKILL) {
        let after = oom_kills();
        if let (Some(a), Some(b)) = (after, kills_before) {
            if a > b {
                return Ok(TrialOutcome::Oom {
                    message: "killed by the kernel's OOM killer".into(),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                });
            }
        }
    }
    if oom::is_oom(&stderr) {
        if !started {
            return Ok(TrialOutcome::Error {
                message: format!(
                    "the trial process ran out of memory before it started ({what}): the memory limit is below \
                     what libtorch itself needs (about 600 MiB of data segment); raise --memory-budget"
                ),
            });
        }
        return Ok(TrialOutcome::Oom { message: oom::first_line(&stderr), peak_bytes: None, rss_peak_bytes: None });
    }
    Ok(TrialOutcome::Error {
        message: format!("the trial process died ({what}) without a result; stderr: {}", oom::first_line(&stderr)),
    })
}
