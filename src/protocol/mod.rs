//! The protocol between the probe (parent) and a trial (child process), below both of them.
//!
//! * [`TrialRequest`]: what the search asks of a device: `steps` training steps at `batch`, with
//!   `accumulation` micro-batches per optimizer step;
//! * [`TrialOutcome`] with its measurements ([`GpuMeasure`], [`AllocatorReport`]): what a trial came to
//!   (fits / oom / retries / over-budget / timeout / error), as the search, the plan and the progress
//!   lines see it;
//! * the stdout markers a tch trial child prints ([`STARTED_MARKER`], [`RESULT_PREFIX`]) and
//!   [`result_line`] / [`parse_result`] for its result line;
//! * [`Workload`]: how a device starts one trial of *something* (a tch model, a user's command) without
//!   knowing what it is;
//! * [`classify`]: the one out-of-memory classifier, fed the evidence of a failure.
//!
//! Nothing here knows tch, clap or NVML.

pub mod classify;

use serde::{Deserialize, Serialize};

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
    /// The trial's measured footprint went above the limit without the limit stopping it: under
    /// `RLIMIT_DATA`, which bounds each process's data segment alone, the process tree's anonymous
    /// and shared memory (each page once) was above the limit. The job needs more than this budget,
    /// so this size bounds the search exactly like an out-of-memory (the "runs out of memory one
    /// step up" half of the proof: out of *this budget*), and is never a fit.
    OverBudget {
        message: String,
        /// Which figure went above the limit: `tree-pss` (the tree's summed `Pss_Anon +
        /// Pss_Shmem`).
        measure: String,
        /// Its peak.
        peak_bytes: u64,
        /// The limit it went above.
        limit_bytes: u64,
    },
    /// Killed after the trial timeout: neither a fit nor proof of a limit.
    Timeout {
        /// How long it ran before it was killed (`timeout_seconds` in JSON: a trial record's own
        /// `seconds` sits beside the flattened outcome).
        #[serde(rename = "timeout_seconds")]
        seconds: f64,
    },
    /// Anything else (crash, bad loss, no result): neither a fit nor proof of a limit.
    Error { message: String },
}

impl TrialOutcome {
    /// A trial that completed its steps: a fit, or, when the caching allocator had to flush its
    /// cache and try an allocation again to get there, a fit only by retries (which bounds the
    /// search as batchfit's own trials do). The allocator counts a retry also before each
    /// out-of-memory it raises, including those cuDNN catches while it looks for a smaller
    /// workspace: only the retries that succeeded count.
    pub fn completed(
        peak_bytes: u64,
        rss_peak_bytes: Option<u64>,
        step_seconds: f64,
        gpu: Option<GpuMeasure>,
    ) -> TrialOutcome {
        let allocator = gpu.as_ref().and_then(|g| g.allocator);
        match allocator.map(|a| a.alloc_retries.saturating_sub(a.ooms)) {
            Some(retries) if retries > 0 => TrialOutcome::Retries {
                retries,
                peak_bytes,
                step_seconds,
                gpu,
            },
            _ => TrialOutcome::Fits {
                peak_bytes,
                rss_peak_bytes,
                step_seconds,
                gpu,
            },
        }
    }

