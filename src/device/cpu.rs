//! The CPU device: a fresh child process per trial under a real `RLIMIT_DATA` equal to the limit, so
//! an over-limit step fails inside the allocator exactly as a memory-capped training job would.
//!
//! Default budget: [`DEFAULT_BUDGET_FRACTION`] of the lower of `MemAvailable` and what the cgroup can
//! still take (its limit less what it already holds), leaving room for the page cache and whatever
//! else runs on the machine.

use super::process::{self, Ran, Worker, WorkerRan};
use super::{Backend, BackendError, DeviceInfo, DeviceKind, IsolationMode};
use crate::platform::sysmem;
use crate::protocol::{Isolation, Placement, TrialOutcome, TrialRequest, Workload};
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
        })
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
                self.workload.outcome(&f)
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
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        if self.mode == IsolationMode::Hybrid && !req.fresh {
            Isolation::Worker
        } else {
            Isolation::Process
        }
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        let out = if self.isolation(&req) == Isolation::Worker {
            self.run_in_worker(req)?
        } else {
            let cmd = self.workload.command(&req, &Placement::Cpu);
            match process::run(cmd, Some(self.limit), self.timeout, &mut |_| {})? {
                Ran::Finished(f) => self.workload.outcome(&f),
                Ran::TimedOut { seconds } => TrialOutcome::Timeout { seconds },
            }
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
