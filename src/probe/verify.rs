//! `batchfit verify`: confirmation trials of a plan's micro-batch sizes on this machine, each with
//! the plan's accumulation (as the trainer will run it), with the probe's own set-up
//! ([`super::setup::plan_backend`]) and confirmation ([`Prober::confirm_split`]). On the plan's own
//! device they run under the job's limit, what the plan promises a run of its answer; elsewhere
//! under the trials' limit (the job's less the guard band), as the probe proved its answer.

use super::report::{ProbeError, Progress};
use super::setup;
use crate::config;
use crate::device::sim::SimSpec;
use crate::device::{DeviceInfo, DeviceKind};
use crate::plan::{Plan, Status};
use crate::platform::now_unix;
use crate::platform::units::format_size;
use crate::search::{Confirmation, Prober, Purpose, SearchConfig, Stop, TrialRecord};

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
/// steps and confirm steps) on this machine's backend of the plan's kind, under the job's limit
/// `(budget − reserve) × (1 − margin)` from the plan, or elsewhere that less the plan's guard band.
/// The trials are appended to the plan's `trials`; on success the plan is `verified: true` and its
/// `device` is this machine's.
/// `sim` replaces the plan's simulated device (`sim_spec`); `observe` watches a command's DataLoaders
/// (`--observe`).
pub fn verify(
    plan: &Plan,
    sim: Option<SimSpec>,
    observe: bool,
    progress: &mut dyn Progress,
) -> Result<VerifyReport, ProbeError> {
    let rec = verifiable_recommendation(plan, sim.is_some())?;
    // The curve a sim plan is verified on (`--sim`, or its own).
    let sim_used = sim.clone().or_else(|| plan.sim_spec.clone());
    let mut backend = setup::plan_backend(plan, sim, observe)?;
    let here = Here::of(plan, backend.device().clone(), sim_used);
    let device = &here.device;
    if plan.budget_bytes > device.total_bytes {
        return Err(ProbeError::Usage(format!(
            "the plan's budget {} is larger than this device's {} ({}); probe here instead",
            format_size(plan.budget_bytes),
            format_size(device.total_bytes),
            device.name
        )));
    }
    let (limit, job) = limits(plan)?;
    // On the plan's own device its sizes run under the job's limit, what the plan promises (under
    // the trials' own, the answer's runs that drew high at the noisy edge the probe stopped at
    // failed right plans); elsewhere under the trials' limit, as the probe proved them.
    let run_under = if here.elsewhere { limit } else { job };
    progress.line(&format!(
        "batchfit: verifying micro-batches {} of {} on {} ({}): limit {}{}",
        crate::plan::describe_micro_batches(&rec.micro_batches),
        plan.model.name(),
        device.kind,
        device.name,
        format_size(run_under),
        if run_under > limit {
            " (the job's)"
        } else {
            ""
        }
    ));
    let (ending, trials, spread) = {
        let progress = &mut *progress;
        let mut prober = Prober::new(backend.as_mut(), search_config(plan), run_under)
            .on_trial(move |t, all| progress.trial(all.len(), t, run_under));
        let ending = confirm_plan(&mut prober, plan, &rec, &here, run_under)?;
        (ending, prober.trials().to_vec(), prober.noise_spread())
    };
    let mut out = plan.clone();
    let first_here = out.trials.len();
    out.trials.extend(trials);
    match &ending {
        VerifyEnding::Verified => {
            mark_verified(&mut out, plan, &here, limit, first_here, spread);
        }
        VerifyEnding::Failed(why) => {
            failed_elsewhere(&mut out, &here, first_here);
            out.verified = Some(false);
            out.verification_failure = Some(why.clone());
            out.warnings.push(format!("verification failed: {why}"));
        }
        VerifyEnding::Interrupted(_) => {
            // no verdict: the plan keeps its state (a plan refused after an interruption could
            // never be verified again), with the runs that finished
            failed_elsewhere(&mut out, &here, first_here);
            out.warnings.push(format!(
                "a verification was interrupted after {} of its runs; the plan's verification \
                 state is as it was",
                out.trials.len() - first_here
            ));
        }
    }
    Ok(VerifyReport { plan: out, ending })
}

