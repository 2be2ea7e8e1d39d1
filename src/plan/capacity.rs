//! The capacity model: the memory curve a probe measured, kept as a line, and what it predicts for
//! other memory sizes (`batchfit predict`).
//!
//! A probe measures the peak of every trial and then keeps one number. The model keeps the rest: the
//! least-squares line `peak(b) = fixed + per_sample · b` through the fits of the affine part of the
//! curve, the sizes it rests on with their residuals, and the range they cover. A flat part below the
//! range (allocator granularity, fixed buffers: a *knee*) and an out-of-memory that the line says
//! should fit (a *jump* above the range: an algorithm switch, or memory that appears late) are
//! recorded, and predictions that would cross them are refused instead of extrapolated.
//!
//! Predictions are never proof: [`Prediction::micro_batch`] is what the line says, with an error bar
//! from the residuals and the slope's uncertainty; only a probe on the machine proves a size. Pure
//! arithmetic on plans: no device, no clap.

use crate::accumulate::{self, Split};
use crate::search::line::least_squares;
use crate::search::{Prior, TrialRecord};
use serde::{Deserialize, Serialize};

/// A point is off the line when it misses it by more than this fraction of the memory the line
/// spans over its range (the per-sample part at the largest size), and by more than [`NOISE`] of
/// its peak, and by more than three times the scatter of the points already on it.
const OFF_LINE: f64 = 0.02;
/// The rise of the top peak over another fit, as a fraction of it, below which the two give no slope
/// (measurement noise would dominate it): the line's first pair needs at least this, and fits that
/// all lie within it refuse a line (and seed a sweep's next point as a single fit would).
const CLEAR_RISE: f64 = 0.02;
/// The refusal of fits whose peaks do not rise with the batch size.
const FLAT: &str =
    "the peaks do not rise with the batch size (flat: memory does not limit the batch here)";
/// Measurement noise allowed for, as a fraction of the peak.
const NOISE: f64 = 0.005;
/// Smallest error bar in bytes (allocator rounding, so a two-point fit does not claim ±0).
const MIN_ERROR_BYTES: f64 = 1024.0 * 1024.0;
/// The error assumed in every measured peak, as a fraction of the largest, for the error bar: the
/// data segment repeats to the byte on CPU (docs/benchmarks.md), NVML and the simulated device's
/// `noise` do not; what the residuals show counts when it is larger.
const MEASUREMENT_FLOOR: f64 = 0.002;

/// One fitting trial the line rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityPoint {
    pub batch: u64,
    pub peak_bytes: u64,
    /// Steps of the trial (the largest peak of the size, when it ran with several).
    pub steps: u32,
    /// Measured minus fitted peak.
    pub residual_bytes: f64,
}

/// Extra memory with gradient accumulation, measured by the split's confirmation trials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccumulationOffset {
    pub accumulation: u32,
    pub batch: u64,
    pub peak_bytes: u64,
    /// The peak above the line at this size (the accumulated gradients held beside the activations).
    pub extra_bytes: f64,
}

/// The plan's `capacity_model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityModel {
    /// Fitted fixed bytes (weights, optimizer state, runtime): the line at batch 0.
    pub fixed_bytes: f64,
    /// Fitted bytes per sample (accumulation 1).
    pub per_sample_bytes: f64,
    /// The sizes the line rests on, with their residuals.
    pub points: Vec<CapacityPoint>,
    /// The smallest and largest size of `points`: the range the line was measured on.
    pub range: [u64; 2],
    /// Largest |residual| of `points`.
    pub max_residual_bytes: f64,
    /// Standard error of the slope (bytes per sample), from the residuals (0 with two points).
    pub per_sample_error_bytes: f64,
    /// The largest fit below the range, which lies off the line (above it: a flat part, a knee;
    /// below it: a jump up into the range): no prediction below the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_below: Option<u64>,
    /// An out-of-memory at this size although the line says it fits under the probe's limit (a jump
    /// or late memory above the range): no prediction above the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jump_above: Option<u64>,
    /// Per accumulation > 1 measured (the split's confirmations), where it differs from the line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accumulation: Vec<AccumulationOffset>,
    /// Why the model predicts nothing at all (too few points, no slope), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
}

/// The noise assumed in each peak on the line `a + k·b` through `pts` (bytes): [`NOISE`] of the top
/// peak, unless the points' own scatter bounds it lower. With 3 or more points the residuals have
/// degrees of freedom, and a 95 % upper bound on their noise (σ ≤ s·√(ν/χ²₀.₀₅(ν))) that lies below
/// the a-priori NOISE is taken instead, never below [`MEASUREMENT_FLOOR`]. On CPU the data segment
/// repeats to the byte: the gpt's three sizes 4, 10 and 14 lie within 0.1 MB of their line, where
/// NOISE assumed 5 MB per point and so kept batch 1 (16 MB above the line: the flat part of the
/// optimizer step's peak, below a knee) in the fit, whose slope then missed 62 at 2 GiB by 2
/// samples. A noisy device's scatter is its own bound: the simulated 0.5 % noise keeps NOISE.
fn point_noise(pts: &[(u64, u64, u32)], a: f64, k: f64, top_peak: f64) -> f64 {
    let prior = NOISE * top_peak;
    let dof = pts.len().saturating_sub(2);
    if dof == 0 {
        return prior;
    }
    let ssr: f64 = pts
        .iter()
        .map(|&(b, p, _)| (p as f64 - (a + k * b as f64)).powi(2))
        .sum();
    let s = (ssr / dof as f64).sqrt();
    // √(ν / χ²₀.₀₅(ν)): ν = 1..5 from the table, Wilson–Hilferty beyond.
    let factor = match dof {
        1 => 15.95,
        2 => 4.42,
        3 => 2.92,
        4 => 2.37,
        5 => 2.09,
        n => {
            let n = n as f64;
            let c = 1.0 - 2.0 / (9.0 * n) - 1.645 * (2.0 / (9.0 * n)).sqrt();
            (1.0 / c.powi(3)).sqrt()
        }
    };
    (s * factor).clamp(MEASUREMENT_FLOOR * top_peak, prior)
}

/// One fitting size: its largest peak at accumulation 1 and the steps of that trial.
#[derive(Debug, Clone, Copy)]
struct Peak {
    batch: u64,
    bytes: u64,
    steps: u32,
}

/// The least-squares line through `peaks[from..]`: `(intercept, slope, slope standard error)`.
fn line_from(peaks: &[Peak], from: usize) -> Option<(f64, f64, f64)> {
    let pts: Vec<(f64, f64)> = peaks[from..]
        .iter()
        .map(|p| (p.batch as f64, p.bytes as f64))
        .collect();
    least_squares(&pts)
}

/// The largest peak of each size at accumulation 1 (confirmation-length trials see late memory).
fn peaks_by_batch(trials: &[TrialRecord]) -> Vec<Peak> {
    let mut peaks: Vec<Peak> = vec![];
    for t in trials
        .iter()
        .filter(|t| t.accumulation <= 1 && t.outcome.fits())
    {
        let Some(bytes) = t.outcome.peak_bytes().filter(|&p| p > 0) else {
            continue;
        };
        let new = Peak {
            batch: t.batch,
            bytes,
            steps: t.steps,
        };
        match peaks.iter_mut().find(|x| x.batch == t.batch) {
            Some(x) if bytes > x.bytes => *x = new,
            Some(_) => {}
            None => peaks.push(new),
        }
    }
    peaks
}

/// Memory that grows after the exploration steps (late memory: a size whose longer trial peaked
/// clearly above its shorter one, by more than two measurement floors or a MiB): the shorter trials'
/// peaks lie below the curve the answer was proven on, and a line through both kinds is neither
/// (5200 at 2 steps with 5731–5881 at 5 made a line 32 % too steep, fixed part −1.5 GB, and
/// predicted 22630 (21503–23757) where 27986 is the largest). Then only the longest trials make it;
/// the refusal when fewer than two sizes ran that long.
fn keep_longest_if_late(trials: &[TrialRecord], peaks: &mut Vec<Peak>) -> Result<(), String> {
    let longest = peaks.iter().map(|x| x.steps).max().unwrap_or(0);
    let late = trials
        .iter()
        .filter(|t| t.accumulation <= 1 && t.outcome.fits() && t.steps < longest)
        .filter_map(|t| Some((t.batch, t.outcome.peak_bytes()?)))
        .find_map(|(b, short)| {
            let long = peaks
                .iter()
                .find(|x| x.batch == b && x.steps == longest)?
                .bytes;
            let floor = (2.0 * MEASUREMENT_FLOOR * long as f64).max(MIN_ERROR_BYTES);
            (long as f64 - short as f64 > floor).then_some((b, long - short))
        });
    let Some((b, rise)) = late else {
        return Ok(());
    };
    peaks.retain(|x| x.steps == longest);
    if peaks.len() < 2 {
        return Err(format!(
            "memory grows after the exploration steps ({b} peaked {} higher with {longest} \
             steps), and only one size ran with {longest} steps: a line needs two",
            crate::platform::units::format_size(rise)
        ));
    }
    Ok(())
}

