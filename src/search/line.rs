//! Memory against batch size, as a line `peak = a + k·b`: the one place that fits it.
//!
//! Two fits, for two questions. The search's proposal ([`fit_line`]) anchors the line at the
//! largest fit and takes the slope from the nearest smaller fit clearly below it: near, so a flat
//! part below a knee does not bend it; one pair, so each new fit moves it at once. The plan's
//! capacity model, `predict` and the plot ([`least_squares`], through `crate::plan::capacity`)
//! and the noise the answer must stay below ([`residual_range`]) read all the fits of a range,
//! where a least-squares line and its residuals say how far the points scatter about it.

use super::guided::MIN_RISE;

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

/// The (batch, peak) points [`fit_line`] takes from `trials`: those that fit with a peak, each
/// size's largest peak, sorted by size.
pub fn peaks<'a>(trials: impl Iterator<Item = &'a super::TrialRecord>) -> Vec<(u64, u64)> {
    let mut points: Vec<(u64, u64)> = trials
        .filter(|t| t.outcome.fits())
        .filter_map(|t| t.outcome.peak_bytes().map(|p| (t.batch, p)))
        .collect();
    points.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    points.dedup_by_key(|p| p.0);
    points
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

/// Least squares through `(x, y)`: `(intercept, slope, slope standard error)`.
pub fn least_squares(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let k = sxy / sxx;
    let a = my - k * mx;
    let se = if points.len() > 2 {
        let ssr: f64 = points.iter().map(|p| (p.1 - a - k * p.0).powi(2)).sum();
        (ssr / (n - 2.0) / sxx).sqrt()
    } else {
        0.0
    };
    Some((a, k, se))
}

/// The range of footprints about their least-squares line, over the fits at sizes from half the
/// largest fit up (memory grows linearly with the batch there, above any knee), when at least three
/// sizes ran there: a few repeats of one size rarely see a job's whole range of noise, the fits of the
/// search near the boundary add theirs.
pub(crate) fn residual_range(by_size: &std::collections::BTreeMap<u64, Vec<u64>>) -> Option<u64> {
    let top = *by_size.keys().next_back()?;
    let points: Vec<(f64, f64)> = by_size
        .range(top / 2..)
        .flat_map(|(&b, v)| v.iter().map(move |&f| (b as f64, f as f64)))
        .collect();
    if by_size.range(top / 2..).count() < 3 {
        return None;
    }
    let (a, k, _) = least_squares(&points)?;
    let residuals = points.iter().map(|p| p.1 - (a + k * p.0));
    let (lo, hi) = residuals.fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(r), hi.max(r)));
    Some(whole_range((hi - lo).max(0.0) as u64, points.len()))
}

/// The whole range of a noise of which `n` draws spanned `range`: `n` draws of a uniform noise
/// span on average `(n − 1) / (n + 1)` of it (three draws, half), so the range is scaled by the
/// inverse. With the scaled range as the room left under the job's limit, a fresh run of the
/// answer at the tightest size the rule allows lands above it 2.7 % of the time with three draws
/// and 1 % with four, where the bare range left 6 % with three (a simulation of uniform noise).
pub(crate) fn whole_range(range: u64, n: usize) -> u64 {
    let n = n.max(2) as f64;
    (range as f64 * (n + 1.0) / (n - 1.0)).ceil() as u64
}

/// The whole range of a noise drawn in several groups of fresh runs (one group per size run more
/// than once): the groups' ranges summed over the shares of the whole range their sizes span on
/// average ([`whole_range`]). One group gives its own scaled range; several pool their draws, where
/// the largest of their scaled ranges would keep the one group that happened to draw wide (two runs
/// a group are each scaled threefold: the largest of a few such is far above the whole range, 190 MiB
/// for a job of ±40 MiB, and every answer it measures steps down again).
pub(crate) fn pooled_range<'a>(groups: impl Iterator<Item = &'a [u64]>) -> Option<u64> {
    let (mut spans, mut share) = (0.0, 0.0);
    for g in groups.filter(|g| g.len() > 1) {
        let n = g.len() as f64;
        spans += (g.iter().max().unwrap() - g.iter().min().unwrap()) as f64;
        share += (n - 1.0) / (n + 1.0);
    }
    (share > 0.0).then(|| (spans / share).ceil() as u64)
}
