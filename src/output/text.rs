//! `--format text`: a human summary of a plan (also what `batchfit probe` prints on stderr).

use super::{Exporter, OutputError};
use crate::plan::capacity::PredictReport;
use crate::plan::{Plan, Status};
use crate::platform::units::format_size;
use std::path::Path;

pub struct Text;

impl Exporter for Text {
    fn render(&self, plan: &Plan, _: Option<&Path>) -> Result<String, OutputError> {
        Ok(summary(plan))
    }
}

/// What "peak" measures, as each limit measures it: under a memory cgroup the cgroup's memory
/// peak (what `memory.max` acts on); under `RLIMIT_DATA` the data segment (by the name
/// `batchfit-train` uses too), of the largest process where a command's tree was followed; on cuda
/// NVML's figure.
fn measure(plan: &Plan) -> &'static str {
    use crate::device::LimitMechanism;
    use crate::plan::DeviceKind;
    match (plan.device.kind, plan.limit_mechanism) {
        (DeviceKind::Cpu, Some(LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2)) => {
            "the cgroup's memory peak"
        }
        (DeviceKind::Cpu, _) if tree_figure(plan, None).is_some() => {
            "peak data segment of the largest process"
        }
        (DeviceKind::Cpu, _) => "peak data segment",
        (DeviceKind::Cuda, _) => "peak on the card (NVML)",
        (DeviceKind::Sim, _) => "peak (simulated)",
    }
}

/// The largest tree figure (`Pss_Anon + Pss_Shmem` over a command's process tree) of the fitting
/// trials at `batch` (any batch when `None`).
fn tree_figure(plan: &Plan, batch: Option<u64>) -> Option<u64> {
    plan.trials
        .iter()
        .filter(|t| t.outcome.fits() && batch.is_none_or(|b| t.batch == b))
        .filter_map(|t| t.details.as_ref()?.tree_pss_peak_bytes)
        .max()
}

/// `; the process tree's Pss_Anon + Pss_Shmem X` under `RLIMIT_DATA` for a command's tree (what no
/// limit bounded, measured beside the data segment).
fn tree_clause(plan: &Plan, batch: u64) -> String {
    use crate::device::LimitMechanism;
    if matches!(
        plan.limit_mechanism,
        Some(LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2)
    ) {
        return String::new();
    }
    tree_figure(plan, Some(batch))
        .map(|b| {
            format!(
                "; the process tree's Pss_Anon + Pss_Shmem {}",
                format_size(b)
            )
        })
        .unwrap_or_default()
}

/// A human summary of a plan.
pub fn summary(plan: &Plan) -> String {
    use crate::plan::count;
    let mut s = String::new();
    let n = plan.trials.len();
    // `+ 0.0`: an empty f64 sum is -0.0, printed "-0.0 s"
    let secs: f64 = plan.trials.iter().map(|t| t.seconds).sum::<f64>() + 0.0;
    match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => {
            s += &r.describe();
            if r.accumulation_proven == Some(false) {
                s += &format!(
                    " (accumulation {} NOT PROVEN: nothing shows the command ran it; see the warning)",
                    r.accumulation
                );
            }
            s += "\n";
            s += &peak_lines(plan, r);
            if let Some(n) = plan.proven_steps() {
                let mut sizes = r.micro_batches.clone();
                sizes.sort_unstable_by(|a, b| b.cmp(a));
                sizes.dedup();
                let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
                s += &format!(
                    "{} {} confirmed with {} at accumulation {}\n",
                    if sizes.len() == 1 {
                        "micro-batch"
                    } else {
                        "micro-batches"
                    },
                    sizes.join(" and "),
                    count(n as usize, "optimizer step", "optimizer steps"),
                    r.accumulation
                );
            }
        }
        _ => {
            s += &format!(
                "no recommendation: {}\n",
                match plan.status {
                    Status::NothingFits => "nothing fits (status nothing-fits)".to_string(),
                    other => format!("the plan is {other}"),
                }
            )
        }
    }
    if plan.status == Status::Complete {
        if let Some(line) = crate::plan::throughput::summary_line(plan) {
            s += &line;
        }
    }
    if let Some(line) = repeats_line(plan) {
        s += &line;
    }
    if let Some(n) = &plan.search.noisy_boundary {
        s += &format!("{}\n", n.describe());
    }
    s += &format!("stopped: {}\n", plan.stop_detail);
    if plan.stop_reason == crate::search::StopReason::MaxTrials {
        s += &more_trials_line(plan, n);
    }
    if plan.stop_reason == crate::search::StopReason::TimeLimit {
        s += &more_time_line(plan, n, secs);
    }
    s += &format!("{}, {secs:.1} s of trials\n", count(n, "trial", "trials"));
    for w in &plan.warnings {
        s += &format!("warning: {w}\n");
    }
    if let Some(sw) = &plan.sweep {
        s += &sweep_table(sw);
    }
    s
}