/// Where the affine part starts its descent: the largest size and the nearest smaller one whose peak
/// lies clearly ([`CLEAR_RISE`]) below it. Two sizes a few samples apart give a slope of measurement
/// noise (a sweep's seeded point, 12559 and 12621 under 1 % noise: 4.7 MB per sample where 6.3 MB
/// was true, and the next point's prior missed by a third), so when none does the model refuses.
fn first_pair(peaks: &[Peak]) -> Result<usize, String> {
    let n = peaks.len();
    let top = peaks[n - 1].bytes as f64;
    (0..n - 1)
        .rev()
        .find(|&j| top - peaks[j].bytes as f64 >= CLEAR_RISE * top)
        .ok_or_else(|| {
            let (lo, hi) = (peaks[0].batch, peaks[n - 1].batch);
            if hi >= 2 * lo {
                FLAT.into()
            } else {
                format!(
                    "the fits ({lo}–{hi}) lie within 2 % of one another's peak: their slope \
                     would be measurement noise"
                )
            }
        })
}

/// How far the point below `peaks[start..]` may miss their line `a + k·b` and still be on it: a
/// fraction of the span ([`OFF_LINE`]), [`NOISE`] of its peak, three times the line's own
/// uncertainty carried out to it (a short baseline extrapolates its noise far), three times the
/// scatter of the points already on it, and a MiB.
fn allowed_miss(peaks: &[Peak], start: usize, a: f64, k: f64) -> f64 {
    let on = &peaks[start..];
    let below = peaks[start - 1];
    let top_peak = peaks[peaks.len() - 1].bytes as f64;
    let top = peaks[peaks.len() - 1].batch as f64;
    let residual = |p: &Peak| p.bytes as f64 - (a + k * p.batch as f64);
    let scatter = (on.iter().map(|p| residual(p).powi(2)).sum::<f64>() / on.len() as f64).sqrt();
    let mean = on.iter().map(|p| p.batch as f64).sum::<f64>() / on.len() as f64;
    let sxx: f64 = on.iter().map(|p| (p.batch as f64 - mean).powi(2)).sum();
    let reach = (below.batch as f64 - mean).abs() / sxx.sqrt().max(1.0);
    let triples: Vec<(u64, u64, u32)> = on.iter().map(|p| (p.batch, p.bytes, p.steps)).collect();
    let noise = point_noise(&triples, a, k, top_peak);
    (OFF_LINE * k.abs() * top)
        .max(NOISE * below.bytes as f64)
        .max(3.0 * noise * reach)
        .max(3.0 * scatter)
        .max(MIN_ERROR_BYTES)
}

/// The affine part, grown from the first pair down while each next point lies on the line of the
/// points above it: `(start, (a, k, se), knee_below)`. A point above the line ends it as a knee
/// (a flat part below the range); a point below it means the points above sit on a jump, and the
/// line holds above it.
fn descend(peaks: &[Peak], mut start: usize) -> Option<(usize, (f64, f64, f64), Option<u64>)> {
    let mut line = line_from(peaks, start)?;
    while start > 0 {
        let (a, k, _) = line;
        let below = peaks[start - 1];
        let off = below.bytes as f64 - (a + k * below.batch as f64);
        if off.abs() > allowed_miss(peaks, start, a, k) {
            return Some((start, line, (off > 0.0).then_some(below.batch)));
        }
        start -= 1;
        if let Some(l) = line_from(peaks, start) {
            line = l;
        }
    }
    Some((start, line, None))
}

/// The slope's error, at least what a measurement floor on every peak would make of it (two points
/// have no residuals to tell the noise by).
fn slope_error(used: &[Peak], se: f64, top_peak: f64) -> f64 {
    let n = used.len() as f64;
    let mean = used.iter().map(|x| x.batch as f64).sum::<f64>() / n;
    let sxx: f64 = used.iter().map(|x| (x.batch as f64 - mean).powi(2)).sum();
    let floor = (MEASUREMENT_FLOOR * top_peak).max(MIN_ERROR_BYTES);
    se.max(floor / sxx.sqrt().max(1.0))
}

/// An out-of-memory above the range where the line says the size fits under the probe's limit (by
/// more than the residuals, and by more than 1 % of the limit: a miss that small is measurement noise
/// near the top, not a jump): the curve jumps (or grows late) between.
fn jump_above(trials: &[TrialRecord], model: &CapacityModel, limit_bytes: u64) -> Option<u64> {
    let slack = (2.0 * model.max_residual_bytes)
        .max(0.01 * limit_bytes as f64)
        .max(MIN_ERROR_BYTES);
    trials
        .iter()
        .filter(|t| t.accumulation <= 1 && t.outcome.is_bound() && t.batch > model.range[1])
        .map(|t| t.batch)
        .filter(|&b| model.peak_at(b as f64) + slack < limit_bytes as f64)
        .min()
}

/// Split confirmations with accumulation: their extra bytes over the line, the largest per
/// accumulation.
fn accumulation_offsets(trials: &[TrialRecord], model: &CapacityModel) -> Vec<AccumulationOffset> {
    let mut offsets: Vec<AccumulationOffset> = vec![];
    for t in trials
        .iter()
        .filter(|t| t.accumulation > 1 && t.outcome.fits())
    {
        let Some(p) = t.outcome.peak_bytes().filter(|&p| p > 0) else {
            continue;
        };
        let new = AccumulationOffset {
            accumulation: t.accumulation,
            batch: t.batch,
            peak_bytes: p,
            extra_bytes: p as f64 - model.peak_at(t.batch as f64),
        };
        match offsets
            .iter_mut()
            .find(|x| x.accumulation == t.accumulation)
        {
            Some(x) if new.extra_bytes > x.extra_bytes => *x = new,
            Some(_) => {}
            None => offsets.push(new),
        }
    }
    offsets.sort_by_key(|x| x.accumulation);
    offsets
}

impl CapacityModel {
    /// The model of a probe's trials under its `limit_bytes`. `None` when no trial fit with a
    /// measured peak (nothing to model); a model with a `refusal` when the fits do not make a line.
    pub fn fit(trials: &[TrialRecord], limit_bytes: u64) -> Option<CapacityModel> {
        let mut peaks = peaks_by_batch(trials);
        if peaks.is_empty() {
            return None;
        }
        if let Err(why) = keep_longest_if_late(trials, &mut peaks) {
            return Some(CapacityModel::refused(why));
        }
        peaks.sort_by_key(|x| x.batch);
        if peaks.len() < 2 {
            let why = format!("only one size fit ({}): a line needs two", peaks[0].batch);
            return Some(Self::unfitted(why, &peaks));
        }
        let start = match first_pair(&peaks) {
            Ok(start) => start,
            Err(why) => return Some(Self::unfitted(why, &peaks)),
        };
        let Some((start, (a, k, se), knee)) = descend(&peaks, start) else {
            return Some(Self::unfitted("the fits have no slope".into(), &peaks));
        };
        if k <= 0.0 || !k.is_finite() {
            return Some(Self::unfitted(FLAT.into(), &peaks));
        }
        let used = &peaks[start..];
        let points: Vec<CapacityPoint> = used
            .iter()
            .map(|p| CapacityPoint {
                batch: p.batch,
                peak_bytes: p.bytes,
                steps: p.steps,
                residual_bytes: p.bytes as f64 - (a + k * p.batch as f64),
            })
            .collect();
        let top_peak = peaks[peaks.len() - 1].bytes as f64;
        let mut model = CapacityModel {
            fixed_bytes: a,
            per_sample_bytes: k,
            max_residual_bytes: points
                .iter()
                .map(|p| p.residual_bytes.abs())
                .fold(0.0, f64::max),
            points,
            range: [used[0].batch, used[used.len() - 1].batch],
            per_sample_error_bytes: slope_error(used, se, top_peak),
            // a point below the range under the line is a jump up inside the measured sizes
            knee_below: knee.or((start > 0).then(|| peaks[start - 1].batch)),
            jump_above: None,
            accumulation: vec![],
            refusal: None,
        };
        model.jump_above = jump_above(trials, &model, limit_bytes);
        model.accumulation = accumulation_offsets(trials, &model);
        Some(model)
    }