/// The trials' limit (the budget's limit less the guard band, as the probe set it) and the job's
/// limit the plan promises (`limit_bytes` plus `guard_band_bytes`, never above the budget's limit).
/// A plan whose `limit_bytes` or `guard_band_bytes` is not what its budget's limit and guard band
/// give was edited: verified, it would promise a limit its runs never had.
fn limits(plan: &Plan) -> Result<(u64, u64), ProbeError> {
    let budget_limit = config::limit(plan.budget_bytes, plan.reserve_bytes, plan.margin);
    let limit = setup::guarded(budget_limit, plan.guard_band);
    let band = budget_limit - limit;
    if limit != plan.limit_bytes || plan.guard_band_bytes.is_some_and(|b| b != band) {
        return Err(ProbeError::Usage(format!(
            "the plan's limits disagree with its budget: limit_bytes {} and guard_band_bytes {} \
             where its budget's limit {} less its guard band gives {} and {}; the plan was \
             edited, so what it promises cannot be checked: probe again (batchfit probe …) and \
             verify that plan",
            plan.limit_bytes,
            plan.guard_band_bytes
                .map_or("(none)".into(), |b| b.to_string()),
            budget_limit,
            limit,
            band
        )));
    }
    Ok((limit, plan.job_limit_bytes().min(budget_limit)))
}

/// A verification that did not verify leaves the plan describing its device: trials from
/// `first_here` on, when they ran on another, are not that device's.
fn failed_elsewhere(out: &mut Plan, here: &Here, first_here: usize) {
    if here.elsewhere && first_here < out.trials.len() {
        out.trials_elsewhere.push((first_here, out.trials.len()));
    }
}

/// The recommendation of a plan that can be verified: a complete one, whose model config is the one
/// its fingerprint names, given `--sim` only when it is a sim plan.
fn verifiable_recommendation(
    plan: &Plan,
    sim_given: bool,
) -> Result<crate::plan::Recommendation, ProbeError> {
    let rec = match (&plan.status, &plan.recommendation) {
        (Status::Complete, Some(r)) => r.clone(),
        _ => {
            return Err(ProbeError::Usage(format!(
                "the plan is not complete (status {}: {}); there is nothing to verify",
                plan.status, plan.stop_detail
            )))
        }
    };
    if plan.failed_verification() {
        // a size that did not fit once does not keep the promise however often it fits after
        return Err(ProbeError::Usage(format!(
            "the plan failed its verification ({}): its answer did not fit a run, which no later \
             run can undo; probe this machine again (batchfit probe …) and verify that plan",
            plan.verification_failure
                .as_deref()
                .unwrap_or("verified: false")
        )));
    }
    if !plan.model.fingerprint_matches() {
        return Err(ProbeError::Usage(
            "the plan's model fingerprint does not match its model config; the plan was edited"
                .into(),
        ));
    }
    if sim_given && plan.device.kind != DeviceKind::Sim {
        return Err(ProbeError::Usage(
            "--sim is only used with plans of the sim backend".into(),
        ));
    }
    Ok(rec)
}

/// Where the verification's trials run, and whether that is elsewhere than the plan was proven.
struct Here {
    device: DeviceInfo,
    /// The curve a sim plan is verified on.
    sim_used: Option<SimSpec>,
    /// The torch the trials run on, when batchfit knows it.
    torch: Option<String>,
    /// The plan was proven on another torch (another version or build): its sizes allocate
    /// differently.
    other_torch: bool,
    /// Another device (or another simulated curve: its name shows only three of the curve's
    /// numbers), or another torch: the plan's bracket was proven there, not here.
    elsewhere: bool,
}

impl Here {
    fn of(plan: &Plan, device: DeviceInfo, sim_used: Option<SimSpec>) -> Here {
        // The torch this verification's trials run on (batchfit's own model on cpu or cuda; a
        // user's command runs its own, and sim runs none), as a probe records it in the plan's
        // `tool`.
        let torch = match (&plan.model, device.kind) {
            (crate::plan::WorkloadInfo::Model(_), DeviceKind::Cpu | DeviceKind::Cuda) => {
                crate::workload::runner::Runner::locate()
                    .ok()
                    .map(|r| r.torch.version)
            }
            _ => None,
        };
        let other_torch = matches!(
            (&plan.tool.libtorch_version, &torch),
            (Some(then), Some(now)) if then != now
        );
        let elsewhere = plan.device.kind != device.kind
            || plan.device.name != device.name
            || plan.device.total_bytes != device.total_bytes
            || (device.kind == DeviceKind::Sim && sim_used != plan.sim_spec)
            || other_torch;
        Here {
            device,
            sim_used,
            torch,
            other_torch,
            elsewhere,
        }
    }
}

