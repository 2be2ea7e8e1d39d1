//! The CPU device: a fresh child process per trial under a real memory limit, so an over-limit step
//! fails exactly as a memory-capped training job would:
//!
//! * `RLIMIT_DATA` = the limit on the trial process (and every process it starts, each on its own):
//!   batchfit's own tch child, with its malloc set up so that peaks are clean;
//! * or, for a user's command where this process may create one, a memory cgroup per trial
//!   ([`super::cgroup`]) limiting the whole process tree together, as a job's cgroup will.
//!
//! A user's command's tree is followed and measured ([`super::tree`]): the largest data segment of
//! any of its processes, the summed resident memory, the cgroup's peak.
//!
//! Default budget: [`DEFAULT_BUDGET_FRACTION`] of the lower of `MemAvailable` and what the cgroup can
//! still take (its limit less what it already holds), leaving room for the page cache and whatever
//! else runs on the machine.

use super::cgroup::{self, Group};
use super::process::{self, Ran, Worker, WorkerRan};
use super::{Backend, BackendError, DeviceInfo, DeviceKind, IsolationMode, LimitMechanism};
use crate::platform::sysmem;
use crate::protocol::{
    Isolation, Placement, Trial, TrialDetails, TrialOutcome, TrialRequest, Workload,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Share of available memory used as the budget when `--memory-budget` is not given.
pub const DEFAULT_BUDGET_FRACTION: f64 = 0.8;

pub struct CpuBackend {
    workload: Arc<dyn Workload>,
    timeout: Duration,
    limit: u64,
    device: DeviceInfo,
    available: u64,
    mode: IsolationMode,
    worker: Option<Worker>,
    /// Where trials' memory cgroups are made (`None`: `RLIMIT_DATA`).
    cgroup: Option<cgroup::Parent>,
    /// `--logs DIR`: each trial's whole output.
    logs: Option<PathBuf>,
    /// Trials started, shared with the other devices of `--parallel` (cgroup and log names).
    trials: Arc<AtomicU32>,
    details: Option<TrialDetails>,
    /// The running trial's number (of [`CpuBackend::trials`]).
    n: u32,
    /// The next trial's warm process, when the workload has one ([`Workload::warm_command`]).
    warm: Option<Warm>,
    /// The fork server of forked trials, under `RLIMIT_DATA` ([`process::ForkServer`]), and the
    /// limit it was started under.
    server: Option<(process::ForkServer, u64)>,
    /// What the fork server imports when it was started before a trial said what the job imports
    /// ([`Workload::warm_guess`]).
    guessed: Option<Vec<String>>,
    /// A guess was ended (the job did not import it, or wrote no report): none is made again.
    guess_failed: bool,
    /// Whether warm trials may fork from a server where the limit allows it (`--warm` auto or on).
    forking: bool,
    /// How long the last cold trial took: how long a trial waits at most for the fork server.
    cold_start: Duration,
}

/// A warm process started ahead of its trial, in the memory cgroup its trial will have (or under
/// `RLIMIT_DATA`), at the limit it was started under.
struct Warm {
    pre: process::Prestarted,
    group: Option<Group>,
    limit: u64,
}

impl CpuBackend {
    /// Trials of `workload`, each killed after `timeout`; `mode` says whether exploration may run in
    /// the workload's long-lived worker.
    pub fn new(
        workload: Arc<dyn Workload>,
        timeout: Duration,
        mode: IsolationMode,
    ) -> Result<Self, BackendError> {
        let (total, _) = sysmem::meminfo()
            .map_err(|e| BackendError::Environment(format!("cannot read /proc/meminfo: {e}")))?;
        let cg = sysmem::cgroup_limit();
        let total = cg.map_or(total, |c| c.min(total));
        // what the cgroup already holds is not available (a half-full container has half)
        let available = sysmem::available_bytes()
            .map_err(|e| BackendError::Environment(format!("cannot read /proc/meminfo: {e}")))?;
        if total == 0 || available == 0 {
            return Err(BackendError::Environment(
                "the machine reports 0 bytes of memory".into(),
            ));
        }
        let device = DeviceInfo {
            kind: DeviceKind::Cpu,
            name: sysmem::cpu_name(),
            total_bytes: total,
            free_bytes_at_start: available,
        };
        Ok(CpuBackend {
            workload,
            timeout,
            limit: available,
            device,
            available,
            mode,
            worker: None,
            cgroup: None,
            logs: None,
            trials: Arc::new(AtomicU32::new(0)),
            details: None,
            n: 0,
            warm: None,
            server: None,
            guessed: None,
            guess_failed: false,
            forking: true,
            cold_start: Duration::ZERO,
        })
    }

    /// Warm trials only in processes started ahead, never forked (`--warm ahead`).
    pub fn without_fork_server(mut self) -> Self {
        self.forking = false;
        self
    }

    /// Trials in memory cgroups under `parent` instead of under `RLIMIT_DATA`.
    /// Trial groups that dead batchfit processes left under `parent` are removed first.
    pub fn with_cgroup(mut self, parent: cgroup::Parent) -> Self {
        cgroup::remove_stale(&parent);
        self.cgroup = Some(parent);
        self
    }

    /// Numbers its trials together with `other`'s (`--parallel`: devices of one probe running
    /// trials at once), so that no two trials share a cgroup's or a log's name.
    pub fn numbered_with(mut self, other: &CpuBackend) -> Self {
        self.trials = other.trials.clone();
        self
    }

    /// Each trial's whole output into `dir` (`trial-NNN-bB-aA.stdout` / `.stderr`).
    pub fn with_logs(mut self, dir: PathBuf) -> Self {
        self.logs = Some(dir);
        self
    }

    /// How trials' memory is limited.
    fn mechanism(&self) -> LimitMechanism {
        match &self.cgroup {
            Some(p) if p.version == cgroup::Version::V2 => LimitMechanism::CgroupV2,
            Some(_) => LimitMechanism::CgroupV1,
            None => LimitMechanism::RlimitData,
        }
    }

    /// The trial's memory cgroup (`name`), when trials have one.
    fn group(&self, name: &str) -> Result<Option<Group>, BackendError> {
        self.cgroup
            .as_ref()
            .map(|parent| Group::create(parent, name, self.limit))
            .transpose()
            .map_err(BackendError::Environment)
    }

    /// The workload's command for `req`, numbered as this device's trial: a command's
    /// `BATCHFIT_TRIAL` is one less than the number its log is named by (`self.n`). Devices side by
    /// side each draw both numbers from counters shared among them; the workload's alone could pair
    /// one device's log with the other's number.
    fn command(&self, req: &TrialRequest) -> (std::process::Command, Trial) {
        let (mut cmd, trial) = self.workload.command(req, &Placement::Cpu);
        if cmd.get_envs().any(|(k, _)| k == "BATCHFIT_TRIAL") {
            cmd.env("BATCHFIT_TRIAL", self.n.saturating_sub(1).to_string());
        }
        (cmd, trial)
    }

    /// How the trial `req` in `group` is run and watched.
    fn options<'a>(
        &self,
        req: &TrialRequest,
        group: Option<&'a Group>,
        evidence: &'a dyn Fn() -> bool,
    ) -> process::Options<'a> {
        let tree = self.workload.measured_by_device();
        process::Options {
            evidence: Some(process::EvidenceCheck(evidence)),
            data_limit: group.is_none().then_some(self.limit),
            cgroup: group,
            tree,
            log: self.logs.as_ref().map(|d| {
                d.join(format!(
                    "trial-{:03}-b{}-a{}",
                    self.n, req.batch, req.accumulation
                ))
            }),
            own_child: !tree,
            lender: None,
        }
    }

    /// Starts the next trial's warm process, when the workload has one and none is waiting. One that
    /// cannot be started is no error: the trial runs cold.
    fn prestart(&mut self) {
        if self.serve(false) || self.warm.is_some() {
            return;
        }
        let Some(modules) = self.workload.warm_modules() else {
            return;
        };
        let Some(cmd) = self.workload.warm_command(&modules, false) else {
            return;
        };
        // numbered across the devices of `--parallel`, as trials are
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "batchfit-{}-warm{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::SeqCst) + 1
        );
        let Ok(group) = self.group(&name) else { return };
        let opts = process::Options {
            data_limit: group.is_none().then_some(self.limit),
            cgroup: group.as_ref(),
            tree: true,
            ..Default::default()
        };
        if let Ok(pre) = process::prestart(cmd, &opts) {
            self.warm = Some(Warm {
                pre,
                group,
                limit: self.limit,
            });
        }
    }

    /// Starts the fork server, when the workload has one, the limit is `RLIMIT_DATA` and none
    /// runs: whether one runs now. `early`, before a trial said what the job imports, it imports the
    /// frameworks the command names ([`Workload::warm_guess`]) while the first trial runs cold; once
    /// a trial said, it imports the rest, or ends when the job did not import what it guessed (or
    /// said nothing). One that cannot be started is no error: trials run otherwise.
    fn serve(&mut self, early: bool) -> bool {
        let known = self.workload.warm_modules();
        if let Some(guess) = self.guessed.take() {
            match (&known, &mut self.server) {
                (Some(m), Some((server, _))) if guess.iter().all(|g| m.contains(g)) => {
                    if !server.import(m) {
                        self.server = None;
                    }
                }
                (None, Some(_)) if early => self.guessed = Some(guess),
                _ => {
                    self.server = None;
                    self.guess_failed = true;
                }
            }
        }
        if self.server.is_some() {
            return true;
        }
        let may = self.forking && self.cgroup.is_none() && crate::platform::reaper::adopting();
        let (modules, guessed) = match known {
            _ if !may => return false,
            Some(m) => (m, false),
            None if early && !self.guess_failed => (self.workload.warm_guess(), true),
            None => return false,
        };
        if guessed && modules.is_empty() {
            return false;
        }
        let Some(cmd) = self.workload.warm_command(&modules, true) else {
            return false;
        };
        let opts = process::Options {
            data_limit: Some(self.limit),
            tree: true,
            ..Default::default()
        };
        if let Ok(server) = process::ForkServer::start(cmd, &opts) {
            self.server = Some((server, self.limit));
            self.guessed = guessed.then_some(modules);
        }
        self.server.is_some()
    }

    /// Runs `req` in a process forked from the fork server: `None` when there is none at this
    /// limit, it is still importing, or it did not run the command (then nothing of it is
    /// evidence). A server that exited before it was ready (its imports started a thread) or did
    /// not run a trial is not started again: warm processes are then started ahead instead.
    fn run_forked(&mut self, req: &TrialRequest) -> Option<(Result<Ran, BackendError>, Trial)> {
        let (mut server, limit) = self.server.take().filter(|s| s.1 == self.limit)?;
        // waiting longer than a cold start takes would gain nothing
        if !server.ready(self.cold_start) {
            if server.alive() {
                self.server = Some((server, limit));
            } else {
                self.forking = false;
            }
            return None;
        }
        let timeout = self.timeout;
        let (ran, trial) = self.hand_off(req, None, |line, opts| {
            server.run(line, opts, timeout, &mut |_| {})
        });
        match ran {
            Err(e) => Some((Err(e), trial)),
            Ok(Some(ran)) if self.workload.warm_took(&trial) => {
                self.server = Some((server, limit));
                Some((Ok(ran), trial))
            }
            Ok(_) => {
                self.workload.trial_ended(&trial);
                self.forking = false;
                None
            }
        }
    }

    /// The trial `req` handed to a warm process by `run` (given the hand-off line and how the trial
    /// is watched, in `group` when it has one): what ran (`None`: nothing reached the command) and
    /// the trial as started.
    fn hand_off(
        &self,
        req: &TrialRequest,
        group: Option<&Group>,
        run: impl FnOnce(&[u8], &process::Options) -> Result<Option<Ran>, BackendError>,
    ) -> (Result<Option<Ran>, BackendError>, Trial) {
        let (cmd, mut trial) = self.command(req);
        let ran = match self.workload.warm_handoff(&mut trial, &cmd) {
            Some(line) => {
                let workload = Arc::clone(&self.workload);
                let watched = trial.clone();
                let evidence = move || workload.evidence_in(&watched);
                let opts = self.options(req, group, &evidence);
                run(&line, &opts)
            }
            None => Ok(None),
        };
        (ran, trial)
    }

    /// Runs `req` in the waiting warm process: `None` when there is none at this limit, or the
    /// hand-off did not reach the command (then nothing of it is evidence).
    fn run_warm(&mut self, req: &TrialRequest) -> Option<(Result<Ran, BackendError>, Trial)> {
        let warm = self.warm.take().filter(|w| w.limit == self.limit)?;
        // the next one imports while this trial runs
        self.prestart();
        let timeout = self.timeout;
        let (ran, trial) = self.hand_off(req, warm.group.as_ref(), |line, opts| {
            process::run_prestarted(warm.pre, line, opts, timeout, &mut |_| {})
        });
        drop(warm.group);
        let took = self.workload.warm_took(&trial);
        match ran {
            Err(e) => Some((Err(e), trial)),
            Ok(Some(ran)) if took => Some((Ok(ran), trial)),
            Ok(_) => {
                self.workload.trial_ended(&trial);
                None
            }
        }
    }

    fn run_fresh(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.n = self.trials.fetch_add(1, Ordering::SeqCst) + 1;
        // Only exploration runs warm, forked or started ahead: a trial that proves (a bound, the
        // answer's confirmation and its fresh repeats) runs as the job will, started cold. A warm
        // process's imports ran outside the job (before its code, in the server's environment and
        // argv, their transient memory gone before the trial, their random state shared by every
        // fork). Measured: an Accelerate job with DataLoader workers under a memory cgroup peaked
        // within 1.2 MiB over three warm runs of its answer, and cold runs of it ran out of memory 6
        // times in 10, peaking up to 80 MiB higher; a library sized by an environment variable the
        // script sets before importing it held 8 MiB in forked trials and 160 MiB cold.
        let started = if req.fresh {
            None
        } else if let Some(ran) = self.run_forked(&req) {
            Some((ran, true))
        } else {
            self.run_warm(&req).map(|ran| (ran, false))
        };
        let ((ran, trial), warm, forked) = match started {
            Some((ran, forked)) => (ran, true, forked),
            None => {
                if !req.fresh {
                    // an exploration trial that runs cold (the first): the server imports meanwhile
                    self.serve(true);
                }
                let t0 = std::time::Instant::now();
                let ran = self.run_cold(&req);
                self.cold_start = t0.elapsed();
                (ran, false, false)
            }
        };
        let out = match ran {
            Ok(Ran::Finished(f)) => {
                let (o, d) = self.workload.outcome(&trial, &f);
                self.details = d.map(|d| TrialDetails { warm, forked, ..d });
                Ok(o)
            }
            Ok(Ran::TimedOut { seconds, tail }) => {
                self.details =
                    TrialDetails::timed_out(tail).map(|d| TrialDetails { warm, forked, ..d });
                Ok(TrialOutcome::Timeout { seconds })
            }
            Err(e) => Err(e),
        };
        self.workload.trial_ended(&trial);
        let out = out?;
        // what this trial reported may be what a warm process needs: the next one starts now,
        // unless this trial had to run cold (a device that runs only the proof's trials, side by
        // side with the one that explores, would start one for nothing)
        if !req.fresh {
            self.prestart();
        }
        Ok(out)
    }

    /// Runs `req` in a fresh process started now.
    fn run_cold(&mut self, req: &TrialRequest) -> (Result<Ran, BackendError>, Trial) {
        let (cmd, trial) = self.command(req);
        let group = match self.group(&format!("batchfit-{}-{}", std::process::id(), self.n)) {
            Ok(g) => g,
            Err(e) => return (Err(e), trial),
        };
        let workload = Arc::clone(&self.workload);
        let watched = trial.clone();
        let evidence = move || workload.evidence_in(&watched);
        let opts = self.options(req, group.as_ref(), &evidence);
        let ran = process::run(cmd, &opts, self.timeout, &mut |_| {});
        drop(group);
        (ran, trial)
    }

    fn run_in_worker(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        if self.worker.is_none() {
            let cmd = self
                .workload
                .worker_command(&Placement::Cpu)
                .ok_or_else(|| {
                    BackendError::Environment(
                        "--isolation hybrid: this workload has no long-lived worker".into(),
                    )
                })?;
            self.worker = Some(Worker::start(cmd, Some(self.limit))?);
        }
        let line = serde_json::to_string(&req).expect("request serialises");
        let worker = self.worker.as_mut().expect("started");
        Ok(match worker.run(&line, self.timeout)? {
            WorkerRan::Result(o) => o,
            WorkerRan::Died(f) => {
                self.worker = None;
                self.workload.outcome(&Trial::of(req), &f).0
            }
            WorkerRan::TimedOut { seconds } => {
                self.worker = None;
                TrialOutcome::Timeout { seconds }
            }
        })
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }
    fn default_budget(&self) -> u64 {
        (self.available as f64 * DEFAULT_BUDGET_FRACTION) as u64
    }
    fn set_limit(&mut self, limit_bytes: u64) {
        self.limit = limit_bytes;
        self.worker = None;
        self.warm = None;
        self.server = None;
        self.guessed = None;
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        if self.mode == IsolationMode::Hybrid && !req.fresh {
            Isolation::Worker
        } else {
            Isolation::Process
        }
    }
    fn limit_mechanism(&self) -> LimitMechanism {
        self.mechanism()
    }
    fn take_details(&mut self) -> Option<TrialDetails> {
        self.details.take()
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.details = None;
        let out = if self.isolation(&req) == Isolation::Worker {
            self.run_in_worker(req)?
        } else {
            self.run_fresh(req)?
        };
        // A fit whose measured footprint is 0 means the measurement failed: fail loudly rather than
        // record it.
        if let TrialOutcome::Fits { peak_bytes: 0, .. } = &out {
            return Ok(TrialOutcome::Error {
                message: "the trial reported a peak of 0 bytes".into(),
            });
        }
        Ok(out)
    }
}
