//! One device: the search, then (when it completes) the confirmed accumulation split, into a plan.
//! Like hyperfine's exporters, the partial plan is rewritten after every trial, so a crash or an
//! interruption keeps what was measured.

use super::report::{self, Ending, ProbeError, Progress};
use super::split::{self, SplitOutcome};
use crate::config::ProbeConfig;
use crate::device::Backend;
use crate::plan::{CapacityModel, Plan, Recommendation, Status};
use crate::search::{Prober, Purpose, SearchOutcome, Stop, StopReason, TrialRecord};

/// A search on one device, with the prober kept for the split's confirmations.
pub struct Searched<'b> {
    pub prober: Prober<'b>,
    pub outcome: SearchOutcome,
}

/// Runs the search on `backend` under `limit`, calling `on_trial` after every trial (progress, and
/// the partial plan rewritten); `gpu` is recorded in every trial of a multi-GPU probe.
pub fn search<'b>(
    cfg: &ProbeConfig,
    backend: &'b mut dyn Backend,
    limit: u64,
    gpu: Option<u32>,
    on_trial: impl FnMut(&TrialRecord, &[TrialRecord]) + 'b,
) -> Searched<'b> {
    let mut prober = Prober::new(backend, cfg.search.clone(), limit).on_trial(on_trial);
    if let Some(g) = gpu {
        prober = prober.on_gpu(g);
    }
    let outcome = prober.search();
    Searched { prober, outcome }
}

/// The single-device probe: search, split, plan (not yet written to `--out`).
pub fn run(
    cfg: &ProbeConfig,
    backend: &mut dyn Backend,
    skeleton: &Plan,
    limit: u64,
    progress: &mut dyn Progress,
) -> Result<(Plan, Ending), ProbeError> {
    let mut write_error = None;
    let (outcome, split) = {
        let partial_out = cfg.out.as_deref();
        let write_error = &mut write_error;
        let progress = &mut *progress;
        let Searched {
            mut prober,
            outcome,
        } = search(cfg, backend, limit, None, move |t, all| {
            progress.trial(all.len(), t, limit);
            let mut snap = skeleton.clone();
            snap.trials = all.to_vec();
            if let Err(e) = report::write(partial_out, &snap) {
                *write_error = Some(e);
            }
        });
        let split = match (outcome.max_fitting, outcome.stop_reason.is_complete()) {
            (Some(max), true) => {
                let (g, w) = cfg.global.unwrap_or((max * cfg.world_size, cfg.world_size));
                Some(split::confirmed(
                    g,
                    w,
                    max,
                    cfg.allow_uneven,
                    &mut |b, acc, retest| {
                        let purpose = if retest {
                            Purpose::Retry
                        } else {
                            Purpose::Split
                        };
                        prober.confirm_split(b, acc, purpose)
                    },
                ))
            }
            _ => None,
        };
        let outcome = SearchOutcome {
            trials: prober.trials().to_vec(),
            ..outcome
        };
        (outcome, split)
    };
    if let Some(e) = write_error {
        return Err(e);
    }
    Ok(assemble(cfg, skeleton, &outcome, split))
}

