//! A trial's process tree, followed from `/proc` while it runs: a user's command may start workers
//! (torchrun's ranks, DataLoader workers, a shell's children), and their memory is the trial's memory.
//!
//! Descendants are found through `/proc/PID/task/TID/children` from every process already known, so a
//! grandchild that left the trial's session (`setsid`) is still found while its parent lives, and is
//! remembered (with its start time, so a reused PID is never killed) after its parent exits. A
//! daemon whose parent exited before a sample saw it (a double fork) is found by a scan of `/proc`
//! ([`Tree::follow_marker`]): the trial's session and process group, and the trial's marker in the
//! environment of this user's processes started since the trial began; what such a daemon holds is
//! the job's memory too. Each
//! sample reads every known process's `VmData` and `VmRSS`: the largest data segment (what a
//! per-process `RLIMIT_DATA` acts on) and the summed resident memory (what the machine gives up).
//!
//! **The tree's figure counts each page once**: the sum over its processes of their proportional
//! set sizes of anonymous and shared memory, `Pss_Anon + Pss_Shmem` from `/proc/PID/smaps_rollup`
//! (a page mapped by k processes counts 1/k in each). Forked workers (a DataLoader's) share the
//! parent's copy-on-write pages and shared-memory batches: the summed `RssAnon + RssShmem` counts
//! those once per process (measured: 1054 MiB summed over 5 processes where a memory cgroup around
//! the same tree charged 243 MiB). Reading `smaps_rollup` walks the process's page tables (about
//! 5-10 ms per 100 MiB resident on the development machine), so the tree is read in rounds that take
//! at most a tenth of the time ([`PSS_COST_SHARE`]), and at once whenever a process joins or leaves
//! the tree (a fork shares its parent's pages, an exit leaves its share to the others). Between two
//! rounds a process's share is its last reading raised by any growth of its `RssAnon + RssShmem`
//! since (read every sample, so a short peak of new memory is not missed; what falls counts until
//! the next round). Shared memory that grows in more than one process at once is most likely one
//! region they fill together (forked workers writing batches into one memfd or `/dev/shm`
//! segment): counted per process it reached 1.2-1.8 times the region, a tree over its limit where
//! a memory cgroup around it charged the region once. Such growth counts once (the largest of the
//! processes'), and the next round is due after the last round's cost over
//! [`SHARED_GROWTH_COST_SHARE`] instead. While a process exits (its memory detached, its shares passing to the others
//! page by page) readings do not add up, so such a sample is not taken into the peak (the total only
//! falls then) and the tree is read again at the next. What the figure misses between rounds: a copy-on-write page copied by one of
//! the processes that share it (its `RssAnon` does not change), and separate shared regions grown
//! by several processes at once (counted as the largest until that round). Where `smaps_rollup` cannot be read
//! (kernels before 5.7 have no `Pss_Anon`; a process batchfit may not inspect) that process counts
//! with its `RssAnon + RssShmem`, and [`Tree::measure`] says so ([`Measure::RssSum`]).

use crate::platform::procfs::{children, start_time};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// The share of the sampler's time that reading `smaps_rollup` may take: after a round that took
/// `d`, the next is due `d / PSS_COST_SHARE` later.
pub const PSS_COST_SHARE: f64 = 0.1;

/// The share of the sampler's time that reading `smaps_rollup` may take while shared memory grows in
/// more than one process of the tree: between rounds each process counts its growth of `RssShmem`
/// in full, so pages of one shared region (a memfd or `/dev/shm` segment that forked workers fill
/// together) count once per process until the next round reads their proportional shares.
pub const SHARED_GROWTH_COST_SHARE: f64 = 0.5;

pub use crate::protocol::TreeFigure as Measure;

/// A process's last `smaps_rollup` reading: its proportional anonymous and shared memory, and its
/// resident anonymous (of the same walk) and shared memory when read.
#[derive(Debug, Clone, Copy)]
struct Reading {
    pss: u64,
    rss: u64,
    /// Its `RssShmem` at the reading.
    shmem: u64,
    /// Its `Pss_Shmem` at the reading.
    pss_shmem: u64,
}

