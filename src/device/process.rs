//! The one runner of trial processes: spawn in their own process group under a memory limit, wait
//! with a timeout while watching for SIGINT/SIGTERM, kill the whole group when needed, and hand what
//! came back ([`Finished`]) to the workload, which says what it means.
//! Two shapes: [`run`] (a fresh process per trial, the proof) and [`Worker`] (one long-lived process
//! for exploration trials, `--isolation hybrid`). Shared by the cpu and cuda devices.

use super::BackendError;
use crate::platform::interrupt;
use crate::protocol::{Finished, TrialOutcome, RESULT_PREFIX};
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

/// Whether the kernel's OOM killer killed a process that ended with `status`: it died by SIGKILL and
/// the kernel's `oom_kill` counter rose meanwhile (any other SIGKILL is not evidence).
fn killed_by_kernel(status: ExitStatus, before: Option<u64>, after: Option<u64>) -> bool {
    status.signal() == Some(libc::SIGKILL) && matches!((before, after), (Some(b), Some(a)) if a > b)
}

/// How a trial process ended.
#[derive(Debug)]
pub enum Ran {
    Finished(Finished),
    /// Killed after the trial timeout.
    TimedOut {
        seconds: f64,
    },
}

/// Runs `cmd` as a fresh trial process under `RLIMIT_DATA = data_limit`, calling `sample(pid)` about
/// every 5 ms while it runs (the cuda device samples NVML there).
pub fn run(
    cmd: Command,
    data_limit: Option<u64>,
    timeout: Duration,
    sample: &mut dyn FnMut(u32),
) -> Result<Ran, BackendError> {
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
            return Ok(Ran::TimedOut {
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
    Ok(Ran::Finished(Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        kernel_oom_kill: killed_by_kernel(status, kills_before, oom_kills()),
    }))
}

/// A long-lived trial process: one request per stdin line, one result line per trial on stdout.
/// Exploration only: it saves the process and libtorch start of every trial, at the price of state
/// carried between trials, so the proof always re-runs in fresh processes.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Lines it printed that were not results (the started marker, its own messages).
    stdout: String,
}

/// What one request to a [`Worker`] came to.
pub enum WorkerRan {
    /// A result line; the worker can take another request.
    Result(TrialOutcome),
    /// The worker died: what its end means is the workload's to say.
    Died(Finished),
    TimedOut {
        seconds: f64,
    },
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
            stdout: String::new(),
        })
    }

    fn kill(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }

    /// Sends one request line and waits (up to `timeout`) for its result.
    pub fn run(&mut self, request: &str, timeout: Duration) -> Result<WorkerRan, BackendError> {
        let kills_before = oom_kills();
        let t0 = Instant::now();
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            // It died between trials.
            return Ok(WorkerRan::Died(self.died(kills_before)));
        }
        loop {
            if let Some(sig) = interrupt::pending() {
                self.kill();
                return Err(BackendError::Interrupted(sig));
            }
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                self.kill();
                return Ok(WorkerRan::TimedOut {
                    seconds: t0.elapsed().as_secs_f64(),
                });
            }
            match self.lines.recv_timeout(left.min(Duration::from_millis(20))) {
                Ok(line) => match crate::protocol::parse_result(&line) {
                    Some(o) => return Ok(WorkerRan::Result(o)),
                    None => {
                        self.stdout.push_str(&line);
                        self.stdout.push('\n');
                    }
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Ok(WorkerRan::Died(self.died(kills_before)))
                }
            }
        }
    }

    fn died(&mut self, kills_before: Option<u64>) -> Finished {
        let status = match self.child.wait() {
            Ok(s) => s,
            // Cannot happen for our own child; report it as a failure without a result.
            Err(_) => ExitStatus::from_raw(1 << 8),
        };
        kill_group(self.child.id());
        let stderr =
            String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned();
        Finished {
            status,
            // a worker never exits cleanly in the middle of a trial: no result line is passed on
            stdout: self.stdout.replace(RESULT_PREFIX, ""),
            stderr,
            kernel_oom_kill: killed_by_kernel(status, kills_before, oom_kills()),
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

    /// A SIGKILL counts as the kernel's OOM kill only when the kernel's OOM-kill counter (`oom_kill`
    /// in /proc/vmstat) rose during the trial; any other SIGKILL (a user, a timeout elsewhere) is not.
    #[test]
    fn kernel_oom_kill_needs_the_counter_and_a_sigkill() {
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert!(killed_by_kernel(killed, Some(7), Some(8)));
        assert!(!killed_by_kernel(killed, Some(7), Some(7)));
        // no counter readable: not evidence either
        assert!(!killed_by_kernel(killed, None, None));
        // a SIGSEGV is not, even if the counter moved (another process was OOM-killed)
        assert!(!killed_by_kernel(
            ExitStatus::from_raw(libc::SIGSEGV),
            Some(1),
            Some(2)
        ));
        // the real counter is readable on Linux
        assert!(oom_kills().is_some(), "/proc/vmstat has no oom_kill line");
    }
}