/// The search settings of the plan's probe, without its trial and time limits or prior.
fn search_config(plan: &Plan) -> SearchConfig {
    SearchConfig {
        strategy: plan.search.strategy,
        steps: plan.search.steps,
        confirm_steps: plan.search.confirm_steps,
        min_batch: plan.search.min_batch,
        max_batch: plan.search.max_batch,
        multiple_of: plan.search.multiple_of,
        max_trials: None,
        time_limit: None,
        allow_retries: plan.search.allow_retries,
        tolerance: plan.search.tolerance.unwrap_or(0.0),
        prior: None,
        repeats: plan.search.repeats,
    }
}

/// Confirms each distinct size of the plan's micro-batches, largest first, with its accumulation;
/// then, when verifying elsewhere than the plan was proven, its bracket too.
fn confirm_plan(
    prober: &mut Prober,
    plan: &Plan,
    rec: &crate::plan::Recommendation,
    here: &Here,
    limit: u64,
) -> Result<VerifyEnding, ProbeError> {
    let ending = confirm_sizes(prober, plan, rec, here, limit)?;
    if ending != VerifyEnding::Verified || !here.elsewhere {
        return Ok(ending);
    }
    // The verified plan names this device, and its bracket (largest fitting size, first failing
    // size) is what it claims of it: on another device that claim was proven there only, so it
    // is checked here too, or the verification fails (a plan proven at 2247/2258 on one device,
    // verified on one where 2162 is the largest, said "largest fitting micro-batch: 2247 (fits
    // at 2247, 2258 runs out of memory)" of the new one).
    let name = match &here.torch {
        Some(v) if here.other_torch => format!("{} on PyTorch {v}", here.device.name),
        _ => here.device.name.clone(),
    };
    Ok(check_bracket(prober, plan, rec, &name)
        .err()
        .unwrap_or(ending))
}

/// Confirms each distinct size of `rec`'s micro-batches, largest first, with its accumulation, as
/// often as the plan's probe ran its answer, each run held to the noise ceiling ([`run_held`]): the
/// plan's promise, checked as it was made. The first size that does not hold ends the verification.
fn confirm_sizes(
    prober: &mut Prober,
    plan: &Plan,
    rec: &crate::plan::Recommendation,
    here: &Here,
    limit: u64,
) -> Result<VerifyEnding, ProbeError> {
    let device = &here.device.name;
    let mut sizes = rec.micro_batches.clone();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let acc = u32::try_from(rec.accumulation).unwrap_or(u32::MAX);
    for b in sizes {
        let ending = match run_held(prober, plan, here.elsewhere, b, acc) {
            Ok(None) => continue,
            Ok(Some(NotHeld::AboveNoise(why))) => VerifyEnding::Failed(why),
            Ok(Some(NotHeld::Failed(why))) => VerifyEnding::Failed(format!(
                "micro-batch {b} × accumulation {acc} could not be confirmed on {device}: {why}"
            )),
            Ok(Some(NotHeld::OutOfMemory)) => {
                let last = prober.trials().last();
                let why = last
                    .and_then(|t| t.outcome.message().map(String::from))
                    .unwrap_or_default();
                VerifyEnding::Failed(format!(
                    "micro-batch {b} × accumulation {acc} did not fit under the {} limit on {device} ({}): {why}",
                    format_size(limit),
                    last.map_or("", |t| t.outcome.kind())
                ))
            }
            Err(Stop::Interrupted(sig)) => VerifyEnding::Interrupted(sig),
            Err(Stop::Fatal(m)) => return Err(ProbeError::Environment(m)),
            Err(Stop::Reason(r)) => VerifyEnding::Failed(r.describe().to_string()),
        };
        return Ok(ending);
    }
    Ok(VerifyEnding::Verified)
}

/// How the runs of one size ended where they did not hold the plan's promise.
enum NotHeld {
    OutOfMemory,
    /// An error or a timeout, twice: no evidence either way.
    Failed(String),
    /// It fit, above the ceiling the job's noise leaves under its limit.
    AboveNoise(String),
}