/// What one pass over the tree's `/proc/PID/status` files found.
#[derive(Default)]
struct StatusPass {
    /// The processes with memory: (pid, RssAnon + RssShmem, RssShmem), in bytes.
    live: Vec<(u32, u64, u64)>,
    /// The summed VmRSS.
    rss: u64,
    /// The summed RssAnon + RssShmem.
    anon: u64,
    /// A process is exiting (its memory detached, not yet a zombie): it is handing its shares of
    /// shared pages to the others page by page, so readings taken meanwhile do not add up.
    unsettled: bool,
}

/// One process of the tree: its PID and its start time (clock ticks since boot, field 22 of
/// `/proc/PID/stat`), which tells it from a later process with the same PID.
type Known = BTreeMap<u32, u64>;

/// The tree under a root process.
#[derive(Debug)]
pub struct Tree {
    known: Known,
    /// Peaks over all samples.
    pub data_peak: u64,
    pub rss_peak: u64,
    /// Peak of the summed `RssAnon` + `RssShmem` (anonymous and shared memory, no file pages; a
    /// page shared by k processes counts k times).
    pub anon_peak: u64,
    /// The tree's figure: peak of the summed `Pss_Anon` + `Pss_Shmem` (each page once; see the
    /// module doc and [`Tree::measure`]).
    pub pss_peak: u64,
    /// Peak of the tree's figure over the processes outside the set given to
    /// [`Tree::sample_inside`] (the trial's cgroup).
    pub escaped_peak: u64,
    /// Last `smaps_rollup` reading per process.
    readings: BTreeMap<u32, Reading>,
    /// When the next round of `smaps_rollup` readings is due.
    next_round: Option<Instant>,
    /// The earliest a round is taken because shared memory grew in more than one process
    /// ([`SHARED_GROWTH_COST_SHARE`]).
    next_shared_round: Option<Instant>,
    /// The processes with memory at the last round.
    members: std::collections::BTreeSet<u32>,
    /// A live process's `smaps_rollup` could not be read (it counted with its `RssAnon +
    /// RssShmem`).
    rss_fallback: bool,
    /// Descendants seen dead by a signal before their parent reaped them (`pid N (name): signal S`).
    pub killed: Vec<String>,
    killed_pids: std::collections::BTreeSet<u32>,
    /// The trial's marker scan, when followed ([`Tree::follow_marker`]).
    scan: Option<Scan>,
    /// The root the tree was started from.
    root: u32,
    /// Processes seen, while the root still held its memory, with a parent outside the tree: made
    /// to outlive the job (a double fork's daemon), so never waited for once the root exits.
    detached: std::collections::BTreeSet<u32>,
    /// Orphans adopted while this trial followed them that cannot be told to be its own or
    /// another's (`pid N (name)`): several trials ran at once with no memory cgroup.
    pub unattributed: Vec<String>,
    /// The fork server the root was forked from ([`Tree::forked_from`]), and its part of the pages
    /// it shares with the tree at the last round.
    lender: Option<(u32, u64)>,
    /// The same orphans with their start times: ended with the trial (another trial that could be
    /// theirs is no fit either).
    disputed: Known,
}

/// How the tree looks for processes that left it (see [`Tree::follow_marker`]).
#[derive(Debug)]
struct Scan {
    trial: TrialIds,
    /// Counted among the trials that follow adopted orphans ([`crate::platform::reaper`]).
    _following: crate::platform::reaper::Following,
    /// How many orphans had been disputed when the trial began.
    disputes_before: usize,
    /// Processes already found not to belong to the trial (with their start times).
    strangers: Known,
    /// When the next scan is due.
    next: Option<Instant>,
}

/// The share of the sampler's time a scan of `/proc` for the trial's processes may take.
const SCAN_COST_SHARE: f64 = 0.05;

/// What tells a trial's processes apart on the machine: its root (session and process group
/// leader), when it started (clock ticks since boot) and its marker (`NAME=value` in the
/// environment, inherited across `setsid` and double forks).
#[derive(Debug, Clone)]
pub struct TrialIds {
    pub root: u32,
    pub since: u64,
    pub marker: Vec<u8>,
}

