//! The search for the largest micro-batch that fits, and the proof that it does.
//!
//! The engine ([`Prober`]) owns the **proof invariant**: a size is reported only when a trial at it fit
//! (run with `confirm_steps` when those are more than the exploration steps, because some memory only
//! appears after several steps) and a trial at the next size up (the next multiple of `multiple_of`)
//! failed with `oom`, or a stated cap (`max_batch`) was reached. An `error` or `timeout` is never
//! proof of anything. An `over-budget` trial (its measured footprint went above the limit without
//! the limit stopping it: a command's process tree under `RLIMIT_DATA`, which bounds each process
//! alone) is the out-of-memory half of the proof: that size needs more than this budget, so it
//! bounds the bracket exactly like an `oom` ([`TrialOutcome::is_bound`]), and is never a fit. Strategies ([`Strategy`]) only propose which size to try next; whatever they
//! propose, the engine keeps the bracket `[largest fit, smallest oom]` and decides when the proof is
//! complete. If a cap on trials or time, or an interruption, stops the search first, the result is
//! marked partial.
//!
//! **With a tolerance** `F` ([`SearchConfig::tolerance`], `--tolerance`), "the next size up" widens:
//! a size b is reported when it fit with `confirm_steps` (and, later, at the accumulation it will run
//! with: [`Prober::confirm_split`]) and a size b' with `b < b' ≤ b + max(multiple_of, ⌊F·b⌋)` ran out
//! of memory ([`within_tolerance`]); the stop reason is then [`StopReason::ProvenWithinTolerance`]
//! (complete) unless b' is the next size anyway ([`StopReason::Proven`]). The reported size is still one
//! that ran and fit, so it is never above the true largest size; it may be below it by less than the
//! gap. `F = 0` is the exact proof. The tolerance never turns an `error` or a `timeout` into
//! evidence: only an `oom` (or allocator retries) can close a bracket.
//!
//! A strategy may ask for a size to run with `confirm_steps` at once ([`Proposal::confirm`]), and
//! the engine does so by itself for a size whose fit would close the bracket: such a fit is both an
//! exploration fit and the confirmation. Its out-of-memory is an upper bound for the answer (the
//! answer must fit with `confirm_steps`), but it says nothing about the shorter exploration trials:
//! [`SearchState::confirm_ooms`] tells the strategy which bounds came from confirmation-length trials,
//! so that memory that appears only after the exploration steps (late memory) is not read as a miss
//! of its line.
//!
//! **A noisy boundary** ([`noise`]): when outcomes disagree (a size fits at or above one that ran
//! out of memory, with no more steps), the job's run-to-run noise is larger than the step between
//! them; the engine then stops bisecting and answers a size that fit twice at least one noise band
//! below every failure, within [`noise::NOISY_TRIALS`] more trials
//! ([`StopReason::ProvenBelowNoise`]). Searches whose outcomes never disagree keep the proof above.
//!
//! **Warm exploration** ([`TrialRecord::warm`]: `--exec` trials in processes that imported the job's
//! modules ahead) costs a fraction of a cold trial and never proves: while it runs warm, every
//! proposal explores warm, those that may close the bracket included, and [`Prober::prove`] then runs
//! the closed bracket's two ends cold (the failure above with `confirm_steps`, the fit's confirmation
//! and repeats). [`WARM_DISAGREEMENTS`] cold trials that disagree with warm ones turn the rest of
//! the search cold: the strategy then sees only the cold trials, with the warm fits' line as a
//! [`Prior`] whose fixed part is unknown (warm processes hold or miss a fixed part of a cold one's
//! memory; their slope still says where the boundary lies). On several devices the proof's cold
//! trials run side by side ([`rounds`]), and so does a cold walk; the proof reads their records as
//! it reads trials run one by one.
//!
//! A [`Prior`] (a predicted line from earlier probes, e.g. the points before this one in a
//! `--sweep`) only helps the strategy choose sizes; it is never evidence of a fit or of a failure.
//!
//! This module knows nothing of clap, tch or NVML: it talks to a [`Backend`] (a device) and sees only
//! outcomes.

pub mod bisect;
mod failures;
pub mod guided;
pub mod line;
pub mod noise;
pub mod rounds;

use crate::device::{Backend, BackendError};
use crate::protocol::{Isolation, TrialDetails, TrialOutcome, TrialRequest};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Which strategy proposes sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Predict from measured peaks (affine above a knee), then prove; bisection when predictions miss.
    Guided,
    /// Doubling from the smallest size, then bisection of the bracket.
    Bisect,
    /// Doubling only (Lightning's `power`): proves the answer only to within a factor of two.
    Power,
}

/// Search settings, validated by the caller.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchConfig {
    pub strategy: StrategyKind,
    /// Training steps per exploration trial (≥ 1; 2 by default: Adam's state, created at the first
    /// optimizer step, is resident through the second step's forward and backward, so the second step
    /// holds the steady-state peak. Measured on CPU, 2- and 3-step peaks agree to the byte on the
    /// default MLP at 1–2048 and to 0.02 % at 4096, and within 0.2 MB on gpt and resnet18:
    /// docs/benchmarks.md, "Two exploration steps").
    pub steps: u32,
    /// Training steps of the confirmation trial of the final size.
    pub confirm_steps: u32,
    pub min_batch: u64,
    pub max_batch: u64,
    pub multiple_of: u64,
    pub max_trials: Option<u32>,
    pub time_limit: Option<Duration>,
    /// Count a CUDA trial that completed only with allocator retries as a fit (`--allow-retries`).
    pub allow_retries: bool,
    /// Relative tolerance of the proof (`--tolerance`): the search may stop with a fit at b and an
    /// out-of-memory at b' ≤ b + max(multiple_of, ⌊F·b⌋). 0: exact (b' = the next size).
    #[serde(default)]
    pub tolerance: f64,
    /// Prior knowledge of the memory curve (a sweep's earlier points), used only to propose sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior: Option<Prior>,
    /// Fresh re-runs of the answer after its confirmation (`--repeats`): the answer must fit
    /// `1 + repeats` times, and the spread of their footprints is the job's measured noise
    /// ([`noise`], "The answer's own noise").
    #[serde(default)]
    pub repeats: u32,
}

/// The default `--tolerance`: 0.5 %. Measured on CPU (docs/benchmarks.md, "Tolerance"): the peak
/// data segment of one trial repeats to the byte in fresh processes, but the largest size that fits
/// moves with the process that runs it (the probe's trial child against `batchfit-train`: 0.33 %, two
/// builds of the probe: 0.02 %, Lightning's fit on re-run: 0.04 %), so the last few samples of an exact
/// proof are below what a training job can rely on. With 0.5 %, every size below 400 is still proven
/// exactly (⌊0.005·b⌋ ≤ 1) and the answer is at least 99.5 % of the exact one.
pub const DEFAULT_TOLERANCE: f64 = 0.005;

/// The largest gap `b' − b` between a fit at b and an out-of-memory at b' that proves b within the
/// tolerance: `max(step, ⌊tolerance·b⌋)` (`step` = `multiple_of`, so 0 means exact).
pub fn tolerance_gap(b: u64, tolerance: f64, step: u64) -> u64 {
    let t = if tolerance.is_finite() && tolerance > 0.0 {
        (tolerance * b as f64).floor() as u64
    } else {
        0
    };
    t.max(step.max(1))
}

/// Whether a fit at `fit` and an out-of-memory at `oom` prove `fit` within the tolerance.
pub fn within_tolerance(fit: u64, oom: u64, tolerance: f64, step: u64) -> bool {
    oom > fit && oom - fit <= tolerance_gap(fit, tolerance, step)
}

