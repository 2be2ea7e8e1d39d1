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
/// for `global_batch` over `world_size` ranks. Refuses plans of different models and plans that are
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
                "{} is not a complete plan (status {:?}: {}); only complete plans can be merged",
                p.display(),
                plan.status,
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
    let s = accumulate::split(opts.global_batch, opts.world_size, max, opts.allow_uneven)
        .map_err(|e| MergeError::Usage(e.to_string()))?;
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
        .map(|(p, plan, r)| PlanSource {
            path: p.display().to_string(),
            device_kind: plan.device.kind,
            device_name: plan.device.name.clone(),
            max_fitting_batch: r.max_fitting_batch,
        })
        .collect();
    merged.stop_detail = format!(
        "merged from {} plans: micro-batch limited by {} ({}, largest fitting {}); not verified on \
         this machine: run `batchfit verify`",
        plans.len(),
        base_path.display(),
        base.device.name,
        max
    );
    merged.warnings = base.warnings.clone();
    if let Some(w) = &s.warning {
        merged.warnings.push(w.clone());
    }
    Ok(merged)
}
