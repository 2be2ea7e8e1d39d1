//! The one runner of trial processes: spawn in their own process group under a memory limit, wait
//! with a timeout while watching for SIGINT/SIGTERM, kill the whole group when needed, and hand what
//! came back ([`Finished`]) to the workload, which says what it means. Nothing a trial starts
//! outlives it: every process carries the trial's marker ([`TRIAL_MARKER`]), so a daemon that left
//! the session is measured with the tree while the trial runs and ended with it (recorded as what it
//! left behind), and [`end_all`] sweeps this batchfit's markers when it exits.
//! Two shapes: [`run`] (a fresh process per trial, the proof) and [`Worker`] (one long-lived process
//! for exploration trials, `--isolation hybrid`). Shared by the cpu and cuda devices.

mod fork;

pub use fork::ForkServer;

use super::tree::TrialIds;
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

/// What is kept of a stream: its first `cap / 2` bytes and, in a ring buffer, its last `cap / 2`
/// (the last lines say what went wrong). Each chunk costs its own length, whatever came before, so a
/// command printing hundreds of megabytes costs no more than reading them.
#[derive(Debug)]
struct Capture {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    cap: usize,
    /// Bytes between the head and the tail were dropped.
    dropped: bool,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            cap,
            dropped: false,
        }
    }

    fn push(&mut self, mut data: &[u8]) {
        let h = self.cap / 2;
        if self.head.len() < h {
            let n = (h - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        let t = self.cap - h;
        if data.is_empty() || t == 0 {
            self.dropped |= !data.is_empty();
            return;
        }
        if data.len() >= t {
            self.dropped |= !self.tail.is_empty() || data.len() > t;
            self.tail.clear();
            self.tail.extend(&data[data.len() - t..]);
            return;
        }
        let over = (self.tail.len() + data.len()).saturating_sub(t);
        if over > 0 {
            self.tail.drain(..over);
            self.dropped = true;
        }
        self.tail.extend(data);
    }

    fn clear(&mut self) {
        self.head.clear();
        self.tail.clear();
        self.dropped = false;
    }

    fn text(&self) -> String {
        let mut v = self.head.clone();
        if self.dropped {
            v.extend_from_slice(b"\n[...]\n");
        }
        v.extend(self.tail.iter());
        String::from_utf8_lossy(&v).into_owned()
    }
}

/// How long the output pipes are read after the trial's processes were ended: a process that escaped
/// every kill (a daemon that cleared its environment and left the session) may hold them open.
const DRAIN: Duration = Duration::from_secs(2);

/// How long the trial's leftover processes get after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_millis(500);

/// The environment variable that marks every process of a trial (inherited across `setsid` and
/// double forks), so that escaped daemons are found by a scan of `/proc`.
pub const TRIAL_MARKER: &str = "BATCHFIT_TRIAL_ID";

/// A stream being read in the background: what came so far, and whether it ended.
struct Reader {
    buf: Arc<Mutex<Capture>>,
    done: mpsc::Receiver<()>,
}

impl Reader {
    /// What was read, waiting until `deadline` at most for the stream's end.
    fn finish(self, deadline: Instant) -> String {
        let left = deadline.saturating_duration_since(Instant::now());
        let ended = self.done.recv_timeout(left).is_ok();
        let mut s = self.buf.lock().unwrap_or_else(|e| e.into_inner()).text();
        if !ended {
            s.push_str(
                "\n[batchfit: the output was still open after the trial's processes were ended; \
                 not read further]\n",
            );
        }
        s
    }
}

fn read_all(mut r: impl Read + Send + 'static, cap: usize, log: LogSlot) -> Reader {
    let buf = Arc::new(Mutex::new(Capture::new(cap)));
    let sink = Arc::clone(&buf);
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = log.as_mut() {
                // a log that cannot be written must not stop the trial: drop it
                if f.write_all(&chunk[..n]).is_err() {
                    *log = None;
                }
            }
            drop(log);
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(&chunk[..n]);
        }
        let _ = tx.send(());
    });
    Reader { buf, done }
}

/// Clock ticks since boot now (the unit of a process's start time in `/proc/PID/stat`).
fn ticks_now() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0, |up| (up * hz) as u64)
}

/// Every live process of a trial: its session, process group and marker ([`TrialIds::processes`]:
/// daemons that left the session carry the marker), its followed tree and its cgroup; only
/// processes started since the trial began, and never batchfit itself.
fn trial_processes(
    trial: &TrialIds,
    tree: Option<&super::tree::Tree>,
    cgroup: Option<&super::cgroup::Group>,
) -> Vec<u32> {
    let me = std::process::id();
    let mut v = trial.processes();
    if let Some(t) = tree {
        v.extend(t.live_pids());
        v.extend(t.disputed_alive());
    }
    if let Some(g) = cgroup {
        v.extend(g.pids());
    }
    v.sort_unstable();
    v.dedup();
    v.retain(|&p| p != me);
    v
}