/// What earlier probes predict about this one's memory curve: `peak(b) ≈ fixed_bytes +
/// per_sample_bytes · b`, each with a relative uncertainty. Used by strategies to propose sizes;
/// never evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prior {
    pub fixed_bytes: f64,
    pub per_sample_bytes: f64,
    /// Relative uncertainty of `fixed_bytes` (e.g. 0.05).
    pub fixed_error: f64,
    /// Relative uncertainty of `per_sample_bytes` (e.g. 0.3 when extrapolated from one point).
    pub per_sample_error: f64,
    /// The prediction is a guess that is exact more often than not (a sweep's second point: the
    /// parameter's usual power, which holds for the common models), while the errors bound how far
    /// off it is otherwise: the search first tries, once, the size just under the prediction with
    /// the confirmation's steps, and starts below by the error only when that runs out of memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub try_first: bool,
}

impl Prior {
    /// The predicted largest size under `limit` and its relative uncertainty, if the prior says
    /// anything (a positive slope and a fixed part below the limit).
    pub fn predict(&self, limit: u64) -> Option<(f64, f64)> {
        let free = limit as f64 - self.fixed_bytes;
        if self.per_sample_bytes.is_nan()
            || self.per_sample_bytes <= 0.0
            || free.is_nan()
            || free <= 0.0
        {
            return None;
        }
        let b = free / self.per_sample_bytes;
        let rel = self.per_sample_error + self.fixed_error * self.fixed_bytes / free;
        Some((b, rel))
    }
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            strategy: StrategyKind::Guided,
            steps: 2,
            confirm_steps: 5,
            min_batch: 1,
            max_batch: 1_000_000,
            multiple_of: 1,
            max_trials: None,
            time_limit: None,
            allow_retries: false,
            tolerance: DEFAULT_TOLERANCE,
            prior: None,
            repeats: 0,
        }
    }
}

/// Cold trials disagreeing with warm ones ([`Prober::warm_disagreements`]) after which exploration
/// runs cold: one is the job's noise at the boundary (measured on Lightning and plain scripts: a warm
/// and a cold run at one size within 2 MiB of the limit go either way), a second is a pattern (a
/// confirmation that runs out of memory twice where a warm trial of as many steps fit: a job whose
/// warm processes hold less), and the cold search it starts bounds what such a job costs.
pub const WARM_DISAGREEMENTS: usize = 2;

/// Why a trial ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    Explore,
    /// Re-run of the final size with `confirm_steps`.
    Confirm,
    /// A size chosen by the accumulation split that no trial had run.
    Split,
    /// A repeat of a trial that ended in `error` or `timeout`.
    Retry,
    /// A trial that can close the bracket (next to either end of it), or the failure above the answer
    /// re-run after the worker found it: always in a fresh process.
    Proof,
    /// A fresh re-run of the answer after its confirmation ([`SearchConfig::repeats`]): the job's own
    /// run-to-run noise, measured where it matters.
    Repeat,
}

/// One trial as the plan records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    pub batch: u64,
    pub steps: u32,
    pub purpose: Purpose,
    /// `process` (fresh), `worker` (hybrid exploration) or `none` (sim).
    pub isolation: Isolation,
    /// Micro-batches per optimizer step (1 unless this trial proves an accumulation split).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub accumulation: u32,
    #[serde(flatten)]
    pub outcome: TrialOutcome,
    /// Wall seconds of the whole trial, process start included.
    pub seconds: f64,
    /// The GPU (NVML index) the trial ran on, in probes of several GPUs (`--gpus`). (`gpu` is the
    /// outcome's measurement.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_index: Option<u32>,
    /// More about a trial of a user's command (its output's tail, its report, its process tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<TrialDetails>,
    /// The round the trial ran in, when trials run several at once ([`rounds`]): trials of one
    /// round ran side by side on identical devices; a trial alone in its round ran by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
}

impl TrialRecord {
    /// The figure the limit holds this trial to, as measured: the anonymous and shared memory of its
    /// memory cgroup where it had one (the kernel's own peak there counts page cache, which it
    /// reclaims before it kills), else the larger of its peak and its process tree's figure (under
    /// `RLIMIT_DATA` the limit bounds each process's data segment, and batchfit the tree's sum).
    pub fn footprint(&self) -> Option<u64> {
        let d = self.details.as_ref();
        if let Some(anon) = d.and_then(|d| d.cgroup_anon_peak_bytes) {
            return Some(anon);
        }
        let tree = d.and_then(|d| d.tree_pss_peak_bytes);
        self.outcome.peak_bytes().into_iter().chain(tree).max()
    }

    /// Whether the trial ran as the job will: in a process started for it alone, cold (not in
    /// batchfit's worker, whose leftovers can add or hide memory, nor in a warm process, started
    /// ahead or forked from a fork server, whose imports ran before and outside the job: in the
    /// server's environment and argv, their transient memory before the trial, their random state
    /// shared by every fork). Only such trials confirm a size or bound one.
    pub fn cold(&self) -> bool {
        self.isolation != Isolation::Worker && !self.warm()
    }

    /// Whether the trial is a fresh fit of `accumulation` (exactly) with at least `steps` steps: it
    /// fit, cold ([`TrialRecord::cold`]). The runs that confirm a size and measure its noise.
    pub fn fresh_fit_at(&self, steps: u32, accumulation: u32) -> bool {
        self.outcome.fits()
            && self.steps >= steps
            && self.cold()
            && self.accumulation == accumulation.max(1)
    }

    /// Whether the trial ran in a warm process (`--warm`: started ahead, or forked): exploration
    /// only.
    pub fn warm(&self) -> bool {
        self.details.as_ref().is_some_and(|d| d.warm)
    }
}

#[cfg(test)]
impl TrialRecord {
    /// An exploration trial for tests, cold, one second long: a fit peaking at `peak`, or an
    /// out-of-memory where it is `None`.
    pub fn for_test(batch: u64, peak: Option<u64>, steps: u32, accumulation: u32) -> Self {
        TrialRecord {
            batch,
            steps,
            purpose: Purpose::Explore,
            isolation: Isolation::None,
            accumulation,
            outcome: match peak {
                Some(p) => TrialOutcome::Fits {
                    peak_bytes: p,
                    rss_peak_bytes: None,
                    step_seconds: 0.1,
                    gpu: None,
                },
                None => TrialOutcome::Oom {
                    message: "oom".into(),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                    gpu: None,
                },
            },
            seconds: 1.0,
            gpu_index: None,
            details: None,
            round: None,
        }
    }
}

fn one() -> u32 {
    1
}
fn is_one(a: &u32) -> bool {
    *a == 1
}

/// How the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// Fit at b (confirmed) and oom at the next size up.
    Proven,
    /// The largest allowed size (`max_batch`) fits.
    MaxBatch,
    /// Power strategy: fit at b, oom at the next proposal (up to 2 b); coarser than a full proof.
    PowerResolution,
    /// Even the smallest size ran out of memory.
    NothingFits,
    MaxTrials,
    TimeLimit,
    /// Trials above the best fit ended in `error`/`timeout`, so no limit could be proven.
    TrialErrors,
    Interrupted,
    /// Fit at b (confirmed) and oom at b' with b + 1 < b' ≤ b + max(1, ⌊tolerance·b⌋): complete.
    ProvenWithinTolerance,
    /// Outcomes near the boundary disagreed; b fit twice with the confirmation's steps, at least one
    /// noise band below every failure ([`noise`]): complete.
    ProvenBelowNoise,
    /// Outcomes near the boundary disagreed and no size at or below the noise band's low end fit
    /// twice within the trials allowed ([`noise::NOISY_TRIALS`]): partial.
    NoisyBoundary,
    /// `--exec`: the fitting trials' peaks do not grow with the batch size and no report shows
    /// the job ran the size it was given, so the size is not shown to reach the job: no answer.
    BatchNotShown,
}

