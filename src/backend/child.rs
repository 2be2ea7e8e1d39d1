//! Trial processes: spawn in their own process group under a memory limit, wait with a timeout while
//! watching for SIGINT/SIGTERM, kill the whole group when needed, and classify what came back.
//! Two shapes: [`run_trial_child`] (a fresh process per trial, the proof) and [`Worker`] (one
//! long-lived process for exploration trials, `--isolation hybrid`). Shared by process-isolated
//! backends.

use super::{BackendError, TrialOutcome};
use crate::trial::{RESULT_PREFIX, STARTED_MARKER};
use crate::{interrupt, oom};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
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
    t.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// Keeps the head and the tail of a stream, at most `cap` bytes.
fn push_capped(buf: &mut Vec<u8>, data: &[u8], cap: usize) {
    buf.extend_from_slice(data);
    if buf.len() > cap {
        let tail = buf.split_off(buf.len() - cap / 2);
        buf.truncate(cap / 2);
        buf.extend_from_slice(b"\n[...]\n");
        buf.extend_from_slice(&tail);
    }
}

fn read_all(mut r: impl Read + Send + 'static, cap: usize) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            push_capped(&mut buf, &chunk[..n], cap);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Spawns `cmd` in its own process group, without core dumps, under `RLIMIT_DATA = data_limit`.
fn spawn_limited(
    mut cmd: Command,
    data_limit: Option<u64>,
    stdin: Stdio,
) -> Result<Child, BackendError> {
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            let core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &core);
            if let Some(l) = data_limit {
                let lim = libc::rlimit {
                    rlim_cur: l as libc::rlim_t,
                    rlim_max: l as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| BackendError::Environment(format!("cannot start a trial process: {e}")))
}

/// What a process that ended (during a trial) means for that trial.
fn classify_exit(
    status: ExitStatus,
    started: bool,
    result: Option<&str>,
    stderr: &str,
    kills_before: Option<u64>,
) -> TrialOutcome {
    classify_exit_with(status, started, result, stderr, kills_before, oom_kills())
}

/// [`classify_exit`] with the kernel's OOM-kill counter after the exit given (testable).
fn classify_exit_with(
    status: ExitStatus,
    started: bool,
    result: Option<&str>,
    stderr: &str,
    kills_before: Option<u64>,
    kills_after: Option<u64>,
) -> TrialOutcome {
    if status.success() {
        if let Some(json) = result {
            return serde_json::from_str(json).unwrap_or_else(|e| TrialOutcome::Error {
                message: format!("unreadable trial result ({e}): {json}"),
            });
        }
        return TrialOutcome::Error {
            message: format!(
                "the trial process exited without a result; stderr: {}",
                oom::first_line(stderr)
            ),
        };
    }
    let what = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    };
    if status.signal() == Some(libc::SIGKILL) {
        if let (Some(a), Some(b)) = (kills_after, kills_before) {
            if a > b {
                return TrialOutcome::Oom {
                    message: "killed by the kernel's OOM killer".into(),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                    gpu: None,
                };
            }
        }
    }
    if oom::is_oom(stderr) {
        if !started {
            return TrialOutcome::Error {
                message: format!(
                    "the trial process ran out of memory before it started ({what}): the memory limit is below \
                     what libtorch itself needs (about 600 MiB of data segment); raise --memory-budget"
                ),
            };
        }
        return TrialOutcome::Oom {
            message: oom::first_line(stderr),
            peak_bytes: None,
            rss_peak_bytes: None,
            gpu: None,
        };
    }
    TrialOutcome::Error {
        message: format!(
            "the trial process died ({what}) without a result; stderr: {}",
            oom::first_line(stderr)
        ),
    }
}

/// Runs `cmd` as a fresh trial child under `RLIMIT_DATA = data_limit` and classifies its report.
pub fn run_trial_child(
    cmd: Command,
    data_limit: Option<u64>,
    timeout: Duration,
) -> Result<TrialOutcome, BackendError> {
    run_trial_child_sampled(cmd, data_limit, timeout, &mut |_| {})
}