/// What [`end_trial`] found and did: the processes it found running (`pid N (name)`), and whether
/// none was left at the end.
#[derive(Debug, Default)]
struct Ended {
    found: Vec<String>,
    all_gone: bool,
}

/// Ends every process of a trial: SIGTERM, then SIGKILL after [`GRACE`] to those left, until none is
/// found (bounded: a process stuck in the kernel cannot be waited for forever).
fn end_trial(
    trial: &TrialIds,
    tree: Option<&super::tree::Tree>,
    cgroup: Option<&super::cgroup::Group>,
) -> Ended {
    let signal = |pids: &[u32], sig: i32| {
        for &p in pids {
            // SAFETY: sending a signal to a process of the trial (found above, started after it).
            unsafe {
                libc::kill(p as i32, sig);
            }
        }
    };
    let found = trial_processes(trial, tree, cgroup);
    let mut ended = Ended {
        found: found.iter().map(|&p| super::tree::describe(p)).collect(),
        all_gone: true,
    };
    if found.is_empty() {
        return ended;
    }
    signal(&found, libc::SIGTERM);
    let t0 = Instant::now();
    while t0.elapsed() < GRACE {
        std::thread::sleep(Duration::from_millis(20));
        if trial_processes(trial, tree, cgroup).is_empty() {
            return ended;
        }
    }
    for _ in 0..100 {
        kill_group(trial.root);
        if let Some(t) = tree {
            t.kill_all();
        }
        if let Some(g) = cgroup {
            g.kill_all();
        }
        let left = trial_processes(trial, tree, cgroup);
        if left.is_empty() {
            return ended;
        }
        signal(&left, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(20));
    }
    ended.all_gone = false;
    ended
}

/// What the end of a trial whose root had exited found ([`Ended`]): the record of what it left
/// running, and (into `left_behind`) the processes the tree had not named (started meanwhile).
fn record_left_behind(
    ended: Ended,
    left_behind: &mut Vec<String>,
) -> Option<crate::protocol::LeftBehind> {
    if ended.found.is_empty() {
        return None;
    }
    for p in &ended.found {
        if !left_behind.contains(p) {
            left_behind.push(p.clone());
        }
    }
    Some(crate::protocol::LeftBehind {
        count: ended.found.len() as u32,
        killed: ended.all_gone,
    })
}

/// The trials running now, so that whatever ends batchfit ends them too ([`end_all`]).
static RUNNING: Mutex<Vec<TrialIds>> = Mutex::new(Vec::new());

/// When this process's first trial started (clock ticks since boot), for [`end_all`].
static FIRST_TRIAL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// A running trial, registered in [`RUNNING`]: dropped on every way out of [`run`] (an error, a
/// panic), it ends what the trial left.
struct Registered(TrialIds);

impl Registered {
    fn new(trial: TrialIds) -> Registered {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(trial.clone());
        Registered(trial)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        end_trial(&self.0, None, None);
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| t.marker != self.0.marker);
    }
}

/// Ends every process any trial of this batchfit left (its running trials', and every process
/// carrying one of its markers): batchfit's last act, whatever its end (a plan written, an error, an
/// interruption). Returns how many it found.
pub fn end_all() -> usize {
    let running: Vec<TrialIds> = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let n: usize = running
        .iter()
        .map(|t| end_trial(t, None, None).found.len())
        .sum();
    let Some(&since) = FIRST_TRIAL.get() else {
        return n;
    };
    // every orphan batchfit adopted is a trial's (a daemon no trial could claim as its own)
    let n = n + terminate(&|| {
        (crate::platform::reaper::adopted().into_iter())
            .map(|(p, _)| p)
            .collect()
    });
    let prefix = format!("{TRIAL_MARKER}={}-", std::process::id()).into_bytes();
    n + terminate(&|| {
        let (left, _) = super::tree::scan_proc(since, &|_| false, &|p, _, _| {
            super::tree::has_marker_prefix(p, &prefix)
        });
        left.into_iter().map(|(p, _)| p).collect()
    })
}

/// Ends what the trials of a batchfit that is gone left running: a probe killed by SIGKILL never
/// made its last sweep ([`end_all`]), and a job's children that outlived their trial's root (a
/// DataLoader worker, a daemon) would hold their memory for good. Each carries its trial's marker,
/// `<batchfit's PID>-<trial>-<start>`; where no process of that PID that started before the trial
/// lives, the batchfit that ran it is gone, and the process is ended. Run before a probe's first
/// trial. Returns how many it found.
pub fn end_abandoned_trials() -> usize {
    let me = std::process::id();
    terminate(&|| {
        let (left, _) = super::tree::scan_proc(0, &|_| false, &|p, _, _| abandoned_trial(p, me));
        left.into_iter().map(|(p, _)| p).collect()
    })
}