impl StopReason {
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::Proven => "proven: the size fits and the next size up runs out of memory",
            StopReason::MaxBatch => "the largest allowed size (--max-batch) fits",
            StopReason::PowerResolution => "power strategy: proven only to within a factor of two",
            StopReason::NothingFits => "even the smallest size runs out of memory",
            StopReason::MaxTrials => "--max-trials reached before the proof was complete",
            StopReason::TimeLimit => "--time-limit reached before the proof was complete",
            StopReason::TrialErrors => {
                "trials failed with errors or timeouts, so no limit could be proven"
            }
            StopReason::Interrupted => "interrupted",
            StopReason::BatchNotShown => {
                "the batch size is not shown to reach the job: the fitting trials' peaks do not \
                 grow with it, and no report says the job ran the size it was given"
            }
            StopReason::ProvenWithinTolerance => {
                "proven within the tolerance: the size fits and a size at most max(1, ⌊tolerance × \
                 size⌋) above it runs out of memory"
            }
            StopReason::ProvenBelowNoise => {
                "proven below the noise: outcomes near the boundary disagree (or fresh runs of one size \
                 spread wider than the guard band), so the size fit every time it ran in fresh \
                 processes (at least twice), at least one noise band below every size that failed"
            }
            StopReason::NoisyBoundary => {
                "outcomes near the boundary disagree and no size at or below their noise band's low \
                 end fit twice within the trials allowed, so no size is proven"
            }
        }
    }
    /// Whether the answer is a finished result (vs. partial).
    pub fn is_complete(self) -> bool {
        matches!(
            self,
            StopReason::Proven
                | StopReason::MaxBatch
                | StopReason::PowerResolution
                | StopReason::ProvenWithinTolerance
                | StopReason::ProvenBelowNoise
        )
    }
}

/// The grid of allowed sizes: multiples of `multiple_of` within `[min_batch, max_batch]`, indexed.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub first: u64,
    pub step: u64,
    pub last_index: u64,
}

impl Grid {
    pub fn new(min: u64, max: u64, multiple_of: u64) -> Option<Grid> {
        let step = multiple_of.max(1);
        let first = min.max(1).div_ceil(step) * step;
        if first > max {
            return None;
        }
        Some(Grid {
            first,
            step,
            last_index: (max - first) / step,
        })
    }
    pub fn batch(&self, i: u64) -> u64 {
        self.first + i * self.step
    }
    /// Largest index whose batch is ≤ b (b ≥ first).
    pub fn index_at_or_below(&self, b: u64) -> u64 {
        (b.saturating_sub(self.first) / self.step).min(self.last_index)
    }
}

/// What a strategy sees.
pub struct SearchState<'a> {
    pub grid: Grid,
    /// Largest index that fit (exploration steps), if any.
    pub lo: Option<u64>,
    /// Smallest index that ran out of memory, if any.
    pub hi: Option<u64>,
    /// Smallest index above `lo` that ended in error/timeout twice: an upper bound for exploration.
    pub ceiling: Option<u64>,
    pub trials: &'a [TrialRecord],
    pub limit_bytes: u64,
    /// Steps of an exploration trial now (raised to `confirm_steps` once late memory was seen).
    pub steps: u32,
    /// The configured exploration steps (`steps` until late memory raised them).
    pub base_steps: u32,
    pub confirm_steps: u32,
    /// [`SearchConfig::tolerance`].
    pub tolerance: f64,
    /// Whether `hi` is the out-of-memory of a confirmation-length trial (then it bounds the answer,
    /// but says nothing about exploration-length trials at that size).
    pub confirm_ooms: bool,
    pub prior: Option<&'a Prior>,
}

impl SearchState<'_> {
    /// [`tolerance_gap`] at `b` on this grid.
    pub fn gap(&self, b: u64) -> u64 {
        tolerance_gap(b, self.tolerance, self.grid.step)
    }
    /// Whether a fit at index `i` would close the bracket against the smallest out-of-memory.
    pub fn fit_would_close(&self, i: u64) -> bool {
        self.hi.is_some_and(|h| {
            h > i
                && within_tolerance(
                    self.grid.batch(i),
                    self.grid.batch(h),
                    self.tolerance,
                    self.grid.step,
                )
        })
    }
}

/// What a strategy proposes: a grid index, and whether to run it with the confirmation steps at once
/// (when its fit is expected to be the answer), or as a measurement below the largest fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposal {
    pub index: u64,
    pub confirm: bool,
    /// A size below the largest fit that was never tried, run for its peak only (a second point
    /// of a line is cheaper below the largest fit than above it: a trial's time grows with the
    /// batch). Its outcome never moves the bracket.
    pub measure: bool,
}

impl Proposal {
    pub fn explore(index: u64) -> Self {
        Proposal {
            index,
            confirm: false,
            measure: false,
        }
    }
    pub fn candidate(index: u64) -> Self {
        Proposal {
            index,
            confirm: true,
            measure: false,
        }
    }
    /// A measurement below the largest fit (see [`Proposal::measure`]).
    pub fn measure(index: u64) -> Self {
        Proposal {
            index,
            confirm: false,
            measure: true,
        }
    }
}

/// The exclusive upper end of the open bracket: the smallest oom or error/timeout ceiling, if any.
pub fn upper_bound(hi: Option<u64>, ceiling: Option<u64>) -> Option<u64> {
    match (hi, ceiling) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// Proposes the next grid index to try. Must return an index strictly between `lo` and
/// `min(hi, ceiling)` (or, when nothing has fit yet, below the upper bound), or a
/// [`Proposal::measure`] of a never-tried size below `lo`.
pub trait Strategy {
    fn propose(&mut self, st: &SearchState) -> Proposal;
    /// Up to `k` distinct proposals for one round of trials run at once (`k` identical devices),
    /// chosen to shrink the bracket the most; the first is what [`Strategy::propose`] would run
    /// alone. The default: that proposal, the size whose out-of-memory would prove it when it is
    /// a candidate for the answer, and sizes spread over the rest of the bracket
    /// ([`rounds::around`]).
    fn propose_round(&mut self, st: &SearchState, k: usize) -> Vec<Proposal> {
        let first = self.propose(st);
        rounds::around(st, first, k, first.confirm)
    }
}

pub fn make_strategy(kind: StrategyKind) -> Box<dyn Strategy> {
    match kind {
        StrategyKind::Guided => Box::new(guided::Guided::default()),
        StrategyKind::Bisect => Box::new(bisect::DoublingBisection::default()),
        StrategyKind::Power => Box::new(bisect::DoublingBisection::power()),
    }
}

/// The search's result: everything the plan needs.
#[derive(Debug, Clone)]
pub struct SearchOutcome {
    pub trials: Vec<TrialRecord>,
    /// The largest proven-fitting size (fit with confirm steps), if any.
    pub max_fitting: Option<u64>,
    /// The smallest size proven not to fit, if any.
    pub first_failing: Option<u64>,
    pub stop_reason: StopReason,
    /// The signal number when interrupted.
    pub interrupted_by: Option<i32>,
    /// Why the search stopped where the stop reason alone does not say it: an environment failure,
    /// or the failure of the smallest size whose trials failed.
    pub fatal: Option<String>,
    /// Outcomes that disagreed near the boundary, and the band the answer stayed below.
    pub noisy_boundary: Option<noise::NoisyBoundary>,
    /// The job's measured noise: the widest spread of footprints of fresh runs at one size.
    pub noise_spread_bytes: Option<u64>,
}

impl SearchOutcome {
    /// The record of the fitting trial at `batch` with the most steps.
    pub fn best_record(&self, batch: u64) -> Option<&TrialRecord> {
        self.trials
            .iter()
            .filter(|t| t.batch == batch && t.outcome.fits())
            .max_by_key(|t| t.steps)
    }
}

/// Called after every trial with it and all trials so far.
type OnTrial<'b> = Box<dyn FnMut(&TrialRecord, &[TrialRecord]) + 'b>;

/// Called before every trial with its number (1-based) and request.
type OnStart<'b> = Box<dyn FnMut(usize, &TrialRequest) + 'b>;

/// Runs the search against a backend. `on_trial` is called after every trial (the CLI writes the
/// partial plan and prints progress there).
pub struct Prober<'b> {
    backend: &'b mut dyn Backend,
    cfg: SearchConfig,
    limit_bytes: u64,
    started: Instant,
    trials: Vec<TrialRecord>,
    on_trial: OnTrial<'b>,
    on_start: OnStart<'b>,
    /// Cleared once a fresh process fits where the worker ran out of memory (the worker's state
    /// costs memory near the limit), or cold trials disagreed with warm ones twice
    /// ([`Prober::warm_disagreements`]): from then on exploration runs fresh, cold, and closes
    /// the bracket itself.
    worker_trusted: bool,
    /// Accumulation of the trials being run (see [`Prober::confirm_split`]).
    accumulation: u32,
    /// The GPU to record in every trial (multi-GPU probes).
    gpu: Option<u32>,
    /// A strategy given by the caller instead of `cfg.strategy`'s (tests of the engine's bracket).
    strategy: Option<Box<dyn Strategy + 'b>>,
    /// The noisy boundary the search answered below, once outcomes disagreed.
    noise: Option<noise::NoisyBoundary>,
    /// Rounds run so far, when the device runs several trials at once (`None`: one at a time).
    round: Option<u32>,
    /// The limit the job itself will run under (the trials' limit plus the guard band); `None`: the
    /// trials' limit.
    job_limit: Option<u64>,
    /// The caller's test, after each trial, that the trials so far already refuse an answer
    /// ([`Prober::refuse_when`]).
    refuse: Option<Refuse<'b>>,
}