    pub fn fits(&self) -> bool {
        matches!(self, TrialOutcome::Fits { .. })
    }
    pub fn is_oom(&self) -> bool {
        matches!(self, TrialOutcome::Oom { .. })
    }
    /// Proof that this size is too large: an OOM, a completion that needed allocator retries, or a
    /// footprint measured above the limit (over budget).
    pub fn is_bound(&self) -> bool {
        matches!(
            self,
            TrialOutcome::Oom { .. }
                | TrialOutcome::Retries { .. }
                | TrialOutcome::OverBudget { .. }
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
            TrialOutcome::OverBudget { .. } => "over-budget",
            TrialOutcome::Timeout { .. } => "timeout",
            TrialOutcome::Error { .. } => "error",
        }
    }
    pub fn peak_bytes(&self) -> Option<u64> {
        match self {
            TrialOutcome::Fits { peak_bytes, .. } => Some(*peak_bytes),
            TrialOutcome::Oom { peak_bytes, .. } => *peak_bytes,
            TrialOutcome::Retries { peak_bytes, .. } => Some(*peak_bytes),
            TrialOutcome::OverBudget { peak_bytes, .. } => Some(*peak_bytes),
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
            TrialOutcome::Oom { message, .. }
            | TrialOutcome::Error { message }
            | TrialOutcome::OverBudget { message, .. } => Some(message),
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

/// A process using a GPU, as NVML reports it (the plan lists the other processes on the card).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where NVML reports per-process memory as unavailable.
    pub used_bytes: Option<u64>,
}

/// Printed on stdout by a tch trial child once the process is set up (before any model work): a
/// child that runs out of memory before it is not measuring the trial, only its own start.
pub const STARTED_MARKER: &str = "BATCHFIT-TRIAL-STARTED";
/// Prefix of a tch trial child's result line on stdout (the [`TrialOutcome`] as JSON).
pub const RESULT_PREFIX: &str = "BATCHFIT-TRIAL-RESULT ";

/// The result line for `outcome` (with its newline).
pub fn result_line(outcome: &TrialOutcome) -> String {
    format!(
        "{RESULT_PREFIX}{}\n",
        serde_json::to_string(outcome).unwrap_or_default()
    )
}

/// The outcome of the first result line in `stdout`, if there is one (an unreadable one is an error).
pub fn parse_result(stdout: &str) -> Option<TrialOutcome> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .map(|json| {
            serde_json::from_str(json).unwrap_or_else(|e| TrialOutcome::Error {
                message: format!("unreadable trial result ({e}): {json}"),
            })
        })
}

/// Whether `stdout` carries the [`STARTED_MARKER`] line.
pub fn started(stdout: &str) -> bool {
    stdout.lines().any(|l| l == STARTED_MARKER)
}

/// Where a trial runs, as the device tells the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    /// One GPU: NVML's index (the child queries NVML with it) and its UUID (the device exposes it as
    /// the trial's only CUDA device, `cuda:0`).
    Cuda {
        nvml_index: u32,
        uuid: String,
    },
}

/// How the tree's figure of a trial ([`TreeMeasure::pss_peak`]) was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TreeFigure {
    /// Every process by its proportional set size (`Pss_Anon + Pss_Shmem` of
    /// `/proc/PID/smaps_rollup`): each page once, however many processes of the tree map it.
    Pss,
    /// Some process's `smaps_rollup` could not be read: it counted with its `RssAnon + RssShmem`
    /// (its pages shared with others of the tree counted again): an overcount.
    RssSum,
}

impl TreeFigure {
    pub fn name(self) -> &'static str {
        match self {
            TreeFigure::Pss => "pss",
            TreeFigure::RssSum => "rss-sum",
        }
    }
    /// What the figure sums, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            TreeFigure::Pss => "Pss_Anon + Pss_Shmem, each page once",
            TreeFigure::RssSum => {
                "RssAnon + RssShmem where smaps_rollup could not be read, shared pages once per \
                 process"
            }
        }
    }
}

/// What the device measured of a trial's process tree (user commands; a tch child measures itself).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeMeasure {
    /// The largest data segment of any process of the tree (what `RLIMIT_DATA` acts on, per process).
    pub data_peak: Option<u64>,
    /// The `RLIMIT_DATA` the tree ran under, if any.
    pub data_limit: Option<u64>,
    /// Peak of the tree's summed resident memory.
    pub rss_peak: Option<u64>,
    /// Peak usage of the memory cgroup the tree ran in, if any (what `memory.max` acts on).
    pub cgroup_peak: Option<u64>,
    /// Processes seen in the tree.
    pub processes: u32,
    /// Wall seconds from start to exit.
    pub seconds: f64,
    /// Where the whole output was written (`--logs`).
    pub log: Option<std::path::PathBuf>,
    /// Peak of the tree's summed anonymous and shared memory (`RssAnon` + `RssShmem`; file pages
    /// left out; a page shared by k processes counted k times).
    pub anon_peak: Option<u64>,
    /// The tree's figure: peak of its summed proportional anonymous and shared memory (`Pss_Anon +
    /// Pss_Shmem`: each page once), what no limit on one process's data segment bounds for the tree,
    /// measured as [`TreeMeasure::tree_figure`] says.
    pub pss_peak: Option<u64>,
    pub tree_figure: Option<TreeFigure>,
    /// The limit of the memory cgroup the tree ran in, if any.
    pub cgroup_limit: Option<u64>,
    /// OOM kills the trial's own memory cgroup counted (`None` without a group).
    pub group_oom_kills: Option<u64>,
    /// The cgroup's peak of anonymous memory (sampled from `memory.stat`; the kernel's peak also
    /// counts page cache).
    pub cgroup_anon_peak: Option<u64>,
    /// Peak of the summed anonymous memory of the tree's processes that were not in its cgroup.
    pub escaped_peak: Option<u64>,
    /// The root died by SIGKILL while the machine-wide `oom_kill` counter (/proc/vmstat) rose: weak
    /// evidence (any process of the machine may have been the one killed).
    pub machine_oom_kill: bool,
    /// Descendants seen dead by a signal (`pid N (name): signal S`), sampled as zombies.
    pub killed_descendants: Vec<String>,
    /// Descendants still running when the root exited (`pid N (name)`), killed by batchfit.
    pub left_behind: Vec<String>,
    /// The trial's processes batchfit found running after the root exited and ended (escaped
    /// daemons included), if any.
    pub left_running: Option<LeftBehind>,
    /// Orphans adopted while the trial ran that could be another trial's as well (`pid N
    /// (name)`): trials ran at once with no memory cgroup ([`crate::platform::reaper`]).
    pub unattributed: Vec<String>,
}