    /// A model that refuses to make a line, for `why`, over the sizes that fit.
    fn unfitted(why: String, peaks: &[Peak]) -> CapacityModel {
        CapacityModel {
            points: peaks
                .iter()
                .map(|p| CapacityPoint {
                    batch: p.batch,
                    peak_bytes: p.bytes,
                    steps: p.steps,
                    residual_bytes: 0.0,
                })
                .collect(),
            range: [peaks[0].batch, peaks[peaks.len() - 1].batch],
            ..CapacityModel::refused(why)
        }
    }

    /// A model that predicts nothing, for `why` (no points).
    pub fn refused(why: String) -> CapacityModel {
        CapacityModel {
            fixed_bytes: 0.0,
            per_sample_bytes: 0.0,
            points: vec![],
            range: [0, 0],
            max_residual_bytes: 0.0,
            per_sample_error_bytes: 0.0,
            knee_below: None,
            jump_above: None,
            accumulation: vec![],
            refusal: Some(why),
        }
    }

    /// The line's peak at `batch` (accumulation 1).
    pub fn peak_at(&self, batch: f64) -> f64 {
        self.fixed_bytes + self.per_sample_bytes * batch
    }

    /// Extra bytes measured with gradient accumulation (the largest over the accumulations measured),
    /// if any split was confirmed with accumulation.
    pub fn accumulation_extra(&self) -> Option<f64> {
        self.accumulation
            .iter()
            .map(|x| x.extra_bytes.max(0.0))
            .reduce(f64::max)
    }

    /// The largest micro-batch under `limit_bytes` the line predicts (accumulation 1, or with the
    /// accumulation's extra bytes), with its error bar, or why the model cannot say.
    pub fn largest_under(&self, limit_bytes: u64, extra: f64) -> Result<Estimate, String> {
        if let Some(r) = &self.refusal {
            return Err(r.clone());
        }
        let k = self.per_sample_bytes;
        let free = limit_bytes as f64 - self.fixed_bytes - extra;
        let b = free / k;
        // Error in bytes at b: the residuals, and the slope's error over the distance from the
        // middle of the range.
        let mid = (self.range[0] + self.range[1]) as f64 / 2.0;
        let floor = (MEASUREMENT_FLOOR * self.peak_at(self.range[1] as f64)).max(MIN_ERROR_BYTES);
        let err_bytes = self.max_residual_bytes.max(floor)
            + 2.0 * self.per_sample_error_bytes * (b - mid).abs();
        let err = err_bytes / k;
        // Below the range with a bend measured under it, the crossing lies where nothing says the
        // line holds: the bend (a flat part above the line) may start anywhere between the point off
        // the line and the range, so even a crossing whose error bar reaches into the range is
        // refused (a knee at 4090 under a range from 4096 up; 4089 (4051–4126) was
        // predicted where nothing fits).
        if b < self.range[0] as f64 {
            if let Some(kb) = self.knee_below {
                return Err(format!(
                    "the line was measured from {} up; below it the curve bends (the fit at {kb} lies off \
                     the line: a knee or a jump), so sizes around {} cannot be predicted; probe there",
                    self.range[0],
                    b.max(0.0).floor()
                ));
            }
        }
        if let Some(j) = self.jump_above {
            if b - err > self.range[1] as f64 {
                return Err(format!(
                    "{j} ran out of memory although the line says it fits: the curve jumps between {} \
                     and {j}, so the line cannot be extended above {}; probe there",
                    self.range[1], self.range[1]
                ));
            }
        }
        // (rounded to a millionth first, so that an exact crossing is not lost to rounding)
        let floor = |x: f64| {
            let x = (x * 1e6).round() / 1e6;
            if x <= 0.0 {
                0
            } else {
                x.floor() as u64
            }
        };
        Ok(Estimate {
            micro_batch: floor(b),
            low: floor(b - err),
            high: floor(b + err),
            extrapolation: if b > self.range[1] as f64 {
                b / self.range[1] as f64
            } else if b < self.range[0] as f64 {
                // Below the range: as far, the other way (never "within it").
                self.range[0] as f64 / b.max(1.0)
            } else {
                1.0
            },
        })
    }
}

/// A predicted largest size and its error bar (floor of the line's crossing ± the error).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub micro_batch: u64,
    pub low: u64,
    pub high: u64,
    /// How far outside the measured range the crossing lies (1: within it): above it, the crossing
    /// over the largest measured size; below it, the smallest measured size over the crossing.
    pub extrapolation: f64,
}

/// The memory limit of a budget as the probe computes it: `(budget − reserve) × (1 − margin)`.
pub fn limit(budget: u64, reserve: u64, margin: f64) -> u64 {
    (budget.saturating_sub(reserve) as f64 * (1.0 - margin)) as u64
}

/// One capacity's prediction, as `batchfit predict` prints and writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub memory_bytes: u64,
    pub reserve_bytes: u64,
    pub margin: f64,
    pub limit_bytes: u64,
    /// Always `false`: a prediction, not a proof.
    pub proven: bool,
    /// The predicted largest micro-batch at accumulation 1 (absent when refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_micro_batch: Option<Estimate>,
    /// The plan's global batch split with the predicted size (absent without a prediction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// With accumulation > 1, the largest micro-batch the line predicts with the accumulation's extra
    /// memory (when the plan measured it) that the split used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_micro_batch_accumulating: Option<Estimate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Why there is no prediction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The sizes the probe allowed (predictions are capped to them) and, when the probe had a global
/// batch, what its split needs.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// `--max-batch` of the probe (larger sizes were never allowed).
    pub max_batch: u64,
    /// `--multiple-of` of the probe.
    pub multiple_of: u64,
    pub split: Option<SplitTarget>,
    /// The plan's guard band ([`crate::plan::Plan::guard_band`]): its trials ran under the limit
    /// less this share, and so does every prediction (the probe would set the same band).
    pub guard_band: Option<f64>,
    /// The plan's guard band in bytes ([`crate::plan::Plan::guard_band_bytes`]): when present, each
    /// prediction's limit is less these bytes (at most a quarter of it), as the probe would set it
    /// for that memory, instead of `guard_band`'s share.
    pub guard_band_bytes: Option<u64>,
    /// What the plan's own trials showed out of memory: the smallest size that ran out of memory at
    /// accumulation 1 and with accumulation, under `limit_bytes` (the plan's limit). Evidence: no
    /// prediction for a limit at most that one may reach it, and where the line said it fits, the
    /// line is that much short there.
    pub oom: Option<OomEvidence>,
}

/// The plan's out-of-memory evidence (see [`Target::oom`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OomEvidence {
    /// The plan's `limit_bytes`: the limit those trials ran under.
    pub limit_bytes: u64,
    /// The smallest size out of memory at accumulation 1.
    pub batch: Option<u64>,
    /// The smallest size out of memory with accumulation > 1.
    pub accumulating: Option<u64>,
}

impl OomEvidence {
    /// The evidence of `trials` run under `limit_bytes`.
    pub fn of(trials: &[TrialRecord], limit_bytes: u64) -> Option<OomEvidence> {
        // An out-of-memory is a bound unless a size at least as large fit with at least as many
        // steps (a measurement below the largest fit that ran out of memory: a dip in the curve,
        // not a limit above the answer).
        let smallest = |acc: bool| {
            let class = |t: &&TrialRecord| (t.accumulation > 1) == acc;
            trials
                .iter()
                .filter(class)
                .filter(|t| t.outcome.is_bound())
                .filter(|t| {
                    !trials
                        .iter()
                        .filter(class)
                        .any(|f| f.outcome.fits() && f.batch >= t.batch && f.steps >= t.steps)
                })
                .map(|t| t.batch)
                .min()
        };
        let e = OomEvidence {
            limit_bytes,
            batch: smallest(false),
            accumulating: smallest(true),
        };
        (e.batch.is_some() || e.accumulating.is_some()).then_some(e)
    }
}

/// The global batch to split with a predicted size.
#[derive(Debug, Clone, Copy)]
pub struct SplitTarget {
    pub global_batch: u64,
    pub world_size: u64,
    pub allow_uneven: bool,
}

impl Default for Target {
    /// batchfit's defaults: `--max-batch 1000000`, `--multiple-of 1`, no global batch.
    fn default() -> Self {
        Target {
            max_batch: 1_000_000,
            multiple_of: 1,
            split: None,
            guard_band: None,
            guard_band_bytes: None,
            oom: None,
        }
    }
}