/// Whether `pid` carries the marker of a trial whose batchfit (not `me`) is gone.
fn abandoned_trial(pid: u32, me: u32) -> bool {
    let prefix = format!("{TRIAL_MARKER}=");
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let Some(marker) = (env.split(|&b| b == 0))
        .find_map(|e| e.strip_prefix(prefix.as_bytes()))
        .and_then(|m| std::str::from_utf8(m).ok())
    else {
        return false;
    };
    let mut parts = marker.splitn(3, '-');
    let (Some(Ok(owner)), Some(_), Some(Ok(since))) = (
        parts.next().map(str::parse::<u32>),
        parts.next(),
        parts.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    let owner_lives = crate::platform::procfs::stat(owner)
        .and_then(|s| crate::platform::procfs::started_at(&s))
        .is_some_and(|started| started <= since);
    owner != me && !owner_lives
}

/// Sends SIGTERM to the processes `marked` lists, then SIGKILL to those still listed after
/// [`GRACE`]; returns how many were listed at first.
fn terminate(marked: &dyn Fn() -> Vec<u32>) -> usize {
    let signal = |pids: &[u32], sig: i32| {
        for &p in pids {
            // SAFETY: a process carrying a trial marker of batchfit's, listed just now.
            unsafe {
                libc::kill(p as i32, sig);
            }
        }
    };
    let left = marked();
    signal(&left, libc::SIGTERM);
    let t0 = Instant::now();
    while !left.is_empty() && t0.elapsed() < GRACE * 2 {
        std::thread::sleep(Duration::from_millis(20));
        let now = marked();
        if now.is_empty() {
            break;
        }
        if t0.elapsed() >= GRACE {
            signal(&now, libc::SIGKILL);
        }
    }
    left.len()
}

/// Whether `name` is the name of a trial's log under `--logs` (`trial-….stdout` / `.stderr`).
pub fn is_log_name(name: &str) -> bool {
    name.starts_with("trial-") && (name.ends_with(".stdout") || name.ends_with(".stderr"))
}

/// Opens (creates or truncates) a trial's log: a regular file only. The name is not followed when it
/// is a symlink (`O_NOFOLLOW`), and opening does not wait on a FIFO (`O_NONBLOCK`); whatever is not a
/// regular file at the name is refused, never written or truncated.
fn open_log(path: &std::path::Path) -> Result<std::fs::File, BackendError> {
    use crate::platform::files::{open_regular, OpenError};
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |why: String| {
        BackendError::Environment(format!(
            "--logs: cannot write the trial log {}: {why}",
            path.display()
        ))
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(false).mode(0o644);
    let f = open_regular(path, &mut opts, false).map_err(|e| match e {
        OpenError::Link(_) => {
            refuse("it is a symbolic link; batchfit does not follow links there".into())
        }
        OpenError::Io(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            refuse("it is a FIFO, not a regular file".into())
        }
        OpenError::Missing(e) | OpenError::Io(e) => refuse(e.to_string()),
        OpenError::Directory | OpenError::NotRegular(_) => refuse(
            "it is not a regular file (a FIFO, socket or device); remove it or use another \
             --logs directory"
                .into(),
        ),
    })?;
    f.set_len(0).map_err(|e| refuse(e.to_string()))?;
    Ok(f)
}

/// How a trial process is started and watched.
#[derive(Debug, Default, Clone)]
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
    /// Whether the trial's evidence is in: its processes are then ended after [`EVIDENCE_GRACE`]
    /// instead of waiting for the job's teardown.
    pub evidence: Option<EvidenceCheck<'a>>,
    /// The fork server the trial's root was forked from: the pages they share are the trial's
    /// ([`super::tree::Tree::forked_from`]).
    pub lender: Option<u32>,
}

/// Spawns `cmd` in its own session (and process group), stdin as given, without core dumps, under
/// the limits of `opts`, and killed (SIGKILL) when batchfit dies: a batchfit killed by SIGKILL, or by
/// the kernel's OOM killer, runs no clean-up, and a trial left running would go on holding memory
/// (and the GPU) with no one to end it. The kernel sends that signal when the *thread* that forked
/// the trial ends, so every trial is forked by one thread that lasts as long as batchfit
/// ([`spawn_from_lasting_thread`]). It reaches the trial's first
/// process only: its own children are ended by the trial's clean-up, or by their own parent's death.
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
    let batchfit = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // batchfit died between the fork and the prctl: the signal will never come
            if libc::getppid() != batchfit {
                libc::_exit(1);
            }
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
    spawn_from_lasting_thread(cmd)
        .map_err(|e| BackendError::Environment(format!("cannot start a trial process: {e}")))
}

