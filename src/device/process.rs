//! The one runner of trial processes: spawn in their own process group under a memory limit, wait
//! with a timeout while watching for SIGINT/SIGTERM, kill the whole group when needed, and hand what
//! came back ([`Finished`]) to the workload, which says what it means.
//! Two shapes: [`run`] (a fresh process per trial, the proof) and [`Worker`] (one long-lived process
//! for exploration trials, `--isolation hybrid`). Shared by the cpu and cuda devices.

use super::BackendError;
use crate::platform::interrupt;
use crate::protocol::{Finished, TreeMeasure, TrialOutcome, RESULT_PREFIX};
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

fn read_all(
    mut r: impl Read + Send + 'static,
    cap: usize,
    mut log: Option<std::fs::File>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if let Some(f) = log.as_mut() {
                // a log that cannot be written must not stop the trial: drop it
                if f.write_all(&chunk[..n]).is_err() {
                    log = None;
                }
            }
            push_capped(&mut buf, &chunk[..n], cap);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// How a trial process is started and watched.
#[derive(Debug, Default)]
pub struct Options<'a> {
    /// `RLIMIT_DATA` of the process (inherited by every process it starts).
    pub data_limit: Option<u64>,
    /// The memory cgroup the process joins before exec (and with it all it starts).
    pub cgroup: Option<&'a super::cgroup::Group>,
    /// Follow and measure the whole process tree (a user's command; a tch child measures itself).
    pub tree: bool,
    /// Keep the whole output in this file (stdout and stderr as they come).
    pub log: Option<std::path::PathBuf>,
    /// batchfit's own child: Rust backtraces off (a backtrace printed at an OOM can deadlock).
    pub own_child: bool,
}

/// Spawns `cmd` in its own session (and process group), stdin as given, without core dumps, under
/// the limits of `opts`.
fn spawn_limited(mut cmd: Command, opts: &Options, stdin: Stdio) -> Result<Child, BackendError> {
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if opts.own_child {
        cmd.env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0");
    }
    let data_limit = opts.data_limit;
    let procs = opts.cgroup.map(|g| g.procs_path().clone());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                libc::setpgid(0, 0);
            }
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
            if let Some(p) = &procs {
                super::cgroup::join(p)?;
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

/// Waits for `pid` (without blocking unless `block`): its exit status and the kernel's high-water
/// mark of its resident memory (`ru_maxrss`, which includes the children it waited for).
fn reap(pid: u32, block: bool) -> std::io::Result<Option<(ExitStatus, u64)>> {
    let mut status = 0;
    // SAFETY: wait4 with valid pointers on our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        let r = unsafe { libc::wait4(pid as i32, &mut status, flags, &mut ru) };
        if r == 0 {
            return Ok(None);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(Some((
            ExitStatus::from_raw(status),
            (ru.ru_maxrss.max(0) as u64) * 1024,
        )));
    }
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

/// Runs `cmd` as a fresh trial process as `opts` say, calling `sample(pids)` about every 5 ms while
/// it runs with the PIDs of the trial (its tree when `opts.tree`; the cuda device sums NVML over them).
pub fn run(
    cmd: Command,
    opts: &Options,
    timeout: Duration,
    sample: &mut dyn FnMut(&[u32]),
) -> Result<Ran, BackendError> {
    let kills_before = oom_kills();
    let t0 = Instant::now();
    let log = |suffix: &str| {
        opts.log.as_ref().and_then(|p| {
            let mut name = p.clone().into_os_string();
            name.push(suffix);
            std::fs::File::create(name).ok()
        })
    };
    let mut child = spawn_limited(cmd, opts, Stdio::null())?;
    let pid = child.id();
    let mut tree = opts.tree.then(|| super::tree::Tree::new(pid));
    let out = read_all(child.stdout.take().expect("piped"), 1 << 20, log(".stdout"));
    let err = read_all(
        child.stderr.take().expect("piped"),
        64 << 10,
        log(".stderr"),
    );
    // Everything the trial started goes, whatever happens: its group, its tree, its cgroup.
    let kill_everything = |tree: &Option<super::tree::Tree>| {
        kill_group(pid);
        if let Some(t) = tree {
            t.kill_all();
        }
        if let Some(g) = opts.cgroup {
            g.kill_all();
        }
    };
    let status = loop {
        if let Some(sig) = interrupt::pending() {
            kill_everything(&tree);
            let _ = child.wait();
            return Err(BackendError::Interrupted(sig));
        }
        if t0.elapsed() >= timeout {
            kill_everything(&tree);
            let _ = child.wait();
            let _ = (out.join(), err.join());
            return Ok(Ran::TimedOut {
                seconds: t0.elapsed().as_secs_f64(),
            });
        }
        match reap(pid, false) {
            Ok(Some(s)) => break s,
            Ok(None) => {
                match tree.as_mut() {
                    Some(t) => {
                        t.sample();
                        sample(&t.live_pids());
                    }
                    None => sample(&[pid]),
                }
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => {
                return Err(BackendError::Environment(format!(
                    "waiting for a trial process: {e}"
                )))
            }
        }
    };
    let (status, root_maxrss) = status;
    let seconds = t0.elapsed().as_secs_f64();
    kill_everything(&tree);
    let cgroup_oom = opts.cgroup.is_some_and(|g| g.oom_kills() > 0);
    let measure = TreeMeasure {
        data_peak: tree.as_ref().map(|t| t.data_peak).filter(|&b| b > 0),
        data_limit: opts.data_limit,
        // the kernel's own high-water mark of the root (and its reaped children) covers a process
        // that ended before the first sample
        rss_peak: tree
            .as_ref()
            .map(|t| t.rss_peak.max(root_maxrss))
            .filter(|&b| b > 0),
        cgroup_peak: opts.cgroup.and_then(|g| g.peak()),
        processes: tree.as_ref().map_or(1, |t| t.seen()),
        seconds,
        log: opts.log.clone(),
    };
    Ok(Ran::Finished(Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        kernel_oom_kill: cgroup_oom || killed_by_kernel(status, kills_before, oom_kills()),
        measure,
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
        let opts = Options {
            data_limit,
            own_child: true,
            ..Default::default()
        };
        let mut child = spawn_limited(cmd, &opts, Stdio::piped())?;
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
            measure: TreeMeasure::default(),
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