/// [`run_trial_child`], calling `sample(pid)` about every 5 ms while the child runs (the cuda backend
/// samples NVML's used memory of the trial's process there).
pub fn run_trial_child_sampled(
    cmd: Command,
    data_limit: Option<u64>,
    timeout: Duration,
    sample: &mut dyn FnMut(u32),
) -> Result<TrialOutcome, BackendError> {
    let kills_before = oom_kills();
    let t0 = Instant::now();
    let mut child = spawn_limited(cmd, data_limit, Stdio::null())?;
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
            return Ok(TrialOutcome::Timeout {
                seconds: t0.elapsed().as_secs_f64(),
            });
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {
                sample(pid);
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => {
                return Err(BackendError::Environment(format!(
                    "waiting for a trial process: {e}"
                )))
            }
        }
    };
    // Anything the child left in its group goes too.
    kill_group(pid);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let started = stdout.lines().any(|l| l == STARTED_MARKER);
    let result = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
    Ok(classify_exit(
        status,
        started,
        result,
        &stderr,
        kills_before,
    ))
}

/// A long-lived trial process: one trial spec per stdin line, one result line per trial on stdout.
/// Exploration only: it saves the process and libtorch start of every trial, at the price of state
/// carried between trials, so the proof always re-runs in fresh processes.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Vec<u8>>>,
    started: bool,
}

impl Worker {
    pub fn start(cmd: Command, data_limit: Option<u64>) -> Result<Worker, BackendError> {
        let mut child = spawn_limited(cmd, data_limit, Stdio::piped())?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut err_pipe = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = err_pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                push_capped(
                    &mut sink.lock().unwrap_or_else(|e| e.into_inner()),
                    &chunk[..n],
                    64 << 10,
                );
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            stderr,
            started: false,
        })
    }

    fn kill(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }

    /// Runs one trial. `Ok(outcome, alive)`: whether the worker can take another trial.
    pub fn run(
        &mut self,
        spec_json: &str,
        timeout: Duration,
    ) -> Result<(TrialOutcome, bool), BackendError> {
        let kills_before = oom_kills();
        let t0 = Instant::now();
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if writeln!(self.stdin, "{spec_json}")
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            // It died between trials; classify from its exit.
            return Ok((self.died(kills_before), false));
        }
        loop {
            if let Some(sig) = interrupt::pending() {
                self.kill();
                return Err(BackendError::Interrupted(sig));
            }
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                self.kill();
                return Ok((
                    TrialOutcome::Timeout {
                        seconds: t0.elapsed().as_secs_f64(),
                    },
                    false,
                ));
            }
            match self.lines.recv_timeout(left.min(Duration::from_millis(20))) {
                Ok(line) if line == STARTED_MARKER => self.started = true,
                Ok(line) => {
                    if let Some(json) = line.strip_prefix(RESULT_PREFIX) {
                        let o =
                            serde_json::from_str(json).unwrap_or_else(|e| TrialOutcome::Error {
                                message: format!("unreadable trial result ({e}): {json}"),
                            });
                        return Ok((o, true));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Ok((self.died(kills_before), false))
                }
            }
        }
    }

    fn died(&mut self, kills_before: Option<u64>) -> TrialOutcome {
        let status = match self.child.wait() {
            Ok(s) => s,
            Err(e) => {
                return TrialOutcome::Error {
                    message: format!("lost the worker process: {e}"),
                }
            }
        };
        kill_group(self.child.id());
        let stderr =
            String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned();
        match classify_exit(status, self.started, None, &stderr, kills_before) {
            // A worker never exits cleanly in the middle of a trial.
            TrialOutcome::Error { message } if status.success() => TrialOutcome::Error { message },
            o => o,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A SIGKILL counts as an OOM only when the kernel's OOM-kill counter (`oom_kill` in /proc/vmstat)
    /// rose during the trial; any other SIGKILL (a user, a timeout elsewhere) is an error, never proof.
    #[test]
    fn kernel_oom_kill_is_an_oom_other_kills_are_errors() {
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        let o = classify_exit_with(killed, true, None, "", Some(7), Some(8));
        assert!(o.is_oom(), "{o:?}");
        assert!(o.message().unwrap().contains("OOM killer"));
        let o = classify_exit_with(killed, true, None, "", Some(7), Some(7));
        assert_eq!(o.kind(), "error", "{o:?}");
        // no counter readable: not evidence either
        let o = classify_exit_with(killed, true, None, "", None, None);
        assert_eq!(o.kind(), "error", "{o:?}");
        // a SIGSEGV is an error even if the counter moved (another process was OOM-killed)
        let o = classify_exit_with(
            ExitStatus::from_raw(libc::SIGSEGV),
            true,
            None,
            "",
            Some(1),
            Some(2),
        );
        assert_eq!(o.kind(), "error", "{o:?}");
        // the real counter is readable on Linux
        assert!(oom_kills().is_some(), "/proc/vmstat has no oom_kill line");
    }
}