/// See [`Prober::refuse_when`].
type Refuse<'b> = Box<dyn FnMut(&[TrialRecord]) -> bool + 'b>;

/// Why a run of trials stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    Reason(StopReason),
    Interrupted(i32),
    Fatal(String),
}

/// What a confirmation trial showed.
#[derive(Debug, Clone, PartialEq)]
pub enum Confirmation {
    /// The size fits with the confirmation steps (and the accumulation asked for).
    Fits,
    /// It ran out of memory (or needed allocator retries): proof that it does not fit this way.
    OutOfMemory,
    /// It ended in an error or a timeout, twice: no proof either way.
    Failed(String),
    /// It fit, but a fit peaked above the ceiling the job's measured noise leaves under its limit
    /// (a fresh run of it may not fit): not a size to recommend. `below` is the size that the
    /// excess footprint points to ([`Prober::confirm_split_held`]).
    AboveNoise { why: String, below: u64 },
}

impl Confirmation {
    /// What a confirmation trial's outcome at `batch` shows.
    fn of(o: &TrialOutcome, batch: u64) -> Self {
        if o.fits() {
            Confirmation::Fits
        } else if o.is_bound() {
            Confirmation::OutOfMemory
        } else {
            Confirmation::Failed(format!(
                "{} at {batch}: {}",
                o.kind(),
                o.message().unwrap_or_default()
            ))
        }
    }
}

impl<'b> Prober<'b> {
    pub fn new(backend: &'b mut dyn Backend, cfg: SearchConfig, limit_bytes: u64) -> Self {
        backend.set_limit(limit_bytes);
        let round = (backend.width() > 1).then_some(0);
        Prober {
            round,
            backend,
            cfg,
            limit_bytes,
            started: Instant::now(),
            trials: vec![],
            on_trial: Box::new(|_, _| {}),
            on_start: Box::new(|_, _| {}),
            worker_trusted: true,
            accumulation: 1,
            gpu: None,
            strategy: None,
            noise: None,
            job_limit: None,
            refuse: None,
        }
    }

    /// The limit the job will run under, above the trials' limit by the guard band: a fresh run of
    /// the answer, noise included, must stay under it ([`noise`], "The answer's own noise").
    pub fn with_job_limit(mut self, bytes: u64) -> Self {
        self.job_limit = Some(bytes.max(self.limit_bytes));
        self
    }

    /// Proposes sizes with `strategy` instead of the configured one (the engine still owns the
    /// bracket and the proof).
    pub fn with_strategy(mut self, strategy: Box<dyn Strategy + 'b>) -> Self {
        self.strategy = Some(strategy);
        self
    }

