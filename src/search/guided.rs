//! Model-guided search: predict the largest fitting size from measured peaks, then prove it.
//!
//! Memory per trial is, to first order, `max(c, a + k·b)`: flat below a knee (allocator granularity,
//! fixed buffers), affine above, sometimes with jumps (algorithm switches). Two measured peaks in the affine
//! part predict where the line crosses the limit; the remaining trials only prove it (a fit at b, an oom
//! at the next size). Failed trials report no peak, so a miss above the answer teaches only the bracket:
//! the strategy is built to miss high rarely, and to bisect rather than walk when it does.
//!
//! * **Second size.** With one point (b₁, p₁) and `a ≥ 0`, `b₁·limit/p₁` surely fits (absent jumps): that
//!   size when it is at least ×16, else ×16, or ×2 when the headroom is under 25 % of p₁ (a large model
//!   whose answer is small, where ×16 would overshoot).
//! * **Line.** Anchored at the largest fit; slope from the *nearest* smaller fit whose peak is at least
//!   [`MIN_RISE`] (2 %) lower: near, so a point in the flat part below a knee is not used once a point above
//!   it exists (a slope through a flat point is too small and the prediction too large); 2 % apart, so
//!   0.5–1 % noise cannot dominate the slope. No such point: grow (×16) or bisect (geometrically over wide
//!   brackets).
//! * **Exactness** is checked, not assumed: the newest point is compared with the line fitted without it.
//!   On an exact line the prediction is proposed as is, and the next size up is the proof: five trials in
//!   all on an affine curve (1, the second size, the answer, the size above, the confirmation).
//! * **Uncertainty.** Otherwise the expected error of a prediction is the larger of the errors seen
//!   (scaled to the new extrapolation distance), 1 % noise in the anchor's peak, and 1 % noise in the two
//!   slope peaks over that distance. It sets the first step of galloping when the line points outside the
//!   bracket (up from the last fit, or down from the smallest oom, doubling while it keeps missing, capped
//!   at half the bracket), and a noisy prediction inside a bracket is kept min(error, ⅛ bracket) from its
//!   ends so every trial shrinks it.
//! * **Overshoot of unknown size.** When the line said a failing size fits and the miss cannot be noise (the
//!   line had been exact: a jump; or its slope may come from a flat point: a knee), the next size is the
//!   bracket's midpoint, never a step of one below the failure (that walk cost 10 ooms in a row on knee and
//!   cliff curves).
//!
//! The engine ([`super::Prober`]) decides when the proof is complete and confirms the answer; this
//! strategy never reports anything, and only proposes sizes strictly inside the open bracket.

use super::{upper_bound, SearchState, Strategy};

/// Smallest rise of the top peak over another point, as a fraction of the top peak, for the pair to set
/// a slope: below it, measurement noise of ~0.5–1 % would dominate the slope (and in a flat region there
/// is no rise at all).
pub const MIN_RISE: f64 = 0.02;
/// Reported-peak noise assumed before any prediction was checked (fraction of the peak).
const NOISE: f64 = 0.01;
/// A prediction whose observed error is below this many sizes counts as exact.
const EXACT: f64 = 0.5;

#[derive(Default)]
pub struct Guided {
    up_run: u32,
    down_run: u32,
}

/// A line `peak = a + k·b` through measured points.
#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub a: f64,
    pub k: f64,
}

impl Line {
    /// Largest real b with `a + k·b ≤ limit`.
    pub fn crossing(&self, limit: u64) -> f64 {
        (limit as f64 - self.a) / self.k
    }
    pub fn at(&self, b: f64) -> f64 {
        self.a + self.k * b
    }
}

/// Fits the line from (batch, peak) points of fitting trials, sorted by batch with distinct batches.
/// Anchored at the largest batch; slope from the *nearest* smaller batch whose peak is at least
/// [`MIN_RISE`] below (near, so a point in the flat part below a knee is not used when a point above
/// the knee exists; far enough in peak that noise does not dominate). `None` when no point qualifies.
pub fn fit_line(points: &[(u64, u64)]) -> Option<(Line, (u64, u64))> {
    let &(bt, pt) = points.last()?;
    let &(bs, ps) = points
        .iter()
        .rev()
        .skip(1)
        .find(|p| p.1 < pt && (pt - p.1) as f64 >= MIN_RISE * pt as f64)?;
    let k = (pt - ps) as f64 / (bt - bs) as f64;
    Some((
        Line {
            a: pt as f64 - k * bt as f64,
            k,
        },
        (bs, ps),
    ))
}

