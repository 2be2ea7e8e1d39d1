//! The plan's invariants, checked on every read ([`super::Plan::parse`]): whoever reads a plan —
//! `show`, `batchfit-train`, `merge`, `verify`, the cache, `doctor --plan` — gets one that does not
//! contradict itself, or an error saying where it does.
//!
//! * `schema_version` is 1 or more (no batchfit writes 0);
//! * `status` is `complete` exactly when there is a `recommendation`;
//! * a recommendation's sizes are positive; `micro_batches` has `accumulation` entries (at most
//!   [`MAX_ACCUMULATION`]), `micro_batch` is the largest of them, their sum × `world_size` is
//!   `global_batch`, and they are all equal unless `uneven`;
//! * `micro_batch` ≤ `max_fitting_batch` < `first_failing_batch`; `fastest_micro_batch` ≤ `micro_batch`;
//! * `limit_bytes` ≤ `budget_bytes`, `reserve_bytes` < `budget_bytes`, `margin` in [0, 0.9];
//! * every trial ran at least one step of at least one sample, with an accumulation of at least 1;
//! * its recommendation is backed by its recorded trials ([`backed`]): each recommended micro-batch
//!   has a trial of that size that fit with (at least) the plan's accumulation, its largest fitting
//!   size a trial that fit, and its first failing size, when it has one (none: a cap was reached), a
//!   trial that ran out of memory or over its limit. A merged plan not yet verified here is held to
//!   this only for the sizes its sources proved: its micro-batches are re-solved for the new split
//!   and run by `batchfit verify`, and it says so (`"verified": false`).
//!
//! [`check`] is both, the one check every reader gets through [`super::Plan::parse`]. What the plan
//! cache trusts without a person in the loop is stronger, [`evidence`]: the sizes fit with the
//! confirmation's steps, and the bracket matches the stop reason.

use super::{Plan, Recommendation, Status};
use crate::accumulate::MAX_ACCUMULATION;

/// The check of every plan read ([`super::Plan::parse`]): its [`invariants`], and its
/// recommendation [`backed`] by its trials.
pub fn check(plan: &Plan) -> Result<(), String> {
    invariants(plan)?;
    backed(plan)
}

/// The first invariant `plan` breaks, as a sentence.
pub fn invariants(plan: &Plan) -> Result<(), String> {
    if plan.schema_version == 0 {
        return Err("schema_version is 0; plans start at version 1".into());
    }
    match (plan.status, &plan.recommendation) {
        (Status::Complete, None) => {
            return Err("its status is complete but it has no recommendation".into())
        }
        (Status::Partial | Status::NothingFits, Some(_)) => {
            return Err(format!(
                "its status is {} but it carries a recommendation",
                plan.status
            ))
        }
        _ => {}
    }
    if !(plan.margin.is_finite() && (0.0..=0.9).contains(&plan.margin)) {
        return Err(format!("its margin {} is outside [0, 0.9]", plan.margin));
    }
    if plan.budget_bytes == 0 || plan.limit_bytes == 0 {
        return Err("its budget or limit is 0 bytes".into());
    }
    if plan.limit_bytes > plan.budget_bytes {
        return Err(format!(
            "its limit ({} bytes) is above its budget ({} bytes)",
            plan.limit_bytes, plan.budget_bytes
        ));
    }
    if plan.reserve_bytes >= plan.budget_bytes {
        return Err("its reserve is not smaller than its budget".into());
    }
    if let Some(t) = plan
        .trials
        .iter()
        .find(|t| t.batch == 0 || t.steps == 0 || t.accumulation == 0)
    {
        return Err(format!(
            "a trial has batch {}, {} steps, accumulation {} (each must be at least 1)",
            t.batch, t.steps, t.accumulation
        ));
    }
    match &plan.recommendation {
        Some(r) => recommendation(r),
        None => Ok(()),
    }
}

