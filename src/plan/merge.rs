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
/// saw fail with accumulation (out of memory, or above its noise ceiling). Refuses plans of
/// different models, plans that are not complete, and plans whose verification failed. The result
/// is `verified: false` and lists its sources.
pub fn merge(opts: &MergeOptions) -> Result<Plan, MergeError> {
    if opts.plans.is_empty() {
        return Err(MergeError::Usage("merge needs at least one plan".into()));
    }
    accumulate::check_global(opts.global_batch, opts.world_size)
        .map_err(|e| MergeError::Usage(e.to_string()))?;
    let sources = opts
        .plans
        .iter()
        .map(Source::read)
        .collect::<Result<Vec<_>, _>>()?;
    check_one_model(&sources)?;
    check_all_real_or_all_simulated(&sources)?;
    let base = base_source(&sources);
    // A size that ran out of memory *with accumulation* on any source is not a size to accumulate
    // with, whatever max_fitting_batch (measured at accumulation 1) says.
    let failed_acc: Vec<Option<u64>> = sources
        .iter()
        .map(|s| smallest_failing_with_accumulation(&s.plan))
        .collect();
    let (split, notes) = split_for(opts, &sources, base, &failed_acc)?;
    Ok(merged_plan(&sources, base, &failed_acc, &split, notes))
}

/// One source plan: where it was read from, and its recommendation (a source is complete).
struct Source<'a> {
    path: &'a PathBuf,
    plan: Plan,
    rec: Recommendation,
}

impl<'a> Source<'a> {
    /// Reads `path`, refusing a plan that is not complete or whose model config was edited.
    fn read(path: &'a PathBuf) -> Result<Source<'a>, MergeError> {
        let plan = Plan::read(path).map_err(MergeError::Read)?;
        let rec = match (&plan.status, &plan.recommendation) {
            (Status::Complete, Some(r)) => r.clone(),
            _ => {
                return Err(MergeError::Usage(format!(
                    "{} is not a complete plan (status {}: {}); only complete plans can be merged",
                    path.display(),
                    plan.status.as_str(),
                    plan.stop_detail
                )))
            }
        };
        if plan.failed_verification() {
            // its device and bracket are still the ones its verify did not confirm: merged, they
            // would stand for a machine on which its sizes did not hold
            return Err(MergeError::Usage(format!(
                "{} failed its verification ({}), so it describes no machine its sizes hold on: \
                 probe the machine that verified it (batchfit probe) and merge that plan",
                path.display(),
                plan.verification_failure
                    .as_deref()
                    .unwrap_or("verified: false")
            )));
        }
        if !plan.model.fingerprint_matches() {
            return Err(MergeError::Usage(format!(
                "{}: its model fingerprint does not match its model config; the plan was edited",
                path.display()
            )));
        }
        Ok(Source { path, plan, rec })
    }
}

/// Refuses sources made for different models (by fingerprint).
fn check_one_model(sources: &[Source]) -> Result<(), MergeError> {
    let first = &sources[0];
    let (first_path, first) = (first.path, &first.plan);
    for Source { path, plan, .. } in &sources[1..] {
        if plan.model.fingerprint() != first.model.fingerprint() {
            return Err(MergeError::Usage(format!(
                "{} and {} were made for different models ({} {} vs {} {}); merge plans of one model only",
                first_path.display(),
                path.display(),
                first.model.name(),
                short(first.model.fingerprint()),
                plan.model.name(),
                short(plan.model.fingerprint()),
            )));
        }
    }
    Ok(())
}

/// A simulated plan proves nothing about a real device: never combined with one.
fn check_all_real_or_all_simulated(sources: &[Source]) -> Result<(), MergeError> {
    let is_sim = |p: &Plan| p.device.kind.as_str() == "sim";
    let first = &sources[0];
    let Some(other) = sources[1..]
        .iter()
        .find(|s| is_sim(&s.plan) != is_sim(&first.plan))
    else {
        return Ok(());
    };
    let (sim, real) = if is_sim(&first.plan) {
        (first.path, other.path)
    } else {
        (other.path, first.path)
    };
    Err(MergeError::Usage(format!(
        "{} is a simulated plan (--backend sim) and {} was measured on a real device; a \
         simulation proves nothing about a device: merge plans of real devices only",
        sim.display(),
        real.display()
    )))
}

/// The base: the source with the smallest proven size (ties: the first given).
fn base_source<'s, 'a>(sources: &'s [Source<'a>]) -> &'s Source<'a> {
    let i = (0..sources.len())
        .min_by_key(|&i| (sources[i].rec.max_fitting_batch, i))
        .expect("at least one plan");
    &sources[i]
}