/// A spawn and where its child goes.
type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from one thread that lives as long as this process: the kernel sends a trial's
/// parent-death signal when the thread that forked it ends, and a trial (or a warm process started
/// ahead of its trial) may outlive the thread that asked for it (a round's thread per device).
fn spawn_from_lasting_thread(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: std::sync::OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("batchfit-spawner".into())
            .spawn(move || {
                for (mut cmd, back) in rx {
                    let child = crate::platform::reaper::start_child(|| cmd.spawn(), Child::id);
                    let _ = back.send(child);
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    });
    let (back, child) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, back))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    child
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// A number for each trial this process starts (part of its marker).
fn next_trial() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
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

/// One sample of a trial's tree (and of its cgroup's anonymous memory).
fn sample_tree(
    t: &mut super::tree::Tree,
    group: Option<&super::cgroup::Group>,
    cgroup_anon: &mut Option<u64>,
) {
    match group {
        Some(g) => {
            t.sample_inside(Some(&|| g.pids()));
            if let Some(a) = g.anon() {
                *cgroup_anon = Some(cgroup_anon.unwrap_or(0).max(a));
            }
        }
        None => t.sample(),
    }
}

/// How long descendants may outlive the root before they count as left behind.
const DESCENDANT_GRACE: Duration = Duration::from_millis(1000);

/// After the root (`root`) exited: waits up to [`DESCENDANT_GRACE`] for the tree's other processes
/// (and its cgroup's) to end, sampling them; those still running are returned (`pid N (name)`).
/// A process the job detached while it ran ([`super::tree::Tree::detached`]: a double fork's
/// daemon) is not waited for: still running when the root exited, it is left behind whenever it
/// would end, so a daemon that ends a second after the job is caught every time, not by its race
/// with the grace (the grace is for the job's own children shutting down).
fn wait_for_descendants(
    t: &mut super::tree::Tree,
    root: u32,
    group: Option<&super::cgroup::Group>,
    cgroup_anon: &mut Option<u64>,
) -> Vec<String> {
    let running = |t: &super::tree::Tree| {
        let mut v = t.running_except(root);
        if let Some(g) = group {
            for p in g.pids() {
                if p != root && !v.contains(&p) {
                    v.push(p);
                }
            }
        }
        v
    };
    let t0 = Instant::now();
    t.root_exited();
    loop {
        sample_tree(t, group, cgroup_anon);
        let left = running(t);
        if left.is_empty() {
            return vec![];
        }
        let detached = left.iter().any(|&p| t.detached(p));
        if detached || t0.elapsed() >= DESCENDANT_GRACE || interrupt::pending().is_some() {
            return left.into_iter().map(super::tree::describe).collect();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How a trial process ended.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per trial, moved once
pub enum Ran {
    Finished(Finished),
    /// Killed after the trial timeout; the last lines of what it printed until then
    /// ([`output_tail`]), all there is to tell why it hung.
    TimedOut {
        seconds: f64,
        tail: Vec<String>,
    },
}

/// How many lines of a trial's output its record keeps.
pub const TAIL_LINES: usize = 20;

/// The last `n` non-empty lines of a trial's output, stderr's then stdout's, each cut to 300
/// characters.
pub fn output_tail(stderr: &str, stdout: &str, n: usize) -> Vec<String> {
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.chars().take(300).collect())
            .collect()
    };
    let mut v = lines(stderr);
    v.extend(lines(stdout));
    let k = v.len().saturating_sub(n);
    v.split_off(k)
}

/// How long a trial's processes may go on after its evidence is in (the command's complete report)
/// before they are ended: what a job does after its last step (saving a checkpoint, flushing its
/// logger, shutting its DataLoader down, the interpreter's exit) is no part of the evidence, and a job
/// that ends by itself within it ends as it would have.
pub const EVIDENCE_GRACE: Duration = Duration::from_secs(1);

/// How often a running trial's evidence is checked ([`Options::evidence`]).
const EVIDENCE_EVERY: Duration = Duration::from_millis(50);

/// Whether a running trial's evidence is in ([`crate::protocol::Workload::evidence_in`]).
#[derive(Clone, Copy)]
pub struct EvidenceCheck<'a>(pub &'a (dyn Fn() -> bool + 'a));

impl std::fmt::Debug for EvidenceCheck<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EvidenceCheck")
    }
}