/// The trials a capped search may still need: those of the proof, or how many a noisy boundary
/// takes (it stops bisecting, then runs a few sizes twice) on top of the answer's repeats; and why.
fn trials_to_finish(plan: &Plan) -> (u32, String) {
    let repeats = plan.search.repeats;
    match &plan.search.noisy_boundary {
        Some(_) => {
            let noisy = crate::search::noise::noisy_trials(repeats);
            let why = format!(
                "; outcomes near the boundary disagree, which takes up to {noisy} trials after \
                 the first disagreement"
            );
            (noisy + 1, why)
        }
        None => (4 + repeats, String::new()),
    }
}

/// What a search cut short by `--max-trials` needs to finish: more trials.
fn more_trials_line(plan: &Plan, ran: usize) -> String {
    let (more, why) = trials_to_finish(plan);
    format!(
        "to finish: run the probe again with --max-trials {} or more ({ran} ran{why})\n",
        ran as u32 + more
    )
}

/// What a search cut short by `--time-limit` needs to finish: the time of the trials it may still
/// need, at the mean time of those that ran.
fn more_time_line(plan: &Plan, ran: usize, secs: f64) -> String {
    if ran == 0 {
        return "to finish: run the probe again with a longer --time-limit (no trial ran within \
                it)\n"
            .into();
    }
    let (more, why) = trials_to_finish(plan);
    let mean = secs / ran as f64;
    format!(
        "to finish: run the probe again with --time-limit {:.0} or more ({ran} trials ran in \
         {secs:.0} s{why})\n",
        (secs + more as f64 * mean).ceil()
    )
}

/// `; PEAK P of the L limit (N%)` and the tree figure, of a peak measured at `batch`: of the
/// trials' limit, or of the job's where the peak lies above the trials' (a run of `verify` on the
/// plan's own device, which runs under the job's limit).
fn peak_clause(plan: &Plan, batch: u64, peak: u64) -> String {
    let (limit, whose) = if peak > plan.limit_bytes {
        (plan.job_limit_bytes(), " job's")
    } else {
        (plan.limit_bytes, "")
    };
    format!(
        "; {} {} of the{whose} {} limit ({:.0}%){}",
        measure(plan),
        format_size(peak),
        format_size(limit),
        100.0 * peak as f64 / limit.max(1) as f64,
        tree_clause(plan, batch)
    )
}