/// Processes a trial left running after its command exited, which batchfit ended (SIGTERM, then
/// SIGKILL): `details.left_behind` in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftBehind {
    /// How many processes of the trial (its session, process group, tree, cgroup, or carrying its
    /// marker) were still running.
    pub count: u32,
    /// Whether batchfit ended them all (false: one survived SIGKILL, stuck in the kernel).
    pub killed: bool,
}

/// A trial process that ended, as the process runner saw it.
#[derive(Debug, Clone)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    /// Captured output (head and tail when long).
    pub stdout: String,
    pub stderr: String,
    /// The kernel's OOM killer killed a process of the trial (its `oom_kill` counter rose and the
    /// process died by SIGKILL, or the trial's memory cgroup counted an OOM kill).
    pub kernel_oom_kill: bool,
    /// The device's measurements of the tree (empty for a self-measuring tch child).
    pub measure: TreeMeasure,
    /// The device ended the trial's processes a moment after the command's complete report (its
    /// exit status is then that of the kill, not the command's).
    pub ended_after_report: bool,
}

/// The report a user's command may write to `BATCHFIT_RESULT` (`batchfit python-helper` writes it):
/// what it really trained, so a trial that exits 0 can be checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialReport {
    /// `batchfit-trial-report/1`.
    pub schema: String,
    pub batch: u64,
    pub steps: u64,
    pub accumulation: u64,
    /// The command asked for the accumulation (so a split's accumulation reached it).
    pub reads_accumulation: bool,
    pub step_seconds: Vec<f64>,
    #[serde(default)]
    pub rank: u32,
    #[serde(default = "one_u32")]
    pub world_size: u32,
    /// torch's CUDA allocator statistics of the rank's device, when it used CUDA.
    #[serde(default)]
    pub cuda: Option<ReportedCuda>,
    #[serde(default)]
    pub python: Option<String>,
    #[serde(default)]
    pub torch: Option<String>,
    /// The largest micro-batch the job really got (the helper's `Trial.step(samples=n)` or the
    /// Lightning callback's count), when it counted: fewer than `batch` means it did not train it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// The batch came from `BATCHFIT_BATCH` (the helper's `batch_size()` read it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reads_batch: bool,
    /// The optimizer steps the job runs without batchfit (the helper's `steps(default=N)`), when
    /// it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_steps: Option<u64>,
    /// The files the job read (the helper's: its own modules outside the standard library and
    /// installed packages, and the files under the working directory it opened for reading), as
    /// absolute paths. Absent in a report that does not say (the plan then keeps them in
    /// `model.read_files`, not per trial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_files: Option<Vec<String>>,
    /// The top-level installed packages the job imported (the helper's: `torch`, `numpy`, …): what
    /// a warm trial process imports ahead of the next trial. Absent when the report does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<Vec<String>>,
    /// The installed packages the job ran with (the helper's: its site dirs, their distributions,
    /// the stat of each file it imported from them). Absent in a report that does not say (the
    /// plan then keeps it in `model.python_environment`, not per trial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_environment: Option<PythonEnvironment>,
}

fn one_u32() -> u32 {
    1
}

/// The `cuda` block of a [`TrialReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportedCuda {
    pub device: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub reserved_bytes: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
}

/// The schema of [`TrialReport`] this build reads.
pub const REPORT_SCHEMA: &str = "batchfit-trial-report/1";

/// Where a fitting trial's seconds per step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepTime {
    /// The command's report (its own step times).
    Report,
    /// The trial's wall time over its steps (start-up included: slower than the real step).
    WallClock,
}

