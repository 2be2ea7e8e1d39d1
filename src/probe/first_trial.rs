//! A command's first trial, at the smallest size, already over its limit: one plain message in the
//! plan's warnings (the search ends at that trial: nothing smaller exists, so the summary says it at
//! once), of what the command needs at that size and what budget or limit would let it run —
//! instead of a bare "nothing fits".
//!
//! What is known depends on how the trial ended: an `over-budget` trial measured the tree's need
//! (its anonymous and shared memory, each page once), so the budget that covers it is said; an
//! out-of-memory under `RLIMIT_DATA` shows only that a data segment reached the limit, which counts
//! address space a process reserved as well as what it touched (an interpreter that imports torch
//! reserves about 676 MiB and touches about 473), so `--cpu-limit cgroup` (touched memory of the
//! whole tree) is named beside a larger budget; under a memory cgroup only a larger budget helps.

use crate::device::LimitMechanism;
use crate::plan::Plan;
use crate::platform::units::format_size;
use crate::protocol::TrialOutcome;
use crate::search::TrialRecord;

/// The `--memory-budget` whose trials' limit is at least `need` under `plan`'s margin, reserve and
/// guard band (`limit = (budget − reserve) × (1 − margin) − guard`), rounded up to a MiB.
fn budget_for(plan: &Plan, need: u64) -> u64 {
    let guard = plan.guard_band_bytes.unwrap_or(0) as f64;
    let keep = (1.0 - plan.margin).max(0.1);
    let b = (need as f64 + guard) / keep + plan.reserve_bytes as f64;
    let mib = (1u64 << 20) as f64;
    ((b / mib).ceil() * mib) as u64
}

/// The message when `first` — the probe's first trial — ran at the smallest size of the grid and
/// ran out of memory or over the budget under a CPU limit of a command (`--exec`); `None` otherwise.
pub fn over_the_limit(plan: &Plan, first: &TrialRecord) -> Option<String> {
    let mechanism = plan.limit_mechanism?;
    let s = &plan.search;
    let smallest = s.min_batch.max(1).div_ceil(s.multiple_of.max(1)) * s.multiple_of.max(1);
    if first.batch != smallest || !first.outcome.is_bound() {
        return None;
    }
    let limit = plan.limit_bytes;
    let head = format!(
        "the first trial (micro-batch {}) already needs more than the {} limit, so no size can fit",
        first.batch,
        format_size(limit)
    );
    let touched = first
        .details
        .as_ref()
        .and_then(|d| d.tree_pss_peak_bytes)
        .filter(|&b| b > 0);
    let text = match (&first.outcome, mechanism) {
        (TrialOutcome::OverBudget { peak_bytes, .. }, _) => format!(
            "{head}: its processes held {} (anonymous and shared memory, each page once). A \
             --memory-budget of at least {} would let micro-batch {} run",
            format_size(*peak_bytes),
            format_size(budget_for(plan, *peak_bytes)),
            first.batch
        ),
        (TrialOutcome::Oom { peak_bytes, .. }, LimitMechanism::RlimitData) => {
            let seg = peak_bytes.unwrap_or(limit);
            let held = touched
                .map(|t| format!(" while its processes had touched {}", format_size(t)))
                .unwrap_or_default();
            format!(
                "{head}: {}{held}. RLIMIT_DATA counts the address space a process reserves, not \
                 only what it touches (an interpreter importing torch reserves about 676 MiB): \
                 --cpu-limit cgroup limits the memory the whole tree touches, or a \
                 --memory-budget above {} gives the data segment more room",
                segment_reached(seg, limit),
                format_size(budget_for(plan, seg.max(limit)))
            )
        }
        (TrialOutcome::Oom { .. }, LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2) => {
            let held = touched
                .map(|t| format!(" (its processes held {} when it ended)", format_size(t)))
                .unwrap_or_default();
            format!(
                "{head}: it ran out of the memory cgroup's limit{held}. A --memory-budget above \
                 {} is needed for micro-batch {}",
                format_size(budget_for(plan, limit)),
                first.batch
            )
        }
        _ => return None,
    };
    Some(text)
}

/// What the largest data segment measured, `seg`, says of an out-of-memory under `RLIMIT_DATA`:
/// below the limit, the allocation that failed was one that would have taken the segment past it
/// (one large block is refused whole, so the segment never reached the limit).
fn segment_reached(seg: u64, limit: u64) -> String {
    if seg < limit {
        format!(
            "an allocation failed that would have taken a data segment of {} past the limit",
            format_size(seg)
        )
    } else {
        format!("a data segment reached {}", format_size(seg))
    }
}

#[cfg(test)]
mod tests {
    use super::segment_reached;

    /// A segment measured below the limit is never said to have reached it.
    #[test]
    fn a_refused_large_allocation_is_not_said_to_reach_the_limit() {
        let mib = 1u64 << 20;
        let below = segment_reached(200 * mib, 269 * mib);
        assert!(!below.contains("reached"), "{below}");
        assert!(below.contains("an allocation failed") && below.contains("200.00 MiB"));
        assert_eq!(
            segment_reached(269 * mib, 269 * mib),
            "a data segment reached 269.00 MiB"
        );
    }
}