/// Runs `b` at `acc` with the confirmation's steps until it has fit as often as the plan's probe
/// ran its answer (`1 + search.repeats` fresh fits in this verification), each fit held to the
/// noise ceiling ([`above_ceiling`]: elsewhere after every run, on the plan's own device once they
/// are all in, since it reads their lowest); the first run that does not hold ends it.
fn run_held(
    prober: &mut Prober,
    plan: &Plan,
    elsewhere: bool,
    b: u64,
    acc: u32,
) -> Result<Option<NotHeld>, Stop> {
    let needed = 1 + plan.search.repeats as usize;
    let mut run = prober.confirm_split(b, acc, Purpose::Confirm)?;
    loop {
        match run {
            Confirmation::Fits => {}
            Confirmation::OutOfMemory => return Ok(Some(NotHeld::OutOfMemory)),
            Confirmation::Failed(why) => return Ok(Some(NotHeld::Failed(why))),
            Confirmation::AboveNoise { why, .. } => return Ok(Some(NotHeld::AboveNoise(why))),
        }
        // elsewhere the highest run is held, and one above the ceiling ends it at once; on the
        // plan's own device the lowest, once all the runs are in
        let done = fresh_fits(prober.trials(), plan, b, acc).len() >= needed;
        if done || elsewhere {
            if let Some(why) = above_ceiling(prober, plan, elsewhere, b, acc) {
                return Ok(Some(NotHeld::AboveNoise(why)));
            }
        }
        if done {
            return Ok(None);
        }
        run = prober.repeat_split(b, acc)?;
    }
}

/// The footprints of the fresh fits of `b` at exactly `acc` with the confirmation's steps.
fn fresh_fits<'a>(
    trials: impl IntoIterator<Item = &'a TrialRecord>,
    plan: &Plan,
    b: u64,
    acc: u32,
) -> Vec<u64> {
    let steps = plan.confirmation_steps();
    trials
        .into_iter()
        .filter(|t| t.batch == b && t.fresh_fit_at(steps, acc))
        .filter_map(|t| t.footprint())
        .collect()
}

/// Why the fits of `b` at `acc` break the plan's promise, if they do, once the job's noise (the
/// wider of the probe's measured spread and the spread of this verification's runs, scaled to the
/// whole range so few draws imply) is wider than the guard band:
///
/// * on the plan's own device its runs of `b` at `acc` count with these, draws of the same noise,
///   and a fresh run may reach the lowest of them all plus the noise, which must stay under the
///   job's limit ([`crate::search::noise::reach_above_limit`]): a plan the probe accepted is not
///   refused for drawing again (held to the highest, a run of verify above the probe's highest,
///   as likely as not, failed plans that were right);
/// * elsewhere only this device's runs count, few of them, so each is held as the probe holds its
///   answer's ([`crate::search::noise::above_noise`]: the highest plus the noise), the margin a
///   noise measured from three runs needs; a machine noisier than the probe's is held to its own.
fn above_ceiling(
    prober: &Prober,
    plan: &Plan,
    elsewhere: bool,
    b: u64,
    acc: u32,
) -> Option<String> {
    use crate::search::noise::{above_noise, reach_above_limit};
    let carried = if elsewhere {
        vec![]
    } else {
        fresh_fits(plan.device_trials(), plan, b, acc)
    };
    let mut fits = fresh_fits(prober.trials(), plan, b, acc);
    fits.extend(carried);
    let measured = plan.search.noise_spread_bytes.max(prober.noise_spread());
    let (job, limit) = (plan.job_limit_bytes(), plan.limit_bytes);
    let size = match acc {
        0 | 1 => format!("micro-batch {b}"),
        _ => format!("micro-batch {b} × accumulation {acc}"),
    };
    let (over, which) = if elsewhere {
        (above_noise(&fits, measured, job, limit)?, "highest")
    } else {
        (reach_above_limit(&fits, measured, job, limit)?, "lowest")
    };
    let runs = match fits.len() {
        1 => "its one run".to_string(),
        n => format!("the {which} of its {n} runs"),
    };
    let noise = if over.band {
        format!(
            "the guard band ({}, the noise it stands for: no run of it under the trials' {} \
             limit shows a narrower one)",
            format_size(over.spread),
            format_size(limit)
        )
    } else {
        format!(
            "the job's measured noise ({} between fresh runs)",
            format_size(over.spread)
        )
    };
    Some(format!(
        "{size} peaked at {} ({runs}), above the {} that {noise} leaves under the job's {} limit: \
         a fresh run may reach {}",
        format_size(over.top),
        format_size(over.ceiling),
        format_size(job),
        format_size(over.top.saturating_add(over.spread))
    ))
}