/// A process's group, session and start time (fields 5, 6 and 22 of `/proc/PID/stat`), unless it is
/// a zombie or gone.
pub fn stat_ids(pid: u32) -> Option<(u32, u32, u64)> {
    let rest = crate::platform::procfs::stat(pid)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.first() == Some(&"Z") || f.first() == Some(&"X") {
        return None;
    }
    Some((
        f.get(2)?.parse().ok()?,
        f.get(3)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// Whether process `pid`'s environment has an entry that `matches` (unreadable: no).
fn environ_any(pid: u32, matches: &dyn Fn(&[u8]) -> bool) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    env.split(|&b| b == 0).any(matches)
}

/// This user's live processes (not batchfit itself, not zombies) started at `since` or later, that
/// `skip` does not rule out, with their start times, split by `belongs(pid, pgrp, sid)`: those that
/// belong, and those that do not. Processes that vanish or cannot be read while scanned are left out.
pub fn scan_proc(
    since: u64,
    skip: &dyn Fn(u32) -> bool,
    belongs: &dyn Fn(u32, u32, u32) -> bool,
) -> (Vec<(u32, u64)>, Vec<(u32, u64)>) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let me = std::process::id();
    let (mut yes, mut no) = (vec![], vec![]);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (yes, no);
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || skip(pid) || e.metadata().map_or(true, |m| m.uid() != uid) {
            continue;
        }
        let Some((pgrp, sid, start)) = stat_ids(pid) else {
            continue;
        };
        if start + 1 < since {
            continue;
        }
        if belongs(pid, pgrp, sid) {
            yes.push((pid, start));
        } else {
            no.push((pid, start));
        }
    }
    (yes, no)
}

impl TrialIds {
    /// Whether a process (`pid` in group `pgrp` and session `sid`) is the trial's.
    pub fn owns(&self, pid: u32, pgrp: u32, sid: u32) -> bool {
        sid == self.root || pgrp == self.root || environ_any(pid, &|e| e == self.marker.as_slice())
    }

    /// The trial's live processes found by a scan of `/proc` (see [`scan_proc`]).
    pub fn processes(&self) -> Vec<u32> {
        let (yes, _) = scan_proc(self.since, &|_| false, &|p, g, s| self.owns(p, g, s));
        yes.into_iter().map(|(p, _)| p).collect()
    }
}

/// Whether `pid` carries a marker that starts with `prefix` (the markers of every trial of one
/// probe share one).
pub fn has_marker_prefix(pid: u32, prefix: &[u8]) -> bool {
    environ_any(pid, &|e| e.starts_with(prefix))
}

/// The signal that ended `pid` when it is a zombie (field 52 of `/proc/PID/stat`, `exit_code`, as
/// `waitpid` reports it; Linux ≥ 3.5), else `None`.
fn zombie_signal(pid: u32) -> Option<i32> {
    let rest = crate::platform::procfs::stat(pid)?;
    if !rest.starts_with('Z') {
        return None;
    }
    // rest's first field is field 3: exit_code (52) is its 50th
    let code: i32 = rest.split_whitespace().nth(49)?.parse().ok()?;
    let sig = code & 0x7f;
    (sig != 0 && sig != 0x7f).then_some(sig)
}

/// A signal that ends a process abnormally: the kernel's (SIGKILL from the OOM killer, SIGSEGV,
/// SIGBUS, SIGABRT, …). SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGALRM and the user signals are how jobs
/// stop their own helpers (a DataLoader's shutdown, a closed pipe) and are left out.
fn abnormal(sig: i32) -> bool {
    ![
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGPIPE,
        libc::SIGALRM,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ]
    .contains(&sig)
}

/// `pid N (name)` of a process.
pub fn describe(pid: u32) -> String {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let name = name.trim();
    if name.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} ({name})")
    }
}

fn is_zombie(pid: u32) -> bool {
    crate::platform::procfs::stat(pid).is_none_or(|s| s.starts_with('Z'))
}

fn status_kb(text: &str, key: &str) -> u64 {
    status_number(text, key).map_or(0, |kb| kb * 1024)
}

/// The number after `key` in a process's `status` text (`PPid:`, `VmData:` in KiB), if any.
fn status_number(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Whether a process's `status` text shows memory (a zombie's has no `VmRSS` line).
fn has_memory(status: &str) -> bool {
    status.lines().any(|l| l.starts_with("VmRSS:"))
}

/// Whether a process's `status` text is that of a process exiting: its memory detached (no `VmRSS`
/// line), not yet a zombie.
fn exiting(status: &str) -> bool {
    !has_memory(status)
        && status
            .lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|st| !matches!(st.trim_start().chars().next(), Some('Z' | 'X')))
}

/// Whether `pid` is still a process with memory (not gone, not a zombie).
fn has_memory_now(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| has_memory(&s))
}