/// The plan of a finished search and its split: the trials, how the search stopped, the
/// recommendation when the split was proven.
pub fn assemble(
    cfg: &ProbeConfig,
    skeleton: &Plan,
    outcome: &SearchOutcome,
    split: Option<SplitOutcome>,
) -> (Plan, Ending) {
    let mut plan = skeleton.clone();
    plan.trials = outcome.trials.clone();
    plan.stop_reason = outcome.stop_reason;
    plan.stop_detail = outcome
        .fatal
        .clone()
        .unwrap_or_else(|| outcome.stop_reason.describe().to_string());
    let mut ending = Ending::of(outcome.stop_reason, outcome.interrupted_by);
    match split {
        Some(SplitOutcome { split, warnings }) => {
            plan.warnings.extend(warnings);
            match split {
                Ok(s) => {
                    let max = outcome.max_fitting.expect("split only with a fit");
                    let rec =
                        best_fit(&outcome.trials, s.micro_batch).expect("split size confirmed");
                    let mut r = Recommendation::from_split(&s, max, outcome.first_failing, rec);
                    if let Some(a) = crate::plan::throughput::advise(
                        &outcome.trials,
                        cfg.search.steps,
                        cfg.search.confirm_steps,
                        cfg.throughput_tolerance,
                        r.micro_batch,
                    ) {
                        r.fastest_micro_batch = Some(a.fastest.batch);
                        r.fastest_samples_per_second = Some(a.fastest.samples_per_second);
                    }
                    if let Some(w) = unproven_accumulation(cfg, &outcome.trials, &r) {
                        plan.warnings.push(w);
                    }
                    plan.recommendation = Some(r);
                    if let Some(w) = &s.warning {
                        plan.warnings.push(w.clone());
                    }
                    plan.status = Status::Complete;
                }
                Err(stop) => {
                    ending = stopped(&mut plan, stop);
                    plan.status = Status::Partial;
                }
            }
        }
        None => {
            plan.status = if ending == Ending::NothingFits {
                Status::NothingFits
            } else {
                Status::Partial
            };
        }
    }
    plan.capacity_model = CapacityModel::fit(&plan.trials, plan.limit_bytes);
    if let (Some(g), Some(r)) = (plan.gpu.as_mut(), plan.recommendation.as_ref()) {
        g.footprint_method = plan
            .trials
            .iter()
            .filter(|t| t.batch == r.micro_batch && t.outcome.fits())
            .find_map(|t| t.outcome.gpu().map(|m| m.method));
    }
    (plan, ending)
}

/// Records in `plan` why a stage after the search stopped; returns the ending.
pub fn stopped(plan: &mut Plan, stop: Stop) -> Ending {
    match stop {
        Stop::Interrupted(sig) => {
            plan.stop_reason = StopReason::Interrupted;
            plan.stop_detail = StopReason::Interrupted.describe().into();
            Ending::Interrupted(sig)
        }
        Stop::Reason(r) => {
            plan.stop_reason = r;
            plan.stop_detail = r.describe().into();
            Ending::of(r, None)
        }
        Stop::Fatal(m) => {
            plan.stop_reason = StopReason::TrialErrors;
            plan.stop_detail = m;
            Ending::TrialErrors
        }
    }
}

/// The fitting trial at `batch` that proves the most: the largest accumulation, then the most steps.
pub fn best_fit(trials: &[TrialRecord], batch: u64) -> Option<&TrialRecord> {
    trials
        .iter()
        .filter(|t| t.batch == batch && t.outcome.fits())
        .max_by_key(|t| (t.accumulation, t.steps))
}

/// A user's command proves a split only when it ran the accumulation it was given: the warning for
/// a recommended accumulation > 1 whose trials say (by their report) the command did not read it, or
/// cannot say (no report, no `{accumulation}` in its arguments).
fn unproven_accumulation(
    cfg: &ProbeConfig,
    trials: &[TrialRecord],
    r: &Recommendation,
) -> Option<String> {
    let exec = cfg.exec.as_ref()?;
    if r.accumulation <= 1 {
        return None;
    }
    let placeholder = exec.info.argv.iter().any(|a| a.contains("{accumulation}"));
    if placeholder {
        return None;
    }
    let reads = trials
        .iter()
        .filter(|t| t.batch == r.micro_batch && u64::from(t.accumulation) == r.accumulation)
        .filter_map(|t| t.details.as_ref()?.report.as_ref())
        .map(|rep| rep.reads_accumulation && rep.accumulation == r.accumulation)
        .next();
    match reads {
        Some(true) => None,
        Some(false) => Some(format!(
            "the command's report says it did not read the accumulation (BATCHFIT_ACCUMULATION, \
             {{accumulation}}): the split {} × {} was proven at accumulation 1 only",
            r.micro_batch, r.accumulation
        )),
        None => Some(format!(
            "the command takes no {{accumulation}} and wrote no report, so nothing shows it ran {} \
             micro-batches per step: the split {} × {} may be proven at accumulation 1 only",
            r.accumulation, r.micro_batch, r.accumulation
        )),
    }
}