/// The largest fitting micro-batch with its bracket and its own peak, then, when the recommended
/// micro-batch is smaller (a split's rounding), the recommended size with its peak and speed: each
/// figure beside the size it was measured at. The largest fit's peak is the highest of its fitting
/// trials on the plan's device; none measured (a merged plan's size proven elsewhere): no figure
/// for it.
fn peak_lines(plan: &Plan, r: &crate::plan::Recommendation) -> String {
    let x = r.max_fitting_batch;
    let bracket = r
        .first_failing_batch
        .map(|f| bracket(plan, x, f))
        .unwrap_or_default();
    // a merged plan's split that no trial ran: nothing measured, nothing to print as a figure
    if r.peak_bytes == 0 && !plan.sources.is_empty() {
        return format!(
            "largest fitting micro-batch: {x}{bracket}
recommended micro-batch {}: not measured \
             at accumulation {} (a merged plan: `batchfit verify` runs it here)
",
            r.micro_batch, r.accumulation
        );
    }
    let speed = format!("; {:.0} samples/s", r.samples_per_second);
    let recommended = peak_clause(plan, r.micro_batch, r.peak_bytes);
    if r.micro_batch == x {
        return format!("largest fitting micro-batch: {x}{bracket}{recommended}{speed}\n");
    }
    let largest = plan
        .device_trials()
        .into_iter()
        .filter(|t| t.batch == x && t.outcome.fits())
        .filter_map(|t| t.outcome.peak_bytes().filter(|&p| p > 0))
        .max()
        .map(|p| peak_clause(plan, x, p))
        .unwrap_or_default();
    format!(
        "largest fitting micro-batch: {x}{bracket}{largest}\nrecommended micro-batch {}{recommended}{speed}\n",
        r.micro_batch
    )
}

/// ` (fits at b, b' runs out of memory)`, with the tolerance when b' is not the next size.
fn bracket(plan: &Plan, b: u64, f: u64) -> String {
    let tol = match (plan.stop_reason, plan.search.tolerance) {
        (crate::plan::StopReason::ProvenWithinTolerance, Some(t)) => {
            format!("; proven within the {}% tolerance", t * 100.0)
        }
        _ => String::new(),
    };
    // a size bounded only by over-budget trials ran out of this budget, not out of memory
    let mut bounds = plan
        .trials
        .iter()
        .filter(|t| t.batch == f && t.outcome.is_bound())
        .peekable();
    let over = bounds.peek().is_some()
        && bounds.all(|t| matches!(t.outcome, crate::protocol::TrialOutcome::OverBudget { .. }));
    let fails = if over {
        "is over the budget (its measured footprint went above the limit)"
    } else {
        "runs out of memory"
    };
    format!(" (fits at {b}, {f} {fails}{tol})")
}

/// The `--sweep` table: one line per point.
pub fn sweep_table(sw: &crate::plan::Sweep) -> String {
    let mut s = format!(
        "sweep of {}: {:>8} {:>19} {:>22} {:>12} {:>7}\n",
        sw.parameter, "point", "largest micro-batch", "tokens per micro-batch", "peak", "trials"
    );
    let pad = " ".repeat(format!("sweep of {}: ", sw.parameter).chars().count());
    for p in &sw.points {
        let mark = if p.value == sw.plan_point { "*" } else { " " };
        s += &format!(
            "{pad}{:>7}{mark} {:>19} {:>22} {:>12} {:>7}\n",
            p.value,
            p.max_fitting_batch
                .map(|b| b.to_string())
                .unwrap_or_else(|| format!("{:?}", p.status).to_lowercase()),
            p.tokens_per_micro_batch
                .map(|t| t.to_string())
                .unwrap_or_else(|| "-".into()),
            p.peak_bytes.map(format_size).unwrap_or_else(|| "-".into()),
            p.trials
        );
    }
    s += &format!(
        "{pad}(* the point this plan's recommendation is for; {} trials in all)\n",
        sw.points.iter().map(|p| p.trials).sum::<usize>()
    );
    s
}

