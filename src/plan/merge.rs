//! `batchfit merge`: one plan from several nodes' or GPU types' plans of one model.
//!
//! A merged plan is `verified: false`: its micro-batch was proven on the smallest source device, not
//! necessarily here; `batchfit-train` refuses it until `batchfit verify`
//! ([`crate::probe::verify`]) re-runs the sizes here, with the plan's accumulation.

use super::{Plan, PlanError, PlanSource, Recommendation, Status, Tool};
use crate::accumulate;
use crate::platform::now_unix;
use std::path::PathBuf;
use thiserror::Error;

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

#[derive(Debug, Error)]
pub enum MergeError {
    /// Plans that cannot be combined, or a bad split (exit 2).
    #[error("{0}")]
    Usage(String),
    /// A plan that cannot be read (exit 2).
    #[error(transparent)]
    Read(#[from] PlanError),
}

/// What `batchfit merge` combines.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    pub plans: Vec<PathBuf>,
    pub global_batch: u64,
    pub world_size: u64,
    pub allow_uneven: bool,
}

/// One plan from several: micro-batch = the smallest `max_fitting_batch`, the accumulation re-solved
/// for `global_batch` over `world_size` ranks on the sources' grid of sizes, below any size a source
/// saw run out of memory with accumulation. Refuses plans of different models and plans that are
/// not complete. The result is `verified: false` and lists its sources.
pub fn merge(opts: &MergeOptions) -> Result<Plan, MergeError> {
    if opts.plans.is_empty() {
        return Err(MergeError::Usage("merge needs at least one plan".into()));
    }
    accumulate::check_global(opts.global_batch, opts.world_size)
        .map_err(|e| MergeError::Usage(e.to_string()))?;
    let mut plans = vec![];
    for p in &opts.plans {
        let plan = Plan::read(p).map_err(MergeError::Read)?;
        let rec = match (&plan.status, &plan.recommendation) {
            (Status::Complete, Some(r)) => r.clone(),
            _ => {
                return Err(MergeError::Usage(format!(
                    "{} is not a complete plan (status {}: {}); only complete plans can be merged",
                    p.display(),
                    plan.status.as_str(),
                    plan.stop_detail
                )))
            }
        };
        if !plan.model.fingerprint_matches() {
            return Err(MergeError::Usage(format!(
                "{}: its model fingerprint does not match its model config; the plan was edited",
                p.display()
            )));
        }
        plans.push((p, plan, rec));
    }
    let (first_path, first, _) = &plans[0];
    for (p, plan, _) in &plans[1..] {
        if plan.model.fingerprint() != first.model.fingerprint() {
            return Err(MergeError::Usage(format!(
                "{} and {} were made for different models ({} {} vs {} {}); merge plans of one model only",
                first_path.display(),
                p.display(),
                first.model.name(),
                short(first.model.fingerprint()),
                plan.model.name(),
                short(plan.model.fingerprint()),
            )));
        }
    }
    // The base: the plan with the smallest proven size (ties: the first given).
    let base_idx = (0..plans.len())
        .min_by_key(|&i| (plans[i].2.max_fitting_batch, i))
        .expect("at least one plan");
    let (base_path, base, base_rec) = &plans[base_idx];
    let max = base_rec.max_fitting_batch;
    // Sizes every source could have tried: multiples of all their --multiple-of, at least the
    // largest --min-batch.
    let sizes = accumulate::Sizes::new(
        plans
            .iter()
            .fold(1, |k, (_, p, _)| lcm(k, p.search.multiple_of.max(1))),
        plans
            .iter()
            .map(|(_, p, _)| p.search.min_batch)
            .max()
            .unwrap_or(1),
    );
    // A size that ran out of memory *with accumulation* on any source is not a size to accumulate
    // with, whatever max_fitting_batch (measured at accumulation 1) says.
    let failed_acc: Vec<Option<u64>> = plans
        .iter()
        .map(|(_, p, _)| smallest_failing_with_accumulation(p))
        .collect();
    let usage = |e: accumulate::SplitError| MergeError::Usage(e.to_string());
    let mut s = accumulate::split_on(
        opts.global_batch,
        opts.world_size,
        max,
        opts.allow_uneven,
        sizes,
    )
    .map_err(usage)?;
    let mut notes = vec![];
    if let Some((i, fail)) = failed_acc
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.map(|f| (i, f)))
        .min_by_key(|&(_, f)| f)
    {
        if s.accumulation > 1 && s.micro_batch >= fail {
            s = accumulate::split_on(
                opts.global_batch,
                opts.world_size,
                fail - 1,
                opts.allow_uneven,
                sizes,
            )
            .map_err(|e| {
                MergeError::Usage(format!(
                    "{e} ({} ran out of memory at micro-batch {fail} with gradient accumulation, \
                     so the split must stay below it)",
                    plans[i].0.display()
                ))
            })?;
            notes.push(format!(
                "{} ran out of memory at micro-batch {fail} with gradient accumulation, although \
                 larger sizes fit alone there; the merged split stays below {fail}",
                plans[i].0.display()
            ));
        }
    }
    // Measurements of the chosen size, when the base plan ran it.
    let measured = base
        .trials
        .iter()
        .filter(|t| t.batch == s.micro_batch && t.outcome.fits())
        .max_by_key(|t| t.steps);
    let mut rec = match measured {
        Some(t) => Recommendation::from_split(&s, max, base_rec.first_failing_batch, t),
        None => {
            let mut r = base_rec.clone();
            r.micro_batch = s.micro_batch;
            r.accumulation = s.accumulation;
            r.global_batch = s.global_batch;
            r.world_size = s.world_size;
            r.max_fitting_batch = max;
            r.peak_bytes = 0;
            r.samples_per_second = 0.0;
            r.uneven = s.uneven;
            r.micro_batches = s.micro_batches.clone();
            r.warning = s.warning.clone();
            r.better_global_batches = s.better_global_batches.clone();
            r
        }
    };
    rec.fastest_micro_batch = None;
    rec.fastest_samples_per_second = None;

    let mut merged = base.clone();
    merged.created_unix = now_unix();
    merged.tool = Tool::current();
    merged.recommendation = Some(rec);
    merged.verified = Some(false);
    merged.sources = plans
        .iter()
        .zip(&failed_acc)
        .map(|((p, plan, r), f)| PlanSource {
            path: p.display().to_string(),
            device_kind: plan.device.kind,
            device_name: plan.device.name.clone(),
            max_fitting_batch: r.max_fitting_batch,
            smallest_failing_with_accumulation: *f,
        })
        .collect();
    merged.stop_detail = format!(
        "merged from {} plan{}: micro-batch limited by {} ({}, largest fitting {}); not verified on \
         this machine: run `batchfit verify` (it confirms each size with the plan's accumulation)",
        plans.len(),
        if plans.len() == 1 { "" } else { "s" },
        base_path.display(),
        base.device.name,
        max
    );
    merged.warnings = base.warnings.clone();
    merged.warnings.extend(notes);
    if let Some(w) = &s.warning {
        merged.warnings.push(w.clone());
    }
    Ok(merged)
}

/// The smallest micro-batch that ran out of memory with gradient accumulation in `plan` (its own
/// trials, and what its sources reported when it is itself a merged plan).
pub fn smallest_failing_with_accumulation(plan: &Plan) -> Option<u64> {
    plan.trials
        .iter()
        .filter(|t| t.accumulation > 1 && t.outcome.is_bound())
        .map(|t| t.batch)
        .chain(
            plan.sources
                .iter()
                .filter_map(|s| s.smallest_failing_with_accumulation),
        )
        .min()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    (a / gcd(a, b).max(1)).saturating_mul(b)
}