/// Spawns a trial's root with the trial's marker ([`TRIAL_MARKER`]: this batchfit's PID, the
/// trial's number, its start) in its environment: what tells the trial's processes apart.
fn spawn_marked(
    mut cmd: Command,
    opts: &Options,
    stdin: Stdio,
) -> Result<(Child, TrialIds), BackendError> {
    let since = ticks_now();
    FIRST_TRIAL.get_or_init(|| since);
    let marker = format!("{}-{}-{}", std::process::id(), next_trial(), since);
    cmd.env(TRIAL_MARKER, &marker);
    let child = spawn_limited(cmd, opts, stdin)?;
    let trial = TrialIds {
        root: child.id(),
        since,
        marker: format!("{TRIAL_MARKER}={marker}").into_bytes(),
    };
    Ok((child, trial))
}

/// Where a stream's copy goes (`--logs`): set when the trial starts, which for a warm process is
/// after its output began.
type LogSlot = Arc<Mutex<Option<std::fs::File>>>;

/// A trial's root process: one batchfit spawned, or one a fork server forked that the kernel then
/// gave to batchfit as its subreaper ([`fork`]).
enum Root {
    Spawned(Child),
    Adopted(u32),
}

impl Root {
    fn id(&self) -> u32 {
        match self {
            Root::Spawned(c) => c.id(),
            Root::Adopted(pid) => *pid,
        }
    }

    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Root::Spawned(c) => c.wait(),
            Root::Adopted(pid) => reap(*pid, true)?
                .map(|(s, _)| s)
                .ok_or_else(|| std::io::Error::other("no exit status")),
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Root::Spawned(c) => c.try_wait(),
            Root::Adopted(pid) => Ok(reap(*pid, false)?.map(|(s, _)| s)),
        }
    }
}

/// A started trial process: its root, its ids (registered: ended on every way out), its output
/// being read.
struct Spawned {
    child: Root,
    trial: TrialIds,
    registered: Registered,
    out: Reader,
    err: Reader,
}

/// Starts `cmd` as a trial's root ([`spawn_marked`]) and reads its output (copied to the logs).
fn spawn_trial(
    cmd: Command,
    opts: &Options,
    stdin: Stdio,
    logs: (LogSlot, LogSlot),
) -> Result<Spawned, BackendError> {
    let (mut child, trial) = spawn_marked(cmd, opts, stdin)?;
    let registered = Registered::new(trial.clone());
    let out = read_all(child.stdout.take().expect("piped"), 1 << 20, logs.0);
    let err = read_all(child.stderr.take().expect("piped"), 64 << 10, logs.1);
    Ok(Spawned {
        child: Root::Spawned(child),
        trial,
        registered,
        out,
        err,
    })
}

/// Opens the trial's logs of `opts` (`--logs`), when it asks for them.
fn open_logs(
    opts: &Options,
) -> Result<(Option<std::fs::File>, Option<std::fs::File>), BackendError> {
    let log = |suffix: &str| -> Result<Option<std::fs::File>, BackendError> {
        let Some(p) = opts.log.as_ref() else {
            return Ok(None);
        };
        let mut name = p.clone().into_os_string();
        name.push(suffix);
        open_log(std::path::Path::new(&name)).map(Some)
    };
    Ok((log(".stdout")?, log(".stderr")?))
}

/// Runs `cmd` as a fresh trial process as `opts` say, calling `sample(pids)` about every 5 ms while
/// it runs with the PIDs of the trial (its tree when `opts.tree`; the cuda device sums NVML over them).
pub fn run(
    cmd: Command,
    opts: &Options,
    timeout: Duration,
    sample: &mut dyn FnMut(&[u32]),
) -> Result<Ran, BackendError> {
    let (out_log, err_log) = open_logs(opts)?;
    let logs = (Arc::new(Mutex::new(out_log)), Arc::new(Mutex::new(err_log)));
    let spawned = spawn_trial(cmd, opts, Stdio::null(), logs)?;
    watch(spawned, opts, timeout, sample)
}

/// A trial process started ahead of its trial (a warm process): in its own session, with its own
/// marker, under the limits its trial will have (`RLIMIT_DATA` set before its exec, or the trial's
/// own cgroup joined before it), its output already read; handed its trial by [`run_prestarted`].
/// Ended when dropped unused.
pub struct Prestarted {
    spawned: Option<Spawned>,
    stdin: Option<ChildStdin>,
    logs: (LogSlot, LogSlot),
}

impl Drop for Prestarted {
    fn drop(&mut self) {
        if let Some(s) = self.spawned.take() {
            end_unused(s);
        }
    }
}

/// Ends a process started ahead that no trial used (a warm process, a fork server): whatever
/// carries its marker, its group, then waits for it.
fn end_unused(mut s: Spawned) {
    end_trial(&s.trial, None, None);
    kill_group(s.child.id());
    let _ = s.child.wait();
}

