//! Doubling, then bisection: the classic strategy (Lightning's `binsearch` without its flaws: every
//! answer is a tested size, the bracket is proven, and the grid honours `multiple_of`).

use super::{upper_bound, Proposal, SearchState, Strategy};

#[derive(Default)]
pub struct DoublingBisection {
    /// Doubling only (Lightning's `power` mode).
    power_only: bool,
}

impl DoublingBisection {
    pub fn power() -> Self {
        DoublingBisection { power_only: true }
    }
}

impl Strategy for DoublingBisection {
    fn propose(&mut self, st: &SearchState) -> Proposal {
        Proposal::explore(self.index(st))
    }
    /// `k` sizes at once: doubling `k` times from the largest fit (from the smallest size before
    /// any fit), or `k` evenly spaced sizes inside the bracket, which one round cuts by `k + 1`.
    fn propose_round(&mut self, st: &SearchState, k: usize) -> Vec<Proposal> {
        let g = st.grid;
        let k = k.max(1) as u64;
        let mut out: Vec<u64> = match (st.lo, upper_bound(st.hi, st.ceiling)) {
            (None, None) => doublings(st, 0, k),
            (Some(l), None) => doublings(st, l, k + 1).into_iter().skip(1).collect(),
            (None, Some(u)) => (1..=k).map(|j| j * u / (k + 1)).collect(),
            (Some(l), Some(u)) => (1..=k)
                .map(|j| l + (j * (u - l) / (k + 1)).max(1))
                .filter(|&i| i < u)
                .collect(),
        };
        out.retain(|&i| i <= g.last_index);
        out.dedup();
        out.into_iter().map(Proposal::explore).collect()
    }
}

/// `n` sizes from grid index `from` on, each double the one before (at least one index up), up to
/// the largest size.
fn doublings(st: &SearchState, from: u64, n: u64) -> Vec<u64> {
    let g = st.grid;
    let mut out = vec![from];
    while (out.len() as u64) < n {
        let last = *out.last().expect("one index");
        if last >= g.last_index {
            break;
        }
        let next = g.batch(last).saturating_mul(2);
        out.push(if next > g.batch(g.last_index) {
            g.last_index
        } else {
            g.index_at_or_below(next).max(last + 1)
        });
    }
    out
}

impl DoublingBisection {
    fn index(&self, st: &SearchState) -> u64 {
        let g = st.grid;
        let upper = upper_bound(st.hi, st.ceiling);
        match (st.lo, upper) {
            (None, None) => 0,
            // Nothing fit yet but something above failed with error: walk down by halving.
            (None, Some(u)) => u / 2,
            (Some(l), None) => {
                let next = g.batch(l).saturating_mul(2);
                if next > g.batch(g.last_index) {
                    g.last_index
                } else {
                    g.index_at_or_below(next).max(l + 1)
                }
            }
            (Some(l), Some(u)) => {
                let _ = self.power_only;
                l + (u - l) / 2
            }
        }
    }
}
