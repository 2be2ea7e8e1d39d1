//! The CPU backend: real libtorch training steps in a fresh child process per trial, under a real
//! `RLIMIT_DATA` equal to the limit, so an over-limit step fails inside libtorch's allocator exactly as a
//! memory-capped training job would.
//!
//! Default budget: [`DEFAULT_BUDGET_FRACTION`] of the lower of `MemAvailable` and the cgroup memory limit,
//! leaving room for the page cache and whatever else runs on the machine.

use super::child::{run_trial_child, Worker};
use super::{Backend, BackendError, DeviceInfo, Isolation, TrialOutcome, TrialRequest};
use crate::sysmem;
use crate::trial::TrialSpec;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// How exploration trials are isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// Every trial in a fresh process.
    Process,
    /// Exploration in one long-lived worker under the same limit; proof trials in fresh processes.
    Hybrid,
}

/// Share of available memory used as the budget when `--memory-budget` is not given.
pub const DEFAULT_BUDGET_FRACTION: f64 = 0.8;

pub struct CpuBackend {
    exe: PathBuf,
    template: TrialSpec,
    timeout: Duration,
    limit: u64,
    device: DeviceInfo,
    available: u64,
    mode: IsolationMode,
    worker: Option<Worker>,
}

impl CpuBackend {
    /// `exe` is the batchfit binary (its hidden `__trial` subcommand runs the trial); `template` holds the
    /// model, threads, seed (batch and steps are filled per trial).
    pub fn new(
        exe: PathBuf,
        template: TrialSpec,
        timeout: Duration,
        mode: IsolationMode,
    ) -> Result<Self, BackendError> {
        let (total, avail) = sysmem::meminfo()
            .map_err(|e| BackendError::Environment(format!("cannot read /proc/meminfo: {e}")))?;
        let cg = sysmem::cgroup_limit();
        let total = cg.map_or(total, |c| c.min(total));
        let available = cg.map_or(avail, |c| c.min(avail));
        if total == 0 || available == 0 {
            return Err(BackendError::Environment(
                "the machine reports 0 bytes of memory".into(),
            ));
        }
        let device = DeviceInfo {
            kind: "cpu".into(),
            name: sysmem::cpu_name(),
            total_bytes: total,
            free_bytes_at_start: available,
        };
        Ok(CpuBackend {
            exe,
            template,
            timeout,
            limit: available,
            device,
            available,
            mode,
            worker: None,
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
            if self.worker.is_none() {
                let mut cmd = Command::new(&self.exe);
                cmd.arg("__worker")
                    .arg(serde_json::to_string(&self.template).expect("spec serialises"));
                self.worker = Some(Worker::start(cmd, Some(self.limit))?);
            }
            let line = serde_json::to_string(&crate::trial::WorkerRequest {
                batch: req.batch,
                steps: req.steps,
                accumulation: req.accumulation,
            })
            .expect("request serialises");
            let (out, alive) = self
                .worker
                .as_mut()
                .expect("started")
                .run(&line, self.timeout)?;
            if !alive {
                self.worker = None;
            }
            out
        } else {
            let spec = TrialSpec {
                batch: req.batch,
                steps: req.steps,
                accumulation: req.accumulation,
                ..self.template.clone()
            };
            let mut cmd = Command::new(&self.exe);
            cmd.arg("__trial")
                .arg(serde_json::to_string(&spec).expect("spec serialises"));
            run_trial_child(cmd, Some(self.limit), self.timeout)?
        };
        // A fit whose measured footprint exceeds the limit is impossible under RLIMIT_DATA unless the
        // measurement is wrong: fail loudly rather than record it.
        if let TrialOutcome::Fits { peak_bytes, .. } = &out {
            if *peak_bytes == 0 {
                return Ok(TrialOutcome::Error {
                    message: "the trial reported a peak of 0 bytes".into(),
                });
            }
        }
        Ok(out)
    }
}
