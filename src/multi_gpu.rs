//! Several GPUs of one machine (`--gpus all|0,2,…`): one probe per GPU, in parallel (each its own
//! trial children on its own card), then one plan for all of them.
//!
//! Data-parallel training runs the same micro-batch on every rank, so the plan takes the smallest of
//! the GPUs' largest fitting sizes, re-solves the accumulation for the global batch over the world
//! size (default: the number of GPUs), and confirms the chosen micro-batch — with its accumulation,
//! as the trainer runs it — on **every** GPU, again in parallel. GPUs of one model can still differ:
//! another job may hold memory on one of them, which is exactly what this catches. Each GPU's own
//! result is kept in the plan's `gpu.per_gpu`.
//!
//! Beyond one machine, `batchfit merge` combines the plans of several nodes (see docs/recipes.md).

use crate::accumulate;
use crate::backend::Backend;
use crate::config::ProbeConfig;
use crate::plan::{self, PerGpu, Plan, Recommendation, Status};
use crate::probe::{run_cached, CudaSetup, Ending, ProbeError, ProbeReport, Progress};
use crate::search::{Prober, Purpose, Stop, StopReason, TrialRecord};
use std::path::Path;
use std::sync::mpsc;

/// Each GPU's index with the trials it ran.
type PerGpuTrials = Vec<(u32, Vec<TrialRecord>)>;

/// Progress lines of one GPU's thread, sent to the caller's progress on the main thread.
struct Forward {
    tx: mpsc::Sender<String>,
    prefix: String,
}

impl Progress for Forward {
    fn line(&mut self, line: &str) {
        let _ = self.tx.send(format!("{}{line}", self.prefix));
    }
}

/// Runs `work(index, progress)` for every GPU in parallel, forwarding progress lines.
fn each_gpu<T: Send>(
    indices: &[u32],
    progress: &mut dyn Progress,
    work: impl Fn(u32, &mut dyn Progress) -> T + Sync,
) -> Vec<(u32, T)> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = indices
            .iter()
            .map(|&i| {
                let mut fwd = Forward {
                    tx: tx.clone(),
                    prefix: format!("[gpu {i}] "),
                };
                s.spawn(move || (i, work(i, &mut fwd)))
            })
            .collect();
        drop(tx);
        for line in rx {
            progress.line(&line);
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("a GPU's probe thread panicked"))
            .collect()
    })
}

