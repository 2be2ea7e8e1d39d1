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

/// The split of `global` over `world` ranks with micro-batches of at most `max_fitting` on the
/// search's grid (`sizes`), each size confirmed by `confirm(size, accumulation, retest)` (on every device; `retest` marks the repeat of
/// a failure at accumulation 1).
pub fn confirmed(
    global: u64,
    world: u64,
    max_fitting: u64,
    allow_uneven: bool,
    sizes: Sizes,
    confirm: &mut dyn FnMut(u64, u32, bool) -> Result<Confirmation, Stop>,
) -> SplitOutcome {
    let mut warnings = vec![];
    let mut cap = max_fitting;
    for _ in 0..MAX_RESPLITS {
        let s = match accumulate::split_on(global, world, cap, allow_uneven, sizes) {
            Ok(s) => s,
            Err(e) => {
                return SplitOutcome {
                    split: Err(Stop::Fatal(e.to_string())),
                    warnings,
                }
            }
        };
        let acc = u32::try_from(s.accumulation).unwrap_or(u32::MAX);
        let mut sizes = s.micro_batches.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        let mut lower_cap = None;
        for b in sizes {
            let first = match confirm(b, acc, false) {
                Ok(c) => c,
                Err(stop) => {
                    return SplitOutcome {
                        split: Err(stop),
                        warnings,
                    }
                }
            };
            match first {
                Confirmation::Fits => continue,
                Confirmation::Failed(why) => {
                    return SplitOutcome {
                        split: Err(Stop::Fatal(format!(
                        "the confirmation of micro-batch {b} × accumulation {acc} failed ({why}); \
                             the split is not proven"
                    ))),
                        warnings,
                    }
                }
                Confirmation::OutOfMemory if acc > 1 => {
                    warnings.push(format!(
                        "micro-batch {b} fits alone but ran out of memory with {acc} accumulated \
                         micro-batches (gradient accumulation holds more memory); the split was \
                         recomputed below {b}"
                    ));
                    lower_cap = Some(b - 1);
                    break;
                }
                Confirmation::OutOfMemory => {
                    // A size below a proven fit failed at accumulation 1: re-test once.
                    let again = match confirm(b, acc, true) {
                        Ok(c) => c,
                        Err(stop) => {
                            return SplitOutcome {
                                split: Err(stop),
                                warnings,
                            }
                        }
                    };
                    if again != Confirmation::Fits {
                        warnings.push(format!(
                            "non-monotonic memory: micro-batch {b} ran out of memory although \
                             {max_fitting} fit, and again when re-tested; no recommendation relies \
                             on {b}"
                        ));
                        return SplitOutcome {
                            split: Err(Stop::Fatal(format!(
                                "micro-batch {b} chosen by the accumulation split did not fit although \
                                 {max_fitting} did: memory is not monotonic in the batch size here; \
                                 re-run with --global-batch a multiple of {max_fitting}"
                            ))),
                            warnings,
                        };
                    }
                    // The re-test fit: one run out of memory and one fit is no proof that it fits,
                    // so the split is recomputed below it and nothing recommended relies on it.
                    warnings.push(format!(
                        "non-monotonic memory: micro-batch {b} ran out of memory although \
                         {max_fitting} fit; the re-test fit (flaky near the limit); resolved \
                         conservatively: the split was recomputed below {b}, so no recommendation \
                         relies on {b}"
                    ));
                    lower_cap = Some(b - 1);
                    break;
                }
            }
        }
        match lower_cap {
            None => {
                return SplitOutcome {
                    split: Ok(s),
                    warnings,
                }
            }
            Some(0) => {
                return SplitOutcome {
                    split: Err(Stop::Fatal(
                        "no micro-batch fits with gradient accumulation".into(),
                    )),
                    warnings,
                }
            }
            Some(c) => cap = c,
        }
    }
    SplitOutcome {
        split: Err(Stop::Fatal(
            "every accumulation split tried ran out of memory; lower the global batch or the \
             budget's pressure"
                .into(),
        )),
        warnings,
    }
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
