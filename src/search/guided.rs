//! Model-guided search: predict the largest fitting size from measured peaks, then prove it.
//!
//! Memory per trial is, to first order, `max(c, a + k·b)`: flat below a knee (allocator granularity,
//! fixed buffers), affine above. Two well-separated measured peaks in the affine part predict where the
//! line crosses the limit; the remaining trials only prove it (a fit at b, an oom at the next size).
//!
//! * **Line.** Anchored at the largest fitting trial (closest to the limit, so the extrapolation is
//!   short); slope from the fit with the largest batch at most half of it (well separated, so noise in
//!   either peak moves the slope little). Points whose rise over the smallest trial is too small to
//!   trust (still in the flat part) do not make a line: the search grows instead.
//! * **Proposal.** The predicted size when it lies inside the open bracket; otherwise a step from the
//!   side it lies beyond (`lo + s` or `hi − s`) whose size doubles while the prediction keeps missing
//!   in the same direction (galloping), capped at half the bracket, which makes it bisection in the worst
//!   case. So a miss costs O(log error) trials, never a walk.
//! * **Growth** before any line exists: ×16 from the largest fit, or half the (uncertain) prediction.
//!
//! The engine ([`super::Prober`]) decides when the proof is complete and confirms the answer; this
//! strategy never reports anything.

use super::{SearchState, Strategy};

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
}

/// Fits the line from (batch, peak) points of fitting trials; `None` when the data cannot support a
/// prediction (fewer than two distinct sizes, or no clear rise).
pub fn fit_line(points: &[(u64, u64)], limit: u64) -> Option<(Line, bool)> {
    let &(bt, pt) = points.iter().max_by_key(|p| p.0)?;
    let &(b0, p0) = points.iter().min_by_key(|p| p.0)?;
    if bt == b0 {
        return None;
    }
    // Second point: the largest batch ≤ bt/2, else the smallest.
    let &(bs, ps) = points
        .iter()
        .filter(|p| p.0 * 2 <= bt)
        .max_by_key(|p| p.0)
        .unwrap_or(&(b0, p0));
    if pt <= ps {
        return None;
    }
    let k = (pt - ps) as f64 / (bt - bs) as f64;
    let a = pt as f64 - k * bt as f64;
    // Trust: the rise seen so far is a fair share of the way to the limit.
    let headroom = limit.saturating_sub(p0).max(1) as f64;
    let trusted = (pt - p0) as f64 >= 0.2 * headroom;
    Some((Line { a, k }, trusted))
}

impl Strategy for Guided {
    fn propose(&mut self, st: &SearchState) -> u64 {
        let g = st.grid;
        let upper = match (st.hi, st.ceiling) {
            (Some(h), Some(c)) => Some(h.min(c)),
            (h, c) => h.or(c),
        };
        let Some(l) = st.lo else {
            return match upper {
                None => 0,
                Some(u) => u / 2,
            };
        };
        // Fits measured with the current exploration steps (the most steps any fit has, in practice).
        let max_steps = st.trials.iter().filter(|t| t.outcome.fits()).map(|t| t.steps).max().unwrap_or(0);
        let points: Vec<(u64, u64)> = st
            .trials
            .iter()
            .filter(|t| t.outcome.fits() && t.steps == max_steps && t.batch <= g.batch(l))
            .filter_map(|t| t.outcome.peak_bytes().map(|p| (t.batch, p)))
            .collect();
        let lb = g.batch(l);
        let line = fit_line(&points, st.limit_bytes);
        let bisect = |u: u64| l + (u - l) / 2;
        let to_index = |b: f64| -> i64 {
            if b < g.first as f64 {
                -1
            } else {
                ((b - g.first as f64) / g.step as f64).floor().min(g.last_index as f64) as i64
            }
        };
        let grow = |target: u64| -> u64 {
            let t = target.clamp(lb.saturating_mul(2), lb.saturating_mul(64)).min(g.batch(g.last_index));
            g.index_at_or_below(t).max(l + 1)
        };
        match line {
            None => match upper {
                None => grow(lb.saturating_mul(16)),
                Some(u) => bisect(u),
            },
            Some((line, trusted)) => {
                let p = to_index(line.crossing(st.limit_bytes));
                if !trusted && upper.is_none() {
                    // Too little rise to extrapolate far: step to half the prediction (or grow).
                    let half = (line.crossing(st.limit_bytes) / 2.0).max(0.0) as u64;
                    return grow(half.max(lb.saturating_mul(2)));
                }
                let u = upper.unwrap_or(g.last_index + 1);
                if p > l as i64 && (p as u64) < u {
                    self.up_run = 0;
                    self.down_run = 0;
                    return p as u64;
                }
                let half = ((u - l) / 2).max(1);
                if p <= l as i64 {
                    let step = (1u64 << self.up_run.min(40)).min(half);
                    self.up_run += 1;
                    self.down_run = 0;
                    l + step
                } else {
                    let step = (1u64 << self.down_run.min(40)).min(half);
                    self.down_run += 1;
                    self.up_run = 0;
                    u - step
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_through_separated_points() {
        let pts = [(1, 1000), (16, 1150), (256, 3550), (300, 3990)];
        let (l, trusted) = fit_line(&pts, 10_000).unwrap();
        // anchored at 300, slope from 16 (the largest ≤ 150)
        assert!((l.k - (3990.0 - 1150.0) / 284.0).abs() < 1e-9);
        assert!((l.a + l.k * 300.0 - 3990.0).abs() < 1e-6);
        assert!(trusted);
        assert!(fit_line(&[(5, 100)], 1000).is_none());
        assert!(fit_line(&[(5, 100), (10, 100)], 1000).is_none(), "flat: no line");
        let (_, t) = fit_line(&[(1, 100), (16, 110)], 10_000).unwrap();
        assert!(!t, "tiny rise is not trusted");
    }
}