pub fn run(
    cfg: &ProbeConfig,
    reserve_note: Option<String>,
    exe: &Path,
    progress: &mut dyn Progress,
    setup: &CudaSetup,
) -> Result<ProbeReport, ProbeError> {
    progress.line(&format!(
        "batchfit: probing {} GPUs in parallel ({}); the plan takes the smallest answer and confirms it on \
         each",
        setup.indices.len(),
        setup.list()
    ));
    // 1. Each GPU's largest fitting micro-batch.
    let per = each_gpu(&setup.indices, progress, |i, p| {
        let mut c = cfg.clone();
        c.gpus = Some(i.to_string());
        c.world_size_given = true;
        c.reserve_given = true;
        c.global = None;
        c.out = None;
        c.compare_alloc_conf = false;
        run_cached(&c, exe, p, None)
    });
    let mut reports = vec![];
    for (i, r) in per {
        reports.push((i, r?));
    }
    let entry = |i: u32, p: &Plan| PerGpu {
        index: i,
        name: p.device.name.clone(),
        uuid: p.gpu.as_ref().map(|g| g.uuid.clone()).unwrap_or_default(),
        free_bytes_at_start: p.device.free_bytes_at_start,
        max_fitting_batch: p.recommendation.as_ref().map(|r| r.max_fitting_batch),
        first_failing_batch: p
            .recommendation
            .as_ref()
            .and_then(|r| r.first_failing_batch),
        trials: p.trials.len(),
        confirmed: false,
        peak_bytes: None,
    };
    let mut per_gpu: Vec<PerGpu> = reports.iter().map(|(i, r)| entry(*i, &r.plan)).collect();

    // A GPU whose search did not complete makes the whole plan partial (its reason is the plan's).
    if let Some((_, bad)) = reports
        .iter()
        .find(|(_, r)| r.plan.status != Status::Complete)
    {
        let mut plan = bad.plan.clone();
        if let Some(g) = plan.gpu.as_mut() {
            g.per_gpu = per_gpu;
        }
        plan.reserve_note = reserve_note;
        let written = write(cfg, &plan)?;
        return Ok(ProbeReport {
            plan,
            ending: bad.ending,
            written,
            notices: vec![],
        });
    }

    // 2. The smallest answer, split for the global batch, confirmed on every GPU.
    let (base_i, base) = reports
        .iter()
        .min_by_key(|(_, r)| r.plan.recommendation.as_ref().map(|x| x.max_fitting_batch))
        .map(|(i, r)| (*i, &r.plan))
        .expect("at least two GPUs");
    let rec0 = base
        .recommendation
        .clone()
        .expect("complete plans recommend");
    let smallest = rec0.max_fitting_batch;
    let world = cfg.world_size;
    let (g, w) = cfg.global.unwrap_or((smallest * world, world));
    let mut cap = smallest;
    let mut confirmed: Option<(accumulate::Split, PerGpuTrials)> = None;
    let mut failures: Vec<String> = vec![];
    for _ in 0..8 {
        let split = accumulate::split(g, w, cap, cfg.allow_uneven)
            .map_err(|e| ProbeError::Usage(e.to_string()))?;
        let acc = split.accumulation.min(u32::MAX as u64) as u32;
        let mut sizes = split.micro_batches.clone();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        let limits: Vec<(u32, u64)> = reports
            .iter()
            .map(|(i, r)| (*i, r.plan.limit_bytes))
            .collect();
        let results = each_gpu(&setup.indices, progress, |i, p| {
            let limit = limits.iter().find(|(j, _)| *j == i).expect("limit").1;
            let mut backend = match setup.backend(i, cfg, exe) {
                Ok(b) => b,
                Err(e) => return (Err(Stop::Fatal(e.to_string())), vec![]),
            };
            let backend: &mut dyn Backend = &mut backend;
            let mut prober = Prober::new(backend, cfg.search.clone(), limit)
                .on_trial(move |t, all| p.trial(all.len(), t, limit));
            let mut failed_at = None;
            for &b in &sizes {
                match prober.confirm_split(b, acc, Purpose::Split) {
                    Ok(true) => {}
                    Ok(false) => {
                        failed_at = Some(b);
                        break;
                    }
                    Err(stop) => return (Err(stop), prober.trials().to_vec()),
                }
            }
            (Ok(failed_at), prober.trials().to_vec())
        });
        let mut lowest_failure = None;
        let mut trials = vec![];
        for (i, (r, t)) in results {
            match r {
                Ok(None) => {}
                Ok(Some(b)) => {
                    failures.push(format!(
                        "micro-batch {b} × accumulation {acc} did not fit on GPU {i}; the split was recomputed below it"
                    ));
                    lowest_failure = Some(lowest_failure.map_or(b, |l: u64| l.min(b)));
                }
                Err(Stop::Interrupted(sig)) => {
                    let mut plan = base.clone();
                    plan.status = Status::Partial;
                    plan.stop_reason = StopReason::Interrupted;
                    plan.stop_detail = StopReason::Interrupted.describe().into();
                    plan.recommendation = None;
                    let written = write(cfg, &plan)?;
                    return Ok(ProbeReport {
                        plan,
                        ending: Ending::Interrupted(sig),
                        written,
                        notices: vec![],
                    });
                }
                Err(Stop::Fatal(m)) => return Err(ProbeError::Environment(m)),
                Err(Stop::Reason(r)) => {
                    return Err(ProbeError::Environment(format!(
                        "confirming the split on GPU {i} stopped: {}",
                        r.describe()
                    )))
                }
            }
            trials.push((i, t));
        }
        match lowest_failure {
            None => {
                confirmed = Some((split, trials));
                break;
            }
            Some(b) if b > 1 => cap = b - 1,
            Some(_) => break,
        }
    }
    let Some((split, confirm_trials)) = confirmed else {
        return Err(ProbeError::Environment(format!(
            "no accumulation split fits on every GPU: {}",
            failures.join("; ")
        )));
    };

    // 3. The plan: the smallest GPU's measurements, every GPU's result, the confirmed split.
    let mut plan = base.clone();
    let base_trials = confirm_trials
        .iter()
        .find(|(i, _)| *i == base_i)
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    plan.trials.extend(base_trials.iter().cloned());
    for e in per_gpu.iter_mut() {
        let t = confirm_trials.iter().find(|(i, _)| *i == e.index);
        let fit = t.and_then(|(_, t)| {
            t.iter()
                .filter(|r| r.batch == split.micro_batch && r.outcome.fits())
                .max_by_key(|r| r.steps)
        });
        // a size the GPU's own search had already confirmed with this accumulation needs no new trial
        let own = reports
            .iter()
            .find(|(i, _)| *i == e.index)
            .and_then(|(_, r)| {
                r.plan
                    .trials
                    .iter()
                    .filter(|t| t.batch == split.micro_batch && t.outcome.fits())
                    .max_by_key(|t| t.steps)
                    .cloned()
            });
        e.confirmed = true;
        e.peak_bytes = fit.cloned().or(own).and_then(|t| t.outcome.peak_bytes());
    }
    let rec_trial = plan
        .trials
        .iter()
        .filter(|t| t.batch == split.micro_batch && t.outcome.fits())
        .max_by_key(|t| (t.accumulation, t.steps))
        .cloned()
        .ok_or_else(|| {
            ProbeError::Environment("the confirmed micro-batch has no fitting trial".into())
        })?;
    let r = Recommendation::from_split(&split, smallest, rec0.first_failing_batch, &rec_trial);
    plan.recommendation = Some(r);
    plan.warnings.extend(failures);
    if let Some(w) = &split.warning {
        plan.warnings.push(w.clone());
    }
    plan.stop_detail = format!(
        "{}; the smallest of {} GPUs' answers (GPU {base_i}), confirmed on every GPU",
        plan.stop_detail,
        setup.indices.len()
    );
    if let Some(gs) = plan.gpu.as_mut() {
        gs.per_gpu = per_gpu;
        gs.footprint_method = rec_trial.outcome.gpu().map(|m| m.method);
    }
    plan.reserve_note = reserve_note;
    plan.status = Status::Complete;
    let written = write(cfg, &plan)?;
    Ok(ProbeReport {
        plan,
        ending: Ending::Complete,
        written,
        notices: vec![],
    })
}

/// `--out` for a complete plan (its `.partial` sibling removed), else the `.partial` sibling.
fn write(cfg: &ProbeConfig, plan: &Plan) -> Result<Option<std::path::PathBuf>, ProbeError> {
    let Some(out) = &cfg.out else {
        return Ok(None);
    };
    let partial = plan::partial_path(out);
    if plan.status == Status::Complete {
        plan.write_atomic(out)?;
        let _ = std::fs::remove_file(&partial);
        Ok(Some(out.clone()))
    } else {
        plan.write_atomic(&partial)?;
        Ok(Some(partial))
    }
}
