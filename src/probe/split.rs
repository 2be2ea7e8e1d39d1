//! The accumulation split of the global batch, proven the way the trainer will run it.
//!
//! Accumulating `a` micro-batches holds more memory than one micro-batch alone (the gradients and
//! the optimizer's state beside each micro-batch's activations), so every micro-batch size of the
//! split is confirmed *with the split's accumulation* before it is recommended. One loop, used by
//! the single-device probe and by the multi-GPU probe (which confirms on every GPU):
//!
//! * a size that runs out of memory with accumulation `a > 1`: the split is recomputed below it (a
//!   few times at most), and the plan says why;
//! * a size below the largest proven fit that runs out of memory at accumulation 1: memory is not
//!   monotonic in the batch here; re-tested once: if it fails again the probe stops, if it fits the
//!   split is recomputed below it (either way no recommendation relies on it);
//! * an error or a timeout of a confirmation is never read as memory: the split is not proven, and
//!   the plan is partial.

use crate::accumulate::{self, Sizes, Split};
use crate::search::{Confirmation, Stop};

/// How many times the split may be recomputed below a size that did not fit with accumulation.
const MAX_RESPLITS: usize = 8;

/// The confirmed split, or why there is none, with the warnings for the plan.
pub struct SplitOutcome {
    pub split: Result<Split, Stop>,
    pub warnings: Vec<String>,
}

/// Confirms one size of a split: `(size, accumulation, retest)`, on every device; `retest` marks the
/// repeat of a failure at accumulation 1.
pub type Confirm<'a> = dyn FnMut(u64, u32, bool) -> Result<Confirmation, Stop> + 'a;

/// The split of `global` over `world` ranks with micro-batches of at most `max_fitting` on the
/// search's grid (`sizes`), each of its sizes confirmed by `confirm` with the split's accumulation.
pub fn confirmed(
    global: u64,
    world: u64,
    max_fitting: u64,
    allow_uneven: bool,
    sizes: Sizes,
    confirm: &mut Confirm,
) -> SplitOutcome {
    let mut warnings = vec![];
    let mut cap = max_fitting;
    let split = (|| {
        for _ in 0..MAX_RESPLITS {
            let s = accumulate::split_on(global, world, cap, allow_uneven, sizes)
                .map_err(|e| Stop::Fatal(e.to_string()))?;
            match lower_cap(&s, max_fitting, confirm, &mut warnings)? {
                None => return Ok(s),
                Some(0) => {
                    return Err(Stop::Fatal(
                        "no micro-batch fits with gradient accumulation".into(),
                    ))
                }
                Some(c) => cap = c,
            }
        }
        Err(Stop::Fatal(
            "every accumulation split tried ran out of memory; lower the global batch or the \
             budget's pressure"
                .into(),
        ))
    })();
    SplitOutcome { split, warnings }
}

/// Confirms each distinct size of `s`, largest first: `None` when all fit, or the cap below which
/// the split must be recomputed.
fn lower_cap(
    s: &Split,
    max_fitting: u64,
    confirm: &mut Confirm,
    warnings: &mut Vec<String>,
) -> Result<Option<u64>, Stop> {
    let acc = u32::try_from(s.accumulation).unwrap_or(u32::MAX);
    let mut sizes = s.micro_batches.clone();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    for b in sizes {
        match confirm(b, acc, false)? {
            Confirmation::Fits => continue,
            Confirmation::Failed(why) => {
                return Err(Stop::Fatal(format!(
                    "the confirmation of micro-batch {b} × accumulation {acc} failed ({why}); \
                     the split is not proven"
                )))
            }
            Confirmation::AboveNoise { why, below } => {
                warnings.push(format!(
                    "{why}: a fresh run of it may not fit; the split was recomputed below {b}"
                ));
                return Ok(Some(below.min(b - 1)));
            }
            Confirmation::OutOfMemory if acc > 1 => {
                warnings.push(format!(
                    "micro-batch {b} fit alone but ran out of memory with {acc} accumulated \
                     micro-batches (accumulation holds more memory, or the job's run-to-run noise \
                     reached the limit); the split was recomputed below {b}"
                ));
                return Ok(Some(b - 1));
            }
            Confirmation::OutOfMemory => {
                return retest_below_fit(b, acc, max_fitting, confirm, warnings).map(Some)
            }
        }
    }
    Ok(None)
}

/// A size below the proven fit `max_fitting` ran out of memory at accumulation 1: re-tested once.
/// Failing again stops the probe; a fit there is no proof either (one out-of-memory and one fit),
/// so the split is recomputed below it and nothing recommended relies on it.
fn retest_below_fit(
    b: u64,
    acc: u32,
    max_fitting: u64,
    confirm: &mut Confirm,
    warnings: &mut Vec<String>,
) -> Result<u64, Stop> {
    if confirm(b, acc, true)? != Confirmation::Fits {
        warnings.push(format!(
            "non-monotonic memory: micro-batch {b} ran out of memory although {max_fitting} fit, \
             and again when re-tested; no recommendation relies on {b}"
        ));
        return Err(Stop::Fatal(format!(
            "micro-batch {b} chosen by the accumulation split did not fit although {max_fitting} \
             did: memory is not monotonic in the batch size here; re-run with --global-batch a \
             multiple of {max_fitting}"
        )));
    }
    warnings.push(format!(
        "non-monotonic memory: micro-batch {b} ran out of memory although {max_fitting} fit; the \
         re-test fit (flaky near the limit); resolved conservatively: the split was recomputed \
         below {b}, so no recommendation relies on {b}"
    ));
    Ok(b - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A size that ran out of memory at accumulation 1 and fit when re-tested is not recommended:
    /// the split is recomputed below it, so the warning that no recommendation relies on it is
    /// true.
    #[test]
    fn a_flaky_retest_is_not_recommended() {
        let mut calls = vec![];
        let out = confirmed(
            100,
            1,
            120,
            false,
            Sizes::new(1, 1),
            &mut |b, acc, retest| {
                calls.push((b, acc, retest));
                Ok(if b == 100 && acc == 1 && !retest {
                    Confirmation::OutOfMemory
                } else {
                    Confirmation::Fits
                })
            },
        );
        let s = out
            .split
            .unwrap_or_else(|_| panic!("no split: {:?}", out.warnings));
        assert!(
            s.micro_batches.iter().all(|&m| m < 100),
            "{:?}",
            s.micro_batches
        );
        assert_eq!(s.micro_batches.iter().sum::<u64>(), 100);
        assert!(calls.contains(&(100, 1, true)), "{calls:?}");
        let w = out.warnings.join("\n");
        assert!(w.contains("recomputed below 100"), "{w}");
        // a re-test that fails again stops the probe
        let out = confirmed(100, 1, 120, false, Sizes::new(1, 1), &mut |b, acc, _| {
            Ok(if b == 100 && acc == 1 {
                Confirmation::OutOfMemory
            } else {
                Confirmation::Fits
            })
        });
        assert!(out.split.is_err());
    }
}