/// The limit a probe would set for a budget of `memory` bytes: the plan's guard band under the
/// margin's limit.
fn guarded_limit(memory: u64, reserve: u64, margin: f64, target: &Target) -> u64 {
    let unguarded = limit(memory, reserve, margin);
    match (target.guard_band_bytes, target.guard_band) {
        (Some(b), _) => unguarded.saturating_sub(b.min(unguarded / 4)),
        (None, Some(g)) if g > 0.0 && g < 1.0 => (unguarded as f64 * (1.0 - g)) as u64,
        _ => unguarded,
    }
}

/// The line's estimates under one limit, held to the plan's evidence and caps.
struct Predictor<'a> {
    model: &'a CapacityModel,
    limit_bytes: u64,
    target: Target,
}

impl Predictor<'_> {
    /// `e` under the probe's `--max-batch` and `--multiple-of`.
    fn capped(&self, e: Estimate) -> Estimate {
        let m = self.target.multiple_of.max(1);
        let c = |x: u64| (x.min(self.target.max_batch) / m) * m;
        Estimate {
            micro_batch: c(e.micro_batch),
            low: c(e.low),
            high: c(e.high),
            ..e
        }
    }

    /// The line's estimate with `extra` bytes, held to the plan's out-of-memory evidence at `oom`
    /// (the smallest size that ran out of memory under the plan's limit): the line may say that size
    /// fits (a miss within what `fit` takes for noise near the top), but it did not.
    fn bounded(
        &self,
        extra: f64,
        oom: Option<u64>,
        notes: &mut Vec<String>,
    ) -> Result<Estimate, String> {
        let mut e = self.model.largest_under(self.limit_bytes, extra)?;
        let (Some(ev), Some(bo)) = (self.target.oom, oom) else {
            return Ok(self.capped(e));
        };
        // How far the line (with `extra`) is below the plan's limit at `bo`: it said `bo` fits.
        let short = ev.limit_bytes as f64 - self.model.peak_at(bo as f64) - extra;
        if self.limit_bytes > ev.limit_bytes && short > 0.0 {
            // The curve is at least `short` above the line at `bo` (a jump, or memory that grows
            // faster near the top): carried above it.
            let shifted = self.model.largest_under(self.limit_bytes, extra + short)?;
            if shifted.micro_batch < e.micro_batch {
                notes.push(format!(
                    "{bo} ran out of memory under the plan's limit although the line says it fits \
                     ({:.1} MiB short there): the prediction carries that shortfall above {bo}",
                    short / (1024.0 * 1024.0)
                ));
                e = shifted;
            }
        }
        if self.limit_bytes <= ev.limit_bytes && e.high >= bo {
            // Less memory than the plan's limit, under which `bo` already ran out of memory.
            let below = bo.saturating_sub(1);
            if e.micro_batch >= bo {
                notes.push(format!(
                    "{bo} ran out of memory under the plan's limit ({}), which is at least this one; \
                     the line says {} fits: capped below {bo}",
                    crate::platform::units::format_size(ev.limit_bytes),
                    e.micro_batch
                ));
            }
            // (the error bar moves down with the estimate, not into a point)
            let moved = e.micro_batch.saturating_sub(below);
            e.micro_batch = e.micro_batch.min(below);
            e.low = e.low.saturating_sub(moved).min(below);
            e.high = e.high.min(below);
        }
        Ok(self.capped(e))
    }

    /// What a reader of the estimate should know: no room, far extrapolation, the cap.
    fn notes(&self, est: &Estimate) -> Vec<String> {
        let (model, target) = (self.model, &self.target);
        let mut notes = vec![];
        if est.micro_batch == 0 {
            notes.push(format!(
                "the line's fixed part ({:.0} MiB) leaves no room for one sample under this limit",
                model.fixed_bytes / (1024.0 * 1024.0)
            ));
        }
        if est.extrapolation > 4.0 {
            notes.push(if est.micro_batch < model.range[0] {
                format!(
                    "extrapolated {:.0}× below the smallest measured size ({}): the error bar assumes \
                     memory stays affine that far down (no knee was measured there)",
                    est.extrapolation, model.range[0]
                )
            } else {
                format!(
                    "extrapolated {:.0}× beyond the largest measured size ({}): the error bar assumes \
                     memory stays affine that far",
                    est.extrapolation, model.range[1]
                )
            });
        }
        let m = target.multiple_of.max(1);
        if est.high >= target.max_batch / m * m {
            notes.push(format!(
                "capped at the probe's --max-batch {}",
                target.max_batch
            ));
        }
        notes
    }

    /// The split of the target's global batch for the estimate `est` (accumulation 1), into `p`.
    fn split(&self, t: SplitTarget, est: Estimate, p: &mut Prediction) {
        match accumulate::split(
            t.global_batch,
            t.world_size,
            est.micro_batch,
            t.allow_uneven,
        ) {
            // Accumulating holds more memory: the measured extra, if the plan has it.
            Ok(s) if s.accumulation > 1 => match self.model.accumulation_extra() {
                Some(extra) => self.split_with_measured_extra(t, extra, p),
                None => self.split_without_measured_extra(t, s, p),
            },
            Ok(s) => p.split = Some(s),
            Err(e) => p.notes.push(format!("no split: {e}")),
        }
    }

    /// The split from the line's estimate with the accumulation's measured extra bytes.
    fn split_with_measured_extra(&self, t: SplitTarget, extra: f64, p: &mut Prediction) {
        let oom = self
            .target
            .oom
            .and_then(|o| match (o.accumulating, o.batch) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            });
        let ea = match self.bounded(extra, oom, &mut p.notes) {
            Ok(ea) => ea,
            Err(why) => return p.notes.push(format!("no split with accumulation: {why}")),
        };
        p.max_micro_batch_accumulating = Some(ea);
        match accumulate::split(t.global_batch, t.world_size, ea.micro_batch, t.allow_uneven) {
            Ok(s) => {
                p.notes.extend(s.warning.clone());
                p.split = Some(s);
            }
            Err(e) => p.notes.push(format!("no split: {e}")),
        }
    }

    /// The split `s` when the plan measured no accumulation: kept below a size that ran out of
    /// memory with accumulation under the plan's limit (at least this one).
    fn split_without_measured_extra(&self, t: SplitTarget, s: Split, p: &mut Prediction) {
        p.notes.push(
            "accumulation > 1 and the plan measured no accumulation: the split \
             assumes accumulated gradients cost no memory beyond the line"
                .into(),
        );
        let failed = self
            .target
            .oom
            .filter(|o| self.limit_bytes <= o.limit_bytes)
            .and_then(|o| o.accumulating)
            .filter(|&a| s.micro_batch >= a);
        let Some(a) = failed else {
            p.notes.extend(s.warning.clone());
            p.split = Some(s);
            return;
        };
        match accumulate::split(t.global_batch, t.world_size, a - 1, t.allow_uneven) {
            Ok(s2) => {
                p.notes.push(format!(
                    "{a} ran out of memory with accumulation under the plan's \
                     limit: the split stays below it"
                ));
                p.notes.extend(s2.warning.clone());
                p.split = Some(s2);
            }
            Err(e) => p.notes.push(format!("no split: {e}")),
        }
    }
}

/// The prediction of `model` for a budget of `memory` bytes with `reserve` and `margin`.
pub fn predict(
    model: &CapacityModel,
    memory: u64,
    reserve: u64,
    margin: f64,
    target: Target,
) -> Prediction {
    // Under the plan's guard band, as the probe would set it for this budget.
    let limit_bytes = guarded_limit(memory, reserve, margin, &target);
    let mut p = Prediction {
        memory_bytes: memory,
        reserve_bytes: reserve,
        margin,
        limit_bytes,
        proven: false,
        max_micro_batch: None,
        split: None,
        max_micro_batch_accumulating: None,
        notes: vec![],
        refused: None,
    };
    let predictor = Predictor {
        model,
        limit_bytes,
        target,
    };
    let est = match predictor.bounded(0.0, target.oom.and_then(|o| o.batch), &mut p.notes) {
        Ok(e) => e,
        Err(why) => {
            p.notes.clear();
            p.refused = Some(why);
            return p;
        }
    };
    p.notes.extend(predictor.notes(&est));
    p.max_micro_batch = Some(est);
    if let Some(t) = target.split {
        predictor.split(t, est, &mut p);
    }
    p
}