/// The split of the global batch at most the base's largest fitting size, on sizes every source
/// could have tried (multiples of all their --multiple-of, at least the largest --min-batch), and
/// below the smallest size any source saw fail with accumulation; with the notes that
/// say when that last bound moved it.
fn split_for(
    opts: &MergeOptions,
    sources: &[Source],
    base: &Source,
    failed_acc: &[Option<u64>],
) -> Result<(accumulate::Split, Vec<String>), MergeError> {
    let sizes = accumulate::Sizes::new(
        sources
            .iter()
            .fold(1, |k, s| lcm(k, s.plan.search.multiple_of.max(1))),
        sources
            .iter()
            .map(|s| s.plan.search.min_batch)
            .max()
            .unwrap_or(1),
    );
    let split_below = |max| {
        accumulate::split_on(
            opts.global_batch,
            opts.world_size,
            max,
            opts.allow_uneven,
            sizes,
        )
    };
    let s =
        split_below(base.rec.max_fitting_batch).map_err(|e| MergeError::Usage(e.to_string()))?;
    let Some((i, fail)) = failed_acc
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.map(|f| (i, f)))
        .min_by_key(|&(_, f)| f)
    else {
        return Ok((s, vec![]));
    };
    if s.accumulation <= 1 || s.micro_batch < fail {
        return Ok((s, vec![]));
    }
    let path = sources[i].path.display();
    let failed = if above_noise_with_accumulation(&sources[i].plan) == Some(fail) {
        "peaked above the ceiling its measured noise leaves under the limit"
    } else {
        "ran out of memory"
    };
    let s = split_below(fail - 1).map_err(|e| {
        MergeError::Usage(format!(
            "{e} ({path} {failed} at micro-batch {fail} with gradient accumulation, so the split \
             must stay below it)"
        ))
    })?;
    let note = format!(
        "{path} {failed} at micro-batch {fail} with gradient accumulation, although larger sizes \
         fit alone there; the merged split stays below {fail}"
    );
    Ok((s, vec![note]))
}

/// The merged recommendation: with the base plan's measurements of the chosen size when it ran it
/// at the split's accumulation, else the base's recommendation with the split's numbers and no
/// measurements.
fn recommendation_for(base: &Source, s: &accumulate::Split) -> Recommendation {
    let max = base.rec.max_fitting_batch;
    let measured = super::recommended_fit(
        &base.plan.trials,
        s.micro_batch,
        u32::try_from(s.accumulation).unwrap_or(u32::MAX),
        base.plan.confirmation_steps(),
    );
    let mut rec = match measured {
        Some(t) => Recommendation::from_split(s, max, base.rec.first_failing_batch, t),
        None => {
            let mut r = base.rec.clone();
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
    rec
}

/// The base plan with the merged recommendation, `verified: false`, its sources listed and the
/// notes and split's warning added to its warnings.
fn merged_plan(
    sources: &[Source],
    base: &Source,
    failed_acc: &[Option<u64>],
    s: &accumulate::Split,
    notes: Vec<String>,
) -> Plan {
    let mut merged = base.plan.clone();
    merged.created_unix = now_unix();
    merged.tool = Tool::current();
    merged.recommendation = Some(recommendation_for(base, s));
    merged.verified = Some(false);
    merged.verification_failure = None;
    merged.sources = sources
        .iter()
        .zip(failed_acc)
        .map(|(src, f)| PlanSource {
            path: src.path.display().to_string(),
            device_kind: src.plan.device.kind,
            device_name: src.plan.device.name.clone(),
            max_fitting_batch: src.rec.max_fitting_batch,
            smallest_failing_with_accumulation: *f,
        })
        .collect();
    merged.stop_detail = format!(
        "merged from {} plan{}: micro-batch limited by {} ({}, largest fitting {}); not verified on \
         this machine: run `batchfit verify` (it confirms each size with the plan's accumulation)",
        sources.len(),
        if sources.len() == 1 { "" } else { "s" },
        base.path.display(),
        base.plan.device.name,
        base.rec.max_fitting_batch
    );
    merged.warnings = base.plan.warnings.clone();
    merged.warnings.extend(notes);
    if let Some(w) = &s.warning {
        merged.warnings.push(w.clone());
    }
    merged
}

/// The smallest micro-batch that failed with gradient accumulation in `plan`: ran out of memory, or
/// fit only above the ceiling its measured noise leaves ([`above_noise_with_accumulation`]); its own
/// trials, and what its sources reported when it is itself a merged plan.
pub fn smallest_failing_with_accumulation(plan: &Plan) -> Option<u64> {
    plan.trials
        .iter()
        .filter(|t| t.accumulation > 1 && t.outcome.is_bound())
        .map(|t| t.batch)
        .chain(above_noise_with_accumulation(plan))
        .chain(
            plan.sources
                .iter()
                .filter_map(|s| s.smallest_failing_with_accumulation),
        )
        .min()
}

/// The smallest micro-batch whose fresh fits with gradient accumulation (at one accumulation, with
/// the confirmation's steps) break the plan's noise ceiling, the rule the probe recomputed its split
/// by ([`crate::search::noise::above_noise`]): a fresh run of it may not fit, so it bounds the split
/// like an out-of-memory.
fn above_noise_with_accumulation(plan: &Plan) -> Option<u64> {
    let steps = plan.confirmation_steps();
    let mut runs: std::collections::BTreeMap<(u64, u32), Vec<u64>> = Default::default();
    for t in plan
        .trials
        .iter()
        .filter(|t| t.accumulation > 1 && t.fresh_fit_at(steps, t.accumulation))
    {
        if let Some(f) = t.footprint() {
            runs.entry((t.batch, t.accumulation)).or_default().push(f);
        }
    }
    runs.into_iter()
        .filter(|(_, fits)| {
            crate::search::noise::above_noise(
                fits,
                plan.search.noise_spread_bytes,
                plan.job_limit_bytes(),
                plan.limit_bytes,
            )
            .is_some()
        })
        .map(|((b, _), _)| b)
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
