//! Rounds: several trials at once, on identical devices (the GPUs of a node that match, `--parallel
//! N` on the cpu).
//!
//! A strategy proposes up to `k` sizes per round ([`super::Strategy::propose_round`]), chosen so that
//! their outcomes together shrink the bracket the most: bisection's `k` evenly spaced sizes cut it
//! by `k + 1`; the default round is the strategy's own proposal, the size whose out-of-memory would
//! prove it, and sizes spread over the rest of the bracket ([`around`]). The proof does not change:
//! the engine checks every proposal as it checks one, runs them side by side, and applies each
//! outcome to the bracket as it would apply a single trial's, one by one. An error or a timeout is
//! retried once (the retries of a round run together) and is never evidence. A fit above a size
//! that ran out of memory in the same round is a contradiction like any other
//! ([`super::noise`]). With one device (`k = 1`) nothing here runs: the trials are today's. Devices
//! that share the cores running their trials (`--parallel auto` on the cpu) explore one size at a
//! time ([`crate::device::Backend::explore_width`]) and run only the proof's trials in rounds.

use super::{upper_bound, Planned, Prober, Proposal, Purpose, SearchState, Stop, TrialRecord};
use crate::protocol::{TrialOutcome, TrialRequest};

/// The sizes of a round around `first` (the strategy's proposal), at most `k`, all distinct: when
/// `first` is expected to be the answer (`answer`), the size a tolerance's gap above it (its
/// out-of-memory proves `first`, once something fit), then,
/// while nothing has failed, a geometric ladder up to the largest size, then the midpoints
/// (geometric) of the widest gaps left in the open bracket; with no bound above but failures below,
/// nothing more.
pub fn around(st: &SearchState, first: Proposal, k: usize, answer: bool) -> Vec<Proposal> {
    let g = st.grid;
    let mut out = vec![first];
    let upper = upper_bound(st.hi, st.ceiling);
    // exclusive end of the open bracket
    let end = upper.unwrap_or(g.last_index + 1).min(g.last_index + 1);
    let open = |i: u64| st.lo.is_none_or(|l| i > l) && i < end;
    let taken = |out: &[Proposal], i: u64| out.iter().any(|p| p.index == i);
    if k > 1 && answer && !first.measure && st.lo.is_some() && open(first.index) {
        let b = g.batch(first.index);
        let top = b.saturating_add(st.gap(b));
        let q = g.index_at_or_below(top).min(end.saturating_sub(1));
        if q > first.index && !taken(&out, q) {
            out.push(Proposal::explore(q));
        }
    }
    if upper.is_none() {
        if st.trials.iter().any(|t| t.outcome.is_bound()) {
            // nothing bounds the bracket, yet sizes failed (below its fit: a noisy boundary, or
            // warm failures that cold fits overturned): the boundary is near them, not up the
            // ladder, and a gap above the proposal reaches as far
            return out;
        }
        ladder(st, &mut out, k);
    }
    while out.len() < k {
        let Some(i) = widest_gap(st, &out, end) else {
            break;
        };
        out.push(Proposal::explore(i));
    }
    out.truncate(k.max(1));
    out
}

/// Above everything proposed or fit, sizes growing by a constant factor (2 to 16) that reaches the
/// largest size with the proposals left.
fn ladder(st: &SearchState, out: &mut Vec<Proposal>, k: usize) {
    let g = st.grid;
    let mut top = out
        .iter()
        .filter(|p| !p.measure)
        .map(|p| p.index)
        .chain(st.lo)
        .max()
        .unwrap_or(0);
    let left = k.saturating_sub(out.len());
    if left == 0 || top >= g.last_index {
        return;
    }
    let span = g.batch(g.last_index) as f64 / g.batch(top) as f64;
    let factor = span.powf(1.0 / left as f64).clamp(2.0, 16.0);
    while out.len() < k && top < g.last_index {
        let next = (g.batch(top) as f64 * factor).min(g.batch(g.last_index) as f64);
        let i = g.index_at_or_below(next as u64).max(top + 1);
        out.push(Proposal::explore(i));
        top = i;
    }
}

