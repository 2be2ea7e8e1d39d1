//! Micro-batch × accumulation × world size.
//!
//! Given a global batch `G`, a world size `W` (data-parallel ranks) and the largest micro-batch `M` that was
//! proven to fit, find the smallest accumulation `a` with `G / W = micro × a` exactly and `micro ≤ M`.
//! Exact splits keep every optimizer step at exactly `G` samples. When the exact split degenerates
//! (`micro < M / 2`, e.g. G = 1018 = 2 × 509 with M = 300 → micro 2, a = 509) we warn and list nearby
//! global batches that split well; `allow_uneven` instead splits `G / W` into `a = ceil(G/W / M)`
//! micro-batches whose sizes differ by at most one (the trainer weights the loss by samples so the
//! gradient still equals the full batch's).

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SplitError {
    #[error("--global-batch {global} is not divisible by --world-size {world}; nearest valid global batches: {below} or {above}")]
    NotDivisible {
        global: u64,
        world: u64,
        below: u64,
        above: u64,
    },
    #[error("--global-batch and --world-size must be at least 1")]
    Zero,
    #[error("no micro-batch fits, so no split exists")]
    NothingFits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The largest micro-batch of the split (all are equal unless `uneven`).
    pub micro_batch: u64,
    pub accumulation: u64,
    pub global_batch: u64,
    pub world_size: u64,
    /// True when `allow_uneven` produced micro-batches of two sizes (`micro_batch` and `micro_batch - 1`).
    pub uneven: bool,
    /// Sizes of the micro-batches of one optimizer step on one rank (sum = global / world).
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
        return Err(SplitError::NotDivisible {
            global,
            world,
            below: if below == 0 { world } else { below },
            above: (global / world + 1) * world,
        });
    }
    Ok(())
}

/// Smallest `a` dividing `per_rank` with `per_rank / a ≤ max_micro`.
fn exact(per_rank: u64, max_micro: u64) -> (u64, u64) {
    let a_min = per_rank.div_ceil(max_micro);
    let mut a = a_min;
    while per_rank % a != 0 {
        a += 1;
    }
    (per_rank / a, a)
}

fn splits_well(per_rank: u64, max_micro: u64) -> bool {
    let (micro, _) = exact(per_rank, max_micro);
    per_rank <= max_micro || micro * 2 >= max_micro
}

pub fn split(
    global: u64,
    world: u64,
    max_micro: u64,
    allow_uneven: bool,
) -> Result<Split, SplitError> {
    check_global(global, world)?;
    if max_micro == 0 {
        return Err(SplitError::NothingFits);
    }
    let per_rank = global / world;
    if per_rank <= max_micro {
        return Ok(Split {
            micro_batch: per_rank,
            accumulation: 1,
            global_batch: global,
            world_size: world,
            uneven: false,
            micro_batches: vec![per_rank],
            warning: None,
            better_global_batches: vec![],
        });
    }
    if allow_uneven {
        let a = per_rank.div_ceil(max_micro);
        let small = per_rank / a;
        let n_big = per_rank % a;
        let mut sizes = vec![small + 1; n_big as usize];
        sizes.extend(std::iter::repeat_n(small, (a - n_big) as usize));
        return Ok(Split {
            micro_batch: if n_big > 0 { small + 1 } else { small },
            accumulation: a,
            global_batch: global,
            world_size: world,
            uneven: n_big > 0,
            micro_batches: sizes,
            warning: None,
            better_global_batches: vec![],
        });
    }
    let (micro, a) = exact(per_rank, max_micro);
    let mut s = Split {
        micro_batch: micro,
        accumulation: a,
        global_batch: global,
        world_size: world,
        uneven: false,
        micro_batches: vec![micro; a as usize],
        warning: None,
        better_global_batches: vec![],
    };
    if micro * 2 < max_micro {
        // Nearest global batches (multiples of W) on either side whose exact split keeps micro ≥ M/2.
        let mut below = vec![];
        let mut above = vec![];
        let mut d = 1;
        while (below.len() < 2 || above.len() < 2) && d <= per_rank {
            if below.len() < 2 && per_rank > d && splits_well(per_rank - d, max_micro) {
                below.push((per_rank - d) * world);
            }
            if above.len() < 2 && splits_well(per_rank + d, max_micro) {
                above.push((per_rank + d) * world);
            }
            d += 1;
        }
        let mut better: Vec<u64> = below.into_iter().chain(above).collect();
        better.sort_unstable();
        s.warning = Some(format!(
            "global batch {global} splits only as {a} × {micro} per rank (largest fitting micro-batch is {max_micro}); \
             each step then runs {a} small micro-batches. Consider --global-batch {} or --allow-uneven",
            better.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(" / ")
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
                below: 1016,
                above: 1020
            })
        );
        assert!(check_global(0, 1).is_err());
        assert!(split(8, 1, 0, false).is_err());
    }
}
