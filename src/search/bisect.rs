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