/// The first invariant a plan's recommendation breaks: its sizes at least 1, its micro-batches
/// adding up to its global batch, and its sizes in order with the search's answer.
fn recommendation(r: &Recommendation) -> Result<(), String> {
    if r.micro_batch == 0 || r.accumulation == 0 || r.world_size == 0 || r.global_batch == 0 {
        return Err(format!(
            "its recommendation has micro-batch {}, accumulation {}, world size {}, global batch {} \
             (each must be at least 1)",
            r.micro_batch, r.accumulation, r.world_size, r.global_batch
        ));
    }
    split_adds_up(r)?;
    sizes_in_order(r)
}

/// The recommendation's micro-batches: as many as its accumulation (at most [`MAX_ACCUMULATION`]),
/// none empty, the largest its micro-batch, all the same size unless marked uneven, and with the
/// world size its global batch.
fn split_adds_up(r: &Recommendation) -> Result<(), String> {
    if r.accumulation > MAX_ACCUMULATION {
        return Err(format!(
            "its accumulation {} is above the {MAX_ACCUMULATION} batchfit plans",
            r.accumulation
        ));
    }
    if r.micro_batches.len() as u64 != r.accumulation {
        return Err(format!(
            "it lists {} micro-batches per step (micro_batches) but its accumulation is {}",
            r.micro_batches.len(),
            r.accumulation
        ));
    }
    if r.micro_batches.contains(&0) {
        return Err("micro_batches holds a micro-batch of 0".into());
    }
    let largest = r.micro_batches.iter().copied().max().unwrap_or(0);
    if largest != r.micro_batch {
        return Err(format!(
            "its micro-batch is {} but the largest of micro_batches is {largest}",
            r.micro_batch
        ));
    }
    let per_step = r
        .micro_batches
        .iter()
        .try_fold(0u64, |s, &m| s.checked_add(m))
        .and_then(|s| s.checked_mul(r.world_size));
    if per_step != Some(r.global_batch) {
        return Err(format!(
            "its micro-batches ({}) × world size {} do not add up to its global batch {}",
            super::describe_micro_batches(&r.micro_batches),
            r.world_size,
            r.global_batch
        ));
    }
    if !r.uneven && r.micro_batches.iter().any(|&m| m != r.micro_batch) {
        return Err("its micro-batches differ in size but it is not marked uneven".into());
    }
    Ok(())
}

/// The recommendation's sizes against the search's answer: the micro-batch at most the largest
/// fit, the first failure above it, the fastest size at most the micro-batch, a finite rate.
fn sizes_in_order(r: &Recommendation) -> Result<(), String> {
    if r.micro_batch > r.max_fitting_batch {
        return Err(format!(
            "its micro-batch {} is larger than its largest fitting size {}",
            r.micro_batch, r.max_fitting_batch
        ));
    }
    if let Some(f) = r.first_failing_batch {
        if f <= r.max_fitting_batch {
            return Err(format!(
                "its first failing size {f} is not above its largest fitting size {}",
                r.max_fitting_batch
            ));
        }
    }
    if let Some(f) = r.fastest_micro_batch {
        if f == 0 || f > r.micro_batch {
            return Err(format!(
                "its fastest micro-batch {f} is not a size up to its micro-batch {}",
                r.micro_batch
            ));
        }
    }
    if !(r.samples_per_second.is_finite() && r.samples_per_second >= 0.0) {
        return Err("its samples/s is not a finite, non-negative number".into());
    }
    Ok(())
}

/// The most optimizer steps of a recorded trial of micro-batch `batch` that fit with an
/// accumulation of at least `accumulation`, if one did.
pub fn fitting_steps(plan: &Plan, batch: u64, accumulation: u32) -> Option<u32> {
    plan.trials
        .iter()
        .filter(|t| t.batch == batch && t.outcome.fits() && t.accumulation >= accumulation)
        .map(|t| t.steps)
        .max()
}

/// Whether a trial of micro-batch `batch` (at accumulation 1: the size alone) ran out of memory or
/// over its limit.
fn failed(plan: &Plan, batch: u64) -> bool {
    plan.trials
        .iter()
        .any(|t| t.batch == batch && t.accumulation <= 1 && t.outcome.is_bound())
}

