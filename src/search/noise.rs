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
//! `W = max(H − L, the tolerance gap at L, the guard band's samples at L)` (at least one step of
//! the grid). The engine stops
//! bisecting and tries the largest size `c ≤ L − W` with the confirmation's steps, in a fresh process,
//! until it has fit **twice**; a failure there makes `c` the new `L` and doubles `W` (the noise is
//! wider than the band showed), and the engine steps down that band. It runs at most [`NOISY_TRIALS`] trials after the first contradiction (plus one
//! retry of any that ends in an error or a timeout, which is never evidence). The answer is then a
//! size that fit twice and lies at least one band below every failure seen
//! ([`StopReason::ProvenBelowNoise`], complete); if the trials run out first, or the band reaches
//! below the smallest size, the search stops without an answer ([`StopReason::NoisyBoundary`]).
//! Searches whose outcomes never disagree never get here: their proof is unchanged.
//!
//! **The answer's own noise.** The trials run under the job's limit less a guard band, so that a
//! fresh run of the answer, whose footprint moves from run to run, still fits under the job's limit.
//! A band of fixed width is a guess about one job's noise; [`super::SearchConfig::repeats`] measures it. The
//! confirmed answer runs `repeats` more times, fresh, with the confirmation's steps: a repeat that
//! fails is a contradiction (the rule above), and otherwise the **spread** of the footprints of the
//! fresh runs at one size (the largest, over the sizes run more than once), scaled to the whole
//! range that so few draws imply (`whole_range`: three draws span half of it), is the job's
//! measured noise. A fresh run may then reach the largest footprint seen plus that spread, so every fit of the
//! answer must have a footprint at most `job limit − spread` (the noise ceiling; when the spread is
//! within the guard band, every fit under the trials' limit is). An answer above the ceiling is a
//! band of its own ([`NoisyBoundary::spread_bytes`]): its lowest bound is the answer, its width the
//! samples, by the slope of the fits below, that bring the mean of its fits plus half the spread
//! under the ceiling (at least the excess of the highest), and the rule above steps down
//! to a size whose fits, `1 + repeats` of them, all lie under the ceiling. Stepping down, the
//! ceiling only falls: a smaller size is held to the ceiling a larger one broke, even where its own
//! runs, drawn close together, narrow the measured spread.

use super::line::{pooled_range, residual_range, whole_range};
use super::{tolerance_gap, Confirmation, Grid, Prober, Purpose, Stop, StopReason, TrialRecord};
use crate::protocol::TrialOutcome;
use serde::{Deserialize, Serialize};

/// Fits of one size that break the promise: the largest ([`above_noise`]) or the lowest
/// ([`reach_above_limit`]) peaked above the ceiling the job's noise leaves under its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AboveNoise {
    /// The fit held to the ceiling.
    pub top: u64,
    pub ceiling: u64,
    pub spread: u64,
    /// The spread is the guard band, not a measured one: the fit lies above the trials' limit and
    /// no narrower noise was shown.
    pub band: bool,
}

/// Whether the fresh fits' footprints of one size (`fits`) break the promise: the job's noise is
/// the wider of `measured` (a spread measured before) and the fits' own range, scaled to the whole
/// range so few draws imply ([`whole_range`]); once that is wider than the guard band (`job_limit −
/// limit`), each fit must leave it under `job_limit`. The rule of the answer's repeats, the split's
/// sizes, `merge` and `verify` elsewhere.
pub fn above_noise(
    fits: &[u64],
    measured: Option<u64>,
    job_limit: u64,
    limit: u64,
) -> Option<AboveNoise> {
    held(fits, measured, job_limit, limit, *fits.iter().max()?)
}

/// How far fresh runs of one size may reach, by what its fresh fits (`fits`) and the job's noise
/// show, where that is above the job's limit: with the noise as in [`above_noise`], every fresh run
/// lies within it of the lowest one seen, so a fresh run may reach the lowest fit plus the noise.
/// `verify`'s rule on the plan's own device: more runs of the same noise only lower the lowest fit
/// and sharpen the range, so a size the probe accepted ([`above_noise`], which holds the highest
/// fit instead: a margin against a noise measured from few runs) stays accepted when its runs are
/// counted again with new ones of the same noise.
pub fn reach_above_limit(
    fits: &[u64],
    measured: Option<u64>,
    job_limit: u64,
    limit: u64,
) -> Option<AboveNoise> {
    held(fits, measured, job_limit, limit, *fits.iter().min()?)
}