/// What the points of a sweep measured so far predict about the next one (`--sweep`), for its
/// search to start near its answer: the fixed part of the nearest point (weights, optimizer state:
/// nearly the same at every point), and the per-sample part as a power of the parameter through the
/// two nearest points (`guess` as the power with one point: the parameter's usual power, which the
/// search tries first, [`Prior::try_first`]). `last_error`: how far (relative) the
/// same prediction missed the previous point's proven answer, when it was made from two points or
/// more; a small miss makes the prior confident (the search may then start with the predicted size
/// at once). Never evidence: the next point's answer is proven by its own trials.
pub fn sweep_prior(
    before: &[(u64, &CapacityModel)],
    next: u64,
    guess: f64,
    last_error: Option<f64>,
) -> Option<Prior> {
    let mut usable: Vec<(f64, f64, f64)> = before
        .iter()
        .filter(|(v, m)| *v > 0 && m.refusal.is_none() && m.per_sample_bytes > 0.0)
        .map(|(v, m)| (*v as f64, m.fixed_bytes, m.per_sample_bytes))
        .collect();
    if usable.is_empty() || next == 0 {
        return None;
    }
    let near = |v: f64, pts: &[(f64, f64, f64)]| {
        pts.iter()
            .min_by(|p, q| {
                (p.0.ln() - v.ln())
                    .abs()
                    .total_cmp(&(q.0.ln() - v.ln()).abs())
            })
            .copied()
    };
    // A point whose proof needed one fit, or fits too close together for a slope (the prior held:
    // its model refuses a line), still measured its per-sample bytes: its largest fit's peak less
    // the fixed part of the nearest point with a line.
    let single: Vec<(f64, f64, f64)> = before
        .iter()
        .filter(|(v, m)| *v > 0 && m.refusal.is_some() && !m.points.is_empty())
        .filter(|(_, m)| {
            let top = m.points.iter().map(|p| p.peak_bytes).max().unwrap_or(0) as f64;
            m.points
                .iter()
                .all(|p| (top - p.peak_bytes as f64) < CLEAR_RISE * top)
        })
        .filter_map(|(v, m)| {
            let pt = m.points.iter().max_by_key(|p| p.batch)?;
            let v = *v as f64;
            let (_, a, _) = near(v, &usable)?;
            let k = (pt.peak_bytes as f64 - a) / pt.batch as f64;
            (pt.batch > 0 && a >= 0.0 && k > 0.0 && k.is_finite()).then_some((v, a, k))
        })
        .collect();
    usable.extend(single);
    let x = (next as f64).ln();
    usable.sort_by(|p, q| (p.0.ln() - x).abs().total_cmp(&(q.0.ln() - x).abs()));
    let (v1, a1, k1) = usable[0];
    let one_point = usable.len() < 2 || (usable[0].0 / usable[1].0).ln().abs() <= 1e-9;
    let (power, per_sample_error, fixed_error) = match usable.get(1) {
        Some(&(v2, a2, k2)) if (v1 / v2).ln().abs() > 1e-9 => {
            let p = (k1 / k2).ln() / (v1 / v2).ln();
            // Extrapolating beyond the two points' span is less sure than between them.
            let reach = (x - v1.ln()).abs() / (v1 / v2).ln().abs();
            (
                p,
                0.05 + 0.1 * reach,
                0.02 + (a1 - a2).abs() / a1.abs().max(1.0),
            )
        }
        // One point: the parameter's usual power, which the per-sample bytes may exceed up to twice
        // over (attention: quadratic in the tokens; a ViT's: in its patches, the pixels squared):
        // the answer may be as small as (v1 / next)^guess of the guess's.
        _ => (
            guess,
            (1.0 - (v1 / next as f64).min(next as f64 / v1).powf(guess.abs())).max(0.5),
            0.05,
        ),
    };
    let k = k1 * (next as f64 / v1).powf(power);
    if !(k.is_finite() && k > 0.0) {
        return None;
    }
    let (mut fixed_error, mut per_sample_error) =
        (if a1 > 0.0 { fixed_error } else { 1.0 }, per_sample_error);
    if let Some(e) = last_error.filter(|e| e.is_finite() && usable.len() >= 2) {
        // The power law held at the last point: trust it about as far as it held there.
        let held = (2.0 * e).max(0.0005);
        per_sample_error = per_sample_error.min(held);
        fixed_error = fixed_error.min(held);
    }
    Some(Prior {
        fixed_bytes: a1.max(0.0),
        per_sample_bytes: k,
        fixed_error,
        per_sample_error,
        // One point: the parameter's usual power is a guess that holds exactly for the common
        // models (tokens for seq-len, pixels for image-size) and is off by up to the error otherwise.
        try_first: one_point,
    })
}

/// How far a prior's line missed a point's measured peaks, as a fraction of the point's answer:
/// for the fit nearest `answer`, |measured − predicted peak| / per-sample bytes / `answer`. (A
/// measure of the line, not of the answer, which the tolerance leaves loose by up to its gap.)
pub fn prior_miss(prior: &Prior, trials: &[TrialRecord], answer: u64) -> Option<f64> {
    if answer == 0 || prior.per_sample_bytes.is_nan() || prior.per_sample_bytes <= 0.0 {
        return None;
    }
    trials
        .iter()
        .filter(|t| t.accumulation <= 1 && t.outcome.fits())
        .filter_map(|t| t.outcome.peak_bytes().map(|p| (t.batch, p)))
        .min_by_key(|&(b, _)| b.abs_diff(answer))
        .map(|(b, p)| {
            let predicted = prior.fixed_bytes + prior.per_sample_bytes * b as f64;
            (p as f64 - predicted).abs() / prior.per_sample_bytes / answer as f64
        })
}

/// Why `batchfit predict` cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("--reserve ({reserve}) must be smaller than --memory {memory}")]
    ReserveTooLarge { reserve: String, memory: String },
    #[error("the plan has no trial that fit with a measured peak, so it has no capacity model")]
    NoModel,
}

/// What `batchfit predict` prints and writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictReport {
    /// The plan file as given.
    pub plan: String,
    pub model: String,
    pub device_kind: crate::device::DeviceKind,
    pub device_name: String,
    /// The plan's own budget and answer, for comparison.
    pub plan_budget_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_max_fitting_batch: Option<u64>,
    pub capacity_model: CapacityModel,
    pub predictions: Vec<Prediction>,
}