/// Whether the recorded trials back the recommendation (see the module doc); the sentence says which
/// part of it no trial supports.
pub fn backed(plan: &Plan) -> Result<(), String> {
    let Some(r) = &plan.recommendation else {
        return Ok(());
    };
    let acc = u32::try_from(r.accumulation).unwrap_or(u32::MAX);
    let merged_unverified = !plan.sources.is_empty() && !plan.is_verified();
    if !merged_unverified {
        let mut sizes = r.micro_batches.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        if let Some(b) = sizes
            .iter()
            .find(|&&b| fitting_steps(plan, b, acc).is_none())
        {
            return Err(format!(
                "its recommended micro-batch {b} (with accumulation {acc}) has no recorded trial \
                 that fit"
            ));
        }
    }
    if fitting_steps(plan, r.max_fitting_batch, 1).is_none() {
        return Err(format!(
            "its largest fitting micro-batch {} has no recorded trial that fit",
            r.max_fitting_batch
        ));
    }
    if let Some(f) = r.first_failing_batch {
        if !failed(plan, f) {
            return Err(format!(
                "its first failing micro-batch {f} has no recorded trial that ran out of memory"
            ));
        }
    }
    Ok(())
}

/// Whether the trials of a complete probe plan back its recommendation: every size of
/// `micro_batches` fit with (at least) the plan's accumulation and its confirm steps, the largest
/// fitting size fit with the confirm steps (as often as the search repeats its answer: `1 +
/// search.repeats` times), and the first failing size ran out of memory. Plans of
/// `batchfit merge` are not held to it until `verify` ran them.
pub fn evidence(plan: &Plan) -> Result<(), String> {
    let Some(r) = &plan.recommendation else {
        return Err("it has no recommendation".into());
    };
    let steps = plan.search.confirm_steps.max(plan.search.steps);
    let acc = u32::try_from(r.accumulation).unwrap_or(u32::MAX);
    let fit = |b: u64, acc: u32| {
        plan.trials
            .iter()
            .any(|t| t.batch == b && t.outcome.fits() && t.steps >= steps && t.accumulation >= acc)
    };
    let mut sizes = r.micro_batches.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if let Some(b) = sizes.iter().find(|&&b| !fit(b, acc)) {
        return Err(format!(
            "no trial of micro-batch {b} with accumulation {acc} and {steps} steps fit"
        ));
    }
    if !fit(r.max_fitting_batch, 1) {
        return Err(format!(
            "no trial of its largest fitting size {} with {steps} steps fit",
            r.max_fitting_batch
        ));
    }
    let runs = plan
        .trials
        .iter()
        .filter(|t| t.batch == r.max_fitting_batch && t.outcome.fits())
        .filter(|t| t.steps >= steps && t.accumulation <= 1)
        .count();
    let needed = 1 + plan.search.repeats as usize;
    if runs < needed {
        return Err(format!(
            "its largest fitting size {} fit {runs} times with {steps} steps, where its search \
             repeats the answer to {needed}",
            r.max_fitting_batch
        ));
    }
    if let Some(f) = r.first_failing_batch {
        // At accumulation 1, as max_fitting_batch: an out-of-memory with accumulation says nothing
        // of the size alone.
        if !failed(plan, f) {
            return Err(format!("no trial of its first failing size {f} failed"));
        }
    }
    // What the stop reason claims of the bracket: the next size, or one within the tolerance.
    use crate::search::StopReason;
    if matches!(
        plan.stop_reason,
        StopReason::Proven | StopReason::ProvenWithinTolerance
    ) {
        let step = plan.search.multiple_of.max(1);
        let tolerance = plan.search.tolerance.unwrap_or(0.0);
        let b = r.max_fitting_batch;
        let ok = match r.first_failing_batch {
            None => false,
            Some(f) if plan.stop_reason == StopReason::Proven => f == b + step,
            Some(f) => crate::search::within_tolerance(b, f, tolerance, step),
        };
        if !ok {
            return Err(format!(
                "its stop reason {:?} does not match its bracket: fits at {b}, first failing {}{}",
                plan.stop_reason,
                r.first_failing_batch
                    .map_or("none".to_string(), |f| f.to_string()),
                if plan.stop_reason == StopReason::Proven {
                    String::new()
                } else {
                    format!(" (tolerance {tolerance})")
                }
            ));
        }
    }
    Ok(())
}
