//! Forked trials: one fork server per device imports the job's packages once (`--warm`, Python
//! commands, under `RLIMIT_DATA` only), and each exploration trial is a process forked from it,
//! handed the trial's argv and environment and its own stdout and stderr
//! ([`crate::platform::fdpass`]).
//!
//! What it measures: `RLIMIT_DATA` acts on each process's data segment, and a fork copies the
//! server's whole segment into the child (every inherited page counts in the child's `VmData`,
//! shared or not), so the trial is held to the bytes of its imports as a fresh interpreter is. Under
//! a memory cgroup the pages the server faulted stay charged to the server, so a forked trial would
//! be measured short: no fork server there (warm processes started ahead instead, each its own
//! cgroup). What it cannot be: the job's cold start. The imports ran in the server's environment and
//! argv, before the job's code, and every fork shares the server's random state: forked trials only
//! explore (the device runs every trial that proves cold). Nothing in the server initializes CUDA,
//! and a server whose imports started a thread does not serve (a fork keeps only the forking thread).
//!
//! The trial is batchfit's own child: the server's child forks the trial and exits, and the kernel
//! gives the orphan to batchfit, the subreaper ([`crate::platform::reaper`]); the trial starts its
//! own session, sets its parent-death signal (a fork clears it) and says its pid once that
//! happened. It is then watched, measured and ended like any trial ([`super::watch`]), and waited
//! for by batchfit, which gets its exit status.

use super::{
    end_trial, end_unused, open_logs, read_all, spawn_trial, ticks_now, watch, BackendError,
    Options, Ran, Registered, Root, Spawned, TrialIds,
};
use crate::platform::{fdpass, reaper};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the server may take to fork a trial and say its pid before it is given up.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// A fork server started under the limits of its trials (`RLIMIT_DATA`), its packages imported or
/// importing; ended when dropped.
pub struct ForkServer {
    spawned: Option<Spawned>,
    control: OwnedFd,
    /// The stages of imports it has not yet said are done: its own, then each
    /// [`ForkServer::import`].
    importing: u32,
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        self.end();
    }
}

impl ForkServer {
    /// Starts `cmd` (the warm bootstrap in its serving mode) under the limits of `opts`, with one
    /// end of a message socket as its stdin.
    pub fn start(cmd: Command, opts: &Options) -> Result<ForkServer, BackendError> {
        let (control, theirs) = fdpass::seqpacket_pair()
            .map_err(|e| BackendError::Environment(format!("cannot make a socket pair: {e}")))?;
        let spawned = spawn_trial(cmd, opts, Stdio::from(theirs), Default::default())?;
        Ok(ForkServer {
            spawned: Some(spawned),
            control,
            importing: 1,
        })
    }

    /// Whether it has imported the job's modules and waits for trials, waiting `patience` at most
    /// for it to say so (a trial that comes before runs otherwise).
    pub fn ready(&mut self, patience: Duration) -> bool {
        let until = std::time::Instant::now() + patience;
        while self.importing > 0 && self.alive() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match fdpass::recv(self.control.as_fd(), left) {
                Ok(Some(m)) if m == b"ready" => self.importing -= 1,
                _ => break,
            }
        }
        self.importing == 0
    }

    /// Asks it to import `modules` too (those it imported already cost nothing): it is not
    /// [`ForkServer::ready`] until it says they are done. `false` when it could not be asked.
    pub fn import(&mut self, modules: &[String]) -> bool {
        let ask = serde_json::json!({ "import": modules }).to_string();
        let asked = fdpass::send(self.control.as_fd(), ask.as_bytes(), &[]).is_ok();
        self.importing += u32::from(asked);
        asked
    }

    /// Whether its process still runs (one whose imports started a thread or initialized CUDA
    /// exits before it is ready).
    pub fn alive(&mut self) -> bool {
        self.spawned
            .as_mut()
            .is_some_and(|s| matches!(s.child.try_wait(), Ok(None)))
    }

    fn end(&mut self) {
        if let Some(s) = self.spawned.take() {
            end_unused(s);
        }
    }

    /// The trial forked for `handoff`, watched as [`super::run`] watches a fresh trial. `None` when
    /// the server is gone or did not fork it (then nothing ran: the trial is to run otherwise, and
    /// this server is of no further use).
    pub fn run(
        &mut self,
        handoff: &[u8],
        opts: &Options,
        timeout: Duration,
        sample: &mut dyn FnMut(&[u32]),
    ) -> Result<Option<Ran>, BackendError> {
        if !self.ready(Duration::ZERO) {
            return Ok(None);
        }
        let (out_log, err_log) = open_logs(opts)?;
        let pipe = |what| {
            fdpass::pipe().map_err(|e| {
                BackendError::Environment(format!("cannot make a pipe for {what}: {e}"))
            })
        };
        let ((out, out_w), (err, err_w)) = (pipe("stdout")?, pipe("stderr")?);
        let server = self.spawned.as_ref().expect("alive");
        // The server carries the marker its trials inherit (a fork keeps the environment a process
        // started with): the trial's processes are those started after it, not with it.
        let started = super::super::tree::stat_ids(server.child.id()).map_or(0, |(_, _, s)| s);
        let since = ticks_now().max(started.max(server.trial.since) + 2);
        let forked = TrialIds {
            root: server.child.id(),
            since,
            marker: server.trial.marker.clone(),
        };
        let control = self.control.as_fd();
        // the record of batchfit's own children is held until the trial is in it: no scan for
        // orphans takes the trial for one in between
        let pid = reaper::start_child(
            move || {
                fdpass::send(control, handoff, &[out_w.as_fd(), err_w.as_fd()])?;
                drop((out_w, err_w));
                let said = fdpass::recv(control, FORK_TIMEOUT)?
                    .ok_or_else(|| std::io::Error::other("the fork server forked no trial"))?;
                std::str::from_utf8(&said)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .ok_or_else(|| std::io::Error::other("the fork server said no pid"))
            },
            |pid| *pid,
        );
        let pid = match pid {
            Ok(pid) if crate::platform::procfs::children(std::process::id()).contains(&pid) => pid,
            _ => {
                // whatever it forked goes (processes of the server's session and marker started
                // since), and so does the server
                end_trial(&forked, None, None);
                self.end();
                return Ok(None);
            }
        };
        let trial = TrialIds {
            root: pid,
            ..forked
        };
        let spawned = Spawned {
            child: Root::Adopted(pid),
            registered: Registered::new(trial.clone()),
            trial,
            out: read_all(out, 1 << 20, Arc::new(Mutex::new(out_log))),
            err: read_all(err, 64 << 10, Arc::new(Mutex::new(err_log))),
        };
        let opts = Options {
            lender: Some(forked.root),
            ..opts.clone()
        };
        watch(spawned, &opts, timeout, sample).map(Some)
    }
}