/// Makes `out` the verified plan of this machine: its device, torch, limit and curve; the trials
/// from `first_here` on as this device's (when it is another than the plan's); the job's noise the
/// wider of the plan's and `spread`, this verification's own (the probe's rule over its runs); and
/// the recommendation's peak and speed from this device's fits of it.
fn mark_verified(
    out: &mut Plan,
    plan: &Plan,
    here: &Here,
    limit: u64,
    first_here: usize,
    spread: Option<u64>,
) {
    let device = &here.device;
    out.verified = Some(true);
    out.verification_failure = None;
    if here.elsewhere {
        // The plan's line was measured on the plan's device; the trials here only confirm
        // sizes. Kept, it would be predicted from as this device's (`batchfit predict`).
        out.capacity_model = Some(crate::plan::CapacityModel::refused(format!(
            "the line was measured on {}{} and this plan was verified on {}{}: its trials \
             here confirm sizes, they do not measure a line; probe this device (batchfit \
             probe) for a capacity model of it",
            plan.device.name,
            on_torch(plan.tool.libtorch_version.as_deref()),
            device.name,
            on_torch(here.torch.as_deref()),
        )));
        // the trials before this verification's ran on another device
        out.trials_elsewhere = vec![(0, first_here)];
    }
    out.device = device.clone();
    // the trials that verified it ran on this torch
    if here.torch.is_some() {
        out.tool.libtorch_version = here.torch.clone();
    }
    out.limit_bytes = limit;
    if device.kind == DeviceKind::Sim {
        out.sim_spec = here.sim_used.clone();
    }
    out.search.noise_spread_bytes = plan.search.noise_spread_bytes.max(spread);
    let steps = out.confirmation_steps();
    if let Some(r) = out.recommendation.clone() {
        let acc = u32::try_from(r.accumulation).unwrap_or(u32::MAX);
        let fit = crate::plan::recommended_fit(out.device_trials(), r.micro_batch, acc, steps);
        let (peak, speed) = fit.map_or((None, None), |t| {
            let s = t.outcome.step_seconds().filter(|s| *s > 0.0);
            (t.outcome.peak_bytes(), s.map(|s| t.batch as f64 / s))
        });
        let rec = out.recommendation.as_mut().expect("cloned above");
        rec.peak_bytes = peak.unwrap_or(rec.peak_bytes);
        rec.samples_per_second = speed.unwrap_or(rec.samples_per_second);
    }
    out.stop_detail = format!(
        "verified on {} ({}) at {}",
        device.name,
        device.kind,
        super::cache::format_date(now_unix())
    );
}

/// ` on PyTorch VERSION`, or nothing when no torch is known.
fn on_torch(version: Option<&str>) -> String {
    version.map_or(String::new(), |v| format!(" on PyTorch {v}"))
}

/// Checks on this device the bracket `rec` claims: its largest fitting size fits alone with the
/// confirmation's steps as often as the probe ran its answer, each run under the noise ceiling
/// ([`run_held`]: claimed as this device's largest fit, it must hold as the probe's did), and its
/// first failing size runs out of memory (with the exploration's steps, as the probe's proof ran).
/// An error or a timeout is no evidence either way: the verification fails then too.
fn check_bracket(
    prober: &mut Prober,
    plan: &Plan,
    rec: &crate::plan::Recommendation,
    device: &str,
) -> Result<(), VerifyEnding> {
    let fail = |m: String| {
        VerifyEnding::Failed(format!(
            "{m}: the plan's bracket was proven on another device or torch and does not hold on \
             {device}; probe this device (batchfit probe) for its own"
        ))
    };
    let stop = |s: Stop| match s {
        Stop::Interrupted(sig) => VerifyEnding::Interrupted(sig),
        Stop::Fatal(m) => VerifyEnding::Failed(m),
        Stop::Reason(r) => VerifyEnding::Failed(r.describe().to_string()),
    };
    let b = rec.max_fitting_batch;
    match run_held(prober, plan, true, b, 1).map_err(stop)? {
        None => {}
        Some(NotHeld::OutOfMemory) => {
            return Err(fail(format!(
                "its largest fitting micro-batch {b} ran out of memory here"
            )))
        }
        Some(NotHeld::Failed(why)) => {
            return Err(fail(format!(
                "its largest fitting micro-batch {b} could not be confirmed here ({why})"
            )))
        }
        Some(NotHeld::AboveNoise(why)) => {
            return Err(fail(format!(
                "its largest fitting micro-batch fit here, but {why}"
            )))
        }
    }
    if let Some(f) = rec.first_failing_batch {
        let o = prober
            .trial(f, plan.search.steps.max(1), Purpose::Proof)
            .map_err(stop)?;
        if !o.is_bound() {
            return Err(fail(format!(
                "its first failing micro-batch {f} {} here",
                if o.fits() {
                    "fits".to_string()
                } else {
                    format!("ended in {} (no evidence)", o.kind())
                }
            )));
        }
    }
    Ok(())
}