    /// Records `gpu` as the device of every trial (probes of several GPUs).
    pub fn on_gpu(mut self, gpu: u32) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Continues from `trials` already run on this device (a confirmation then skips a size they
    /// already confirmed).
    pub fn with_history(mut self, trials: Vec<TrialRecord>) -> Self {
        self.trials = trials;
        self
    }

    pub fn on_trial(mut self, f: impl FnMut(&TrialRecord, &[TrialRecord]) + 'b) -> Self {
        self.on_trial = Box::new(f);
        self
    }

    /// `f(n, request)` before trial `n` (1-based) runs (the live progress line names its size).
    pub fn on_start(mut self, f: impl FnMut(usize, &TrialRequest) + 'b) -> Self {
        self.on_start = Box::new(f);
        self
    }

    /// Stops the search with [`StopReason::BatchNotShown`] as soon as `refused(trials)` says the
    /// trials so far already show that no answer can be given (a job that adjusts its own batch:
    /// more trials would only fit at the same peak). The engine never reads the trials' meaning.
    pub fn refuse_when(mut self, refused: impl FnMut(&[TrialRecord]) -> bool + 'b) -> Self {
        self.refuse = Some(Box::new(refused));
        self
    }

    pub fn trials(&self) -> &[TrialRecord] {
        &self.trials
    }

    fn budget_left(&self) -> Result<(), Stop> {
        if let Some(m) = self.cfg.max_trials {
            if self.trials.len() as u32 >= m {
                return Err(Stop::Reason(StopReason::MaxTrials));
            }
        }
        if let Some(t) = self.cfg.time_limit {
            if self.started.elapsed() >= t {
                return Err(Stop::Reason(StopReason::TimeLimit));
            }
        }
        Ok(())
    }

    /// Runs one trial (checking the trial and time caps first) and records it.
    pub fn trial(
        &mut self,
        batch: u64,
        steps: u32,
        purpose: Purpose,
    ) -> Result<TrialOutcome, Stop> {
        self.budget_left()?;
        let req = TrialRequest {
            batch,
            steps,
            fresh: purpose != Purpose::Explore || !self.worker_trusted,
            accumulation: self.accumulation,
        };
        (self.on_start)(self.trials.len() + 1, &req);
        let ran = crate::device::run_one(&mut *self.backend, req, None);
        let round = self.next_round();
        self.record(&req, purpose, ran, round)
    }

    /// The number of the next round, when trials run several at once.
    fn next_round(&mut self) -> Option<u32> {
        self.round.as_mut().map(|r| {
            *r += 1;
            *r
        })
    }

    /// Records a trial that ran for `req` and returns its outcome (a trial with allocator retries
    /// is a fit under `--allow-retries`).
    fn record(
        &mut self,
        req: &TrialRequest,
        purpose: Purpose,
        ran: crate::device::RoundTrial,
        round: Option<u32>,
    ) -> Result<TrialOutcome, Stop> {
        let outcome = match ran.outcome {
            Ok(o) => o,
            Err(BackendError::Interrupted(sig)) => return Err(Stop::Interrupted(sig)),
            Err(BackendError::Environment(m)) => return Err(Stop::Fatal(m)),
        };
        let outcome = match outcome {
            TrialOutcome::Retries {
                peak_bytes,
                step_seconds,
                gpu,
                ..
            } if self.cfg.allow_retries => TrialOutcome::Fits {
                peak_bytes,
                rss_peak_bytes: None,
                step_seconds,
                gpu,
            },
            o => o,
        };
        let rec = TrialRecord {
            batch: req.batch,
            steps: req.steps,
            purpose,
            isolation: ran.isolation,
            accumulation: req.accumulation,
            outcome: outcome.clone(),
            seconds: ran.seconds,
            gpu_index: ran.gpu.or(self.gpu),
            details: ran.details,
            round,
        };
        self.trials.push(rec);
        if self.warm_disagreements() >= WARM_DISAGREEMENTS {
            self.worker_trusted = false;
        }
        (self.on_trial)(self.trials.last().unwrap(), &self.trials);
        if self.refuse.as_mut().is_some_and(|f| f(&self.trials)) {
            return Err(Stop::Reason(StopReason::BatchNotShown));
        }
        Ok(outcome)
    }

    /// The cold trials that disagreed with warm ones: a cold trial that ran out of memory at or
    /// below a size a warm trial fit with at most its steps and accumulation (warm trials missed
    /// memory of the job's: what its code does before an import, an import's transient memory),
    /// or fit at or above a size a warm trial ran out of memory at with at least its steps (they
    /// held memory the job does not). At the boundary one such trial is the job's noise; a second,
    /// at that size or another, is a pattern ([`WARM_DISAGREEMENTS`]).
    fn warm_disagreements(&self) -> usize {
        let warm = || self.trials.iter().filter(|w| w.warm());
        (self.trials.iter())
            .filter(|c| c.cold())
            .filter(|c| {
                if c.outcome.is_bound() {
                    warm().any(|w| {
                        w.outcome.fits()
                            && w.batch >= c.batch
                            && w.steps >= c.steps
                            && w.accumulation >= c.accumulation
                    })
                } else {
                    c.outcome.fits()
                        && warm().any(|w| {
                            w.outcome.is_bound() && w.batch <= c.batch && w.steps <= c.steps
                        })
                }
            })
            .count()
    }

    /// Whether exploration runs warm (the last exploration trial ran in a warm process, started
    /// ahead or forked, and cold trials have not disagreed with warm ones twice): a warm trial
    /// costs a fraction of a cold one and never proves, so every proposal then explores warm, those
    /// that may close the bracket included, and only the closed bracket's two ends run again cold
    /// ([`Prober::prove`]).
    fn explores_warm(&self) -> bool {
        self.worker_trusted
            && (self.trials.iter().rev())
                .find(|t| t.purpose == Purpose::Explore)
                .is_some_and(TrialRecord::warm)
    }

    /// Runs a trial; an `error`/`timeout` is retried once.
    fn trial_with_retry(
        &mut self,
        batch: u64,
        steps: u32,
        purpose: Purpose,
    ) -> Result<TrialOutcome, Stop> {
        let o = self.trial(batch, steps, purpose)?;
        if matches!(o, TrialOutcome::Error { .. } | TrialOutcome::Timeout { .. }) {
            return self.trial(batch, steps, Purpose::Retry);
        }
        Ok(o)
    }

    /// Finds the largest fitting size on the grid.
    pub fn search(&mut self) -> SearchOutcome {
        let mut found = (None, None);
        let stop = self.search_inner(&mut found);
        self.finish(stop, found.0, found.1)
    }

    /// Turns a stop into an outcome carrying the trials so far.
    pub fn finish(
        &self,
        stop: Stop,
        max_fitting: Option<u64>,
        first_failing: Option<u64>,
    ) -> SearchOutcome {
        let (reason, sig, fatal) = match stop {
            // trials that failed name their failure
            Stop::Reason(StopReason::TrialErrors) => {
                (StopReason::TrialErrors, None, self.failure_detail())
            }
            Stop::Reason(r) => (r, None, None),
            Stop::Interrupted(s) => (StopReason::Interrupted, Some(s), None),
            Stop::Fatal(m) => (StopReason::TrialErrors, None, Some(m)),
        };
        SearchOutcome {
            trials: self.trials.clone(),
            max_fitting,
            first_failing,
            stop_reason: reason,
            interrupted_by: sig,
            fatal,
            noisy_boundary: self.noise.clone(),
            noise_spread_bytes: self.noise_spread(),
        }
    }

    /// Confirms `batch` run the way the trainer will: `accumulation` micro-batches per optimizer step
    /// (gradient accumulation holds more memory than one micro-batch alone).
    pub fn confirm_split(
        &mut self,
        batch: u64,
        accumulation: u32,
        purpose: Purpose,
    ) -> Result<Confirmation, Stop> {
        self.accumulation = accumulation.max(1);
        let r = self.confirm(batch, purpose);
        self.accumulation = 1;
        r
    }

    /// The grid index of the largest size below `b` that fit with at least `steps` steps (the lower
    /// end of the bracket once only fits of that length count), cold once warm trials are no
    /// longer trusted.
    fn largest_fit_below(&self, b: u64, steps: u32, grid: &Grid) -> Option<u64> {
        self.trials
            .iter()
            .filter(|t| t.outcome.fits() && t.batch < b && t.steps >= steps)
            .filter(|t| self.worker_trusted || t.cold())
            .map(|t| grid.index_at_or_below(t.batch))
            .max()
    }

    /// Whether a trial at `batch` fit with the confirmation steps (at the current accumulation or
    /// more), warm or cold.
    fn ran_full_length(&self, batch: u64) -> bool {
        self.full_length_fits(batch).next().is_some()
    }

    /// Whether a trial at `batch` already fit with the confirmation steps (at the current
    /// accumulation or more) in a cold process of its own ([`TrialRecord::cold`]).
    fn confirmed(&self, batch: u64) -> bool {
        self.full_length_fits(batch).any(TrialRecord::cold)
    }

    /// The trials at `batch` that fit with the confirmation steps (at the current accumulation or
    /// more), warm or cold.
    fn full_length_fits(&self, batch: u64) -> impl Iterator<Item = &TrialRecord> {
        let (steps, accumulation) = (
            self.cfg.confirm_steps.max(self.cfg.steps),
            self.accumulation,
        );
        self.trials.iter().filter(move |t| {
            t.batch == batch
                && t.steps >= steps
                && t.outcome.fits()
                && t.accumulation >= accumulation
        })
    }

    /// Confirms `batch` with `confirm_steps` (at the current accumulation), unless a fitting trial
    /// already did. An error or a timeout is retried once and then reported as
    /// [`Confirmation::Failed`]: never read as an out-of-memory.
    pub fn confirm(&mut self, batch: u64, purpose: Purpose) -> Result<Confirmation, Stop> {
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        if self.confirmed(batch) {
            return Ok(Confirmation::Fits);
        }
        let o = self.trial_with_retry(batch, steps, purpose)?;
        Ok(Confirmation::of(&o, batch))
    }

    /// Runs `batch` once more at `accumulation` with the confirmation's steps in a fresh process,
    /// whatever ran before (`verify` repeats a plan's sizes as often as its probe did).
    pub fn repeat_split(&mut self, batch: u64, accumulation: u32) -> Result<Confirmation, Stop> {
        self.accumulation = accumulation.max(1);
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let r = self.trial_with_retry(batch, steps, Purpose::Repeat);
        self.accumulation = 1;
        Ok(Confirmation::of(&r?, batch))
    }

    fn search_inner(&mut self, found: &mut (Option<u64>, Option<u64>)) -> Stop {
        match self.bracket_and_prove(found) {
            Ok(stop) | Err(stop) => stop,
        }
    }

    /// The search's loop. Each turn first stops on noise (outcomes that disagree: no more
    /// bisection inside it) or on failures that repeat; then proves a closed bracket, or confirms
    /// a fit that a longer trial above makes suspect; else explores what the strategy proposes.
    /// `Err` is a stop with no size proven.
    fn bracket_and_prove(&mut self, found: &mut (Option<u64>, Option<u64>)) -> Result<Stop, Stop> {
        let grid = Grid::new(self.cfg.min_batch, self.cfg.max_batch, self.cfg.multiple_of)
            .ok_or_else(|| {
                Stop::Fatal(format!(
                    "no multiple of {} lies in [{}, {}]",
                    self.cfg.multiple_of, self.cfg.min_batch, self.cfg.max_batch
                ))
            })?;
        let mut strategy = self
            .strategy
            .take()
            .unwrap_or_else(|| make_strategy(self.cfg.strategy));
        let mut br = Bracket {
            lo: None,
            hi: None,
            ceiling: None,
            steps: self.cfg.steps,
        };
        loop {
            if let Some(band) = self.noisy_band(&grid) {
                return Ok(self.below_noise(&grid, band, found));
            }
            if let Some(stop) = self.failures_stop() {
                return Ok(stop);
            }
            let power_done =
                self.cfg.strategy == StrategyKind::Power && br.lo.is_some() && br.hi.is_some();
            if self.closed(&grid, &br) || power_done {
                if let Some(l) = self.short_warm_fit(&grid, &br) {
                    // cheaper than a cold confirmation that late memory makes fail
                    self.suspect_warm(&grid, &mut br, l)?;
                    continue;
                }
                if let Some(stop) = self.prove(&grid, &mut br, power_done, found)? {
                    return Ok(stop);
                }
                continue;
            }
            let confirm_ooms = self.confirm_ooms(&grid, &br);
            if let Some(l) = self.suspect_fit(&grid, &br, confirm_ooms) {
                if self.explores_warm() {
                    self.suspect_warm(&grid, &mut br, l)?;
                } else {
                    self.confirm_or_lower(&grid, &mut br, l)?;
                }
                continue;
            }
            self.explore(strategy.as_mut(), grid, &mut br, confirm_ooms)?;
        }
    }

    /// Whether the out-of-memory at grid index `h` closes the bracket above a fit at `l`.
    fn closes(&self, grid: &Grid, l: u64, h: u64) -> bool {
        h > l && within_tolerance(grid.batch(l), grid.batch(h), self.cfg.tolerance, grid.step)
    }

    /// Whether the bracket is closed: the fit and the bound above are neighbours (or within the
    /// tolerance), the fit is the grid's last size, or the first size is bounded.
    fn closed(&self, grid: &Grid, br: &Bracket) -> bool {
        match (br.lo, upper_bound(br.hi, br.ceiling)) {
            (Some(l), Some(u)) => l + 1 >= u || br.hi.is_some_and(|h| self.closes(grid, l, h)),
            (Some(l), None) => l == grid.last_index,
            (None, Some(0)) => true,
            _ => false,
        }
    }

    /// A closed bracket proven: the failure above holds fresh, the fit is confirmed and repeated.
    /// `None` when that moved the bracket and the search goes on.
    fn prove(
        &mut self,
        grid: &Grid,
        br: &mut Bracket,
        power_done: bool,
        found: &mut (Option<u64>, Option<u64>),
    ) -> Result<Option<Stop>, Stop> {
        let Some(l) = br.lo else {
            // Nothing fits at index 0.
            found.1 = Some(grid.batch(0));
            return Ok(Some(Stop::Reason(if br.hi == Some(0) {
                StopReason::NothingFits
            } else {
                StopReason::TrialErrors
            })));
        };
        self.prove_side_by_side(grid, br, l)?;
        if self.noisy_band(grid).is_some() {
            // the rounds' outcomes disagree (two repeats that ran out of memory where the
            // confirmation fit): the loop answers below them before anything else runs
            return Ok(None);
        }
        if !self.fresh_failure_above(grid, br, l)? || !self.confirm_or_lower(grid, br, l)? {
            return Ok(None);
        }
        // The answer again, fresh: a repeat that fails, or footprints spread wider than the guard
        // band, is noise the answer must stay below.
        let b = grid.batch(l);
        self.repeat_answer(b, self.cfg.confirm_steps.max(self.cfg.steps))?;
        if let Some(band) = self.noisy_band(grid).or_else(|| self.spread_band(b, grid)) {
            return Ok(Some(self.below_noise(grid, band, found)));
        }
        found.0 = Some(b);
        found.1 = br.hi.map(|h| grid.batch(h));
        let reason = if br.hi == Some(l + 1) {
            StopReason::Proven
        } else if br.hi.is_some_and(|h| self.closes(grid, l, h)) {
            StopReason::ProvenWithinTolerance
        } else if l == grid.last_index && br.hi.is_none() {
            StopReason::MaxBatch
        } else if power_done && br.hi.is_some() {
            StopReason::PowerResolution
        } else {
            StopReason::TrialErrors
        };
        Ok(Some(Stop::Reason(reason)))
    }

    /// Whether the out-of-memory that closes the bracket above `l` holds in a fresh process, as
    /// the job will run, with the confirmation's steps (the answer must fit with those, so their
    /// out-of-memory bounds it, and memory that grows after the exploration's steps shows). A
    /// bound found in the worker or in a warm process is run again cold. `false` when the cold
    /// trial moved the bracket instead: it fit (a confirmed fit: the lower end moves up to it, and
    /// where the worker ran out of memory, exploration runs cold from then on), or it ended in an
    /// error (a ceiling, not evidence).
    fn fresh_failure_above(&mut self, grid: &Grid, br: &mut Bracket, l: u64) -> Result<bool, Stop> {
        // (a bound that does not close the bracket, as power's doubling leaves, is still the
        // plan's first failing size: it too must hold cold)
        let Some(h) = br.hi.filter(|&h| h > l) else {
            return Ok(true);
        };
        let hb = grid.batch(h);
        let steps = self.failure_steps(br);
        let o = match self.cold_failure_above(hb, steps) {
            Some(o) => o,
            None => self.trial_with_retry(hb, steps, Purpose::Proof)?,
        };
        match o {
            TrialOutcome::Fits { .. } => {
                // the worker's leftovers cost memory near the limit (a warm process that ran out
                // of memory here counts among the disagreements instead)
                if (self.trials.iter()).any(|t| {
                    t.batch == hb && t.isolation == Isolation::Worker && t.outcome.is_bound()
                }) {
                    self.worker_trusted = false;
                }
                // the bounds above that still count: cold ones, and warm ones (a warm bound that
                // closes the bracket runs again cold before it proves anything, so each costs at
                // most one cold trial, where dropping them would gallop past what they showed);
                // not the worker's, whose leftovers cost memory near the limit
                let trusted = |t: &TrialRecord| t.outcome.is_bound() && (t.cold() || t.warm());
                br.lo = Some(h);
                br.hi = (self.trials.iter())
                    .filter(|t| t.batch > hb && trusted(t))
                    .map(|t| grid.index_at_or_below(t.batch))
                    .min();
                Ok(false)
            }
            o if o.is_bound() => Ok(true),
            _ => {
                br.ceiling = Some(br.ceiling.map_or(h, |c| c.min(h)));
                br.hi = None;
                Ok(false)
            }
        }
    }

    /// The cold trials that prove the closed bracket at `l` and have not run, in the order the
    /// proof reads them: the failure above, the confirmation, the repeats.
    fn proof_runs(&self, grid: &Grid, br: &Bracket, l: u64) -> Vec<(u64, u32, Purpose)> {
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let b = grid.batch(l);
        let mut runs = vec![];
        if let Some(h) = br.hi.filter(|&h| h > l) {
            let (hb, failure_steps) = (grid.batch(h), self.failure_steps(br));
            if self.cold_failure_above(hb, failure_steps).is_none() {
                runs.push((hb, failure_steps, Purpose::Proof));
                if !self.worker_trusted {
                    // a bound of trials no longer trusted (warm ones that disagreed with cold
                    // ones) fits cold as often as not and moves the bracket up: the answer's runs
                    // wait for it
                    return runs;
                }
            }
        }
        let fits = self.fresh_confirmed_fits(b, steps);
        if fits == 0 {
            runs.push((b, steps, Purpose::Confirm));
        }
        let repeats = self.fits_needed(false).saturating_sub(fits.max(1));
        runs.extend(std::iter::repeat_n((b, steps, Purpose::Repeat), repeats));
        runs
    }

    /// Where the device runs several trials at once ([`Prober::proof_width`]), the proof's cold
    /// trials run side by side, a round at a time, until all have run or one did not go the proof's
    /// way (a fit above, an out-of-memory at the answer: what follows depends on it). The proof then
    /// reads their records as it reads trials run one by one, and runs only what is still missing.
    fn prove_side_by_side(&mut self, grid: &Grid, br: &Bracket, l: u64) -> Result<(), Stop> {
        if self.proof_width() < 2 || self.accumulation != 1 {
            return Ok(());
        }
        loop {
            let runs = self.proof_runs(grid, br, l);
            if runs.is_empty() {
                return Ok(());
            }
            let outcomes = self.round_of(&runs)?;
            let as_hoped = runs.iter().zip(&outcomes).all(|(r, o)| {
                if r.2 == Purpose::Proof {
                    o.is_bound()
                } else {
                    o.fits()
                }
            });
            if !as_hoped || outcomes.len() < runs.len().min(self.backend.width()) {
                return Ok(());
            }
        }
    }

    /// How many sizes the exploration runs at once: the device's exploration width
    /// ([`Backend::explore_width`]: 1 on devices that share their cores), or its full width once
    /// exploration runs cold after warm or worker trials lost trust: that walk is made of the
    /// proof's kind of trials, which run side by side.
    fn explore_width(&self) -> usize {
        if self.worker_trusted {
            self.backend.explore_width()
        } else {
            self.proof_width()
        }
    }

    /// How many of the proof's cold trials run at once: the device's width, or 1 once a trial
    /// that ran beside another ended in an error or a timeout. Some jobs cannot run twice at once
    /// (a fixed port, a fixed file); alone, they run as the job will.
    pub(super) fn proof_width(&self) -> usize {
        if rounds::failed_beside_another(&self.trials).is_some() {
            1
        } else {
            self.backend.width()
        }
    }

    /// The steps of the cold failure above the answer: the confirmation's (the answer must fit
    /// with those), or the bracket's when more.
    fn failure_steps(&self, br: &Bracket) -> u32 {
        self.cfg.confirm_steps.max(br.steps)
    }

    /// The outcome of a cold trial at `hb` that already shows what the failure above the answer
    /// would: a bound (any steps), or a fit with at least `steps` (a proof round ran it).
    fn cold_failure_above(&self, hb: u64, steps: u32) -> Option<TrialOutcome> {
        let at = |t: &&TrialRecord| t.batch == hb && t.cold() && t.accumulation == 1;
        let cold = || self.trials.iter().filter(at);
        (cold().find(|t| t.outcome.is_bound()))
            .or_else(|| cold().find(|t| t.outcome.fits() && t.steps >= steps))
            .map(|t| t.outcome.clone())
    }

    /// Confirms the fit at grid index `l` with the confirmation's steps: `true` when it fits. An
    /// out-of-memory that a repeat does not contradict is memory that grows after the exploration
    /// steps: the bound moves down to `l`, and from then on only fits of the confirmation's length
    /// count (a walk down one size at a time, confirming each, would cost hundreds of trials).
    fn confirm_or_lower(&mut self, grid: &Grid, br: &mut Bracket, l: u64) -> Result<bool, Stop> {
        let b = grid.batch(l);
        let confirm_steps = self.cfg.confirm_steps.max(self.cfg.steps);
        match self.confirm(b, Purpose::Confirm)? {
            // Neither a fit nor memory: nothing is proven about b.
            Confirmation::Failed(why) => Err(Stop::Fatal(format!(
                "the confirmation trial of {b} failed ({why}); no size is proven"
            ))),
            Confirmation::AboveNoise { why, .. } => Err(Stop::Fatal(why)),
            Confirmation::Fits => Ok(true),
            Confirmation::OutOfMemory => {
                // More memory appears with more steps, unless a repeat fits (noise).
                if self.repeat_of_late_memory(b, confirm_steps)? {
                    br.hi = Some(l);
                    br.steps = confirm_steps;
                    br.lo = self.largest_fit_below(b, confirm_steps, grid);
                }
                Ok(false)
            }
        }
    }

    /// With warm exploration, the closed bracket's fit when no trial at it ran the confirmation's
    /// steps: the cold proof would confirm it with those.
    fn short_warm_fit(&self, grid: &Grid, br: &Bracket) -> Option<u64> {
        let l = br.lo?;
        let (b, steps) = (grid.batch(l), self.cfg.confirm_steps.max(self.cfg.steps));
        let long = (self.trials.iter()).any(|t| t.batch == b && t.steps >= steps);
        (self.explores_warm() && !long).then_some(l)
    }

    /// The suspect fit at `l` run again with the confirmation's steps in a warm process, when
    /// exploration runs warm: a fit leaves the bracket as it is (the cold proof confirms it once the
    /// bracket closes); an out-of-memory is memory that grows after the exploration's steps, so the
    /// bound moves down to `l` and from then on only fits of the confirmation's length count. An
    /// error or a timeout leaves the question to a cold confirmation.
    fn suspect_warm(&mut self, grid: &Grid, br: &mut Bracket, l: u64) -> Result<(), Stop> {
        let b = grid.batch(l);
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let o = self.trial(b, steps, Purpose::Explore)?;
        if o.is_bound() {
            br.hi = Some(l);
            br.steps = steps;
            br.lo = self.largest_fit_below(b, steps, grid);
        } else if !o.fits() {
            self.confirm_or_lower(grid, br, l)?;
        }
        Ok(())
    }

    /// Whether the smallest out-of-memory came only from trials longer than the exploration's.
    fn confirm_ooms(&self, grid: &Grid, br: &Bracket) -> bool {
        br.hi.is_some_and(|h| {
            let hb = grid.batch(h);
            let mut bound = (self.trials.iter()).filter(|t| t.batch == hb && t.outcome.is_bound());
            bound.clone().next().is_some() && bound.all(|t| t.steps > br.steps)
        })
    }

    /// The fit to confirm before exploring further, if any: a confirmation-length out-of-memory
    /// just above a fit of fewer steps (memory that grows after the exploration steps, or a
    /// candidate a little too large), or two of them above it (the fit below is the suspect).
    /// Confirming it costs one trial where walking down to it would cost several.
    fn suspect_fit(&self, grid: &Grid, br: &Bracket, confirm_ooms: bool) -> Option<u64> {
        let (Some(l), Some(h), true) = (br.lo, br.hi, confirm_ooms) else {
            return None;
        };
        let b = grid.batch(l);
        let near = grid.batch(h) - b
            <= (2 * tolerance_gap(b, self.cfg.tolerance, grid.step)).max(4 * grid.step);
        let failed_above = (self.trials.iter())
            .filter(|t| t.batch > b && t.steps > br.steps && t.outcome.is_bound())
            .count();
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let shorter = br.steps < steps;
        // with warm exploration, a warm fit with the confirmation's steps answers the suspicion
        let warm_fit = self.explores_warm()
            && (self.trials.iter()).any(|t| t.batch == b && t.steps >= steps && t.outcome.fits());
        ((near || failed_above >= 2) && shorter && !self.confirmed(b) && !warm_fit).then_some(l)
    }

    /// One turn of exploration: the strategy proposes (a round of sizes where the device runs
    /// several trials at once), the engine plans and checks each proposal, and the outcomes move
    /// the bracket (a measurement leaves it as it is).
    fn explore(
        &mut self,
        strategy: &mut (dyn Strategy + '_),
        grid: Grid,
        br: &mut Bracket,
        confirm_ooms: bool,
    ) -> Result<(), Stop> {
        // once warm (or worker) trials lost trust, the strategy sees the cold trials only, and the
        // line of the others as a prior ([`Prober::distrusted_prior`])
        let cold: Vec<TrialRecord>;
        let (trials, distrusted) = if self.worker_trusted {
            (&self.trials[..], None)
        } else {
            cold = self.trials.iter().filter(|t| t.cold()).cloned().collect();
            (&cold[..], self.distrusted_prior())
        };
        let state = SearchState {
            grid,
            lo: br.lo,
            hi: br.hi,
            ceiling: br.ceiling,
            trials,
            limit_bytes: self.limit_bytes,
            steps: br.steps,
            base_steps: self.cfg.steps,
            confirm_steps: self.cfg.confirm_steps.max(self.cfg.steps),
            tolerance: self.cfg.tolerance,
            confirm_ooms,
            prior: self.cfg.prior.as_ref().or(distrusted.as_ref()),
        };
        let width = self.explore_width();
        if width > 1 {
            let proposals = strategy.propose_round(&state, width);
            let planned = (proposals.iter())
                .map(|p| self.plan_trial(&state, *p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(Stop::Fatal)?;
            let outcomes = self.explore_round(&planned)?;
            for (p, o) in planned.iter().zip(&outcomes).filter(|(p, _)| !p.measure) {
                apply(o, p.index, &mut br.lo, &mut br.hi, &mut br.ceiling);
            }
            self.uncross(&grid, br);
            return Ok(());
        }
        let p = self
            .plan_trial(&state, strategy.propose(&state))
            .map_err(Stop::Fatal)?;
        if p.measure {
            // whatever its outcome, the bracket stays
            self.trial(p.batch, p.steps, p.purpose)?;
        } else {
            let o = self.explore_trial(p.batch, p.steps, p.purpose)?;
            apply(&o, p.index, &mut br.lo, &mut br.hi, &mut br.ceiling);
        }
        Ok(())
    }

    /// The line of the fits of trials that lost trust (warm or worker ones; each size's largest
    /// peak, with the exploration's steps or more), as a prior for the cold walk: what such a
    /// process holds or misses against a cold one is mostly a fixed part, so its fixed part is
    /// given as unknown (an error of 100 %) and its slope, anchored at a cold fit, says where the
    /// boundary lies. Like any prior, never evidence.
    fn distrusted_prior(&self) -> Option<Prior> {
        if self.cfg.prior.is_some() {
            return None;
        }
        let steps = self.cfg.steps;
        let points = line::peaks(
            (self.trials.iter()).filter(|t| !t.cold() && t.steps >= steps && t.accumulation == 1),
        );
        let (line, _) = line::fit_line(&points).filter(|(l, _)| l.k > 0.0)?;
        Some(Prior {
            fixed_bytes: line.a.max(0.0),
            per_sample_bytes: line.k,
            fixed_error: 1.0,
            per_sample_error: 0.03,
            try_first: false,
        })
    }

    /// A round planned against the bracket before it can cross it: a fit at or above a size that
    /// ran out of memory in the same round. Cold, that is a contradiction the noise rule answers
    /// below; warm, it is no evidence either way, so the bracket keeps the failure and the largest
    /// fit below it, and the cold proof decides.
    fn uncross(&self, grid: &Grid, br: &mut Bracket) {
        if let (Some(l), Some(h)) = (br.lo, br.hi) {
            if l >= h {
                br.lo = self.largest_fit_below(grid.batch(h), br.steps, grid);
            }
        }
    }

    /// How a proposal runs: its size, steps and purpose; an error when the engine refuses it (a
    /// measurement of a tried size or one not below the largest fit, a size outside the open
    /// bracket).
    fn plan_trial(&self, st: &SearchState, proposal: Proposal) -> Result<Planned, String> {
        let (grid, lo, steps, confirm_steps) = (st.grid, st.lo, st.steps, st.confirm_steps);
        let upper = upper_bound(st.hi, st.ceiling);
        let closes = |l: u64, h: u64| {
            h > l && within_tolerance(grid.batch(l), grid.batch(h), st.tolerance, grid.step)
        };
        let i = proposal.index;
        let b = grid.batch(i);
        if proposal.measure {
            // A measurement below the largest fit: only a size never tried (so a strategy
            // cannot loop on it), run for its peak; whatever its outcome, the bracket stays.
            if lo.is_none_or(|l| i >= l) || self.trials.iter().any(|t| t.batch == b) {
                return Err(format!(
                    "internal error: the {:?} strategy asked to measure size {b}, which is not \
                     an untried size below the largest fit {:?}",
                    self.cfg.strategy,
                    lo.map(|l| grid.batch(l))
                ));
            }
            return Ok(Planned {
                index: i,
                batch: b,
                steps,
                purpose: Purpose::Explore,
                measure: true,
            });
        }
        // The engine owns the bracket: a proposal outside it would re-run a settled size (and a
        // strategy that keeps doing so would never end), so it stops the search instead.
        if lo.is_some_and(|l| i <= l) || upper.is_some_and(|u| i >= u) || i > grid.last_index {
            return Err(format!(
                "internal error: the {:?} strategy proposed size {} outside the open bracket \
                 (largest fit {:?}, smallest bound {:?})",
                self.cfg.strategy,
                b,
                lo.map(|l| grid.batch(l)),
                upper.map(|u| grid.batch(u))
            ));
        }
        // A size whose fit would close the bracket is the answer if it fits: run it with the
        // confirm steps at once (its fit is then also its confirmation), as a strategy may ask
        // for a size it predicts to be the answer.
        // Once the largest fit is confirmed, every trial above it runs so too: a fit there is then a
        // confirmed bound at once, and an out-of-memory closes the proof just as well. While
        // exploring warm, a warm fit with the confirmation's steps counts: a shorter fit above it
        // would miss the memory that appears after the exploration's steps, and its lower peak
        // would aim the line past the boundary the cold proof meets.
        let lo_confirmed = lo.is_some_and(|l| {
            let b = grid.batch(l);
            self.confirmed(b) || (self.explores_warm() && self.ran_full_length(b))
        });
        let as_candidate =
            (proposal.confirm || lo_confirmed || st.fit_would_close(i)) && confirm_steps > steps;
        // A trial next to either end of the bracket may close it: run it fresh, so it is already
        // the proof (saves the worker trial plus its fresh re-run under hybrid isolation). Not
        // with warm exploration: a warm trial never proves, and the closed bracket's two ends run
        // again cold ([`Prober::prove`]), which costs less than one cold trial per step of the
        // walk to it. (A warm candidate still runs the confirmation's steps, so that the warm
        // bracket is the one the cold proof will meet.)
        let cold = !self.explores_warm();
        let closing = cold
            && (as_candidate
                || lo.is_some_and(|l| closes(l, i))
                || st.fit_would_close(i)
                || upper.is_some_and(|u| i + 1 == u));
        Ok(Planned {
            index: i,
            batch: b,
            steps: if as_candidate { confirm_steps } else { steps },
            purpose: if closing {
                Purpose::Proof
            } else {
                Purpose::Explore
            },
            measure: false,
        })
    }
}

/// A proposal as the engine runs it.
#[derive(Debug, Clone, Copy)]
struct Planned {
    index: u64,
    batch: u64,
    steps: u32,
    purpose: Purpose,
    /// A measurement below the largest fit: its outcome never moves the bracket.
    measure: bool,
}

/// The open bracket on the grid (indices): the largest fit `lo`, the smallest out-of-memory `hi`,
/// a `ceiling` above which an error leaves nothing provable, and the steps a trial needs to count.
#[derive(Debug, Clone, Copy)]
struct Bracket {
    lo: Option<u64>,
    hi: Option<u64>,
    ceiling: Option<u64>,
    steps: u32,
}

/// Moves the bracket by one trial's outcome at grid index `i`: a fit raises the largest fit, an
/// out-of-memory lowers the smallest bound, an error or a timeout (after its retry) only caps the
/// exploration.
fn apply(
    o: &TrialOutcome,
    i: u64,
    lo: &mut Option<u64>,
    hi: &mut Option<u64>,
    ceiling: &mut Option<u64>,
) {
    if o.fits() {
        *lo = Some(lo.map_or(i, |l| l.max(i)));
    } else if o.is_bound() {
        *hi = Some(hi.map_or(i, |h| h.min(i)));
    } else {
        *ceiling = Some(ceiling.map_or(i, |c| c.min(i)));
    }
}

#[cfg(test)]
mod tests;