/// The fit `at` held to the ceiling the noise of `fits` (and `measured`) leaves under `job_limit`,
/// where that noise is wider than the guard band and `at` is above it; or where `at` lies above the
/// trials' `limit` (a run under the job's limit: `verify` on the plan's own device), held to the
/// guard band at least, the noise the band stands for when none wider was measured: such a fit
/// leaves a fresh run room only when its spread is known to be narrower, and none is.
fn held(
    fits: &[u64],
    measured: Option<u64>,
    job_limit: u64,
    limit: u64,
    at: u64,
) -> Option<AboveNoise> {
    let (lo, top) = (*fits.iter().min()?, *fits.iter().max()?);
    let own = (fits.len() > 1).then(|| whole_range(top - lo, fits.len()));
    // (without a band, a fit above the limit is the device's figure moving, as a simulated
    // device's noisy peaks do: no run went past a limit)
    let band = (at > limit && job_limit > limit).then(|| job_limit - limit);
    let spread = measured.max(own).max(band)?;
    let ceiling = job_limit.saturating_sub(spread);
    ((ceiling < limit || band.is_some()) && at > ceiling).then_some(AboveNoise {
        top: at,
        ceiling,
        spread,
        band: band.is_some_and(|b| measured.max(own) < Some(b)),
    })
}

/// The most trials the engine runs after the first contradiction (retries of errors aside): two
/// candidates, each run twice.
pub const NOISY_TRIALS: u32 = 4;

/// The most trials a noisy boundary takes after its first contradiction (retries aside), with
/// `repeats`: two candidates run twice ([`NOISY_TRIALS`]), or four each run `1 + repeats` times.
pub fn noisy_trials(repeats: u32) -> u32 {
    match repeats {
        0 => NOISY_TRIALS,
        r => 4 * (1 + r),
    }
}

/// `--repeats` for a user's command (`--exec`): the answer fits three times in fresh runs, and the
/// spread of those runs is the job's noise. Measured: fresh runs of one size of the repository's
/// exec scripts peak up to ~35 MiB apart under a cgroup (docs/benchmarks.md, "does the answer hold
/// in fresh runs?"), more than the 16 MiB guard band; batchfit's own tch trials repeat to the byte.
pub const EXEC_REPEATS: u32 = 2;

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
    /// Where the band came from the answer's own noise: the spread of the footprints of fresh runs
    /// at one size, wider than the guard band ("The answer's own noise").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_bytes: Option<u64>,
    /// The largest footprint a fit of the answer may have so that a fresh run, the spread included,
    /// stays under the job's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_bytes: Option<u64>,
}

impl NoisyBoundary {
    /// The summary's line: where outcomes disagree, and that the answer is at most the noise band's
    /// low end (it may be that end itself: a size that fit twice there).
    pub fn describe(&self) -> String {
        if let (None, Some(spread), Some(ceiling)) = (
            self.contradictions.first(),
            self.spread_bytes,
            self.ceiling_bytes,
        ) {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return format!(
                "the job's fresh runs vary by up to {:.1} MiB (repeats of one size, and the fits' \
                 scatter about their line near the top, scaled to the range so few runs imply), \
                 more than the guard band: a fit must peak at most {:.1} MiB, and {} did not, so \
                 the answer is at most {}",
                mib(spread),
                mib(ceiling),
                self.lowest_bound,
                self.band_low
            );
        }
        let why = match self.contradictions.first() {
            Some(c) if c.fit == c.bound => format!("{} both fit and failed", c.fit),
            Some(c) => format!("fit at {} above a failure at {}", c.fit, c.bound),
            None => String::new(),
        };
        // where the outcomes disagree: the failure with a fit at or above it (the band's lowest
        // bound may since have moved to a size that fit above the noise ceiling)
        let near = self
            .contradictions
            .first()
            .map_or(self.lowest_bound, |c| c.bound);
        if self.band_low == 0 {
            return format!(
                "outcomes near {} disagree ({why}): the noise band {}–{} reaches below the \
                 smallest size, so no size fits reliably under this limit (a larger \
                 --memory-budget, or a smaller job)",
                near, self.band_low, self.band_high
            );
        }
        format!(
            "outcomes near {near} disagree ({why}): the answer is at most {}, the low end of the \
             noise band {}–{}",
            self.band_low, self.band_low, self.band_high
        )
    }
}

