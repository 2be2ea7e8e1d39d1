//! Micro-batch × accumulation × world size.
//!
//! Given a global batch `G`, a world size `W` (data-parallel ranks) and the largest micro-batch `M` that was
//! proven to fit, find the smallest accumulation `a` with `G / W = micro × a` exactly and `micro ≤ M`,
//! with `micro` on the search's grid (a multiple of `--multiple-of`, at least `--min-batch`) and `a`
//! at most [`MAX_ACCUMULATION`] (the work is bounded too: no loop runs longer than that).
//! Exact splits keep every optimizer step at exactly `G` samples. When the exact split degenerates
//! (`micro < M / 2`, e.g. G = 1018 = 2 × 509 with M = 300 → micro 2, a = 509) we warn and list nearby
//! global batches that split well; `allow_uneven` instead splits `G / W` into `a = ceil(G/W / M)`
//! micro-batches whose sizes differ by at most one (the trainer weights the loss by samples so the
//! gradient still equals the full batch's).

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The most gradient-accumulation steps a split may have. A split needing more is refused with the
/// largest global batch that does split (a plan lists every micro-batch of a step, and the
/// trainer and the confirmation trials run them all: an accumulation of a million is a mistake, not
/// a plan).
pub const MAX_ACCUMULATION: u64 = 4096;

/// How many nearby global batches are examined for a better split (each side).
const NEARBY: u64 = 2000;

/// Where micro-batch sizes may lie: multiples of `multiple_of`, at least `min_batch` (the search's
/// `--multiple-of` and `--min-batch`, so every size of a split is one the search could have tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub multiple_of: u64,
    pub min_batch: u64,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            multiple_of: 1,
            min_batch: 1,
        }
    }
}

impl Sizes {
    pub fn new(multiple_of: u64, min_batch: u64) -> Sizes {
        Sizes {
            multiple_of: multiple_of.max(1),
            min_batch: min_batch.max(1),
        }
    }
}

/// "1016 or 1020", "100000" (one value when both sides are the same or only one exists).
fn either(v: &[u64]) -> String {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    match v.as_slice() {
        [] => "none".into(),
        [a] => a.to_string(),
        [a, b] => format!("{a} or {b}"),
        more => more
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn nearest_word(v: &[u64]) -> &'static str {
    let mut v = v.to_vec();
    v.dedup();
    if v.len() == 1 {
        "nearest valid global batch"
    } else {
        "nearest valid global batches"
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SplitError {
    #[error(
        "--global-batch {global} is not divisible by --world-size {world}; {}: {}",
        nearest_word(nearest),
        either(nearest)
    )]
    NotDivisible {
        global: u64,
        world: u64,
        nearest: Vec<u64>,
    },
    #[error("--global-batch and --world-size must be at least 1")]
    Zero,
    #[error("no micro-batch fits, so no split exists")]
    NothingFits,
    #[error(
        "--global-batch {global} gives {per_rank} samples per rank, which is not a multiple of \
         --multiple-of {multiple_of}, so no micro-batch size on the grid splits it exactly; {}: {}",
        nearest_word(nearest),
        either(nearest)
    )]
    OffGrid {
        global: u64,
        per_rank: u64,
        multiple_of: u64,
        nearest: Vec<u64>,
    },
    #[error(
        "--global-batch {global} gives {per_rank} samples per rank, fewer than --min-batch {min_batch}: \
         no micro-batch of at least {min_batch} fits in it; give --global-batch {smallest} or more, or \
         lower --min-batch"
    )]
    BelowMinBatch {
        global: u64,
        per_rank: u64,
        min_batch: u64,
        smallest: u64,
    },
    #[error(
        "--global-batch {global} needs {needed} accumulation steps per rank with micro-batches of at \
         most {max_micro}, more than batchfit plans ({MAX_ACCUMULATION}); the largest global batch \
         that splits is {largest}: give --global-batch {largest} or less{}",
        if *world > 1 { " (or more ranks with --world-size)" } else { "" }
    )]
    TooManySteps {
        global: u64,
        world: u64,
        max_micro: u64,
        needed: u64,
        largest: u64,
    },
    #[error(
        "--global-batch {global} has no exact split into micro-batches of at most {max_micro} that are \
         multiples of {multiple_of}, at least {min_batch}, with at most {MAX_ACCUMULATION} \
         accumulation steps; {}: {}{}",
        nearest_word(better), either(better),
        if *uneven_possible { " (or --allow-uneven)" } else { "" }
    )]
    NoSplit {
        global: u64,
        max_micro: u64,
        multiple_of: u64,
        min_batch: u64,
        better: Vec<u64>,
        uneven_possible: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The largest micro-batch of the split (all are equal unless `uneven`).
    pub micro_batch: u64,
    pub accumulation: u64,
    pub global_batch: u64,
    pub world_size: u64,
    /// True when `allow_uneven` produced micro-batches of two sizes (`micro_batch` and the next
    /// smaller size on the grid).
    pub uneven: bool,
    /// Sizes of the micro-batches of one optimizer step on one rank (sum = global / world; at most
    /// [`MAX_ACCUMULATION`] of them).
    pub micro_batches: Vec<u64>,
    /// Set when the exact split is poor: a warning and better global batches nearby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub better_global_batches: Vec<u64>,
}