/// Starts `cmd` ahead of its trial, under the limits of `opts` (its log is set at the hand-off).
pub fn prestart(cmd: Command, opts: &Options) -> Result<Prestarted, BackendError> {
    let logs: (LogSlot, LogSlot) = Default::default();
    let mut spawned = spawn_trial(cmd, opts, Stdio::piped(), logs.clone())?;
    let stdin = match &mut spawned.child {
        Root::Spawned(c) => c.stdin.take(),
        Root::Adopted(_) => None,
    };
    Ok(Prestarted {
        spawned: Some(spawned),
        stdin,
        logs,
    })
}

/// Hands `handoff` (one line on its stdin, which is then closed) to the prestarted process `pre` and
/// watches it as [`run`] watches a fresh trial, from the hand-off on. `None` when it had died or could
/// not be handed the line: its trial is to run fresh.
pub fn run_prestarted(
    mut pre: Prestarted,
    handoff: &[u8],
    opts: &Options,
    timeout: Duration,
    sample: &mut dyn FnMut(&[u32]),
) -> Result<Option<Ran>, BackendError> {
    let alive = pre
        .spawned
        .as_mut()
        .is_some_and(|s| matches!(s.child.try_wait(), Ok(None)));
    let Some(mut stdin) = pre.stdin.take().filter(|_| alive) else {
        return Ok(None);
    };
    let (out_log, err_log) = open_logs(opts)?;
    *pre.logs.0.lock().unwrap_or_else(|e| e.into_inner()) = out_log;
    *pre.logs.1.lock().unwrap_or_else(|e| e.into_inner()) = err_log;
    let sent = stdin
        .write_all(handoff)
        .and_then(|_| stdin.write_all(b"\n"))
        .and_then(|_| stdin.flush());
    drop(stdin);
    if sent.is_err() {
        return Ok(None);
    }
    let spawned = pre.spawned.take().expect("alive");
    watch(spawned, opts, timeout, sample).map(Some)
}

/// Watches a started trial until it ends (or its timeout, an interruption, or its evidence is in and
/// [`EVIDENCE_GRACE`] passed), measuring its tree, and ends whatever it left.
fn watch(
    spawned: Spawned,
    opts: &Options,
    timeout: Duration,
    sample: &mut dyn FnMut(&[u32]),
) -> Result<Ran, BackendError> {
    let kills_before = oom_kills();
    let Spawned {
        mut child,
        trial,
        registered: _registered,
        out,
        err,
    } = spawned;
    let mut w = Watched::start(child.id(), trial, opts);
    let status = match w.wait_for_exit(&mut child, timeout, sample)? {
        Waited::Exited(status) => status,
        Waited::TimedOut { seconds } => {
            let drained = Instant::now() + DRAIN;
            let (stdout, stderr) = (out.finish(drained), err.finish(drained));
            let tail = output_tail(&stderr, &stdout, TAIL_LINES);
            return Ok(Ran::TimedOut { seconds, tail });
        }
    };
    // The root's ru_maxrss is not used: it counts the image of batchfit forked before the exec
    // (about 180 MiB), which the trial never used. Only samples taken after the exec measure it.
    let seconds = w.t0.elapsed().as_secs_f64();
    let ended_after_report = w.evidence.ended;
    let (left_behind, left_running) = w.end_what_is_left();
    let drained = Instant::now() + DRAIN;
    // Elsewhere than in a cgroup, the machine's counter with a SIGKILL is weak evidence (any
    // process of the machine may have been the one killed), which the workload weighs against the
    // trial's measured peak.
    let machine_oom_kill =
        !ended_after_report && killed_by_kernel(status, kills_before, oom_kills());
    let measure = w.measure(seconds, machine_oom_kill, left_behind, left_running);
    Ok(Ran::Finished(Finished {
        status,
        stdout: out.finish(drained),
        stderr: err.finish(drained),
        kernel_oom_kill: match measure.group_oom_kills {
            Some(n) => n > 0,
            None => machine_oom_kill,
        },
        measure,
        ended_after_report,
    }))
}

/// How the wait for a trial's root ended, when not interrupted.
enum Waited {
    Exited(ExitStatus),
    TimedOut { seconds: f64 },
}

/// A started trial being watched: what is sampled of it, and when its evidence came in.
struct Watched<'a> {
    opts: &'a Options<'a>,
    trial: TrialIds,
    pid: u32,
    t0: Instant,
    tree: Option<super::tree::Tree>,
    /// The anonymous memory charged to the trial's cgroup, sampled (the kernel keeps only the
    /// total's peak, page cache included).
    cgroup_anon: Option<u64>,
    evidence: EvidenceWatch,
}