/// More about a trial of a user's command, kept in its record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialDetails {
    /// The last lines of its output (stderr, then stdout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_tail: Vec<String>,
    /// Where its whole output is (`--logs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// The report it wrote, as read (rank 0's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<TrialReport>,
    /// Peak of the summed resident memory of its process tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_rss_peak_bytes: Option<u64>,
    /// Peak of the summed anonymous and shared memory of its process tree (`RssAnon` + `RssShmem`;
    /// a page shared by k processes counts k times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_anon_peak_bytes: Option<u64>,
    /// The tree's figure: peak of its summed proportional anonymous and shared memory (`Pss_Anon`
    /// + `Pss_Shmem`: each page once), measured as `tree_measure` says. Absent in older plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_pss_peak_bytes: Option<u64>,
    /// How `tree_pss_peak_bytes` was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_measure: Option<TreeFigure>,
    /// Peak of the anonymous memory charged to its memory cgroup (`memory.stat`), beside the
    /// kernel's peak (`peak_bytes`), which counts page cache too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_anon_peak_bytes: Option<u64>,
    /// The reports of ranks other than 0, as read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_reports: Vec<TrialReport>,
    /// Processes seen in its tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// Processes the trial left running after its command exited, which batchfit ended (a
    /// daemon, a worker that outlived the job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_behind: Option<LeftBehind>,
    /// Where `step_seconds` came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time: Option<StepTime>,
    /// Peak of NVML's used memory summed over the tree's processes, per GPU (NVML index, bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_peaks: Vec<(u32, u64)>,
    /// batchfit ended the trial's processes a moment after its complete report (the last step
    /// asked for was done) instead of waiting for the job's teardown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended_after_report: bool,
    /// The trial ran in a warm process: started ahead of time, the job's packages imported, then
    /// handed this trial's arguments and environment (`--warm`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// The warm process was forked from a fork server that had imported the job's packages, under
    /// `RLIMIT_DATA` (its data segment, inherited whole, counted in the trial's): exploration only,
    /// as every warm trial.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forked: bool,
    /// The largest batch the job's torch DataLoaders yielded (the first dimension of its first
    /// tensor), over all its processes, as the DataLoader watcher saw it (`--observe on`); absent
    /// when no DataLoader was seen or no batch's size could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataloader_batch: Option<u64>,
}

impl TrialDetails {
    /// What the record of a trial killed at its timeout keeps: the end of its output (`tail`),
    /// where it printed any. Nothing of it was judged, and its tree's measurements up to the kill
    /// prove nothing.
    pub fn timed_out(tail: Vec<String>) -> Option<Self> {
        (!tail.is_empty()).then(|| TrialDetails {
            output_tail: tail,
            ..Default::default()
        })
    }
}

/// One trial as its workload started it: the request and what the workload gave the trial (its
/// number, the file its report goes to, its temporary directory, the folder of its observations),
/// handed back to the workload with the finished process. A value the device carries from the
/// trial's start to its end, so that a workload keeps no "last trial" between the calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    pub request: TrialRequest,
    /// The workload's count of its trials, from 0.
    pub number: u32,
    /// Where the job's report goes (`BATCHFIT_RESULT`), for a workload whose job writes one.
    pub report: Option<std::path::PathBuf>,
    /// The trial's own temporary directory (`TMPDIR`), removed when it ends.
    pub temp: Option<std::path::PathBuf>,
    /// The folder of the DataLoader watcher's observations.
    pub observed: Option<std::path::PathBuf>,
    /// The file a warm process creates once it runs this trial's command (`--warm`).
    pub warm_ack: Option<std::path::PathBuf>,
}

impl Trial {
    /// A trial that carries nothing but its request (a workload whose child reports on stdout).
    pub fn of(request: TrialRequest) -> Self {
        Trial {
            request,
            number: 0,
            report: None,
            temp: None,
            observed: None,
            warm_ack: None,
        }
    }
}