/// Validates `G` and `W` alone (before any trial runs).
pub fn check_global(global: u64, world: u64) -> Result<(), SplitError> {
    if global == 0 || world == 0 {
        return Err(SplitError::Zero);
    }
    if global % world != 0 {
        let below = (global / world) * world;
        let mut nearest = vec![];
        if below > 0 {
            nearest.push(below);
        }
        if let Some(above) = (global / world + 1).checked_mul(world) {
            nearest.push(above);
        }
        return Err(SplitError::NotDivisible {
            global,
            world,
            nearest,
        });
    }
    Ok(())
}

/// Validates `G` and `W` against the sizes the search may try (before any trial runs): the per-rank
/// batch must be on the grid, hold at least one `min_batch`, and split into at most
/// [`MAX_ACCUMULATION`] micro-batches of `max_batch` (the largest size the search may prove).
pub fn check_against_sizes(
    global: u64,
    world: u64,
    sizes: Sizes,
    max_batch: u64,
) -> Result<(), SplitError> {
    check_global(global, world)?;
    let per_rank = global / world;
    let k = sizes.multiple_of.max(1);
    if per_rank < sizes.min_batch {
        let smallest_per_rank = sizes.min_batch.div_ceil(k) * k;
        return Err(SplitError::BelowMinBatch {
            global,
            per_rank,
            min_batch: sizes.min_batch,
            smallest: smallest_per_rank.saturating_mul(world),
        });
    }
    if per_rank % k != 0 {
        let below = per_rank / k * k;
        let mut nearest = vec![];
        if below >= sizes.min_batch.max(1) {
            nearest.push(below * world);
        }
        if let Some(above) = (per_rank / k + 1)
            .checked_mul(k)
            .and_then(|a| a.checked_mul(world))
        {
            nearest.push(above);
        }
        return Err(SplitError::OffGrid {
            global,
            per_rank,
            multiple_of: k,
            nearest,
        });
    }
    let max_micro = max_batch / k * k;
    if max_micro == 0 {
        return Err(SplitError::NothingFits);
    }
    let needed = per_rank.div_ceil(max_micro);
    if needed > MAX_ACCUMULATION {
        return Err(SplitError::TooManySteps {
            global,
            world,
            max_micro,
            needed,
            largest: largest_global(world, max_micro),
        });
    }
    Ok(())
}

/// The largest global batch over `world` ranks that splits into micro-batches of `max_micro`.
fn largest_global(world: u64, max_micro: u64) -> u64 {
    max_micro
        .saturating_mul(MAX_ACCUMULATION)
        .saturating_mul(world)
}

/// The exact split of `units` into `a` equal parts of at most `max_units` and at least `min_units`,
/// with the fewest parts, if there is one with at most [`MAX_ACCUMULATION`] parts (bounded work:
/// at most that many candidates).
fn exact(units: u64, max_units: u64, min_units: u64) -> Option<(u64, u64)> {
    let a_min = units.div_ceil(max_units).max(1);
    (a_min..=MAX_ACCUMULATION.min(units))
        .take_while(|a| units / a >= min_units)
        .find(|a| units % a == 0)
        .map(|a| (units / a, a))
}

