//! `--sweep seq-len=256,512,1024,2048` (or `image-size=…`): the largest micro-batch at each point,
//! each point a whole probe of its own with its own proof.
//!
//! Every point's configuration was validated up front ([`crate::config::SweepConfig`]); here each
//! runs through [`super::run_cached`] (so the device set-up, the split, the cache and the single-
//! or multi-GPU run are the same as for a plain probe), with one addition: the search of a point
//! starts from what the points before it measured ([`crate::plan::capacity::sweep_prior`], a
//! [`crate::search::Prior`]). The prior only chooses where the search looks first; each point's
//! answer is proven by its own trials, exactly as without a sweep.
//!
//! The plan written is the probe of [`SweepConfig::plan_point`] with the `sweep` table of every
//! point (its largest micro-batch, tokens per micro-batch, peak, trials, and all its trials).
//!
//! Other workloads: a point is substituted into the *configuration* before the probe runs, so a
//! workload only needs a way to take a point — the exec workload would replace `{seq}` in its
//! command; not implemented yet, and refused by the configuration.

use super::cache::CacheOptions;
use super::report::{self, Ending, ProbeError, ProbeReport, Progress};
use crate::config::{ProbeConfig, SweepConfig};
use crate::plan::capacity::{prior_miss, sweep_prior, CapacityModel};
use crate::plan::{Status, Sweep, SweepPoint};

/// Runs every point of `sw` (in the order given) and writes the plan of its `plan_point` with the
/// sweep table to `cfg.out`.
pub fn run(
    cfg: &ProbeConfig,
    sw: &SweepConfig,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    let (mut done, interrupted) = probe_points(sw, progress, cache)?;
    let points: Vec<SweepPoint> = done.iter().map(|d| row(sw, d)).collect();
    // The plan: the plan point's probe (or, when the sweep stopped before it, the last one run).
    let at = done
        .iter()
        .position(|d| d.value == sw.plan_point)
        .unwrap_or(done.len() - 1);
    let Done {
        value: plan_value,
        report,
        ..
    } = done.swap_remove(at);
    let mut plan = report.plan;
    let name = sw.param.as_str();
    if plan_value != sw.plan_point {
        plan.warnings.push(format!(
            "--sweep stopped before {name}={}: this plan's model, trials and recommendation are of \
             {name}={plan_value}",
            sw.plan_point
        ));
    }
    let mut notices = report.notices;
    for d in &done {
        notices.extend(d.report.notices.iter().cloned());
    }
    plan.sweep = Some(Sweep {
        parameter: name.into(),
        // The point this plan is of: the one asked for, or the last one run when it stopped first.
        plan_point: plan_value,
        points,
    });
    let ending = sweep_ending(&mut plan, name, plan_value, report.ending, interrupted);
    let written = report::write(cfg.out.as_deref(), &plan)?;
    Ok(ProbeReport {
        plan,
        ending,
        written,
        notices,
    })
}

/// One point of the sweep that ran: its value, its probe's report, and the size the points before
/// it predicted.
struct Done {
    value: u64,
    report: ProbeReport,
    predicted: Option<u64>,
}

