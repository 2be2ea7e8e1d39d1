//! batchfit as its trials' subreaper: a process a trial orphans comes back to batchfit.
//!
//! A job can leave a daemon that escapes every other way of telling it apart: a double fork
//! (the middle process exits at once, so no sample sees the daemon as a descendant), `setsid`
//! (another session and process group) and a cleared environment (no trial marker). Under a memory
//! cgroup it stays in the trial's group; under `RLIMIT_DATA` nothing else holds it. With
//! `PR_SET_CHILD_SUBREAPER` the kernel makes batchfit, not init, the parent of every orphan of its
//! descendants, so such a daemon is a child of batchfit that batchfit never started: an
//! **adopted** process. A trial's tree counts the adopted processes started since the trial began
//! as its own (their memory is the job's; they are ended and recorded as left behind with the
//! trial), and their zombies are reaped here, never by a wait on a process batchfit started itself.
//!
//! Adoption alone says an orphan is some trial's, not whose. While several trials follow orphans at
//! once (`--parallel N` lanes) and no memory cgroup lists a trial's processes, an orphan adopted
//! then is **disputed**: no trial counts it, for as long as it lives, and a trial that saw one is
//! not proven to fit (its job's memory was partly unmeasured).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

static ADOPTING: AtomicBool = AtomicBool::new(false);

fn started() -> MutexGuard<'static, BTreeSet<u32>> {
    static STARTED: OnceLock<Mutex<BTreeSet<u32>>> = OnceLock::new();
    STARTED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

static FOLLOWING: AtomicUsize = AtomicUsize::new(0);

/// How many orphans were disputed so far: a trial running while the count moved may have had its
/// own among them, seen first (and ended) by another trial.
static DISPUTES: AtomicUsize = AtomicUsize::new(0);

/// How many orphans were disputed so far ([`attributable`]).
pub fn disputes() -> usize {
    DISPUTES.load(Ordering::SeqCst)
}

/// A trial that follows the orphans this process adopts, while it lives.
#[derive(Debug)]
pub struct Following(());

impl Following {
    pub fn start() -> Following {
        FOLLOWING.fetch_add(1, Ordering::SeqCst);
        Following(())
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        FOLLOWING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many trials follow orphans now.
pub fn followers() -> usize {
    FOLLOWING.load(Ordering::SeqCst)
}

fn disputed() -> MutexGuard<'static, BTreeSet<(u32, u64)>> {
    static DISPUTED: OnceLock<Mutex<BTreeSet<(u32, u64)>>> = OnceLock::new();
    DISPUTED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether the orphan `(pid, start)` can be counted as the asking trial's: it is, when that trial
/// is the only one following orphans and the orphan was never disputed; otherwise it is disputed
/// from now on.
pub fn attributable(orphan: (u32, u64)) -> bool {
    let mut d = disputed();
    if d.contains(&orphan) {
        return false;
    }
    if followers() > 1 {
        d.insert(orphan);
        DISPUTES.fetch_add(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// Makes this process the subreaper of its descendants (once, for the rest of its life). Only the
/// `batchfit` binary calls it: a process that never did adopts nothing, so [`adopted`] is empty.
pub fn adopt_orphans() {
    // SAFETY: prctl with an integer argument.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) } == 0 {
        ADOPTING.store(true, Ordering::SeqCst);
    }
}

/// Whether this process adopts its descendants' orphans ([`adopt_orphans`] took effect): only then
/// does a process that a descendant forked and orphaned become this process's own child.
pub fn adopting() -> bool {
    ADOPTING.load(Ordering::SeqCst)
}

/// Starts a child with `spawn` and records it as one this process started itself (a trial's
/// root, a warm process). The record is held while the child is forked, so that [`adopted`], which
/// takes it too, never sees a child between its fork and its record.
pub fn start_child<T>(
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid: impl Fn(&T) -> u32,
) -> std::io::Result<T> {
    let mut mine = started();
    let child = spawn()?;
    mine.insert(pid(&child));
    Ok(child)
}

/// The live children of this process that it did not start (orphans the kernel gave it), with their
/// start times (clock ticks since boot); the zombies among them are reaped.
pub fn adopted() -> Vec<(u32, u64)> {
    if !ADOPTING.load(Ordering::SeqCst) {
        return vec![];
    }
    let me = std::process::id();
    let mine = started();
    let mut out = vec![];
    for pid in super::procfs::children(me)
        .into_iter()
        .filter(|p| !mine.contains(p))
    {
        let Some(stat) = super::procfs::stat(pid) else {
            continue;
        };
        if stat.starts_with(['Z', 'X']) {
            reap(pid);
        } else if let Some(start) = super::procfs::started_at(&stat) {
            out.push((pid, start));
        }
    }
    out
}

/// Collects the exit status of an adopted process that has ended (never blocks).
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid on a child this process did not start (no std `Child` waits on it).
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
}