/// The geometric middle of the widest gap (by ratio of sizes) between neighbours among the
/// bracket's ends and the proposals, when a gap holds an untried size.
fn widest_gap(st: &SearchState, out: &[Proposal], end: u64) -> Option<u64> {
    let g = st.grid;
    // the lower end: the largest fit, or just below the smallest size
    let floor = st.lo.map_or(g.first as f64 / 2.0, |l| g.batch(l) as f64);
    let mut points: Vec<u64> = out
        .iter()
        .filter(|p| !p.measure && st.lo.is_none_or(|l| p.index > l) && p.index < end)
        .map(|p| p.index)
        .collect();
    points.sort_unstable();
    points.push(end);
    let mut best: Option<(f64, u64)> = None;
    let mut prev: (Option<u64>, f64) = (st.lo, floor);
    for &p in &points {
        let lowest = prev.0.map_or(0, |a| a + 1);
        let at = |i: u64| (g.batch(g.last_index) as f64 + g.step as f64).min(g.batch(i) as f64);
        let pb = if p > g.last_index {
            g.batch(g.last_index) as f64 + g.step as f64
        } else {
            at(p)
        };
        if lowest < p {
            let ratio = pb / prev.1.max(f64::MIN_POSITIVE);
            let mid = (pb * prev.1).sqrt();
            let i = g
                .index_at_or_below(mid.max(g.first as f64) as u64)
                .clamp(lowest, p - 1);
            if best.is_none_or(|(r, _)| ratio > r) {
                best = Some((ratio, i));
            }
        }
        prev = (Some(p), pb);
    }
    best.map(|(_, i)| i)
}

/// The first trial that ended in an error or a timeout while another ran beside it (in a round of
/// more than one): a job that may not bear two runs at once (a fixed port, a fixed file).
pub fn failed_beside_another(trials: &[TrialRecord]) -> Option<&TrialRecord> {
    let beside = |t: &TrialRecord| {
        t.round
            .is_some_and(|r| trials.iter().filter(|u| u.round == Some(r)).count() > 1)
    };
    let failed = |t: &TrialRecord| {
        matches!(
            t.outcome,
            TrialOutcome::Error { .. } | TrialOutcome::Timeout { .. }
        )
    };
    trials.iter().find(|t| failed(t) && beside(t))
}

impl Prober<'_> {
    /// Runs a round of planned trials side by side and returns their outcomes in order; an error or
    /// a timeout (not of a measurement) is retried once, the retries again side by side. Fewer
    /// outcomes than trials when `--max-trials` leaves room for fewer.
    pub(super) fn explore_round(&mut self, planned: &[Planned]) -> Result<Vec<TrialOutcome>, Stop> {
        let runs: Vec<(u64, u32, Purpose)> = planned
            .iter()
            .map(|p| (p.batch, p.steps, p.purpose))
            .collect();
        let mut outcomes = self.round_of(&runs)?;
        let retry = self.retry_failures();
        let again: Vec<usize> = (0..outcomes.len())
            .filter(|&j| retry && !planned[j].measure)
            .filter(|&j| {
                matches!(
                    outcomes[j],
                    TrialOutcome::Error { .. } | TrialOutcome::Timeout { .. }
                )
            })
            .collect();
        if !again.is_empty() {
            let retries: Vec<_> = again
                .iter()
                .map(|&j| (runs[j].0, runs[j].1, Purpose::Retry))
                .collect();
            let repeated = self.round_of(&retries)?;
            for (j, o) in again.into_iter().zip(repeated) {
                outcomes[j] = o;
            }
        }
        Ok(outcomes)
    }

    /// One round: each trial on its own device at once, recorded in order with the round's number.
    pub(super) fn round_of(
        &mut self,
        runs: &[(u64, u32, Purpose)],
    ) -> Result<Vec<TrialOutcome>, Stop> {
        self.budget_left()?;
        let room = self.cfg.max_trials.map_or(usize::MAX, |m| {
            (m as usize).saturating_sub(self.trials.len())
        });
        let runs = &runs[..runs.len().min(room).min(self.backend.width())];
        let reqs: Vec<TrialRequest> = runs
            .iter()
            .map(|&(batch, steps, purpose)| TrialRequest {
                batch,
                steps,
                fresh: purpose != Purpose::Explore || !self.worker_trusted,
                accumulation: self.accumulation,
            })
            .collect();
        for (j, r) in reqs.iter().enumerate() {
            (self.on_start)(self.trials.len() + 1 + j, r);
        }
        let ran = self.backend.run_round(&reqs);
        let round = self.next_round();
        let mut outcomes = vec![];
        let mut stop = None;
        for ((req, &(_, _, purpose)), r) in reqs.iter().zip(runs).zip(ran) {
            match self.record(req, purpose, r, round) {
                Ok(o) => outcomes.push(o),
                Err(s) => stop = stop.or(Some(s)),
            }
        }
        match stop {
            Some(s) => Err(s),
            None => Ok(outcomes),
        }
    }
}

#[cfg(test)]
#[path = "rounds_tests.rs"]
mod tests;