/// The predictions of `plan`'s capacity model for each of `memory` (each size as given and in
/// bytes), with `reserve` and `margin` (default: the plan's).
pub fn report(
    plan: &super::Plan,
    plan_path: &str,
    memory: &[(String, u64)],
    reserve: Option<u64>,
    margin: Option<f64>,
) -> Result<PredictReport, PredictError> {
    let margin = margin.unwrap_or(plan.margin);
    let reserve_bytes = reserve.unwrap_or(plan.reserve_bytes);
    if let Some((given, _)) = memory.iter().find(|(_, b)| reserve_bytes >= *b) {
        return Err(PredictError::ReserveTooLarge {
            reserve: crate::platform::units::format_size(reserve_bytes),
            memory: given.clone(),
        });
    }
    let sizes: Vec<u64> = memory.iter().map(|(_, b)| *b).collect();
    let model = match &plan.capacity_model {
        Some(m) => m.clone(),
        None => CapacityModel::fit(&plan.trials, plan.limit_bytes).ok_or(PredictError::NoModel)?,
    };
    // The split only when the probe was given a global batch (without one, its global batch is its
    // own answer, which another memory size would not keep).
    let target = Target {
        max_batch: plan.search.max_batch,
        multiple_of: plan.search.multiple_of,
        split: plan
            .recommendation
            .as_ref()
            .filter(|r| r.accumulation > 1 || r.global_batch != r.max_fitting_batch * r.world_size)
            .map(|r| SplitTarget {
                global_batch: r.global_batch,
                world_size: r.world_size,
                allow_uneven: r.uneven,
            }),
        guard_band: plan.guard_band,
        guard_band_bytes: plan.guard_band_bytes,
        oom: OomEvidence::of(&plan.trials, plan.limit_bytes),
    };
    let predictions = sizes
        .iter()
        .map(|&b| predict(&model, b, reserve_bytes, margin, target))
        .collect();
    Ok(PredictReport {
        plan: plan_path.into(),
        model: plan.model.name(),
        device_kind: plan.device.kind,
        device_name: plan.device.name.clone(),
        plan_budget_bytes: plan.budget_bytes,
        plan_max_fitting_batch: plan.recommendation.as_ref().map(|r| r.max_fitting_batch),
        capacity_model: model,
        predictions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    pub(super) fn trial(
        batch: u64,
        peak: Option<u64>,
        steps: u32,
        accumulation: u32,
    ) -> TrialRecord {
        TrialRecord::for_test(batch, peak, steps, accumulation)
    }

    #[test]
    fn affine_fits_exactly_and_predicts() {
        let peak = |b: u64| 1000 * MIB + 3 * MIB * b;
        let trials = vec![
            trial(1, Some(peak(1)), 3, 1),
            trial(16, Some(peak(16)), 3, 1),
            trial(300, Some(peak(300)), 5, 1),
            trial(302, None, 5, 1),
        ];
        let m = CapacityModel::fit(&trials, peak(300) + MIB).unwrap();
        assert!((m.fixed_bytes - (1000 * MIB) as f64).abs() < 1.0);
        assert!((m.per_sample_bytes - (3 * MIB) as f64).abs() < 1e-6);
        assert_eq!(m.range, [1, 300]);
        assert!(m.max_residual_bytes < 1.0);
        assert_eq!(m.knee_below, None);
        assert_eq!(m.jump_above, None);
        let e = m.largest_under(peak(1000), 0.0).unwrap();
        assert_eq!(e.micro_batch, 1000);
        // the error bar: a 0.2 % measurement floor on the peaks, carried 3.3× past the range
        // (989-1010 here): wider than the residuals (0), narrower than the 3 % target
        assert!(e.low <= 1000 && e.high >= 1000, "{e:?}");
        assert!(e.low < 1000 && e.high - e.low <= 30, "{e:?}");
    }

    #[test]
    fn a_flat_part_is_left_out_and_refused_below() {
        // Flat at 2 GiB + 256 MiB up to 256 samples, then 1 MiB per sample.
        let peak = |b: u64| 2048 * MIB + MIB * b.max(256);
        let trials: Vec<_> = [1, 2, 32, 300, 400, 500]
            .iter()
            .map(|&b| trial(b, Some(peak(b)), 3, 1))
            .collect();
        let m = CapacityModel::fit(&trials, peak(500)).unwrap();
        assert_eq!(m.range, [300, 500]);
        assert_eq!(m.knee_below, Some(32));
        assert!((m.per_sample_bytes - MIB as f64).abs() < 1e-6);
        // Above the range: predicted; below it: refused.
        assert_eq!(m.largest_under(peak(4000), 0.0).unwrap().micro_batch, 4000);
        assert!(m.largest_under(peak(256) + 24 * MIB, 0.0).is_err());
        // Just under the range, the error bar reaching into it: the curve between 32 and 300 is
        // unmeasured, and a flat part up to 299.5 would leave nothing fitting.
        let e = m.largest_under(peak(300), 0.0).unwrap();
        assert_eq!(e.micro_batch, 300, "{e:?}");
        let r = m.largest_under(peak(299), 0.0);
        assert!(r.is_err(), "{r:?}");
    }

    /// Late memory (`--sim …,late=44220`, 2 exploration steps, 5 confirmation steps):
    /// the line through a 2-step peak and 5-step peaks was 32 % too steep and predicted far below
    /// the truth, outside its error bar. With a size measured at both lengths showing the growth,
    /// only the 5-step peaks make the line.
    #[test]
    fn late_memory_keeps_the_short_trials_off_the_line() {
        let (per, late, base) = (1_021_205u64, 44_220u64, 420 * MIB);
        let peak = |b: u64, steps: u32| base + per * b + if steps > 3 { late * b } else { 0 };
        let mut trials: Vec<_> = [(100, 2), (1600, 2), (4000, 2), (5200, 2), (5731, 2)]
            .iter()
            .map(|&(b, s)| trial(b, Some(peak(b, s)), s, 1))
            .collect();
        for b in [5731, 5846, 5881] {
            trials.push(trial(b, Some(peak(b, 5)), 5, 1));
        }
        let limit = peak(5881, 5) + MIB;
        let m = CapacityModel::fit(&trials, limit).unwrap();
        // (a late growth under 1 % of the peak counts too: 8704 at 2 and 5 steps, 0.99 % apart on
        // a 36 GB peak, left a line 4 % off and 21774 outside 20995–21664 at 90 GB)
        let (per2, late2, base2) = (3_751_302u64, 40_860u64, 3_092_238_061u64);
        let peak2 =
            |b: u64, steps: u32| base2 + per2 * b.max(4875) + if steps > 3 { late2 * b } else { 0 };
        let t2: Vec<_> = [
            (1, 2),
            (4096, 2),
            (7168, 2),
            (8704, 2),
            (8704, 5),
            (9438, 5),
        ]
        .iter()
        .map(|&(b, s)| trial(b, Some(peak2(b, s)), s, 1))
        .collect();
        let m2 = CapacityModel::fit(&t2, 39_202_097_345).unwrap();
        let truth2 = (85_666_519_017 - base2) / (per2 + late2);
        let e2 = m2.largest_under(85_666_519_017, 0.0).unwrap();
        assert!(
            e2.low <= truth2 && truth2 <= e2.high,
            "{e2:?} truth {truth2}"
        );
        assert!(m.points.iter().all(|p| p.steps == 5), "{:?}", m.points);
        assert!(((m.per_sample_bytes - (per + late) as f64) / (per + late) as f64).abs() < 1e-6);
        let big = 30 << 30;
        let truth = (big - base) / (per + late);
        let e = m.largest_under(big, 0.0).unwrap();
        assert!(e.low <= truth && truth <= e.high, "{e:?} truth {truth}");
        // Only one size at 5 steps: refused, not a line through the 2-step peaks.
        let one: Vec<_> = trials[..5]
            .iter()
            .cloned()
            .chain([trial(5731, Some(peak(5731, 5)), 5, 1)])
            .collect();
        let m = CapacityModel::fit(&one, limit).unwrap();
        assert!(
            m.refusal
                .as_deref()
                .is_some_and(|r| r.contains("grows after")),
            "{m:?}"
        );
    }

    #[test]
    fn a_point_just_above_a_tight_line_is_a_knee() {
        // The real gpt (vocab 8192, seq 128) under 1 GiB on CPU: 4, 10 and 14 lie within
        // 0.1 MB of their line, batch 1 sits 16 MB above it (the optimizer step's peak, flat below a
        // knee). Kept in the fit (the a-priori 0.5 % noise allowed 17.7 MB out there), it tilted the
        // slope and 2 GiB was predicted at 64 where 62 was proven; its own scatter bounds the
        // noise, so 1 is left out and the line predicts 62 (and 38 at 1.5 GiB, proven 38).
        let pts = [
            (1, 745_799_680),
            (4, 793_759_744),
            (10, 922_103_808),
            (14, 1_007_325_184),
        ];
        let trials: Vec<_> = pts
            .iter()
            .map(|&(b, p)| trial(b, Some(p), if b == 14 { 5 } else { 2 }, 1))
            .collect();
        let m = CapacityModel::fit(&trials, 1_019_006_156).unwrap();
        assert_eq!(m.range, [4, 14], "{m:?}");
        assert_eq!(m.knee_below, Some(1));
        assert_eq!(m.largest_under(2_039_060_889, 0.0).unwrap().micro_batch, 62);
        assert_eq!(m.largest_under(1_529_033_523, 0.0).unwrap().micro_batch, 38);

        // The same sizes with the same 16 MB above the line at 1, but scattered by ±0.5 % of the
        // peak (the simulated device's noise): the scatter does not bound the noise below the
        // a-priori 0.5 %, and 1 stays on the line.
        let noisy: Vec<_> = [
            (1, 745_799_680),
            (4, 797_000_000),
            (10, 917_500_000),
            (14, 1_009_000_000),
        ]
        .iter()
        .map(|&(b, p)| trial(b, Some(p), 2, 1))
        .collect();
        let m = CapacityModel::fit(&noisy, 1_019_006_156).unwrap();
        assert_eq!(m.range, [1, 14], "{m:?}");
    }

    #[test]
    fn an_unexpected_out_of_memory_refuses_extrapolation() {
        // On the line up to 1999, then 8 GiB more: 2000 ran out of memory although the line fits it.
        let peak = |b: u64| 2048 * MIB + 7 * MIB * b;
        let trials = vec![
            trial(16, Some(peak(16)), 3, 1),
            trial(1500, Some(peak(1500)), 3, 1),
            trial(1999, Some(peak(1999)), 5, 1),
            trial(2000, None, 5, 1),
        ];
        let m = CapacityModel::fit(&trials, peak(2900)).unwrap();
        assert_eq!(m.jump_above, Some(2000));
        assert!(m.largest_under(peak(4000), 0.0).is_err());
        // Inside the range it still predicts.
        assert_eq!(m.largest_under(peak(1000), 0.0).unwrap().micro_batch, 1000);
    }

    #[test]
    fn one_point_or_no_slope_is_refused() {
        let m =
            CapacityModel::fit(&[trial(1, Some(MIB), 3, 1), trial(2, None, 3, 1)], MIB).unwrap();
        assert!(m.refusal.is_some());
        assert!(predict(&m, 1 << 30, 0, 0.05, Target::default())
            .refused
            .is_some());
        assert!(CapacityModel::fit(&[trial(5, None, 3, 1)], MIB).is_none());
    }

    #[test]
    fn accumulation_extra_enters_the_split() {
        let peak = |b: u64| 1000 * MIB + MIB * b;
        let trials = vec![
            trial(10, Some(peak(10)), 3, 1),
            trial(500, Some(peak(500)), 5, 1),
            trial(250, Some(peak(250) + 100 * MIB), 5, 4),
        ];
        let m = CapacityModel::fit(&trials, peak(500)).unwrap();
        assert_eq!(m.accumulation.len(), 1);
        assert!((m.accumulation_extra().unwrap() - (100 * MIB) as f64).abs() < 1.0);
        let t = Target {
            split: Some(SplitTarget {
                global_batch: 4000,
                world_size: 1,
                allow_uneven: false,
            }),
            ..Target::default()
        };
        // 2000 MiB budget, no margin: 1000 samples alone, 900 while accumulating → 4000 = 4 × 1000
        // would not fit; 5 × 800 does.
        let p = predict(&m, 2000 * MIB, 0, 0.0, t);
        assert_eq!(p.max_micro_batch.unwrap().micro_batch, 1000);
        assert_eq!(p.max_micro_batch_accumulating.unwrap().micro_batch, 900);
        let s = p.split.unwrap();
        assert_eq!((s.micro_batch, s.accumulation), (800, 5));
        assert!(!p.proven);
    }

    #[test]
    fn an_out_of_memory_below_a_fit_is_no_bound() {
        // A measurement below the largest fit that ran out of memory (a dip in the curve at 512,
        // with 1301 proven) is no bound: taken as the smallest out-of-memory, it would make
        // `predict` answer 511 at the plan's own memory. A bound needs no fit at or above it with
        // as many steps; a 5-step failure at a size that fit only with 3 steps still is one.
        let trials = vec![
            trial(1, Some(GIB), 3, 1),
            trial(1024, Some(2 * GIB), 3, 1),
            trial(512, None, 3, 1),
            trial(1301, Some(3 * GIB), 5, 1),
            trial(1310, None, 5, 1),
        ];
        assert_eq!(OomEvidence::of(&trials, 4 * GIB).unwrap().batch, Some(1310));
        let late = vec![trial(1000, Some(GIB), 3, 1), trial(1000, None, 5, 1)];
        assert_eq!(OomEvidence::of(&late, 4 * GIB).unwrap().batch, Some(1000));
        let only_below = vec![trial(100, None, 3, 1), trial(200, Some(GIB), 3, 1)];
        assert!(OomEvidence::of(&only_below, 4 * GIB).is_none());
    }

    #[test]
    fn an_out_of_memory_the_line_missed_bounds_the_prediction() {
        // On the line up to 9949, 2 GiB more from 9950 (sim jump=9950:2GiB): 9951 ran out of memory
        // only ~50 samples below where the line crosses the limit, a miss `fit` takes for noise
        // near the top (no jump_above), so the line alone predicted 10000 (9963-10037) for the very
        // limit under which 9951 ran out of memory.
        let per = 2_395_582u64;
        let peak = |b: u64| 500 * MIB + per * b + if b >= 9950 { 2048 * MIB } else { 0 };
        let limit = 24_481_313_587u64;
        let trials = vec![
            trial(1, Some(peak(1)), 3, 1),
            trial(46, Some(peak(46)), 3, 1),
            trial(10000, None, 5, 1),
            trial(5023, Some(peak(5023)), 5, 1),
            trial(9951, None, 5, 1),
            trial(9913, Some(peak(9913)), 5, 1),
        ];
        let m = CapacityModel::fit(&trials, limit).unwrap();
        assert_eq!(m.jump_above, None);
        let t = Target {
            oom: OomEvidence::of(&trials, limit),
            ..Target::default()
        };
        // The plan's own memory (24 GiB, margin 0.05): below 9951, error bar included.
        let p = predict(&m, 24 << 30, 0, 0.05, t);
        assert_eq!(p.limit_bytes, limit);
        let e = p.max_micro_batch.unwrap();
        assert!(e.micro_batch < 9951 && e.high < 9951, "{e:?}");
        // the error bar moved down with it, not into a point; and the notes read as sentences
        assert!(e.low + 30 < e.micro_batch, "{e:?}");
        assert!(p.notes.iter().all(|n| !n.contains("  ")), "{:?}", p.notes);
        assert!(
            p.notes.iter().any(|n| n.contains("9951 ran out of memory")),
            "{p:?}"
        );
        // Less memory: below the jump, the line holds.
        let small = predict(&m, 12 << 30, 0, 0.05, t).max_micro_batch.unwrap();
        assert_eq!(
            small.micro_batch,
            (((12u64 << 30) as f64 * 0.95 - (500 * MIB) as f64) / per as f64) as u64
        );
        // More memory: at least the shortfall at 9951 is carried above it.
        let big = predict(&m, 80 << 30, 0, 0.05, t).max_micro_batch.unwrap();
        let line = (((80u64 << 30) as f64 * 0.95 - (500 * MIB) as f64) / per as f64) as u64;
        assert!(big.micro_batch + 45 <= line, "{big:?} vs the line's {line}");
    }

    #[test]
    fn predictions_keep_the_plan_guard_band() {
        let peak = |b: u64| 1000 * MIB + MIB * b;
        let trials = vec![
            trial(10, Some(peak(10)), 3, 1),
            trial(500, Some(peak(500)), 5, 1),
        ];
        let m = CapacityModel::fit(&trials, peak(500)).unwrap();
        let t = Target {
            guard_band: Some(0.02),
            ..Target::default()
        };
        let p = predict(&m, 2000 * MIB, 0, 0.0, t);
        assert_eq!(p.limit_bytes, (2000.0 * MIB as f64 * 0.98) as u64);
        // (2000 × 0.98 − 1000) MiB at 1 MiB a sample
        assert_eq!(p.max_micro_batch.unwrap().micro_batch, 960);
        // A band in bytes is the same bytes off every limit, at most a quarter of it (as a share of
        // the limit it would scale with it: the 16 MiB of a 470 MiB limit, as a share, made a
        // 128 MiB limit's prediction 12 % high).
        let t = Target {
            guard_band: Some((16.0 * MIB as f64) / (470.0 * MIB as f64)),
            guard_band_bytes: Some(16 * MIB),
            ..Target::default()
        };
        let p = predict(&m, 2000 * MIB, 0, 0.0, t);
        assert_eq!(p.limit_bytes, 1984 * MIB);
        assert_eq!(p.max_micro_batch.unwrap().micro_batch, 984);
        let p = predict(&m, 40 * MIB, 0, 0.0, t);
        assert_eq!(p.limit_bytes, 30 * MIB, "the quarter cap");
    }

    #[test]
    fn a_crossing_below_the_range_is_an_extrapolation() {
        // Measured from 6000 up (--min-batch 6000); 2 GiB gives ~632: not "within the range".
        let per = 2_395_582u64;
        let peak = |b: u64| 500 * MIB + per * b;
        let trials = vec![
            trial(6000, Some(peak(6000)), 3, 1),
            trial(8250, Some(peak(8250)), 3, 1),
            trial(10000, Some(peak(10000)), 5, 1),
        ];
        let m = CapacityModel::fit(&trials, peak(10000)).unwrap();
        let p = predict(&m, 2 << 30, 0, 0.05, Target::default());
        let e = p.max_micro_batch.unwrap();
        assert_eq!(e.micro_batch, 632);
        assert!((e.extrapolation - 6000.0 / 632.9).abs() < 0.05, "{e:?}");
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("below the smallest measured size (6000)")),
            "{p:?}"
        );
        // Within the range: 1.
        let inside = m.largest_under(peak(7000), 0.0).unwrap();
        assert_eq!(inside.extrapolation, 1.0);
    }
}

