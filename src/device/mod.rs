//! Where a trial's memory is limited and measured: the [`Backend`] trait the search talks to, and its
//! three devices.
//!
//! | device | limit | measure | decides a fit |
//! |---|---|---|---|
//! | [`sim`] | a formula | the formula | curve ≤ limit |
//! | [`cpu`] | `RLIMIT_DATA` on the trial process | the process's data segment, sampled every ms (and its peak RSS) | the process completed under the limit |
//! | [`cuda`] | `PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction` | NVML's used memory of the trial process, sampled every ~5 ms, plus the caching allocator's own figures | completed, NVML's peak ≤ limit, no allocator retries |
//!
//! A device gets *what* to run from a [`Workload`](crate::protocol::Workload) (a command line for
//! one trial) and never knows whether that is batchfit's own tch child or a user's script;
//! [`process`] is the one runner of trial processes (own process group, limit, timeout, interrupts,
//! captured output). `sim` is pure arithmetic and part of the engine: the search, the plan and the
//! whole-binary tests run on it in milliseconds.

pub mod cgroup;
pub mod cpu;
pub mod cuda;
pub mod lanes;
pub mod process;
pub mod sim;
pub mod tree;

use crate::protocol::{Isolation, TrialDetails, TrialOutcome, TrialRequest};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The kinds of device (serialised as `cpu`, `cuda`, `sim` in plans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Sim,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Sim => "sim",
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Facts about the device a plan was made on. `batchfit-train` compares kind, name and total memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes_at_start: u64,
}

/// How exploration trials are isolated on the cpu device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// Every trial in a fresh process.
    Process,
    /// Exploration in one long-lived worker under the same limit; proof trials in fresh processes.
    Hybrid,
}

/// How a trial's memory is limited (recorded in the plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitMechanism {
    /// `RLIMIT_DATA` on the trial process, inherited by each process it starts (each on its own).
    RlimitData,
    /// A memory cgroup (v1 `memory.limit_in_bytes`) around the whole process tree.
    CgroupV1,
    /// A memory cgroup (v2 `memory.max`) around the whole process tree.
    CgroupV2,
    /// `PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction` per process, NVML's footprint checked.
    CudaFraction,
    /// A formula (sim).
    Simulated,
}

impl LimitMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitMechanism::RlimitData => "RLIMIT_DATA per process",
            LimitMechanism::CgroupV1 => "a memory cgroup (v1) around the process tree",
            LimitMechanism::CgroupV2 => "a memory cgroup (v2) around the process tree",
            LimitMechanism::CudaFraction => "the CUDA allocator's memory fraction, NVML checked",
            LimitMechanism::Simulated => "a formula",
        }
    }
}

/// Failures that stop the whole probe (as opposed to one trial's outcome).
#[derive(Debug, Error)]
pub enum BackendError {
    /// The device or environment cannot run trials at all (no GPU, cannot spawn, ...).
    #[error("{0}")]
    Environment(String),
    /// SIGINT / SIGTERM arrived; the running trial was killed.
    #[error("interrupted by signal {0}")]
    Interrupted(i32),
}

/// A device that can run trials.
pub trait Backend {
    /// Device facts for the plan.
    fn device(&self) -> &DeviceInfo;
    /// The budget when the user gives none (cpu: a fraction of available RAM; sim: its capacity).
    fn default_budget(&self) -> u64;
    /// Sets the limit ((budget − reserve) × (1 − margin)) that a trial must fit under.
    fn set_limit(&mut self, limit_bytes: u64);
    /// Runs one trial. `Err` only for failures that make further trials pointless.
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError>;
    /// Where a request like `req` runs on this backend.
    fn isolation(&self, req: &TrialRequest) -> Isolation;
    /// How this device limits a trial's memory (for the plan). Default: a formula, as the sim
    /// device and the test devices of the search.
    fn limit_mechanism(&self) -> LimitMechanism {
        LimitMechanism::Simulated
    }
    /// More about the trial that just ran, for its record (a user command's output tail, report,
    /// tree measurements); `None` when there is nothing more.
    fn take_details(&mut self) -> Option<TrialDetails> {
        None
    }
    /// How many trials this device runs at once: 1, or the number of identical devices behind it
    /// ([`lanes::Lanes`]: identical GPUs, `--parallel N`).
    fn width(&self) -> usize {
        1
    }
    /// How many sizes the exploration runs at once: the width, or 1 where the devices share the
    /// cores that run their trials ([`lanes::Lanes::exploring_alone`]; the proof's trials still
    /// run side by side).
    fn explore_width(&self) -> usize {
        self.width()
    }
    /// Runs `reqs` (at most [`Backend::width`] of them) at once, each on its own device, and
    /// returns their results in the order of `reqs`. One device runs them one after another.
    fn run_round(&mut self, reqs: &[TrialRequest]) -> Vec<RoundTrial> {
        reqs.iter().map(|r| run_one(self, *r, None)).collect()
    }
}

/// One trial of a round ([`Backend::run_round`]) and what its record needs.
#[derive(Debug)]
pub struct RoundTrial {
    pub outcome: Result<TrialOutcome, BackendError>,
    pub isolation: Isolation,
    pub details: Option<TrialDetails>,
    /// Wall seconds of the trial, process start included.
    pub seconds: f64,
    /// The GPU it ran on, when the device is one of several.
    pub gpu: Option<u32>,
}

/// Runs `req` on `b` and collects what its record needs.
pub fn run_one<B: Backend + ?Sized>(b: &mut B, req: TrialRequest, gpu: Option<u32>) -> RoundTrial {
    let isolation = b.isolation(&req);
    let t0 = std::time::Instant::now();
    let outcome = b.run_trial(req);
    RoundTrial {
        outcome,
        isolation,
        details: b.take_details(),
        seconds: t0.elapsed().as_secs_f64(),
        gpu,
    }
}
