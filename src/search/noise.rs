//! A noisy boundary: outcomes near the limit that disagree, and the answer the engine gives below them.
//!
//! Memory grows with the batch size and with the steps, so a size that fits above one that ran out of
//! memory (or over the budget) with no more steps and no more accumulation, or a repeat of a size that
//! flips, is a **contradiction**: the job's own run-to-run noise (its peak moves by tens of MB from
//! one fresh run to the next) is larger than the step between the two sizes. One fit and one
//! out-of-memory a step apart then prove nothing, and bisecting further only walks into the noise.
//!
//! Where a contradiction shows: the engine's trials stay inside the bracket, so two of them at the
//! same steps never disagree by construction. The engine repeats a size in one place: a size that
//! fit with the exploration's steps and then ran out of memory with the confirmation's. Memory that
//! appears only after the exploration steps (late memory) repeats, noise need not, so that
//! confirmation runs once more in a fresh process (one trial more for a job with late memory, whose
//! answer stays the same); a fit there is a contradiction. Measurements below the largest fit, fresh
//! re-runs and earlier trials on the device (`with_history`) can show one too.
//!
//! The rule, once a contradiction is seen (checked before every proposal): let `L` be the smallest
//! size that ran out of memory or over the budget in a fresh process (a worker's failures are its
//! leftovers, not the job's), `H` the largest size that fit at or above `L`, and the band's width
//! `W = max(H − L, the tolerance gap at L)` (at least one step of the grid). The engine stops
//! bisecting and tries the largest size `c ≤ L − W` with the confirmation's steps, in a fresh process,
//! until it has fit **twice**; a failure there makes `c` the new `L` and doubles `W` (the noise is
//! wider than the band showed), and the engine steps down that band. It runs at most [`NOISY_TRIALS`] trials after the first contradiction (plus one
//! retry of any that ends in an error or a timeout, which is never evidence). The answer is then a
//! size that fit twice and lies at least one band below every failure seen
//! ([`StopReason::ProvenBelowNoise`], complete); if the trials run out first, or the band reaches
//! below the smallest size, the search stops without an answer ([`StopReason::NoisyBoundary`]).
//! Searches whose outcomes never disagree never get here: their proof is unchanged.

use super::{tolerance_gap, Grid, Prober, Purpose, Stop, StopReason, TrialRecord};
use crate::protocol::{Isolation, TrialOutcome};
use serde::{Deserialize, Serialize};

/// The most trials the engine runs after the first contradiction (retries of errors aside): two
/// candidates, each run twice.
pub const NOISY_TRIALS: u32 = 4;

/// A size that fit at or above one that failed (`fit == bound`: a repeat that flipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contradiction {
    pub fit: u64,
    pub bound: u64,
}

/// What the plan records of a noisy boundary (`search.noisy_boundary`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoisyBoundary {
    /// The answer's ceiling: the lowest failure less one band (`lowest_bound − width`).
    pub band_low: u64,
    /// The largest size that fit at or above a failure.
    pub band_high: u64,
    /// The smallest size that ran out of memory or over the budget in a fresh process.
    pub lowest_bound: u64,
    /// The band's width in samples (set at the first contradiction, doubled by each failure below it).
    pub width: u64,
    /// For each failing size with a fit at or above it: that failure and the largest such fit.
    pub contradictions: Vec<Contradiction>,
}

impl NoisyBoundary {
    /// The summary's line: where outcomes disagree and the band the answer stays below.
    pub fn describe(&self) -> String {
        let why = match self.contradictions.first() {
            Some(c) if c.fit == c.bound => format!("{} fit and ran out of memory", c.fit),
            Some(c) => format!("fit at {} above an out-of-memory at {}", c.fit, c.bound),
            None => String::new(),
        };
        format!(
            "outcomes near {} disagree ({why}): the answer stays below the noise band {}–{}",
            self.lowest_bound, self.band_low, self.band_high
        )
    }
}

/// A failure that bounds the answer: out of memory or over the budget, not in the worker.
fn fresh_bound(t: &TrialRecord) -> bool {
    t.outcome.is_bound() && t.isolation != Isolation::Worker && t.accumulation == 1
}