#[cfg(test)]
mod sweep_tests {
    use super::*;
    use crate::device::sim::{SimBackend, SimSpec};
    use crate::search::{Prober, SearchConfig};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A point's search with `prior` (trials, answer) and its truth, and the trials without a prior.
    fn point(spec: &SimSpec, prior: Option<Prior>) -> (Vec<TrialRecord>, u64, u64, usize) {
        let limit = spec.capacity / 20 * 19;
        let truth = spec.true_max(limit, 5, 1_000_000);
        let cfg = SearchConfig {
            prior,
            ..SearchConfig::default()
        };
        let out = Prober::new(&mut SimBackend::new(spec.clone()), cfg, limit).search();
        let alone = Prober::new(
            &mut SimBackend::new(spec.clone()),
            SearchConfig::default(),
            limit,
        )
        .search();
        (
            out.trials,
            out.max_fitting.unwrap_or(0),
            truth,
            alone.trials.len(),
        )
    }

    #[test]
    fn fits_too_close_for_a_slope_refuse_and_still_seed_the_next_point() {
        // A sweep's point (sim, 1 % noise, seq-len 256 → 512 → 1024) proven by two fits 62 apart
        // (12559, 12621): a line through them says 4.7 MB per sample where 6 MB is true, which
        // would make the 1024 point's prior predict 8318 for a truth of 6315 (16 trials). Such fits
        // refuse a line, and the next prior takes the largest one's peak less the nearest line's
        // fixed part, as for a single fit.
        let trial = |b: u64, p: u64| super::tests::trial(b, Some(p), 5, 1);
        let limit = 76 * GIB;
        let exact = |per: u64, b: u64| 2 * GIB + per * b;
        let t0: Vec<_> = [1, 38, 20820, 25248]
            .iter()
            .map(|&b| trial(b, exact(3 * MIB, b)))
            .collect();
        let m0 = CapacityModel::fit(&t0, limit).unwrap();
        assert!(m0.refusal.is_none());
        // 1 % noise, up on the smaller size and down on the larger: a slope far too small
        let noisy = |b: u64, f: f64| (exact(6 * MIB, b) as f64 * f) as u64;
        let t1 = vec![
            trial(12559, noisy(12559, 1.004)),
            trial(12621, noisy(12621, 0.998)),
        ];
        let m1 = CapacityModel::fit(&t1, limit).unwrap();
        let why = m1.refusal.as_deref().unwrap_or("");
        assert!(why.contains("within 2 %"), "{m1:?}");
        let prior = sweep_prior(&[(256, &m0), (512, &m1)], 1024, 1.0, None).unwrap();
        let (b, _) = prior.predict(limit).unwrap();
        let truth = ((limit - 2 * GIB) / (12 * MIB)) as f64;
        assert!(
            (b / truth - 1.0).abs() < 0.02,
            "{b} against {truth}: {prior:?}"
        );
    }