/// A process's `smaps_rollup` reading, if it can be read: its `Pss_Anon + Pss_Shmem`, its
/// `Anonymous` (resident anonymous pages, from the same walk of its page tables as `Pss_Anon`; the
/// counterpart of `status`'s `RssAnon`), and its `Pss_Shmem`.
fn proportional(pid: u32) -> Option<(u64, u64, u64)> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let get = |k: &str| {
        t.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let shmem = get("Pss_Shmem:").unwrap_or(0);
    Some((get("Pss_Anon:")? + shmem, get("Anonymous:")?, shmem))
}

/// A fork server's part of the pages it shares with its forked trial: its `Pss_Anon + Pss_Shmem`
/// less its `Private_Dirty` (pages only it maps, the originals of those a trial copied on write).
fn lent(server: u32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{server}/smaps_rollup")).ok()?;
    let get = |k| status_kb(&t, k);
    Some((get("Pss_Anon:") + get("Pss_Shmem:")).saturating_sub(get("Private_Dirty:")))
}

/// A process's share of the tree's figure now, from its last `smaps_rollup` reading and its
/// `RssAnon + RssShmem` now (`rss`): the reading raised by the growth since, at most `rss`; without
/// a reading, `rss`.
fn estimate(last: Option<Reading>, rss: u64) -> u64 {
    match last {
        Some(r) => (r.pss + rss.saturating_sub(r.rss)).min(rss),
        None => rss,
    }
}

impl Tree {
    pub fn new(root: u32) -> Tree {
        let mut known = Known::new();
        if let Some(t) = start_time(root) {
            known.insert(root, t);
        }
        Tree {
            known,
            data_peak: 0,
            rss_peak: 0,
            anon_peak: 0,
            pss_peak: 0,
            escaped_peak: 0,
            readings: BTreeMap::new(),
            next_round: None,
            next_shared_round: None,
            members: Default::default(),
            rss_fallback: false,
            killed: vec![],
            killed_pids: Default::default(),
            scan: None,
            root,
            detached: Default::default(),
            unattributed: vec![],
            disputed: Known::new(),
            lender: None,
        }
    }

    /// Also follows the trial's processes that left the tree before a sample saw them (a daemon
    /// started by a double fork whose middle process exited at once): scans of `/proc` for the
    /// trial's session, process group and marker ([`TrialIds`]), taking at most
    /// [`SCAN_COST_SHARE`] of the time, add them to the tree.
    pub fn follow_marker(mut self, trial: TrialIds) -> Tree {
        self.scan = Some(Scan {
            trial,
            _following: crate::platform::reaper::Following::start(),
            disputes_before: crate::platform::reaper::disputes(),
            strangers: Known::new(),
            next: None,
        });
        self
    }

    /// The trial's processes not yet known, found by a scan of `/proc` when one is due.
    fn scan_for_escaped(&mut self) -> Vec<(u32, u64)> {
        let known = &self.known;
        let Some(scan) = self.scan.as_mut() else {
            return vec![];
        };
        let now = Instant::now();
        if scan.next.is_some_and(|t| now < t) {
            return vec![];
        }
        let strangers = &scan.strangers;
        let skip = |pid: u32| {
            known.contains_key(&pid)
                || strangers
                    .get(&pid)
                    .is_some_and(|&t| start_time(pid) == Some(t))
        };
        let trial = &scan.trial;
        let (yes, no) = scan_proc(trial.since, &skip, &|p, g, s| trial.owns(p, g, s));
        scan.strangers.extend(no);
        scan.next = Some(now + now.elapsed().div_f64(SCAN_COST_SHARE));
        yes
    }

    /// The orphans batchfit adopted since the trial began ([`crate::platform::reaper`]): a daemon
    /// that left the tree by a double fork, its session by `setsid` and its marker by clearing its
    /// environment is still the trial's. Only for a followed trial ([`Tree::follow_marker`]).
    fn adopted(&self) -> Vec<(u32, u64)> {
        let Some(scan) = self.scan.as_ref() else {
            return vec![];
        };
        let mut found = crate::platform::reaper::adopted();
        found.retain(|&(pid, start)| {
            start + 1 >= scan.trial.since && !self.known.contains_key(&pid)
        });
        found
    }