/// Probes the sweep's points in order, each with the line of the points before it as its prior;
/// stops after a point that was interrupted (its signal).
fn probe_points(
    sw: &SweepConfig,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<(Vec<Done>, Option<i32>), ProbeError> {
    let name = sw.param.as_str();
    let mut done: Vec<Done> = vec![];
    let mut models: Vec<(u64, CapacityModel)> = vec![];
    let mut last_miss: Option<f64> = None;
    for (i, (value, point_cfg)) in sw.points.iter().enumerate() {
        let before: Vec<(u64, &CapacityModel)> = models.iter().map(|(v, m)| (*v, m)).collect();
        let prior = sweep_prior(&before, *value, sw.param.exponent(), last_miss);
        let mut c = point_cfg.clone();
        let predicted = prior.as_ref().and_then(|p| {
            // The prediction under this point's limit is only known once the device is set up;
            // the budget is the same for every point, so the first point's limit stands in.
            let limit = done.first().map(|d| d.report.plan.limit_bytes)?;
            p.predict(limit).map(|(b, _)| b as u64)
        });
        c.search.prior = prior.clone();
        progress.line(&format!(
            "batchfit: sweep {name}={value} ({} of {}){}",
            i + 1,
            sw.points.len(),
            predicted
                .map(|b| format!(": the points before predict about {b}"))
                .unwrap_or_default()
        ));
        let r = super::run_cached(&c, progress, cache)?;
        let answer = r.plan.recommendation.as_ref().map(|x| x.max_fitting_batch);
        last_miss = match (&prior, answer) {
            (Some(p), Some(a)) => prior_miss(p, &r.plan.trials, a),
            _ => None,
        };
        if let Some(m) = r.plan.capacity_model.clone() {
            models.push((*value, m));
        }
        let interrupted = match r.ending {
            Ending::Interrupted(sig) => Some(sig),
            _ => None,
        };
        done.push(Done {
            value: *value,
            report: r,
            predicted,
        });
        if interrupted.is_some() {
            return Ok((done, interrupted));
        }
    }
    Ok((done, None))
}

/// The sweep table's row of a point that ran.
fn row(sw: &SweepConfig, d: &Done) -> SweepPoint {
    let p = &d.report.plan;
    let rec = p
        .recommendation
        .as_ref()
        .filter(|_| p.status == Status::Complete);
    let max = rec.map(|x| x.max_fitting_batch);
    let point_cfg = &sw
        .points
        .iter()
        .find(|(v, _)| *v == d.value)
        .expect("a point of the sweep")
        .1;
    let tokens = sw.tokens_per_sample(point_cfg, d.value);
    SweepPoint {
        value: d.value,
        status: p.status,
        stop_reason: p.stop_reason,
        max_fitting_batch: max,
        first_failing_batch: rec.and_then(|x| x.first_failing_batch),
        tokens_per_sample: tokens,
        tokens_per_micro_batch: max.map(|b| b * tokens),
        peak_bytes: max.and_then(|b| {
            super::single::best_fit(&p.trials, b).and_then(|t| t.outcome.peak_bytes())
        }),
        trials: p.trials.len(),
        seconds: p.trials.iter().map(|t| t.seconds).sum::<f64>() + 0.0,
        model_fingerprint: p.model.fingerprint().to_string(),
        predicted_batch: d.predicted,
        capacity_model: p.capacity_model.clone(),
        trial_records: p.trials.clone(),
    }
}

/// How the sweep ends, and the plan's status with it: complete only when every point is (a point
/// that stopped early, by caps or errors, leaves the sweep partial; a point where nothing fits is an
/// answer); a partial sweep recommends nothing (the plan's invariant), its plan point's proven size
/// staying in the table.
fn sweep_ending(
    plan: &mut crate::plan::Plan,
    name: &str,
    plan_value: u64,
    ending: Ending,
    interrupted: Option<i32>,
) -> Ending {
    let mut ending = ending;
    if let Some(sig) = interrupted {
        ending = Ending::Interrupted(sig);
        plan.status = Status::Partial;
    } else if ending == Ending::Complete {
        let worst = plan.sweep.as_ref().and_then(|s| {
            s.points
                .iter()
                .find(|p| p.status == Status::Partial)
                .map(|p| (p.value, p.stop_reason))
        });
        if let Some((value, reason)) = worst {
            ending = Ending::of(reason, None);
            plan.status = Status::Partial;
            plan.warnings.push(format!(
                "--sweep: the point {name}={value} did not complete ({}); its row is partial",
                reason.describe()
            ));
        }
    }
    if plan.status == Status::Partial {
        if let Some(r) = plan.recommendation.take() {
            plan.warnings.push(format!(
                "--sweep is partial, so this plan recommends nothing; {name}={plan_value} was \
                 proven at micro-batch {} (the sweep table); run the sweep again to complete it",
                r.max_fitting_batch
            ));
        }
    }
    ending
}