impl<'a> Watched<'a> {
    /// Starts watching the trial whose root is `pid`, with a first sample at once (spawn returns
    /// after the exec): a short command may end before the next.
    fn start(pid: u32, trial: TrialIds, opts: &'a Options<'a>) -> Self {
        let tree = opts
            .tree
            .then(|| super::tree::Tree::new(pid).follow_marker(trial.clone()))
            .map(|t| match opts.lender {
                Some(server) => t.forked_from(server),
                None => t,
            });
        let mut w = Watched {
            opts,
            trial,
            pid,
            t0: Instant::now(),
            tree,
            cgroup_anon: None,
            evidence: EvidenceWatch::default(),
        };
        if let Some(t) = w.tree.as_mut() {
            sample_tree(t, opts.cgroup, &mut w.cgroup_anon);
        }
        w
    }

    /// Everything the trial started goes, whatever happens: its session and group, its tree, its
    /// cgroup and every process carrying its marker.
    fn kill_everything(&self) -> Ended {
        end_trial(&self.trial, self.tree.as_ref(), self.opts.cgroup)
    }

    /// Waits for the root to exit, sampling the tree every few milliseconds; ends everything the
    /// trial started on an interruption, at the timeout, or once its evidence is in and the grace
    /// passed (the samples ran until then: the peak covers the whole run up to the kill).
    fn wait_for_exit(
        &mut self,
        child: &mut Root,
        timeout: Duration,
        sample: &mut dyn FnMut(&[u32]),
    ) -> Result<Waited, BackendError> {
        loop {
            if let Some(sig) = interrupt::pending() {
                self.kill_everything();
                let _ = child.wait();
                return Err(BackendError::Interrupted(sig));
            }
            if self.t0.elapsed() >= timeout {
                self.kill_everything();
                let _ = child.wait();
                let seconds = self.t0.elapsed().as_secs_f64();
                return Ok(Waited::TimedOut { seconds });
            }
            if self.evidence.grace_over(self.opts.evidence) {
                self.kill_everything();
                return child.wait().map(Waited::Exited).map_err(|e| {
                    BackendError::Environment(format!("waiting for a trial process: {e}"))
                });
            }
            match reap(self.pid, false) {
                Ok(Some((s, _))) => return Ok(Waited::Exited(s)),
                Ok(None) => {
                    match self.tree.as_mut() {
                        Some(t) => {
                            sample_tree(t, self.opts.cgroup, &mut self.cgroup_anon);
                            sample(&t.live_pids());
                        }
                        None => sample(&[self.pid]),
                    }
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => {
                    return Err(BackendError::Environment(format!(
                        "waiting for a trial process: {e}"
                    )))
                }
            }
        }
    }

    /// Ends what the root left running. Descendants still running after the root exited are
    /// waited for a moment (still measured), then killed, and named: the job left them behind (not
    /// when batchfit ended them itself). What its processes left in /dev/shm (a DataLoader batch
    /// of a killed worker) goes with them.
    fn end_what_is_left(&mut self) -> (Vec<String>, Option<crate::protocol::LeftBehind>) {
        let mut left_behind = match self.tree.as_mut() {
            Some(t) if !self.evidence.ended => {
                wait_for_descendants(t, self.pid, self.opts.cgroup, &mut self.cgroup_anon)
            }
            _ => vec![],
        };
        let left_running = record_left_behind(self.kill_everything(), &mut left_behind);
        if let Some(t) = self.tree.as_ref() {
            crate::platform::shm::remove_left(&t.seen_pids());
        }
        (left_behind, left_running)
    }

    /// What was measured of the trial. In a cgroup only the group's own OOM counter is evidence;
    /// elsewhere `machine_oom_kill`.
    fn measure(
        &self,
        seconds: f64,
        machine_oom_kill: bool,
        left_behind: Vec<String>,
        left_running: Option<crate::protocol::LeftBehind>,
    ) -> TreeMeasure {
        let (opts, tree) = (self.opts, self.tree.as_ref());
        TreeMeasure {
            data_peak: tree.map(|t| t.data_peak).filter(|&b| b > 0),
            data_limit: opts.data_limit,
            rss_peak: tree.map(|t| t.rss_peak).filter(|&b| b > 0),
            cgroup_peak: opts.cgroup.and_then(|g| g.peak()),
            processes: tree.map_or(1, |t| t.seen()),
            seconds,
            log: opts.log.clone(),
            anon_peak: tree.map(|t| t.anon_peak).filter(|&b| b > 0),
            pss_peak: tree.map(|t| t.pss_peak).filter(|&b| b > 0),
            tree_figure: tree.map(|t| t.measure()),
            cgroup_limit: opts.cgroup.and_then(|g| g.limit()),
            group_oom_kills: opts.cgroup.map(|g| g.oom_kills()),
            cgroup_anon_peak: self.cgroup_anon,
            escaped_peak: opts
                .cgroup
                .and(tree)
                .map(|t| t.escaped_peak)
                .filter(|&b| b > 0),
            machine_oom_kill: opts.cgroup.is_none() && machine_oom_kill,
            killed_descendants: tree.map(|t| t.killed.clone()).unwrap_or_default(),
            left_behind,
            left_running,
            unattributed: tree.map_or_else(Vec::new, unattributed),
        }
    }
}

/// The orphans a trial could not tell to be its own (`pid N (name)`), or that another trial could
/// not while this one ran.
fn unattributed(t: &super::tree::Tree) -> Vec<String> {
    let mut v = t.unattributed.clone();
    if v.is_empty() && t.saw_a_dispute() {
        v.push("an orphan another trial running beside it could not tell apart".into());
    }
    v
}

/// When a running trial's evidence came in ([`Options::evidence`], checked every
/// [`EVIDENCE_EVERY`]), and whether its processes were ended for it.
#[derive(Default)]
struct EvidenceWatch {
    checked: Option<Instant>,
    since: Option<Instant>,
    ended: bool,
}

impl EvidenceWatch {
    /// Whether the evidence has been in for [`EVIDENCE_GRACE`] (then the trial is to be ended, which
    /// this records).
    fn grace_over(&mut self, check: Option<EvidenceCheck>) -> bool {
        let Some(check) = check else { return false };
        if self.since.is_none() && self.checked.is_none_or(|t| t.elapsed() >= EVIDENCE_EVERY) {
            self.checked = Some(Instant::now());
            if (check.0)() {
                self.since = Some(Instant::now());
            }
        }
        self.ended = self.since.is_some_and(|t| t.elapsed() >= EVIDENCE_GRACE);
        self.ended
    }
}

/// A long-lived trial process: one request per stdin line, one result line per trial on stdout.
/// Exploration only: it saves the process and libtorch start of every trial, at the price of state
/// carried between trials, so the proof always re-runs in fresh processes.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Capture>>,
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
        let stderr = Arc::new(Mutex::new(Capture::new(64 << 10)));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = err_pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(&chunk[..n]);
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
        let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner()).text();
        Finished {
            status,
            // a worker never exits cleanly in the middle of a trial: no result line is passed on
            stdout: self.stdout.replace(RESULT_PREFIX, ""),
            stderr,
            kernel_oom_kill: killed_by_kernel(status, kills_before, oom_kills()),
            measure: TreeMeasure::default(),
            ended_after_report: false,
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

    /// A trial started from a thread that ends before it (a round's thread per device, which may
    /// leave a warm process for the next round) goes on running: only batchfit's death ends it.
    #[test]
    fn a_trial_outlives_the_thread_that_started_it() {
        let mut child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            spawn_limited(cmd, &Options::default(), Stdio::null()).unwrap()
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let alive = matches!(child.try_wait(), Ok(None));
        let _ = child.kill();
        let _ = child.wait();
        assert!(alive, "the trial died with the thread that started it");
    }

    /// The capture keeps the head and the last bytes, and costs each chunk its own length: 200 MB in
    /// 8 KiB chunks takes well under a second (the old capture moved half its capacity per chunk:
    /// 39 s for a command printing 200 MB, measured through the binary).
    #[test]
    fn the_capture_keeps_head_and_tail_in_linear_time() {
        let mut c = Capture::new(1 << 20);
        let line = b"a line of training output, step 1234, loss 0.5\n";
        let chunk: Vec<u8> = line.iter().copied().cycle().take(8192).collect();
        let t0 = std::time::Instant::now();
        for _ in 0..(200_000_000 / 8192) {
            c.push(&chunk);
        }
        c.push(b"the last line\n");
        let secs = t0.elapsed().as_secs_f64();
        let text = c.text();
        assert!(secs < 1.0, "{secs:.2} s");
        assert!(text.starts_with("a line of training output"));
        assert!(text.ends_with("the last line\n"));
        assert!(text.contains("\n[...]\n"));
        assert!(text.len() <= (1 << 20) + 16, "{}", text.len());
        // small streams are kept whole
        let mut c = Capture::new(16);
        c.push(b"abc");
        c.push(b"defgh");
        assert_eq!(c.text(), "abcdefgh");
        c.push(b"ijklmnopq");
        assert_eq!(c.text(), "abcdefgh\n[...]\njklmnopq");
        c.clear();
        assert_eq!(c.text(), "");
    }

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