    /// Counts an adopted orphan as the trial's where that is known: its memory cgroup lists it, or
    /// this is the only trial following orphans ([`crate::platform::reaper::attributable`]);
    /// otherwise it is recorded as [`Tree::unattributed`].
    fn take_adopted(&mut self, pid: u32, start: u64, inside: Option<&dyn Fn() -> Vec<u32>>) {
        let ours = match inside {
            Some(list) => list().contains(&pid),
            None => crate::platform::reaper::attributable((pid, start)),
        };
        if ours {
            self.known.insert(pid, start);
        } else if inside.is_none() && self.disputed.insert(pid, start).is_none() {
            self.unattributed.push(describe(pid));
        }
    }

    /// Whether an orphan was disputed while this trial followed them, by this trial or another
    /// (which may have seen this trial's own first, and ended it): the trial's memory may be
    /// partly unmeasured.
    pub fn saw_a_dispute(&self) -> bool {
        let Some(scan) = self.scan.as_ref() else {
            return false;
        };
        !self.unattributed.is_empty() || crate::platform::reaper::disputes() != scan.disputes_before
    }

    /// The disputed orphans still alive (as the same processes): ended with the trial.
    pub fn disputed_alive(&self) -> Vec<u32> {
        (self.disputed.iter())
            .filter(|(&pid, &t)| start_time(pid) == Some(t))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// The processes of the tree still alive (as the same processes).
    fn alive(&self) -> Vec<u32> {
        self.known
            .iter()
            .filter(|(&pid, &t)| start_time(pid) == Some(t))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Finds new descendants and samples every live process's memory.
    pub fn sample(&mut self) {
        self.sample_inside(None);
    }

    /// As [`Tree::sample`]; with `inside` (what lists the PIDs of the trial's cgroup), also the
    /// anonymous memory of the tree's processes outside it. The group is listed after the tree's new
    /// processes were found: a process forked between the two readings would otherwise be a process
    /// of the tree outside the group (a DataLoader's workers, forked with the parent's memory).
    pub fn sample_inside(&mut self, inside: Option<&dyn Fn() -> Vec<u32>>) {
        self.find_new_processes(inside);
        let inside: Option<Vec<u32>> = inside.map(|list| list());
        let mut pass = self.read_statuses();
        let shared_growth = self.shared_grew(&pass.live);
        let now = Instant::now();
        let members: BTreeSet<u32> = pass.live.iter().map(|&(p, ..)| p).collect();
        if self.round_due(&members, now, shared_growth) {
            pass.unsettled |= self.read_shares(&mut pass.live, now);
            self.members = members;
        }
        self.rss_peak = self.rss_peak.max(pass.rss);
        self.anon_peak = self.anon_peak.max(pass.anon);
        if pass.unsettled {
            // read again at the next sample; the total only falls while a process exits, so this
            // sample's (too high) sum is not a peak
            self.next_round = None;
            return;
        }
        let (pss, escaped) = self.shares(&pass.live, inside.as_deref(), shared_growth);
        self.pss_peak = self.pss_peak.max(pss + self.shared_outside());
        self.escaped_peak = self.escaped_peak.max(escaped);
    }

    /// Adds the processes that joined the tree since the last sample: escaped ones the scan found,
    /// adopted orphans that are the trial's, and every new descendant of a live member.
    fn find_new_processes(&mut self, inside: Option<&dyn Fn() -> Vec<u32>>) {
        for (pid, start) in self.scan_for_escaped() {
            self.known.insert(pid, start);
        }
        for (pid, start) in self.adopted() {
            self.take_adopted(pid, start, inside);
        }
        let mut frontier = self.alive();
        while let Some(pid) = frontier.pop() {
            for c in children(pid) {
                if let std::collections::btree_map::Entry::Vacant(e) = self.known.entry(c) {
                    if let Some(t) = start_time(c) {
                        e.insert(t);
                        frontier.push(c);
                    }
                }
            }
        }
    }

    /// Reads every live member's `status`: the data segment's peak, the summed RSS and anonymous
    /// memory, the processes with memory, orphans the job made, and members killed by a signal.
    fn read_statuses(&mut self) -> StatusPass {
        let mut pass = StatusPass::default();
        let alive = self.alive();
        let mut orphans = vec![];
        for &pid in &alive {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let parent = status_number(&s, "PPid:").map(|p| p as u32);
                if pid != self.root && parent.is_some_and(|p| !alive.contains(&p)) {
                    orphans.push(pid);
                }
                self.data_peak = self.data_peak.max(status_kb(&s, "VmData:"));
                pass.rss += status_kb(&s, "VmRSS:");
                let a = status_kb(&s, "RssAnon:") + status_kb(&s, "RssShmem:");
                pass.anon += a;
                // a zombie has no memory (and no VmRSS line): nothing to read
                if has_memory(&s) {
                    pass.live.push((pid, a, status_kb(&s, "RssShmem:")));
                } else {
                    pass.unsettled |= exiting(&s);
                }
            }
            if let Some(sig) = zombie_signal(pid).filter(|&s| abnormal(s)) {
                if self.killed_pids.insert(pid) {
                    self.killed.push(format!("{}: signal {sig}", describe(pid)));
                }
            }
        }
        // (a root that exits gives its children away only after its memory: with the root's memory
        // still there, an orphan was made so by the job)
        if has_memory_now(self.root) {
            self.detached.extend(orphans);
        }
        pass
    }

    /// The shared memory of the last round that processes outside the tree hold shares of: a
    /// `/dev/shm` file that another job, or a trial beside this one, maps too counts only its share
    /// in the tree's `Pss_Shmem`, and the job alone holds it whole. At least one process's whole
    /// `RssShmem` is the tree's; what the tree's shares leave of it is added.
    fn shared_outside(&self) -> u64 {
        let mut readings = self.readings.values();
        let whole = readings.clone().map(|r| r.shmem).max().unwrap_or(0);
        whole.saturating_sub(readings.by_ref().map(|r| r.pss_shmem).sum())
    }

    /// Whether shared memory grew in more than one process since their readings.
    fn shared_grew(&self, live: &[(u32, u64, u64)]) -> bool {
        live.iter()
            .filter(|&&(pid, _, shmem)| self.readings.get(&pid).is_some_and(|r| shmem > r.shmem))
            .count()
            > 1
    }

    /// A tree whose root was forked from `server` (a fork server, [`crate::device::process`]): the
    /// pages the server shares with the tree count whole in the tree's figure, as a cold run owns
    /// the same pages alone. Each round reads the server's part of them: its `Pss_Anon +
    /// Pss_Shmem` less its own `Private_Dirty` (the pages a trial copied on write stay the server's
    /// alone and are not counted).
    pub fn forked_from(mut self, server: u32) -> Tree {
        self.lender = Some((server, 0));
        self
    }

    /// A process that joins or leaves the tree changes how its pages are shared (a fork shares
    /// the parent's, an exit leaves its share to the others): every reading is then out of date.
    /// Otherwise the readings are renewed on a schedule that keeps their cost a share of the time,
    /// sooner when shared memory grows in several processes.
    fn round_due(&self, members: &BTreeSet<u32>, now: Instant, shared_growth: bool) -> bool {
        *members != self.members
            || self.next_round.is_none_or(|t| now >= t)
            || (shared_growth && self.next_shared_round.is_none_or(|t| now >= t))
    }

    /// Reads every live process's proportional share afresh (a round), dropping from `live` those
    /// that ended meanwhile; whether the readings are unsettled (a process began to exit).
    fn read_shares(&mut self, live: &mut Vec<(u32, u64, u64)>, now: Instant) -> bool {
        self.readings.clear();
        let mut ended = vec![];
        for &(pid, _, shmem) in live.iter() {
            match proportional(pid) {
                // the anonymous pages of the same walk (not `status`'s, read before it: pages
                // touched meanwhile would count twice), with its shared memory
                Some((pss, anon, pss_shmem)) => {
                    let rss = anon + shmem;
                    let r = Reading {
                        pss,
                        rss,
                        shmem,
                        pss_shmem,
                    };
                    self.readings.insert(pid, r);
                }
                // ended meanwhile (gone, or a zombie): its memory went with it
                None if !has_memory_now(pid) => ended.push(pid),
                None => self.rss_fallback = true,
            }
        }
        live.retain(|(p, ..)| !ended.contains(p));
        if let Some((server, part)) = self.lender.as_mut() {
            *part = lent(*server).unwrap_or(0);
        }
        let cost = now.elapsed();
        self.next_round = Some(now + cost.div_f64(PSS_COST_SHARE));
        self.next_shared_round = Some(now + cost.div_f64(SHARED_GROWTH_COST_SHARE));
        // one that began to exit during the round: the readings before and after it differ
        !ended.is_empty() || live.iter().any(|&(p, ..)| !has_memory_now(p))
    }

    /// The tree's memory with shared pages counted once (each process's share, estimated from its
    /// last reading), and the part of it outside the trial's cgroup (`inside`). Shared memory that
    /// grew in several processes since their readings is most likely one region they fill
    /// together, so its growth counts once, the largest (the next round, due soon, reads each
    /// page's share).
    fn shares(
        &self,
        live: &[(u32, u64, u64)],
        inside: Option<&[u32]>,
        shared_growth: bool,
    ) -> (u64, u64) {
        let outside = |pid: u32| inside.is_some_and(|g| !g.contains(&pid));
        let (mut pss, mut escaped) = (0, 0);
        let mut shared = (0, None);
        for &(pid, a, shmem) in live {
            let last = self.readings.get(&pid).copied();
            let share = if shared_growth {
                let grew = last.map_or(0, |r| shmem.saturating_sub(r.shmem));
                if grew > shared.0 {
                    shared = (grew, Some(pid));
                }
                estimate(last, a - grew)
            } else {
                estimate(last, a)
            };
            pss += share;
            if outside(pid) {
                escaped += share;
            }
        }
        pss += shared.0 + self.lender.map_or(0, |(_, part)| part);
        if shared.1.is_some_and(outside) {
            escaped += shared.0;
        }
        (pss, escaped)
    }

    /// How [`Tree::pss_peak`] was measured.
    pub fn measure(&self) -> Measure {
        if self.rss_fallback {
            Measure::RssSum
        } else {
            Measure::Pss
        }
    }

    /// The tree's processes other than `root` still running (not zombies).
    pub fn running_except(&self, root: u32) -> Vec<u32> {
        self.live_pids()
            .into_iter()
            .filter(|&p| p != root)
            .collect()
    }

    /// Whether `pid` left the tree's parentage while the root ran (a double fork's daemon): it was
    /// made to outlive the job.
    pub fn detached(&self, pid: u32) -> bool {
        self.detached.contains(&pid)
    }

    /// Once the root exited: a scan of `/proc` at once (not when the scans' share of time allows),
    /// so that a daemon no scan had found yet is known; one found now outside the root's session
    /// (it called `setsid`) is detached too (the root's own last children share its session).
    pub fn root_exited(&mut self) {
        if let Some(scan) = self.scan.as_mut() {
            scan.next = None;
        }
        for (pid, start) in self.scan_for_escaped() {
            self.known.insert(pid, start);
            if stat_ids(pid).is_some_and(|(_, sid, _)| sid != self.root) {
                self.detached.insert(pid);
            }
        }
    }

    /// Processes seen so far.
    pub fn seen(&self) -> u32 {
        self.known.len() as u32
    }

    /// The PIDs of every process seen in the tree, live or not.
    pub fn seen_pids(&self) -> Vec<u32> {
        self.known.keys().copied().collect()
    }

    /// The PIDs of the tree's live processes that are not zombies.
    pub fn live_pids(&self) -> Vec<u32> {
        self.alive()
            .into_iter()
            .filter(|&p| !is_zombie(p))
            .collect()
    }

    /// SIGKILL to every live process of the tree (the same processes, never a reused PID).
    pub fn kill_all(&self) {
        for pid in self.alive().into_iter().chain(self.disputed_alive()) {
            // SAFETY: sending a signal to a process we started (checked by its start time).
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_a_tree_and_kills_it() {
        // sh → sleep (a child), and a grandchild in its own session
        let mut c = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & setsid sleep 31 & wait"])
            .spawn()
            .unwrap();
        let mut tree = Tree::new(c.id());
        let t0 = std::time::Instant::now();
        while tree.seen() < 3 && t0.elapsed().as_secs() < 5 {
            tree.sample();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(tree.seen() >= 3, "saw {}", tree.seen());
        assert!(tree.rss_peak > 0 && tree.data_peak > 0);
        let pids = tree.live_pids();
        tree.kill_all();
        let _ = c.wait();
        std::thread::sleep(std::time::Duration::from_millis(100));
        for p in pids {
            assert!(
                is_zombie(p) || start_time(p).is_none(),
                "process {p} of the tree survived"
            );
        }
    }

    /// Forked workers that fill one shared region together (a memfd they all map) grow their
    /// `RssShmem` by the same pages between two rounds of readings: the tree's figure counts that
    /// growth once, as a memory cgroup charges it, not once per worker.
    #[test]
    fn a_shared_region_that_forked_workers_fill_together_counts_once() {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/exec/memfd_workers.py"
        );
        let mut c = std::process::Command::new("/usr/bin/python3")
            .args([script, "768"])
            .spawn()
            .unwrap();
        let tree = sampled_until_exit(&mut c);
        let mib = tree.pss_peak >> 20;
        // the region once, and four interpreters' own few MiB each
        assert!(
            (768..768 * 11 / 10 + 48).contains(&mib),
            "the tree's figure peaked at {mib} MiB for a 768 MiB shared region"
        );
    }

    /// The tree of `c`, sampled every 5 ms until `c` exits.
    fn sampled_until_exit(c: &mut std::process::Child) -> Tree {
        let mut tree = Tree::new(c.id());
        loop {
            tree.sample();
            if c.try_wait().unwrap().is_some() {
                return tree;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Forked workers that only read their parent's memory share its pages: the tree's figure
    /// (proportional set sizes) counts them once, as a memory cgroup would charge them, while the
    /// summed `RssAnon` counts them once per process.
    #[test]
    fn shared_pages_of_forked_workers_count_once() {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/exec/forks.py");
        // the interpreter itself: a `python3` on PATH may be a shim that runs a tree of its own
        let mut c = std::process::Command::new("/usr/bin/python3")
            .args([
                script,
                "1",
                "--shared-mib",
                "96",
                "--own-mib",
                "16",
                "--hold",
                "1.0",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let tree = sampled_until_exit(&mut c);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let (pss, summed) = (mib(tree.pss_peak), mib(tree.anon_peak));
        assert_eq!(tree.measure(), Measure::Pss);
        let names: Vec<String> = tree.known.keys().map(|&p| describe(p)).collect();
        assert_eq!(tree.seen(), 5, "{names:?}");
        // 96 MiB shared by 5 processes, 16 MiB of one worker, a few MiB of each interpreter
        assert!(
            (112.0..112.0 + 5.0 * 8.0).contains(&pss),
            "pss {pss:.0} MiB"
        );
        // the old sum: the 96 MiB once per process
        assert!(summed > 4.0 * 96.0, "summed {summed:.0} MiB");
    }

    /// A region the trial maps together with a process outside its tree (a `/dev/shm` file that
    /// a trial beside it attached to) counts whole, as it does when the trial runs alone: the
    /// process outside takes half of each page's `Pss`.
    #[test]
    fn a_region_shared_with_a_process_outside_the_tree_counts_whole() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = dir.path().join("region");
        let hold = |secs: &str| {
            std::process::Command::new("/usr/bin/python3")
                .args(["-c", SHARED_REGION, file.to_str().unwrap(), "128", secs])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut outside = hold("4");
        while std::fs::metadata(&file).map_or(0, |m| m.len()) < 128 << 20 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut c = hold("1.5");
        let tree = sampled_until_exit(&mut c);
        outside.kill().unwrap();
        outside.wait().unwrap();
        let mib = tree.pss_peak >> 20;
        assert!(
            mib >= 128,
            "the tree's figure peaked at {mib} MiB for a 128 MiB region"
        );
    }

    /// `python3 -c SHARED_REGION FILE MIB SECONDS`: maps FILE (made MIB MiB long and filled when
    /// shorter), touches every page and holds it for SECONDS.
    const SHARED_REGION: &str = "import mmap, os, sys, time
path, mib, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
n = mib << 20
fresh = os.fstat(fd).st_size < n
if fresh:
    os.ftruncate(fd, n)
m = mmap.mmap(fd, n)
for i in range(0, n, 4096):
    if fresh:
        m[i] = 1
    else:
        m[i]
time.sleep(secs)
";

    #[test]
    fn between_readings_a_process_counts_its_growth() {
        let r = Some(Reading {
            pss: 10,
            rss: 100,
            shmem: 0,
            pss_shmem: 0,
        });
        assert_eq!(estimate(r, 100), 10);
        assert_eq!(estimate(r, 130), 40);
        // what falls counts until the next reading; never more than its own resident memory
        assert_eq!(estimate(r, 60), 10);
        assert_eq!(
            estimate(
                Some(Reading {
                    pss: 90,
                    rss: 100,
                    shmem: 0,
                    pss_shmem: 0,
                }),
                50
            ),
            50
        );
        // without a reading: its RssAnon + RssShmem
        assert_eq!(estimate(None, 70), 70);
    }
}