/// Whether `units` splits exactly with micro-batches of at least half the largest (bounded work).
fn splits_well(units: u64, max_units: u64, min_units: u64) -> bool {
    if units <= max_units {
        return units >= min_units;
    }
    // micro ≥ max / 2 means a ≤ 2 × units / max: few candidates
    let a_min = units.div_ceil(max_units);
    let a_max = (units.saturating_mul(2) / max_units).min(MAX_ACCUMULATION);
    (a_min..=a_max)
        .any(|a| units % a == 0 && units / a >= min_units && (units / a) * 2 >= max_units)
}

/// Nearby per-rank sizes (in units) on either side that split well, as global batches (at most two
/// each side, within [`NEARBY`] units).
fn better_nearby(units: u64, max_units: u64, min_units: u64, k: u64, world: u64) -> Vec<u64> {
    let mut below = vec![];
    let mut above = vec![];
    let to_global = |u: u64| u.checked_mul(k).and_then(|b| b.checked_mul(world));
    let mut d = 1;
    while (below.len() < 2 || above.len() < 2) && d <= NEARBY {
        if below.len() < 2 && units > d && splits_well(units - d, max_units, min_units) {
            below.extend(to_global(units - d));
        }
        if above.len() < 2 {
            if let Some(u) = units.checked_add(d) {
                if u.div_ceil(max_units) <= MAX_ACCUMULATION && splits_well(u, max_units, min_units)
                {
                    above.extend(to_global(u));
                }
            }
        }
        d += 1;
    }
    let mut better: Vec<u64> = below.into_iter().chain(above).collect();
    better.sort_unstable();
    better
}

/// The split on the grid of any size ([`Sizes::default`]).
pub fn split(
    global: u64,
    world: u64,
    max_micro: u64,
    allow_uneven: bool,
) -> Result<Split, SplitError> {
    split_on(global, world, max_micro, allow_uneven, Sizes::default())
}

