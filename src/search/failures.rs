//! Sizes that failed: a trial that ends in an error or a timeout is neither a fit nor an
//! out-of-memory, so a size that only failed, above the largest fit and below every out-of-memory,
//! caps the exploration and proves nothing. Bisecting down to where a job's error starts (a shape
//! that stops matching from some size up) would cost two trials a size (each failure is retried
//! once, for flakes) and still prove nothing: the job's error is what needs fixing. So once a
//! failure has repeated at one size (no flake), a failure elsewhere is not retried, and a second
//! size that fails ends the search with the failure of the smallest size that failed named in the
//! stop's detail. An out-of-memory below the failures lifts them from the bracket (an error only at
//! sizes far above the limit does not stop a search that can still be proven).

use super::{Prober, Purpose, Stop};
use crate::protocol::TrialOutcome;
use std::collections::BTreeMap;

impl Prober<'_> {
    /// The sizes above the largest fit and below the smallest bound (every trial there failed), with
    /// their trials' count and first failure's message, smallest first.
    fn failed_sizes(&self) -> BTreeMap<u64, (usize, &str)> {
        let fit = self.largest_fit();
        let bound = self
            .trials
            .iter()
            .filter(|t| t.outcome.is_bound())
            .map(|t| t.batch)
            .min();
        let mut sizes = BTreeMap::new();
        let between = |b: u64| fit.is_none_or(|f| b > f) && bound.is_none_or(|h| b < h);
        for t in self.trials.iter().filter(|t| between(t.batch)) {
            let why = t.outcome.message().unwrap_or("(no message)");
            sizes.entry(t.batch).or_insert((0, why)).0 += 1;
        }
        sizes
    }

    /// The largest size that fit, any steps.
    fn largest_fit(&self) -> Option<u64> {
        self.trials
            .iter()
            .filter(|t| t.outcome.fits())
            .map(|t| t.batch)
            .max()
    }

    /// Whether a failure has repeated at a size that bounds the search (then it is no flake).
    fn failure_repeated(&self) -> bool {
        self.failed_sizes().values().any(|&(n, _)| n >= 2)
    }

    /// An exploration trial, retried once after an error or a timeout unless a failure already
    /// repeated at another size.
    pub(super) fn explore_trial(
        &mut self,
        batch: u64,
        steps: u32,
        purpose: Purpose,
    ) -> Result<TrialOutcome, Stop> {
        if self.failure_repeated() {
            self.trial(batch, steps, purpose)
        } else {
            self.trial_with_retry(batch, steps, purpose)
        }
    }

    /// Whether the retries of a round's failures are worth their trials (see [`Self::explore_trial`]).
    pub(super) fn retry_failures(&self) -> bool {
        !self.failure_repeated()
    }

    /// The stop once a failure repeated at one size and a second size failed too.
    pub(super) fn failures_stop(&self) -> Option<Stop> {
        let sizes = self.failed_sizes();
        (sizes.len() >= 2 && sizes.values().any(|&(n, _)| n >= 2))
            .then(|| Stop::Fatal(self.failure_detail().unwrap_or_default()))
    }

    /// What the failures that bound the search say: the smallest failed size's first message, the
    /// other sizes that failed, and the largest size that fit.
    pub(super) fn failure_detail(&self) -> Option<String> {
        let sizes = self.failed_sizes();
        let (&first, &(n, why)) = sizes.iter().next()?;
        let times = |n: usize| {
            if n > 1 {
                format!(" ({n} trials)")
            } else {
                String::new()
            }
        };
        let others: Vec<String> = sizes
            .iter()
            .skip(1)
            .map(|(b, &(n, _))| format!("{b}{}", times(n)))
            .collect();
        let also = match others.len() {
            0 => String::new(),
            1 => format!("; so did size {}", others[0]),
            _ => format!("; so did sizes {}", others.join(", ")),
        };
        let fit = self.largest_fit().map_or("no size fit".into(), |f| {
            format!("the largest size that fit: {f}")
        });
        Some(format!(
            "size {first} failed{}: {why}{also}. An error or a timeout is neither a fit nor an \
             out-of-memory, so no limit can be proven ({fit}): fix the failure and probe again",
            times(n)
        ))
    }
}