/// What a trial runs, as a device sees it: the command of one trial and what its end means. The
/// device adds the memory limit, its own environment and the measurements; it never knows whether
/// the command is batchfit's own tch child or a user's training script.
pub trait Workload: Send + Sync {
    /// The command of one trial in a fresh process, and the trial as started (given back to
    /// [`Workload::outcome`] and [`Workload::trial_ended`]).
    fn command(&self, req: &TrialRequest, at: &Placement) -> (std::process::Command, Trial);
    /// A long-lived worker that reads one [`TrialRequest`] (JSON) per stdin line and prints one result
    /// line per trial (`--isolation hybrid`), when this workload has one.
    fn worker_command(&self, _at: &Placement) -> Option<std::process::Command> {
        None
    }
    /// What a finished trial process means, and what to keep of it in the trial's record.
    fn outcome(&self, trial: &Trial, finished: &Finished) -> (TrialOutcome, Option<TrialDetails>);
    /// Whether the device measures the trial's process tree (a user's command) rather than the
    /// trial measuring itself (batchfit's tch child).
    fn measured_by_device(&self) -> bool {
        false
    }
    /// Called by the device when a trial has ended, whatever its end (fit, out of memory, error,
    /// timeout, an interruption), once its processes are gone and its outcome is read: what the
    /// trial left is removed here.
    fn trial_ended(&self, _trial: &Trial) {}
    /// Whether the running trial's evidence is in (a complete report: every step asked for done),
    /// so that the device may end its processes without waiting for the job's teardown.
    fn evidence_in(&self, _trial: &Trial) -> bool {
        false
    }
    /// The command of a warm process (`--warm`): started ahead of the next trial under the trial's
    /// limit, it imports `modules` and then waits for [`Workload::warm_handoff`]; when `serve`, a
    /// fork server that imports once and forks a process per hand-off. `None` when the workload
    /// has none.
    fn warm_command(&self, _modules: &[String], _serve: bool) -> Option<std::process::Command> {
        None
    }
    /// What a warm process imports: the packages the job imported (what a trial's report said);
    /// `None` until a report said so.
    fn warm_modules(&self) -> Option<Vec<String>> {
        None
    }
    /// What a fork server may import before any trial has reported: the frameworks the command's
    /// own source imports first thing (`torch`, `lightning`, …); empty when it names none.
    fn warm_guess(&self) -> Vec<String> {
        vec![]
    }
    /// What a warm process or a fork server is handed to run `trial` as `command` would run it
    /// fresh (its [`Workload::command`]); `None` when it cannot be.
    fn warm_handoff(
        &self,
        _trial: &mut Trial,
        _command: &std::process::Command,
    ) -> Option<Vec<u8>> {
        None
    }
    /// Whether `trial`'s hand-off reached the command (the warm process began running it): when
    /// it did not, the trial's end says nothing about the command.
    fn warm_took(&self, _trial: &Trial) -> bool {
        false
    }
}

/// The Python installation a job's helper saw: its site dirs, the distributions installed there
/// and the stat of each file the job imported from them. A stat, not a hash: `import torch` alone
/// imports well over a thousand files, and a package edited in place or upgraded by pip gets new
/// modification times.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PythonEnvironment {
    /// The interpreter's site-packages / dist-packages folders (absolute).
    pub site_dirs: Vec<String>,
    /// The `*.dist-info` and `*.egg-info` entries of those folders (absolute paths), sorted: each
    /// names a distribution and its version.
    pub distributions: Vec<String>,
    /// The files of the modules the job imported from those folders, sorted by path.
    pub files: Vec<FileStat>,
}

/// A file known by its size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub path: String,
    pub size: u64,
    pub mtime_ns: i128,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completed trial is a fit unless the allocator needed retries that succeeded (a retry is
    /// also counted before each out-of-memory it raised, which cuDNN may catch): then it fit only
    /// by flushing the cache.
    #[test]
    fn a_completed_trial_fits_only_by_retries_when_retries_beyond_its_ooms_succeeded() {
        let gpu = |alloc_retries, ooms| GpuMeasure {
            nvml_peak_bytes: 1 << 30,
            method: FootprintMethod::NvmlDeviceDelta,
            allocator: Some(AllocatorReport {
                peak_allocated_bytes: 1,
                peak_reserved_bytes: 1,
                reserved_bytes: 1,
                alloc_retries,
                ooms,
            }),
        };
        let kind = |g: Option<GpuMeasure>| TrialOutcome::completed(7, None, 0.1, g);
        assert!(matches!(
            kind(Some(gpu(3, 1))),
            TrialOutcome::Retries {
                retries: 2,
                peak_bytes: 7,
                ..
            }
        ));
        assert!(matches!(kind(Some(gpu(2, 2))), TrialOutcome::Fits { .. }));
        assert!(matches!(
            kind(None),
            TrialOutcome::Fits { peak_bytes: 7, .. }
        ));
    }
}