/// A fit in a fresh process with at least `steps`, at accumulation 1.
fn fresh_fit(t: &TrialRecord, steps: u32) -> bool {
    t.fresh_fit_at(steps, 1)
}

/// A failure that bounds the answer: out of memory or over the budget, not in the worker.
fn fresh_bound(t: &TrialRecord) -> bool {
    t.outcome.is_bound() && t.cold() && t.accumulation == 1
}

/// The contradictions among `trials`, by failing size: a fit at or above a fresh failure, with at
/// least its steps and accumulation (memory only grows with either). A warm process's fit is none:
/// a warm start differs from a cold one by what it imported ahead, not by the job's noise.
pub fn contradictions(trials: &[TrialRecord]) -> Vec<Contradiction> {
    let mut out: Vec<Contradiction> = vec![];
    for o in trials.iter().filter(|t| fresh_bound(t)) {
        let fit = trials
            .iter()
            .filter(|f| {
                f.outcome.fits()
                    && !f.warm()
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
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let spread = self
            .spread(steps)
            .map_or(0, |s| self.samples_for(s, lowest));
        // the guard band is the noise the trials' limit was set to absorb: a contradiction shows
        // noise of at least about that scale, so the band starts no narrower
        let guard = self
            .job_limit
            .map_or(0, |j| j.saturating_sub(self.limit_bytes));
        let guard = if guard > 0 {
            self.samples_for(guard, lowest)
        } else {
            0
        };
        let width = (high - lowest.min(high))
            .max(tolerance_gap(lowest, self.cfg.tolerance, grid.step))
            .max(spread)
            .max(guard);
        Some(NoisyBoundary {
            band_low: lowest.saturating_sub(width),
            band_high: high,
            lowest_bound: lowest,
            width,
            contradictions,
            spread_bytes: None,
            ceiling_bytes: None,
        })
    }

    /// How many fresh fits with the confirmation's steps an answer needs: `1 + repeats`, and at
    /// least two below a noisy boundary.
    pub(super) fn fits_needed(&self, noisy: bool) -> usize {
        1 + self.cfg.repeats as usize + usize::from(noisy && self.cfg.repeats == 0)
    }

    /// The most trials after the first contradiction (retries aside): two candidates, each run
    /// twice ([`NOISY_TRIALS`]); with repeats, four candidates, each run as often as an answer must
    /// fit.
    pub(super) fn noisy_trials(&self) -> u32 {
        noisy_trials(self.cfg.repeats)
    }

    /// Runs the confirmed answer `b` again, fresh, until it has fit `1 + repeats` times or a repeat
    /// did not fit (the caller reads what that shows). An error or a timeout, twice, proves nothing:
    /// the answer is then not proven.
    pub(super) fn repeat_answer(&mut self, b: u64, steps: u32) -> Result<(), Stop> {
        while self.fresh_confirmed_fits(b, steps) < self.fits_needed(false) {
            let o = self.trial_with_retry(b, steps, Purpose::Repeat)?;
            if o.is_bound() {
                return Ok(());
            }
            if !o.fits() {
                return Err(Stop::Fatal(format!(
                    "the repeat of the answer {b} ended in {} ({}); no size is proven",
                    o.kind(),
                    o.message().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// Confirms micro-batch `b` of the accumulation split at `accumulation` the way the answer was
    /// confirmed, so that the plan's promise holds for the size the job will run: `1 + repeats`
    /// fresh fits with the confirmation's steps, each peaking at most the noise ceiling (the job's
    /// limit less the measured spread: of the answer's fresh runs or of these, whichever is wider).
    /// Accumulation holds more memory than one micro-batch, so a split size below the answer can
    /// peak above that ceiling although the answer did not; it is then [`Confirmation::AboveNoise`],
    /// with the size its excess points to.
    pub fn confirm_split_held(
        &mut self,
        b: u64,
        accumulation: u32,
        purpose: Purpose,
    ) -> Result<Confirmation, Stop> {
        let acc = accumulation.max(1);
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        if let Some(failed) = self.split_side_by_side(b, acc, steps, purpose)? {
            return Ok(failed);
        }
        let first = self.confirm_split(b, accumulation, purpose)?;
        if first != Confirmation::Fits {
            return Ok(first);
        }
        while self.split_fits(b, acc, steps).len() < self.fits_needed(false) {
            match self.repeat_split(b, acc)? {
                Confirmation::Fits => {}
                other => return Ok(other),
            }
        }
        Ok(self
            .split_above_noise(b, acc, steps)
            .unwrap_or(Confirmation::Fits))
    }

    /// Where the device runs several trials at once ([`Prober::proof_width`]), the split's fresh
    /// runs it still needs, side by side in one round: the first out-of-memory among them, if any
    /// (as a run one at a time would have stopped there). An error is no evidence: what is still
    /// missing then runs one at a time.
    fn split_side_by_side(
        &mut self,
        b: u64,
        acc: u32,
        steps: u32,
        purpose: Purpose,
    ) -> Result<Option<Confirmation>, Stop> {
        let need = self
            .fits_needed(false)
            .saturating_sub(self.split_fits(b, acc, steps).len());
        let n = need.min(self.proof_width());
        if n < 2 {
            return Ok(None);
        }
        let runs: Vec<_> = (0..n)
            .map(|j| (b, steps, if j == 0 { purpose } else { Purpose::Repeat }))
            .collect();
        self.accumulation = acc;
        let ran = self.round_of(&runs);
        self.accumulation = 1;
        Ok((ran?.iter())
            .find(|o| o.is_bound())
            .map(|o| Confirmation::of(o, b)))
    }

    /// The footprints of the fresh fits of `b` at exactly `acc` with at least `steps` steps.
    fn split_fits(&self, b: u64, acc: u32, steps: u32) -> Vec<u64> {
        self.trials
            .iter()
            .filter(|t| t.batch == b && t.fresh_fit_at(steps, acc))
            .filter_map(|t| t.footprint())
            .collect()
    }

    /// Why the fits of `b` at `acc` break the promise, if they do: the largest peaks above the job's
    /// limit less the wider of the answer's spread and their own, where that is below the trials'
    /// limit (a spread within the guard band leaves every fit room).
    fn split_above_noise(&self, b: u64, acc: u32, steps: u32) -> Option<Confirmation> {
        let fits = self.split_fits(b, acc, steps);
        let over = above_noise(&fits, self.spread(steps), self.job_limit?, self.limit_bytes)?;
        let mib = |x: u64| x as f64 / (1u64 << 20) as f64;
        let width = self.samples_for(over.top - over.ceiling, b).max(1);
        Some(Confirmation::AboveNoise {
            why: format!(
                "micro-batch {b} × accumulation {acc} peaked at {:.1} MiB, above the {:.1} MiB that \
                 the job's measured noise ({:.1} MiB between fresh runs) leaves under its limit",
                mib(over.top),
                mib(over.ceiling),
                mib(over.spread)
            ),
            below: b.saturating_sub(width),
        })
    }

    /// The job's measured noise: the widest of the ranges of footprints among fresh fits of the
    /// sizes (at one accumulation) run more than once, pooled ([`pooled_range`]: the answer's
    /// repeats, the split's, a noisy boundary's candidates), the range of each such size run as
    /// often as an answer must fit ([`Prober::fits_needed`] below a noisy boundary), and the range
    /// of all fresh fits' footprints without accumulation about the line through them near the top
    /// ([`residual_range`]), each with the confirmation's steps and scaled to the whole range its
    /// number of draws implies ([`whole_range`]). (A failure says only that its run needed more
    /// than the limit, not by how much: a flaky failure would make any spread.)
    pub(super) fn spread(&self, steps: u32) -> Option<u64> {
        type Runs<K> = std::collections::BTreeMap<K, Vec<u64>>;
        let (mut by_size, mut by_run): (Runs<u64>, Runs<(u64, u32)>) = Default::default();
        for t in self
            .trials
            .iter()
            .filter(|t| t.fresh_fit_at(steps, t.accumulation))
        {
            if let Some(f) = t.footprint() {
                by_run.entry((t.batch, t.accumulation)).or_default().push(f);
                if t.accumulation == 1 {
                    by_size.entry(t.batch).or_default().push(f);
                }
            }
        }
        let pooled = pooled_range(by_run.values().map(|v| v.as_slice()));
        // a size run as often as an answer must fit counts alone too, as the split's and verify's
        // rule counts it ([`above_noise`]): the noise may grow with the size, and pooled with
        // smaller sizes it would be diluted
        let alone = self.fits_needed(true);
        let widest = (by_run.values().filter(|v| v.len() >= alone))
            .map(|v| whole_range(v.iter().max().unwrap() - v.iter().min().unwrap(), v.len()))
            .max();
        pooled.max(widest).max(residual_range(&by_size))
    }

    /// The job's measured noise over every trial so far (the plan's `search.noise_spread_bytes`).
    pub fn noise_spread(&self) -> Option<u64> {
        self.spread(self.cfg.confirm_steps.max(self.cfg.steps))
    }

    /// The largest footprint a fit may have for a fresh run, the measured spread included, to stay
    /// under the job's limit; `None` when nothing is measured or every fit under the trials' limit
    /// already leaves that room (the spread is within the guard band).
    pub(super) fn noise_ceiling(&self, steps: u32) -> Option<u64> {
        let spread = self.spread(steps)?;
        let ceiling = self.job_limit?.saturating_sub(spread);
        (ceiling < self.limit_bytes).then_some(ceiling)
    }

    /// A band of the answer's own noise: `b`'s fits peak above the noise ceiling.
    pub(super) fn spread_band(&self, b: u64, grid: &Grid) -> Option<NoisyBoundary> {
        let steps = self.cfg.confirm_steps.max(self.cfg.steps);
        let ceiling = self.noise_ceiling(steps)?;
        let excess = self.excess(b, steps, Some(ceiling))?;
        let width = self
            .samples_for(self.step_below(b, steps, excess, ceiling), b)
            .max(tolerance_gap(b, self.cfg.tolerance, grid.step));
        Some(NoisyBoundary {
            band_low: b.saturating_sub(width),
            band_high: b,
            lowest_bound: b,
            width,
            contradictions: vec![],
            spread_bytes: self.spread(steps),
            ceiling_bytes: Some(ceiling),
        })
    }

    /// The samples that `bytes` of footprint take at `b`. The slope is measured from a fit far
    /// below to the fit at `b`, or the largest fit below it when `b` never fit (a failure's size):
    /// from the largest fit at or below half of that one, each size's smallest footprint, any
    /// steps; near `b` the job's noise would make the slope. It is at most that fit's footprint per
    /// sample (all of it per-sample memory, none fixed), which is also the slope when no fit lies
    /// far below: a slope that is too steep only takes a step too short, which the caller's next
    /// look at the ceiling catches, never one past what the excess needs. At most a quarter of `b`
    /// at a time, so that a slope that noise has flattened cannot send the answer far below.
    fn samples_for(&self, bytes: u64, b: u64) -> u64 {
        let at = |size: u64| {
            self.trials
                .iter()
                .filter(|t| t.batch == size && t.outcome.fits())
                .filter_map(|t| t.footprint())
                .min()
        };
        let largest_fit_to = |top: u64| {
            (self.trials.iter())
                .filter(|t| t.batch <= top && t.outcome.fits() && t.footprint().is_some())
                .map(|t| t.batch)
                .max()
        };
        // the fit at b, or the nearest below it (b itself may never have fit: a failure's size)
        let near = largest_fit_to(b).and_then(|c| at(c).map(|fc| (c, fc)));
        let slope = near.map(|(c, fc)| {
            let whole = fc as f64 / c.max(1) as f64;
            match largest_fit_to(c / 2).and_then(|a| at(a).map(|fa| (a, fa))) {
                Some((a, fa)) if fc > fa => ((fc - fa) as f64 / (c - a) as f64).min(whole),
                _ => whole,
            }
        });
        let samples = match slope {
            Some(k) if k > 0.0 => (bytes as f64 / k).ceil() as u64,
            _ => 1,
        };
        samples.clamp(1, (b / 4).max(1))
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

    /// How far below `b` (in footprint) the next candidate must peak when `b`'s fits rose `excess`
    /// above the noise ceiling `ceiling`: at least that excess, and so far that the mean of `b`'s
    /// fits less the step, plus half the measured spread (a fresh run's draw above the mean), is
    /// under the ceiling. Stepping by the excess alone lands where the next runs peak above it
    /// again as often as not: their highest draw is as likely high as the one just seen.
    fn step_below(&self, b: u64, steps: u32, excess: u64, ceiling: u64) -> u64 {
        let fits = self.split_fits(b, 1, steps);
        let (Some(spread), false) = (self.spread(steps), fits.is_empty()) else {
            return excess;
        };
        let mean = fits.iter().sum::<u64>() / fits.len() as u64;
        excess.max((mean + spread / 2).saturating_sub(ceiling))
    }

    /// Fresh fits at `b` with the confirmation's steps.
    pub(super) fn fresh_confirmed_fits(&self, b: u64, steps: u32) -> usize {
        self.trials
            .iter()
            .filter(|t| t.batch == b && fresh_fit(t, steps))
            .count()
    }

    /// How far the largest footprint of a fresh fit at `b` is above `ceiling` (the noise ceiling,
    /// when there is one); `None` when none is.
    fn excess(&self, b: u64, steps: u32, ceiling: Option<u64>) -> Option<u64> {
        let ceiling = ceiling?;
        self.trials
            .iter()
            .filter(|t| t.batch == b && fresh_fit(t, steps))
            .filter_map(|t| t.footprint())
            .max()
            .filter(|&top| top > ceiling)
            .map(|top| top - ceiling)
    }

    /// The next runs of the candidate `c` below a noisy boundary: one, or where the device runs
    /// several trials at once ([`Prober::proof_width`]), as many side by side as it still needs fits
    /// (and `left` allows);
    /// `left` counts them. An error or a timeout is retried (once, alone).
    fn candidate_runs(
        &mut self,
        c: u64,
        steps: u32,
        left: &mut u32,
    ) -> Result<Vec<TrialOutcome>, Stop> {
        let fits = self.fresh_confirmed_fits(c, steps);
        let first = if fits > 0 {
            Purpose::Repeat
        } else {
            Purpose::Confirm
        };
        let need = self.fits_needed(true).saturating_sub(fits);
        let n = need.min(self.proof_width()).min(*left as usize).max(1);
        *left -= n as u32;
        if n == 1 {
            return Ok(vec![self.trial_with_retry(c, steps, first)?]);
        }
        let runs: Vec<_> = (0..n)
            .map(|j| (c, steps, if j == 0 { first } else { Purpose::Repeat }))
            .collect();
        let mut ran = self.round_of(&runs)?;
        for o in ran.iter_mut().filter(|o| !o.fits() && !o.is_bound()) {
            *o = self.trial(c, steps, Purpose::Retry)?;
        }
        Ok(ran)
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
        let mut left = self.noisy_trials();
        found.0 = None;
        let stop = loop {
            let below = band.lowest_bound.saturating_sub(band.width);
            if below < grid.first {
                break Stop::Reason(StopReason::NoisyBoundary);
            }
            let c = grid.batch(grid.index_at_or_below(below));
            // the ceiling only falls: a smaller size whose own runs drew close together (and so
            // narrow the spread) is held to the ceiling that a larger one broke
            let ceiling = match (self.noise_ceiling(steps), band.ceiling_bytes) {
                (Some(now), Some(broken)) => Some(now.min(broken)),
                (now, broken) => now.or(broken),
            };
            if let Some((excess, ceiling)) =
                ceiling.and_then(|x| Some((self.excess(c, steps, Some(x))?, x)))
            {
                // A fit whose footprint leaves less room under the job's limit than the noise: the
                // next candidate lies below, far enough that its runs are likely under the ceiling.
                band.lowest_bound = c;
                band.width = self
                    .samples_for(self.step_below(c, steps, excess, ceiling), c)
                    .max(1);
                band.spread_bytes = self.spread(steps);
                band.ceiling_bytes = Some(ceiling);
                continue;
            }
            if self.fresh_confirmed_fits(c, steps) >= self.fits_needed(true) {
                found.0 = Some(c);
                break Stop::Reason(StopReason::ProvenBelowNoise);
            }
            if left == 0 {
                break Stop::Reason(StopReason::NoisyBoundary);
            }
            let ran = match self.candidate_runs(c, steps, &mut left) {
                Ok(ran) => ran,
                Err(s) => break s,
            };
            if let Some(o) = ran.iter().find(|o| !o.fits() && !o.is_bound()) {
                break Stop::Fatal(format!(
                    "the repeat trial of {c} below a noisy boundary ended in {} ({}); no size is \
                     proven",
                    o.kind(),
                    o.message().unwrap_or_default()
                ));
            }
            if ran.iter().any(|o| o.is_bound()) {
                band.lowest_bound = c;
                let spread = self.spread(steps).map_or(0, |s| self.samples_for(s, c));
                band.width = band.width.saturating_mul(2).max(spread);
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
        // the smallest size that failed (a band of the answer's noise starts at a size that fit)
        found.1 = lowest_bound(&self.trials);
        self.noise = Some(band);
        stop
    }
}