/// The contradictions among `trials`, by failing size: a fit at or above a fresh failure, with at
/// least its steps and accumulation (memory only grows with either).
pub fn contradictions(trials: &[TrialRecord]) -> Vec<Contradiction> {
    let mut out: Vec<Contradiction> = vec![];
    for o in trials.iter().filter(|t| fresh_bound(t)) {
        let fit = trials
            .iter()
            .filter(|f| {
                f.outcome.fits()
                    && f.batch >= o.batch
                    && f.steps >= o.steps
                    && f.accumulation >= o.accumulation
            })
            .map(|f| f.batch)
            .max();
        if let Some(fit) = fit {
            match out.iter_mut().find(|c| c.bound == o.batch) {
                Some(c) => c.fit = c.fit.max(fit),
                None => out.push(Contradiction {
                    fit,
                    bound: o.batch,
                }),
            }
        }
    }
    out.sort_by_key(|c| c.bound);
    out
}

/// The smallest size that failed in a fresh process.
fn lowest_bound(trials: &[TrialRecord]) -> Option<u64> {
    trials
        .iter()
        .filter(|t| fresh_bound(t))
        .map(|t| t.batch)
        .min()
}

impl Prober<'_> {
    /// The band of the first contradiction, if the trials so far disagree.
    pub(super) fn noisy_band(&self, grid: &Grid) -> Option<NoisyBoundary> {
        let contradictions = contradictions(&self.trials);
        let lowest = lowest_bound(&self.trials)?;
        let high = contradictions.iter().map(|c| c.fit).max()?;
        let width =
            (high - lowest.min(high)).max(tolerance_gap(lowest, self.cfg.tolerance, grid.step));
        Some(NoisyBoundary {
            band_low: lowest.saturating_sub(width),
            band_high: high,
            lowest_bound: lowest,
            width,
            contradictions,
        })
    }

    /// After a size that fit with the exploration's steps ran out of memory with the confirmation's:
    /// late memory (memory that appears only after the exploration steps) repeats, noise need not.
    /// Runs that confirmation once more in a fresh process; `true` when it failed again (late
    /// memory, read as before), `false` when it fit (a contradiction: the caller's next look at the
    /// trials answers below the noise). An error or a timeout is no evidence: the first failure stands.
    pub(super) fn repeat_of_late_memory(&mut self, b: u64, steps: u32) -> Result<bool, Stop> {
        let o = self.trial_with_retry(b, steps, Purpose::Confirm)?;
        Ok(!o.fits())
    }

    /// Fresh fits at `b` with the confirmation's steps.
    fn fresh_confirmed_fits(&self, b: u64, steps: u32) -> usize {
        self.trials
            .iter()
            .filter(|t| {
                t.batch == b
                    && t.steps >= steps
                    && t.outcome.fits()
                    && t.isolation != Isolation::Worker
            })
            .count()
    }

    /// Answers below the noise band of `band` (see the module's rule); `found` gets the answer and the
    /// lowest failure.
    pub(super) fn below_noise(
        &mut self,
        grid: &Grid,
        mut band: NoisyBoundary,
        found: &mut (Option<u64>, Option<u64>),
    ) -> Stop {
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let mut left = NOISY_TRIALS;
        found.0 = None;
        let stop = loop {
            let below = band.lowest_bound.saturating_sub(band.width);
            if below < grid.first {
                break Stop::Reason(StopReason::NoisyBoundary);
            }
            let c = grid.batch(grid.index_at_or_below(below));
            if self.fresh_confirmed_fits(c, steps) >= 2 {
                found.0 = Some(c);
                break Stop::Reason(StopReason::ProvenBelowNoise);
            }
            if left == 0 {
                break Stop::Reason(StopReason::NoisyBoundary);
            }
            left -= 1;
            match self.trial_with_retry(c, steps, Purpose::Confirm) {
                Err(s) => break s,
                Ok(TrialOutcome::Fits { .. }) => {}
                Ok(o) if o.is_bound() => {
                    band.lowest_bound = c;
                    band.width = band.width.saturating_mul(2);
                }
                Ok(o) => {
                    break Stop::Fatal(format!(
                        "the repeat trial of {c} below a noisy boundary ended in {} ({}); no size \
                         is proven",
                        o.kind(),
                        o.message().unwrap_or_default()
                    ))
                }
            }
        };
        band.contradictions = contradictions(&self.trials);
        band.band_high = band
            .contradictions
            .iter()
            .map(|c| c.fit)
            .max()
            .unwrap_or(band.band_high);
        band.band_low = band.lowest_bound.saturating_sub(band.width);
        found.1 = Some(band.lowest_bound);
        self.noise = Some(band);
        stop
    }
}
