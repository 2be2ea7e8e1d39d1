//! Plans across machines: `batchfit merge` (one plan from several nodes' or GPU types' plans) and
//! `batchfit verify` (confirmation trials of a plan's micro-batch sizes on this machine).
//!
//! A merged plan is `verified: false`: its micro-batch was proven on the smallest source device, not
//! necessarily here; `batchfit-train` refuses it until `batchfit verify` re-runs the sizes here, with
//! the very confirmation trial of the probe ([`Prober::confirm`]) under the plan's limit.

use crate::accumulate;
use crate::backend::cpu::{CpuBackend, IsolationMode};
use crate::backend::sim::{SimBackend, SimSpec};
use crate::backend::Backend;
use crate::config;
use crate::plan::{Plan, PlanError, PlanSource, Recommendation, Status, Tool};
use crate::probe::Progress;
use crate::search::{Prober, Purpose, SearchConfig, Stop};
use crate::trial::TrialSpec;
use crate::units::format_size;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum JobError {
    /// Bad input: plans that cannot be combined or verified (exit 2).
    #[error("{0}")]
    Usage(String),
    /// A plan that cannot be read (exit 2).
    #[error(transparent)]
    Read(PlanError),
    /// The device or environment cannot run trials (exit 3).
    #[error("{0}")]
    Environment(String),
    /// The result cannot be written (exit 3).
    #[error("cannot write the plan: {0}")]
    Write(PlanError),
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
pub fn merge(opts: &MergeOptions) -> Result<Plan, JobError> {
    if opts.plans.is_empty() {
        return Err(JobError::Usage("merge needs at least one plan".into()));
    }
    accumulate::check_global(opts.global_batch, opts.world_size)
        .map_err(|e| JobError::Usage(e.to_string()))?;
    let mut plans = vec![];
    for p in &opts.plans {
        let plan = Plan::read(p).map_err(JobError::Read)?;
        let rec = match (&plan.status, &plan.recommendation) {
            (Status::Complete, Some(r)) => r.clone(),
            _ => {
                return Err(JobError::Usage(format!(
                "{} is not a complete plan (status {:?}: {}); only complete plans can be merged",
                p.display(),
                plan.status,
                plan.stop_detail
            )))
            }
        };
        if plan.model.config.fingerprint() != plan.model.fingerprint {
            return Err(JobError::Usage(format!(
                "{}: its model fingerprint does not match its model config; the plan was edited",
                p.display()
            )));
        }
        plans.push((p, plan, rec));
    }
    let (first_path, first, _) = &plans[0];
    for (p, plan, _) in &plans[1..] {
        if plan.model.fingerprint != first.model.fingerprint {
            return Err(JobError::Usage(format!(
                "{} and {} were made for different models ({} {} vs {} {}); merge plans of one model only",
                first_path.display(),
                p.display(),
                first.model.name,
                &first.model.fingerprint.get(..12).unwrap_or(&first.model.fingerprint),
                plan.model.name,
                &plan.model.fingerprint.get(..12).unwrap_or(&plan.model.fingerprint),
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
        .map_err(|e| JobError::Usage(e.to_string()))?;
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
            device_kind: plan.device.kind.clone(),
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

/// How a verification ended.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifyEnding {
    Verified,
    /// A confirmation trial did not fit (or failed): why.
    Failed(String),
    Interrupted(i32),
}

#[derive(Debug)]
pub struct VerifyReport {
    pub plan: Plan,
    pub ending: VerifyEnding,
}

/// Runs confirmation trials of every size of the plan's micro-batches (largest first, with the plan's
/// steps and confirm steps) on this machine's backend of the plan's kind, under
/// `(budget − reserve) × (1 − margin)` from the plan. The trials are appended to the plan's `trials`;
/// on success the plan is `verified: true` and its `device` is this machine's.
/// `sim` replaces the plan's simulated device (`sim_spec`).
pub fn verify(
    plan: &Plan,
    exe: &Path,
    sim: Option<SimSpec>,
    progress: &mut dyn Progress,
) -> Result<VerifyReport, JobError> {
    let rec = match (&plan.status, &plan.recommendation) {
        (Status::Complete, Some(r)) => r.clone(),
        _ => {
            return Err(JobError::Usage(format!(
                "the plan is not complete (status {:?}: {}); there is nothing to verify",
                plan.status, plan.stop_detail
            )))
        }
    };
    if plan.model.config.fingerprint() != plan.model.fingerprint {
        return Err(JobError::Usage(
            "the plan's model fingerprint does not match its model config; the plan was edited"
                .into(),
        ));
    }
    if sim.is_some() && plan.device.kind != "sim" {
        return Err(JobError::Usage(
            "--sim is only used with plans of the sim backend".into(),
        ));
    }
    let template = TrialSpec {
        model: plan.model.config.clone(),
        batch: 0,
        steps: 0,
        threads: plan.runtime.threads,
        seed: plan.runtime.seed,
        accumulation: 1,
        fault: None,
        cuda_device: None,
    };
    let timeout = Duration::from_secs_f64(plan.search.trial_timeout_seconds.max(1.0));
    let mut backend: Box<dyn Backend> = match plan.device.kind.as_str() {
        "sim" => {
            let spec = sim.or_else(|| plan.sim_spec.clone()).ok_or_else(|| {
                JobError::Usage(
                    "this sim plan does not record its simulated device (sim_spec); give --sim SPEC".into(),
                )
            })?;
            Box::new(SimBackend::new(spec))
        }
        "cpu" => Box::new(
            CpuBackend::new(exe.to_path_buf(), template, timeout, IsolationMode::Process)
                .map_err(|e| JobError::Environment(e.to_string()))?,
        ),
        "cuda" => Box::new(
            crate::probe::standalone_cuda_backend(
                plan.gpu.as_ref().map_or(0, |g| g.index),
                template,
                plan.gpu.as_ref().and_then(|g| g.alloc_conf.clone()),
                timeout,
                exe,
            )
            .map_err(JobError::Environment)?,
        ),
        other => {
            return Err(JobError::Usage(format!(
                "unknown device kind {other:?} in the plan"
            )))
        }
    };
    let device = backend.device().clone();
    if plan.budget_bytes > device.total_bytes {
        return Err(JobError::Usage(format!(
            "the plan's budget {} is larger than this device's {} ({}); probe here instead",
            format_size(plan.budget_bytes),
            format_size(device.total_bytes),
            device.name
        )));
    }
    let limit = config::limit(plan.budget_bytes, plan.reserve_bytes, plan.margin);
    let search = SearchConfig {
        strategy: plan.search.strategy,
        steps: plan.search.steps,
        confirm_steps: plan.search.confirm_steps,
        min_batch: plan.search.min_batch,
        max_batch: plan.search.max_batch,
        multiple_of: plan.search.multiple_of,
        max_trials: None,
        time_limit: None,
        allow_retries: plan.search.allow_retries,
    };
    progress.line(&format!(
        "batchfit: verifying micro-batches {:?} of {} on {} ({}): limit {}",
        rec.micro_batches,
        plan.model.name,
        device.kind,
        device.name,
        format_size(limit)
    ));
    let mut sizes = rec.micro_batches.clone();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let (ending, trials) = {
        let progress = &mut *progress;
        let mut prober = Prober::new(backend.as_mut(), search, limit)
            .on_trial(move |t, all| progress.trial(all.len(), t, limit));
        let mut ending = VerifyEnding::Verified;
        for b in sizes {
            match prober.confirm(b, Purpose::Confirm) {
                Ok(true) => {}
                Ok(false) => {
                    let why = prober
                        .trials()
                        .last()
                        .and_then(|t| t.outcome.message().map(String::from))
                        .unwrap_or_default();
                    ending = VerifyEnding::Failed(format!(
                        "micro-batch {b} did not fit under the {} limit on {} ({}): {why}",
                        format_size(limit),
                        device.name,
                        prober.trials().last().map_or("", |t| t.outcome.kind())
                    ));
                    break;
                }
                Err(Stop::Interrupted(sig)) => {
                    ending = VerifyEnding::Interrupted(sig);
                    break;
                }
                Err(Stop::Fatal(m)) => return Err(JobError::Environment(m)),
                Err(Stop::Reason(r)) => {
                    ending = VerifyEnding::Failed(r.describe().to_string());
                    break;
                }
            }
        }
        (ending, prober.trials().to_vec())
    };
    let mut out = plan.clone();
    out.trials.extend(trials.iter().cloned());
    match &ending {
        VerifyEnding::Verified => {
            out.verified = Some(true);
            out.device = device.clone();
            out.limit_bytes = limit;
            if let (Some(r), Some(t)) = (
                out.recommendation.as_mut(),
                trials
                    .iter()
                    .filter(|t| t.batch == rec.micro_batch && t.outcome.fits())
                    .max_by_key(|t| t.steps),
            ) {
                r.peak_bytes = t.outcome.peak_bytes().unwrap_or(r.peak_bytes);
                if let Some(s) = t.outcome.step_seconds().filter(|s| *s > 0.0) {
                    r.samples_per_second = t.batch as f64 / s;
                }
            }
            out.stop_detail = format!(
                "verified on {} ({}) at {}",
                device.name,
                device.kind,
                crate::cache::format_date(now_unix())
            );
        }
        VerifyEnding::Failed(why) => {
            out.verified = Some(false);
            out.warnings.push(format!("verification failed: {why}"));
        }
        VerifyEnding::Interrupted(_) => {
            out.verified = Some(false);
            out.warnings.push("verification interrupted".into());
        }
    }
    Ok(VerifyReport { plan: out, ending })
}