/// micro × accumulation × world = global with every micro-batch at most `max_micro`, on the grid of
/// `sizes` (a multiple of `multiple_of`, at least `min_batch`), with at most [`MAX_ACCUMULATION`]
/// micro-batches per step. Exact (all micro-batches equal, the fewest of them) unless `allow_uneven`,
/// which splits into `ceil(per_rank / max)` micro-batches whose sizes differ by one grid step.
pub fn split_on(
    global: u64,
    world: u64,
    max_micro: u64,
    allow_uneven: bool,
    sizes: Sizes,
) -> Result<Split, SplitError> {
    check_global(global, world)?;
    let k = sizes.multiple_of.max(1);
    // the largest fitting size on the grid (a fit off the grid, e.g. from another plan, rounds down)
    let max_units = max_micro / k;
    if max_units == 0 || max_units * k < sizes.min_batch {
        return Err(SplitError::NothingFits);
    }
    check_against_sizes(global, world, sizes, max_units * k)?;
    let per_rank = global / world;
    let units = per_rank / k;
    let min_units = sizes.min_batch.div_ceil(k);
    let max_grid = max_units * k;
    let done = |micro_batches: Vec<u64>, uneven: bool| Split {
        micro_batch: micro_batches.iter().copied().max().unwrap_or(0),
        accumulation: micro_batches.len() as u64,
        global_batch: global,
        world_size: world,
        uneven,
        micro_batches,
        warning: None,
        better_global_batches: vec![],
    };
    if units <= max_units {
        return Ok(done(vec![per_rank], false));
    }
    if allow_uneven {
        // check_against_sizes bounded a ≤ MAX_ACCUMULATION
        let a = units.div_ceil(max_units);
        let small = units / a;
        let n_big = units % a;
        if small < min_units {
            return Err(SplitError::NoSplit {
                global,
                max_micro: max_grid,
                multiple_of: k,
                min_batch: sizes.min_batch,
                better: better_nearby(units, max_units, min_units, k, world),
                uneven_possible: false,
            });
        }
        let mut v = vec![(small + 1) * k; n_big as usize];
        v.extend(std::iter::repeat_n(small * k, (a - n_big) as usize));
        return Ok(done(v, n_big > 0));
    }
    let Some((micro_units, a)) = exact(units, max_units, min_units) else {
        return Err(SplitError::NoSplit {
            global,
            max_micro: max_grid,
            multiple_of: k,
            min_batch: sizes.min_batch,
            better: better_nearby(units, max_units, min_units, k, world),
            uneven_possible: units.div_ceil(max_units) <= MAX_ACCUMULATION
                && units / units.div_ceil(max_units) >= min_units,
        });
    };
    let micro = micro_units * k;
    let mut s = done(vec![micro; a as usize], false);
    if micro_units * 2 < max_units {
        // Nearest global batches (multiples of k × W) on either side whose exact split keeps
        // micro ≥ M/2.
        let better = better_nearby(units, max_units, min_units, k, world);
        s.warning = Some(format!(
            "global batch {global} splits only as {a} × {micro} per rank (largest fitting micro-batch \
             is {max_grid}); each step then runs {a} small micro-batches. Consider --global-batch {} \
             or --allow-uneven",
            better
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(" / ")
        ));
        s.better_global_batches = better;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        // (G, W, M) → (micro, a)
        let cases = [
            (256, 1, 1000, 256, 1),
            (256, 1, 256, 256, 1),
            (256, 1, 255, 128, 2),
            (256, 1, 100, 64, 4),
            (1024, 4, 100, 64, 4),
            (1024, 8, 128, 128, 1),
            (1000, 1, 300, 250, 4),
            (1018, 1, 300, 2, 509),
            (7, 1, 3, 1, 7),
            (6, 1, 1, 1, 6),
            (4096, 2, 2048, 2048, 1),
            (4096, 2, 2047, 1024, 2),
        ];
        for (g, w, m, micro, a) in cases {
            let s = split(g, w, m, false).unwrap();
            assert_eq!(
                (s.micro_batch, s.accumulation),
                (micro, a),
                "G={g} W={w} M={m}"
            );
            assert_eq!(s.micro_batch * s.accumulation * w, g);
            assert!(s.micro_batch <= m);
        }
    }

    #[test]
    fn degenerate_split_warns_with_better_sizes() {
        let s = split(1018, 1, 300, false).unwrap();
        assert!(s.warning.is_some());
        assert!(!s.better_global_batches.is_empty());
        for g in &s.better_global_batches {
            let t = split(*g, 1, 300, false).unwrap();
            assert!(t.micro_batch * 2 >= 300, "{g} → {t:?}");
        }
        assert!(s.better_global_batches.contains(&1020) || s.better_global_batches.contains(&1016));
        assert!(split(1000, 1, 300, false).unwrap().warning.is_none());
    }

    #[test]
    fn uneven() {
        let s = split(1018, 1, 300, true).unwrap();
        assert_eq!(s.accumulation, 4);
        assert_eq!(s.micro_batches.iter().sum::<u64>(), 1018);
        assert_eq!(s.micro_batch, 255);
        assert!(s.uneven);
        assert!(s.micro_batches.iter().all(|&m| m == 254 || m == 255));
        let e = split(1000, 1, 300, true).unwrap();
        assert!(!e.uneven && e.micro_batch == 250 && e.accumulation == 4);
    }

    #[test]
    fn world_size_must_divide() {
        assert_eq!(
            check_global(1018, 4),
            Err(SplitError::NotDivisible {
                global: 1018,
                world: 4,
                nearest: vec![1016, 1020],
            })
        );
        // below the world size there is one valid global batch, said once
        let e = check_global(3, 100000).unwrap_err().to_string();
        assert!(e.ends_with("nearest valid global batch: 100000"), "{e}");
        assert!(check_global(0, 1).is_err());
        assert!(split(8, 1, 0, false).is_err());
        // no overflow at the top of the range
        let e = check_global(u64::MAX, 2).unwrap_err().to_string();
        assert!(e.contains("18446744073709551614"), "{e}");
    }

    #[test]
    fn uneven_uses_the_fewest_micro_batches() {
        // 9692 = 2 × 4846: two full micro-batches, not three smaller ones
        let s = split(9692, 1, 4846, true).unwrap();
        assert_eq!(s.micro_batches, vec![4846, 4846]);
        assert!(!s.uneven);
        let s = split(9693, 1, 4846, true).unwrap();
        assert_eq!(s.micro_batches, vec![3231, 3231, 3231]);
        let s = split(9691, 1, 4846, true).unwrap();
        assert_eq!(s.micro_batches, vec![4846, 4845]);
        assert!(s.uneven);
    }

    #[test]
    fn the_split_stays_on_the_search_grid() {
        // --multiple-of 8: 250 × 4 is off the grid, 200 × 5 is on it
        let s = split_on(1000, 1, 290, false, Sizes::new(8, 1)).unwrap();
        assert_eq!((s.micro_batch, s.accumulation), (200, 5));
        // uneven splits move in grid steps
        let s = split_on(1000, 1, 290, true, Sizes::new(8, 1)).unwrap();
        assert_eq!(s.micro_batches, vec![256, 248, 248, 248]);
        // --min-batch 64 --multiple-of 64 --global-batch 40: refused, not "40"
        let e = split_on(40, 1, 4096, false, Sizes::new(64, 64)).unwrap_err();
        assert!(
            matches!(e, SplitError::BelowMinBatch { smallest: 64, .. }),
            "{e}"
        );
        let e = split_on(1001, 1, 4096, false, Sizes::new(8, 1)).unwrap_err();
        assert!(e.to_string().ends_with("1000 or 1008"), "{e}");
        // an exact split below --min-batch is no split
        let e = split_on(1018, 1, 300, false, Sizes::new(1, 64)).unwrap_err();
        assert!(matches!(e, SplitError::NoSplit { .. }), "{e}");
        assert!(e.to_string().contains("1020"), "{e}");
        // a fit off the grid (from another plan) rounds down to it
        let s = split_on(1024, 1, 300, false, Sizes::new(64, 1)).unwrap();
        assert_eq!((s.micro_batch, s.accumulation), (256, 4));
    }

    #[test]
    fn huge_global_batches_are_refused_at_once() {
        let t = std::time::Instant::now();
        for (g, w) in [(u64::MAX, 1), (u64::MAX, 5), (1_000_000_007, 1)] {
            let e = split(g, w, 4846, false).unwrap_err();
            assert!(matches!(e, SplitError::TooManySteps { .. }), "{g}: {e}");
            assert!(e
                .to_string()
                .contains("the largest global batch that splits is"));
            let e = split(g, w, 4846, true).unwrap_err();
            assert!(matches!(e, SplitError::TooManySteps { .. }), "{g}: {e}");
        }
        // a prime: no exact split within the bound; nearby global batches that split well
        let e = split(1_000_003, 1, 4846, false).unwrap_err();
        match &e {
            SplitError::NoSplit {
                better,
                uneven_possible,
                ..
            } => {
                assert!(*uneven_possible);
                assert!(!better.is_empty());
                for g in better {
                    let s = split(*g, 1, 4846, false).unwrap();
                    assert!(s.micro_batch * 2 >= 4846, "{g}: {s:?}");
                }
            }
            other => panic!("{other}"),
        }
        let s = split(1_000_003, 1, 4846, true).unwrap();
        assert_eq!(s.accumulation, 207);
        // validation before any trial bounds the work by --max-batch
        assert!(check_against_sizes(u64::MAX, 1, Sizes::default(), 1_000_000).is_err());
        assert!(check_against_sizes(1_000_003, 1, Sizes::default(), 1_000_000).is_ok());
        assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
    }

    proptest::proptest! {
        /// Every split (or refusal) is bounded, on the grid, within the largest fit, and sums to the
        /// per-rank batch; uneven splits use exactly ceil(per_rank / max) micro-batches.
        #[test]
        fn splits_are_sound(per_rank in 1u64..200_000, world in 1u64..9, max in 1u64..5000,
                            k in proptest::sample::select(vec![1u64, 2, 8, 64]), min in 1u64..100,
                            uneven in proptest::bool::ANY) {
            let g = per_rank * world;
            if let Ok(s) = split_on(g, world, max, uneven, Sizes::new(k, min)) {
                proptest::prop_assert!(s.micro_batches.len() as u64 <= MAX_ACCUMULATION);
                proptest::prop_assert_eq!(s.micro_batches.len() as u64, s.accumulation);
                proptest::prop_assert_eq!(s.micro_batches.iter().sum::<u64>(), per_rank);
                for &m in &s.micro_batches {
                    proptest::prop_assert!(m <= max && m % k == 0 && m >= min, "{:?}", s);
                }
                proptest::prop_assert_eq!(s.micro_batch, *s.micro_batches.iter().max().unwrap());
                let max_grid = max / k * k;
                if uneven {
                    proptest::prop_assert_eq!(s.accumulation, (per_rank / k).div_ceil(max_grid / k));
                } else {
                    proptest::prop_assert!(s.micro_batches.iter().all(|&m| m == s.micro_batch));
                    proptest::prop_assert_eq!(s.micro_batch * s.accumulation * world, g);
                }
            }
        }
    }
}
