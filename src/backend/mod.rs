//! Backends turn "run N training steps at batch b" into a measured [`TrialOutcome`].
//!
//! The search ([`crate::search`]) sees only this trait. Three implementations:
//! * [`sim`]: a deterministic memory curve, so the search and the binaries are testable in milliseconds;
//! * [`cpu`]: a fresh child process per trial under a real `RLIMIT_DATA`, running real libtorch steps;
//! * [`cuda`]: compiled everywhere; it says clearly that it cannot run here instead of panicking.
//!
//! Nothing in this module (but the child-process runner in `cpu`) knows about tch or clap.

pub mod child;
pub mod cpu;
pub mod cuda;
pub mod sim;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One trial: `steps` full training steps (forward, backward, optimizer step) at `batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialRequest {
    pub batch: u64,
    pub steps: u32,
    /// Must run in a fresh process (proof trials). When false, a backend may use a long-lived worker.
    pub fresh: bool,
    /// Micro-batches of `batch` per optimizer step (gradient accumulation), as the trainer will run them.
    pub accumulation: u32,
}

/// Where a trial ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// A fresh process, as a training job will see it.
    Process,
    /// The long-lived exploration worker (hybrid isolation).
    Worker,
    /// No process at all (sim).
    None,
}

/// What a trial measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum TrialOutcome {
    /// All steps completed under the limit.
    Fits {
        /// The footprint the limit acts on (cpu: peak data segment; sim: the curve's value).
        peak_bytes: u64,
        /// Peak resident set size of the trial process (cpu only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rss_peak_bytes: Option<u64>,
        /// Median seconds per training step (the first step, which allocates optimizer state, excluded
        /// when there are at least two).
        step_seconds: f64,
        /// CUDA: both measurements of the footprint (cuda backend only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<GpuMeasure>,
    },
    /// The device ran out of memory: proof that this batch does not fit.
    Oom {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rss_peak_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<GpuMeasure>,
    },
    /// CUDA: the steps completed, but only after the caching allocator freed its cache and retried an
    /// allocation. Such a size runs slowly (and fails under a little more pressure), so it bounds the
    /// search like an OOM unless `--allow-retries` counts it as a fit.
    Retries {
        retries: u64,
        peak_bytes: u64,
        step_seconds: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<GpuMeasure>,
    },
    /// Killed after the trial timeout: neither a fit nor proof of a limit.
    Timeout { seconds: f64 },
    /// Anything else (crash, bad loss, no result): neither a fit nor proof of a limit.
    Error { message: String },
}

impl TrialOutcome {
    pub fn fits(&self) -> bool {
        matches!(self, TrialOutcome::Fits { .. })
    }
    pub fn is_oom(&self) -> bool {
        matches!(self, TrialOutcome::Oom { .. })
    }
    /// Proof that this size is too large: an OOM, or a completion that needed allocator retries.
    pub fn is_bound(&self) -> bool {
        matches!(
            self,
            TrialOutcome::Oom { .. } | TrialOutcome::Retries { .. }
        )
    }
    pub fn gpu(&self) -> Option<&GpuMeasure> {
        match self {
            TrialOutcome::Fits { gpu, .. }
            | TrialOutcome::Oom { gpu, .. }
            | TrialOutcome::Retries { gpu, .. } => gpu.as_ref(),
            _ => None,
        }
    }
    /// This outcome with `g` as its GPU measurement and its peak (what the limit acts on) taken from
    /// it: fits and retries; other outcomes as they are.
    pub fn measured_by(self, g: GpuMeasure) -> TrialOutcome {
        match self {
            TrialOutcome::Fits { step_seconds, .. } => TrialOutcome::Fits {
                peak_bytes: g.nvml_peak_bytes,
                rss_peak_bytes: None,
                step_seconds,
                gpu: Some(g),
            },
            TrialOutcome::Retries {
                retries,
                step_seconds,
                ..
            } => TrialOutcome::Retries {
                retries,
                peak_bytes: g.nvml_peak_bytes,
                step_seconds,
                gpu: Some(g),
            },
            other => other,
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            TrialOutcome::Fits { .. } => "fits",
            TrialOutcome::Oom { .. } => "oom",
            TrialOutcome::Retries { .. } => "retries",
            TrialOutcome::Timeout { .. } => "timeout",
            TrialOutcome::Error { .. } => "error",
        }
    }
    pub fn peak_bytes(&self) -> Option<u64> {
        match self {
            TrialOutcome::Fits { peak_bytes, .. } => Some(*peak_bytes),
            TrialOutcome::Oom { peak_bytes, .. } => *peak_bytes,
            TrialOutcome::Retries { peak_bytes, .. } => Some(*peak_bytes),
            _ => None,
        }
    }
    pub fn rss_peak_bytes(&self) -> Option<u64> {
        match self {
            TrialOutcome::Fits { rss_peak_bytes, .. }
            | TrialOutcome::Oom { rss_peak_bytes, .. } => *rss_peak_bytes,
            _ => None,
        }
    }
    pub fn step_seconds(&self) -> Option<f64> {
        match self {
            TrialOutcome::Fits { step_seconds, .. } => Some(*step_seconds),
            _ => None,
        }
    }
    pub fn message(&self) -> Option<&str> {
        match self {
            TrialOutcome::Oom { message, .. } | TrialOutcome::Error { message } => Some(message),
            TrialOutcome::Timeout { .. } => Some("killed after the trial timeout"),
            TrialOutcome::Retries { .. } => Some(
                "completed only after the CUDA caching allocator freed its cache and retried \
                 (slow; --allow-retries counts it as a fit)",
            ),
            TrialOutcome::Fits { .. } => None,
        }
    }
}

/// How a CUDA trial's footprint was measured: NVML's used memory for the trial's process, or (where
/// NVML cannot attribute memory to it, e.g. another PID namespace) the device's change in used memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FootprintMethod {
    NvmlProcess,
    NvmlDeviceDelta,
}

/// The caching allocator's own statistics for a trial (through the C++ shim).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AllocatorReport {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Reserved at the end of the steps.
    pub reserved_bytes: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
}

/// Both measurements of a CUDA trial: what the card gave up (NVML) and what the allocator saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMeasure {
    /// Peak of NVML's used memory for the trial (CUDA context + allocator reserve + libraries), by
    /// `method`. This is the footprint the limit acts on.
    pub nvml_peak_bytes: u64,
    pub method: FootprintMethod,
    /// The allocator's statistics (absent when the child died before reporting them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorReport>,
}

/// Facts about the device a plan was made on. `batchfit-train` compares kind, name and total memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `cpu`, `cuda` or `sim`.
    pub kind: String,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes_at_start: u64,
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
}