/// How often the answer fit in fresh runs, and the job's noise those runs measured against the
/// guard band: the summary's line when the probe repeated its answer (`--repeats`).
fn repeats_line(plan: &Plan) -> Option<String> {
    let r = plan.recommendation.as_ref()?;
    if plan.search.repeats == 0 {
        return None;
    }
    // after a verify on another device, the probe's runs are that device's, not this one's
    let runs = plan
        .device_trials()
        .into_iter()
        .filter(|t| {
            t.batch == r.max_fitting_batch
                && t.outcome.fits()
                && t.steps >= plan.search.confirm_steps
                && t.accumulation == 1
        })
        .count();
    let noise = match (plan.search.noise_spread_bytes, plan.guard_band_bytes) {
        (Some(s), Some(g)) => format!(
            "; the job's peak moved by up to {} from run to run ({} the {} guard band)",
            format_size(s),
            if s <= g { "within" } else { "wider than" },
            format_size(g)
        ),
        (Some(s), None) => format!(
            "; the job's peak moved by up to {} from run to run",
            format_size(s)
        ),
        _ => String::new(),
    };
    Some(format!(
        "micro-batch {} fit {} in fresh runs{noise}\n",
        r.max_fitting_batch,
        crate::plan::schema::count(runs, "time", "times")
    ))
}

/// `batchfit predict`'s human table: the plan, its capacity model, one line per capacity, each
/// marked as a prediction.
pub fn predict(r: &PredictReport) -> String {
    use crate::platform::units::format_size;
    let m = &r.capacity_model;
    let mib = |x: f64| format!("{:.1} MiB", x / (1024.0 * 1024.0));
    let mut s = format!(
        "{} on {} ({}), plan {}: budget {}{}\n",
        r.model,
        r.device_kind,
        r.device_name,
        r.plan,
        format_size(r.plan_budget_bytes),
        r.plan_max_fitting_batch
            .map(|b| format!(", largest micro-batch proven {b}"))
            .unwrap_or_default()
    );
    match &m.refusal {
        Some(r) => s += &format!("capacity model: none ({r})\n"),
        None => {
            s += &format!(
                "capacity model: peak ≈ {} + {:.1} KiB × batch, from {} sizes {}–{} (largest residual {})",
                mib(m.fixed_bytes),
                m.per_sample_bytes / 1024.0,
                m.points.len(),
                m.range[0],
                m.range[1],
                format_size(m.max_residual_bytes.round() as u64)
            );
            if let Some(k) = m.knee_below {
                s += &format!("; off the line below it: {k}");
            }
            if let Some(j) = m.jump_above {
                s += &format!("; {j} ran out of memory above it");
            }
            s += "\n";
            for a in &m.accumulation {
                s += &format!(
                    "  accumulation {}: {} more at {}\n",
                    a.accumulation,
                    mib(a.extra_bytes),
                    a.batch
                );
            }
        }
    }
    let global = r
        .predictions
        .iter()
        .find_map(|p| p.split.as_ref().map(|x| (x.global_batch, x.world_size)));
    s += &format!(
        "{:<12} {:<12} {:<38} {}\n",
        "memory",
        "limit",
        "largest micro-batch (predicted)",
        global
            .map(|(g, w)| if w > 1 {
                format!("global batch {g} over {w} ranks")
            } else {
                format!("global batch {g}")
            })
            .unwrap_or_default()
    );
    for p in &r.predictions {
        let head = format!(
            "{:<12} {:<12} ",
            format_size(p.memory_bytes),
            format_size(p.limit_bytes)
        );
        match (&p.refused, &p.max_micro_batch) {
            (Some(why), _) => s += &format!("{head}refused: {why}\n"),
            (None, Some(e)) => {
                let est = if e.high == 0 {
                    "none fits, predicted, not proven".to_string()
                } else {
                    format!(
                        "{} ({}–{}), predicted, not proven",
                        e.micro_batch, e.low, e.high
                    )
                };
                let split = p
                    .split
                    .as_ref()
                    .map(|x| format!("{} × {}", x.micro_batch, x.accumulation))
                    .unwrap_or_default();
                s += &format!("{head}{est:<38} {split}\n");
            }
            (None, None) => s += &format!("{head}no prediction\n"),
        }
        for n in &p.notes {
            s += &format!("{:<25} note: {n}\n", "");
        }
    }
    s += "predicted, not proven: the error bar is the line's (residuals and slope); prove a size \
          on the machine with `batchfit probe --memory-budget SIZE` before training with it\n";
    s
}