/// How well the line predicted the newest points: for each of the last two points (when enough points lie
/// below it), the error in samples of the line fitted without it, and the distance it extrapolated over.
pub fn checks(points: &[(u64, u64)]) -> Vec<(f64, f64)> {
    let n = points.len();
    (n.saturating_sub(2).max(2)..n)
        .filter_map(|j| {
            let (line, _) = fit_line(&points[..j]).filter(|l| l.0.k > 0.0)?;
            let (b, p) = points[j];
            Some((
                (p as f64 - line.at(b as f64)).abs() / line.k,
                (b - points[j - 1].0) as f64,
            ))
        })
        .collect()
}

impl Strategy for Guided {
    fn propose(&mut self, st: &SearchState) -> u64 {
        let g = st.grid;
        let upper = upper_bound(st.hi, st.ceiling);
        let Some(l) = st.lo else {
            return match upper {
                None => 0,
                Some(u) => u / 2,
            };
        };
        let lb = g.batch(l);
        let limit = st.limit_bytes;
        // Fits measured with the current exploration steps (the most steps any fit has, in practice).
        let max_steps = st
            .trials
            .iter()
            .filter(|t| t.outcome.fits())
            .map(|t| t.steps)
            .max()
            .unwrap_or(0);
        let mut points: Vec<(u64, u64)> = st
            .trials
            .iter()
            .filter(|t| t.outcome.fits() && t.steps == max_steps && t.batch <= lb)
            .filter_map(|t| t.outcome.peak_bytes().map(|p| (t.batch, p)))
            .collect();
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        let line = fit_line(&points);

        let u = upper.unwrap_or(g.last_index + 1); // exclusive
        let half = ((u - l) / 2).max(1);
        let to_index = |b: f64| -> i64 {
            if b < g.first as f64 {
                -1
            } else {
                ((b - g.first as f64) / g.step as f64)
                    .floor()
                    .min((g.last_index + 1) as f64) as i64
            }
        };

        let Some((line, partner)) = line.filter(|ln| ln.0.k > 0.0) else {
            // No slope yet: one point, or all in the flat part below a knee.
            self.up_run = 0;
            self.down_run = 0;
            if upper.is_some() {
                // Bisection, geometric while the bracket spans more than a factor of four.
                let ub = g.batch(u);
                if ub > 4 * lb {
                    let m = ((lb as f64) * (ub as f64)).sqrt() as u64;
                    return g.index_at_or_below(m).clamp(l + 1, u - 1);
                }
                return l + half;
            }
            let &(_, pt) = points.last().unwrap_or(&(lb, limit));
            // Under max(c, a + k·b) with a ≥ 0, lb·limit/pt surely fits; a small headroom suggests a
            // small answer (a large model), where ×16 would overshoot.
            let safe = (lb as f64 * limit as f64 / pt.max(1) as f64) as u64;
            let target = if safe >= lb.saturating_mul(16) {
                safe
            } else if points.len() == 1 && (limit as f64) < 1.25 * pt as f64 {
                lb.saturating_mul(2)
            } else {
                lb.saturating_mul(16)
            };
            return g
                .index_at_or_below(target.min(g.batch(g.last_index)))
                .max(l + 1);
        };

        let (_, pt) = *points.last().expect("a line has points");
        // The slope's lower point may sit in the flat part below a knee (then the slope is too small and
        // the prediction too large by an unknown factor) unless a smaller point lies clearly below it.
        let knee_suspect = !points.iter().any(|q| {
            q.0 < partner.0 && (partner.1.saturating_sub(q.1)) as f64 >= MIN_RISE * partner.1 as f64
        });
        // Relative error of the slope if both peaks are off by NOISE.
        let slope_noise = 2.0 * NOISE * pt as f64 / (pt - partner.1) as f64;
        let p = line.crossing(limit);
        let dist = (p - lb as f64).max(0.0);
        let checks = checks(&points);
        // Exact: the newest checked point lay on the line fitted without it.
        let exact = checks.last().is_some_and(|c| c.0 < EXACT);
        // Expected error of this prediction (samples): the errors seen, each scaled down to this distance
        // but not below the noise prior (a single lucky check proves little); before any check, the slope's
        // noise over this distance.
        let noise = NOISE * pt as f64 / line.k;
        let err = if exact {
            0.0
        } else {
            checks
                .iter()
                .map(|&(e, d)| if d > 0.0 && dist < d { e * dist / d } else { e })
                .fold(noise.max(dist * slope_noise), f64::max)
        };
        let e_steps = ((err / g.step as f64).ceil().max(1.0)) as u64;
        let mut pi = to_index(p);
        if upper.is_none() && pi > g.last_index as i64 {
            // Beyond the largest allowed size: try that.
            pi = g.last_index as i64;
        }

        if pi <= l as i64 {
            // The line says l+1 fails. Exact line: try it (the proof); otherwise gallop up from l by the
            // expected error, doubling while the line keeps falling short.
            self.down_run = 0;
            let step = if exact {
                1u64 << self.up_run.min(40)
            } else {
                e_steps.saturating_mul(1u64 << self.up_run.min(40))
            };
            self.up_run += 1;
            return l + step.min(half).max(1);
        }
        if pi as u64 >= u {
            // The line says u−1 fits, but u failed: the line is wrong above the last fit.
            self.up_run = 0;
            let step = if knee_suspect || (exact && self.down_run > 0) {
                // A slope that may come from the flat part below a knee, or an exact line that missed
                // twice (a jump): the error has no known size. Bisect.
                half
            } else {
                // Noise: gallop down from u, starting at the expected error. A line that was exact so
                // far gets one step of the noise prior first: on real devices a near miss of a few
                // samples (seen on CPU: predicted 16977, true 16976) is far more common than a jump.
                let first = if exact {
                    ((noise / g.step as f64).ceil().max(1.0)) as u64
                } else {
                    e_steps
                };
                first.saturating_mul(1u64 << self.down_run.min(40))
            };
            self.down_run += 1;
            return u - step.min(half).max(1);
        }
        self.up_run = 0;
        self.down_run = 0;
        let i = pi as u64;
        if exact || upper.is_none() {
            return i;
        }
        // A noisy line inside a bracket: keep the proposal an eighth of the bracket (or the expected
        // error, if smaller) away from its ends, so that every trial shrinks it.
        let w = u - l;
        let margin = (w / 8).min(e_steps).max(1);
        i.clamp(l + margin.min(half), u - margin.min(half))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_slope_from_nearest_clear_rise() {
        // 16 is flat (below a knee); 256 and 300 are on the line: the slope comes from 256 (nearest with
        // a clear rise), not from the flat part.
        let pts = [(1, 1000), (16, 1000), (256, 3400), (300, 3840)];
        let (l, partner) = fit_line(&pts).unwrap();
        assert_eq!(partner, (256, 3400));
        assert!((l.k - 10.0).abs() < 1e-9);
        assert!((l.at(300.0) - 3840.0).abs() < 1e-6);
        assert!((l.crossing(10_000) - 916.0).abs() < 1e-6);
        // A rise under MIN_RISE of the top peak is skipped: the slope comes from the farther point.
        let (l, _) = fit_line(&[(1, 1000), (200, 2990), (201, 3000)]).unwrap();
        assert!((l.k - 2000.0 / 200.0).abs() < 1e-9);
        assert!(fit_line(&[(5, 100)]).is_none());
        assert!(fit_line(&[(5, 100), (10, 100)]).is_none(), "flat: no line");
        assert!(
            fit_line(&[(1, 1000), (16, 1010)]).is_none(),
            "a 1 % rise is within noise"
        );
    }

    fn trials(spec: &str) -> (Option<u64>, usize) {
        use crate::device::sim::{SimBackend, SimSpec};
        use crate::search::{Prober, SearchConfig};
        let spec = SimSpec::parse(spec).unwrap();
        let limit = spec.capacity / 20 * 19;
        let mut be = SimBackend::new(spec);
        let out = Prober::new(&mut be, SearchConfig::default(), limit).search();
        (out.max_fitting, out.trials.len())
    }

    #[test]
    fn exact_lines_take_five_trials_and_misses_do_not_walk() {
        // Affine: 1, a safe second size, the prediction, the size above, the confirmation.
        let (m, n) = trials("base=500MiB,per-sample=2395582,capacity=24GiB");
        assert_eq!((m, n), (Some(10_000), 5));
        // An overshoot above a knee or a cliff used to back off one size at a time (38 and 24 trials).
        let (m, n) = trials("base=1GiB,per-sample=4681046,capacity=24GiB,knee=2048");
        assert_eq!(m, Some(5000));
        assert!(n <= 10, "{n} trials");
        let (m, n) = trials("base=2GiB,per-sample=7443369,capacity=24GiB,jump=2000:8GiB");
        assert_eq!(m, Some(1999));
        assert!(n <= 16, "{n} trials");
    }
}