    /// Per-sample bytes `per0 · (v / v0)^exponent` over a fixed part.
    fn family(base: u64, per0: u64, cap: u64, v0: u64, v: u64, exponent: f64) -> SimSpec {
        let per = (per0 as f64 * (v as f64 / v0 as f64).powf(exponent)).round() as u64;
        SimSpec::affine(base, per, cap)
    }

    #[test]
    fn the_second_point_tries_the_usual_power_first() {
        // seq-len 256 → 512 with per-sample bytes linear in the tokens (the usual power): the second
        // point's proof is its first two trials, a fit just under the prediction and the
        // out-of-memory a gap above (was 3: half the prediction first, ±50 %). Same for image-size
        // 128 → 256 with bytes in the pixels (power 2), and for an exact proof (a small answer:
        // 29.3 predicted, where a fit at 28 was tried first, half a gap under the prediction).
        for (guess, v0, v1, base, per0, cap) in [
            (1.0, 256, 512, 2 * GIB, 3 * MIB, 80 * GIB),
            (2.0, 128, 256, 6 * GIB, MIB, 40 * GIB),
            (1.0, 32, 64, 680 * MIB, 5 * MIB, GIB),
        ] {
            let s0 = family(base, per0, cap, v0, v0, guess);
            let limit = s0.capacity / 20 * 19;
            let (t0, _, _, _) = point(&s0, None);
            let m0 = CapacityModel::fit(&t0, limit).unwrap();
            let prior = sweep_prior(&[(v0, &m0)], v1, guess, None).unwrap();
            assert!(prior.try_first);
            let s1 = family(base, per0, cap, v0, v1, guess);
            let (t1, b1, truth, alone) = point(&s1, Some(prior));
            assert!(b1 <= truth && b1 + crate::search::tolerance_gap(b1, 0.005, 1) > truth);
            assert_eq!(t1.len(), 2, "{t1:?}");
            assert!(alone > 2);
            // the third point: the second's single fit measured its per-sample bytes, and the
            // prediction held there, so the prior through both is confident
            let m1 = CapacityModel::fit(&t1, limit).unwrap();
            assert!(m1.refusal.is_some(), "one size fit");
            let miss = prior_miss(
                &sweep_prior(&[(v0, &m0)], v1, guess, None).unwrap(),
                &t1,
                b1,
            );
            let p2 = sweep_prior(&[(v0, &m0), (v1, &m1)], 2 * v1, guess, miss).unwrap();
            assert!(!p2.try_first, "two points");
            assert!(p2.per_sample_error < 0.01, "{p2:?}");
        }
    }

    #[test]
    fn a_noisy_second_point_costs_less_than_no_prior_over_many_draws() {
        // The bench's noisy family (0.5 % peak noise, power 1.2, seq-len 256 → 512): the guess
        // misses, the retry at half fits, and the prior's line through it predicts the candidate.
        // One draw of the noise decides whether that candidate fits (4 trials) or the line is
        // re-fitted (6), so this holds over many draws, not one: fewer trials in all than without
        // a prior (measured over 200 draws: 992 against 1149 with 2 exploration steps, 975 against
        // 1155 with 3), never more than 6 for one point, and never above the truth.
        let (mut with, mut alone_total) = (0, 0);
        for k in 0..100u64 {
            let spec = |v: u64| {
                let mut s = family(2 * GIB, 3 * MIB, 80 * GIB, 256, v, 1.2);
                s.noise = 0.005;
                s.seed = v + 1000 * k;
                s
            };
            let s0 = spec(256);
            let limit = s0.capacity / 20 * 19;
            let (t0, _, _, _) = point(&s0, None);
            let m0 = CapacityModel::fit(&t0, limit).unwrap();
            let prior = sweep_prior(&[(256, &m0)], 512, 1.0, None).unwrap();
            let (t1, b1, truth, alone) = point(&spec(512), Some(prior));
            let seq: Vec<_> = t1.iter().map(|t| (t.batch, t.outcome.fits())).collect();
            assert!(b1 <= truth, "draw {k}: {b1} above the truth {truth}");
            assert!(t1.len() <= 6, "draw {k}: {seq:?} against {alone} alone");
            with += t1.len();
            alone_total += alone;
        }
        assert!(
            with * 100 <= alone_total * 90,
            "{with} trials with the prior against {alone_total} without"
        );
    }

    #[test]
    fn a_wrong_usual_power_costs_no_more_than_no_prior() {
        // The guess (power 1 for seq-len) tried first, against per-sample bytes that grow with other
        // powers, one step of ×2 or ×4: never above the truth; never more trials than the point
        // alone within the band the prior states (up to twice the usual power), at most one more
        // beyond it (power 2.5 at ×2: the first try and the retry at half both run out of memory).
        for exponent in [0.7, 0.9, 1.0, 1.1, 1.3, 1.5, 2.0, 2.5] {
            for ratio in [2u64, 4] {
                for (base, per0, cap) in [
                    (2 * GIB, 3 * MIB, 80 * GIB),
                    (30 * GIB, 20 * MIB, 80 * GIB),
                    (500 * MIB, 64 * 1024, 8 * GIB),
                ] {
                    let (v0, v1) = (256, 256 * ratio);
                    let s0 = family(base, per0, cap, v0, v0, exponent);
                    let limit = s0.capacity / 20 * 19;
                    let (t0, _, _, _) = point(&s0, None);
                    let m0 = CapacityModel::fit(&t0, limit).unwrap();
                    let prior = sweep_prior(&[(v0, &m0)], v1, 1.0, None).unwrap();
                    let s1 = family(base, per0, cap, v0, v1, exponent);
                    let (t1, b1, truth, alone) = point(&s1, Some(prior));
                    let seq: Vec<_> = t1
                        .iter()
                        .map(|t| (t.batch, t.outcome.fits(), t.steps, t.purpose))
                        .collect();
                    assert!(b1 <= truth, "^{exponent} ×{ratio}: {b1} > {truth}");
                    let allowed = if exponent <= 2.0 { alone } else { alone + 1 };
                    assert!(
                        t1.len() <= allowed,
                        "^{exponent} ×{ratio} base {base}: {seq:?} against {alone} alone"
                    );
                }
            }
        }
    }
}
