//! Several GPUs of one machine (`--gpus all|0,2,…`): one search per GPU, in parallel (each its own
//! trial processes on its own card), then one plan for all of them.
//!
//! Data-parallel training runs the same micro-batch on every rank, so the plan takes the smallest of
//! the GPUs' largest fitting sizes, re-solves the accumulation for the global batch over the world
//! size (default: the number of GPUs), and confirms the chosen micro-batch — with its accumulation,
//! as the trainer runs it — on **every** GPU, again in parallel ([`super::split`], the same loop as
//! one device's). GPUs of one model can still differ: another job may hold memory on one of them,
//! which is exactly what this catches. Each GPU's own result is kept in the plan's `gpu.per_gpu`;
//! while the searches run, the partial plan beside `--out` holds every GPU's trials so far (each
//! trial records its `gpu`).
//!
//! **Identical GPUs** (one model, the same total memory, free memory within [`SAME_FREE`] of the
//! total) do not need a search each: they run one search together, in rounds of one trial per GPU
//! at once ([`crate::search::rounds`]), every GPU under the smallest GPU's limit, and the answer is
//! then confirmed on every GPU as above. GPUs that differ search each on their own, and the plan's
//! `search.parallel_fallback` says why.
//!
//! Beyond one machine, `batchfit merge` combines the plans of several nodes (see docs/recipes.md).

use super::report::{self, Ending, ProbeError, Progress};
use super::setup::CudaSetup;
use super::single::{self, best_fit};
use super::split;
use crate::config::ProbeConfig;
use crate::device::cuda::CudaBackend;
use crate::device::lanes::{Lane, Lanes};
use crate::device::Backend;
use crate::plan::{PerGpu, Plan, Recommendation, Status};
use crate::platform::units::format_size;
use crate::search::{Confirmation, Prober, Purpose, SearchOutcome, TrialRecord};
use std::sync::{mpsc, Mutex};

/// One GPU of the probe: its device, the plan skeleton and limit from its own budget, its trials.
pub struct Gpu {
    pub index: u32,
    pub backend: CudaBackend,
    pub skeleton: Plan,
    pub limit: u64,
    trials: Vec<TrialRecord>,
}

impl Gpu {
    pub fn new(index: u32, backend: CudaBackend, skeleton: Plan, limit: u64) -> Self {
        Gpu {
            index,
            backend,
            skeleton,
            limit,
            trials: vec![],
        }
    }
}

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

/// Runs `work(gpu, progress)` for every GPU in parallel, forwarding progress lines.
fn each_gpu<T: Send>(
    gpus: &mut [Gpu],
    progress: &mut dyn Progress,
    work: impl Fn(&mut Gpu, &mut dyn Progress) -> T + Sync,
) -> Vec<T> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = gpus
            .iter_mut()
            .map(|g| {
                let mut fwd = Forward {
                    tx: tx.clone(),
                    prefix: format!("[gpu {}] ", g.index),
                };
                s.spawn(move || work(g, &mut fwd))
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

/// Every GPU's own result, for the plan's `gpu.per_gpu`.
fn per_gpu_entries(gpus: &[Gpu], outcomes: &[Option<SearchOutcome>]) -> Vec<PerGpu> {
    gpus.iter()
        .zip(outcomes)
        .map(|(g, o)| PerGpu {
            index: g.index,
            name: g.skeleton.device.name.clone(),
            uuid: g
                .skeleton
                .gpu
                .as_ref()
                .map(|s| s.uuid.clone())
                .unwrap_or_default(),
            free_bytes_at_start: g.skeleton.device.free_bytes_at_start,
            max_fitting_batch: o.as_ref().and_then(|o| o.max_fitting),
            first_failing_batch: o.as_ref().and_then(|o| o.first_failing),
            trials: g.trials.len(),
            confirmed: false,
            peak_bytes: None,
        })
        .collect()
}

/// How far the GPUs' free memory may differ, as a fraction of their total, for them to search
/// together: every GPU runs under the smallest one's limit, so a GPU with a little more free memory
/// only gives up that little.
pub const SAME_FREE: f64 = 0.01;

/// Why `gpus` cannot search together in rounds, if they cannot: another model, another total
/// memory, or free memory that differs by more than [`SAME_FREE`] of the total.
pub fn differ(gpus: &[Gpu]) -> Option<String> {
    let d0 = &gpus.first()?.skeleton.device;
    gpus.iter().skip(1).find_map(|g| {
        let d = &g.skeleton.device;
        let (a, b) = (d0.free_bytes_at_start, d.free_bytes_at_start);
        if d.name != d0.name {
            Some(format!(
                "GPU {} is a {} and GPU {} a {}",
                gpus[0].index, d0.name, g.index, d.name
            ))
        } else if d.total_bytes != d0.total_bytes {
            Some(format!(
                "GPU {} has {} and GPU {} {} in all",
                gpus[0].index,
                format_size(d0.total_bytes),
                g.index,
                format_size(d.total_bytes)
            ))
        } else if a.abs_diff(b) as f64 > SAME_FREE * d0.total_bytes as f64 {
            Some(format!(
                "GPU {} has {} free and GPU {} {} (more than {:.0}% of {} apart: another job holds \
                 memory on one of them)",
                gpus[0].index,
                format_size(a),
                g.index,
                format_size(b),
                SAME_FREE * 100.0,
                format_size(d0.total_bytes)
            ))
        } else {
            None
        }
    })
}

/// What the probe says before several GPUs search: together in rounds when they are identical,
/// else one search each (`fallback`: why not together).
fn announcement(setup: &CudaSetup, fallback: Option<&str>) -> String {
    match fallback {
        None => format!(
            "batchfit: probing {} identical GPUs together ({}): each round runs one size on each \
             GPU at once, and the answer is confirmed on each",
            setup.indices.len(),
            setup.list()
        ),
        Some(why) => format!(
            "batchfit: probing {} GPUs in parallel ({}), a search on each as they differ ({why}); \
             the plan takes the smallest answer and confirms it on each",
            setup.indices.len(),
            setup.list()
        ),
    }
}

/// Several GPUs' probe: each GPU's largest fitting micro-batch, the smallest of them split for the
/// global batch and confirmed on every GPU, and the plan of the smallest GPU's measurements.
pub fn run(
    cfg: &ProbeConfig,
    setup: &CudaSetup,
    gpus: &mut [Gpu],
    progress: &mut dyn Progress,
) -> Result<(Plan, Ending), ProbeError> {
    let fallback = differ(gpus);
    progress.line(&announcement(setup, fallback.as_deref()));
    // 1. Each GPU's largest fitting micro-batch (one search of them all when they are identical).
    let together = fallback.is_none();
    let (outcomes, shared) = if together {
        let (outcomes, shared) = search_together(cfg, gpus, progress)?;
        (outcomes, Some(shared))
    } else {
        (search_each(cfg, gpus, progress)?, None)
    };
    let width = gpus.len() as u32;
    let mark = |plan: &mut Plan| {
        plan.search.parallel = together.then_some(width);
        plan.search.parallel_fallback = fallback.clone();
    };
    let mut per_gpu = per_gpu_entries(gpus, &outcomes);
    // A GPU whose search did not complete makes the whole plan partial (its reason is the plan's).
    if let Some((i, o)) = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.as_ref().map(|o| (i, o)))
        .find(|(_, o)| !o.stop_reason.is_complete())
    {
        let (mut plan, ending) = single::assemble(cfg, &gpus[i].skeleton, o, None);
        // what every GPU measured, each trial tagged with its GPU
        plan.trials = match &shared {
            Some(s) => s.clone(),
            None => gpus.iter().flat_map(|g| g.trials.clone()).collect(),
        };
        mark(&mut plan);
        if let Some(g) = plan.gpu.as_mut() {
            g.per_gpu = per_gpu;
        }
        return Ok((plan, ending));
    }
    // 2. The smallest answer, split for the global batch, confirmed on every GPU.
    // (searching together, every GPU ran under the smallest limit: that GPU's skeleton)
    let base = (0..gpus.len())
        .min_by_key(|&i| {
            (
                outcomes[i].as_ref().and_then(|o| o.max_fitting),
                gpus[i].limit,
            )
        })
        .expect("at least two GPUs");
    let base_outcome = outcomes[base].clone().expect("searched");
    let searched: Vec<usize> = gpus.iter().map(|g| g.trials.len()).collect();
    let (outcome, failures) = confirm_on_each(cfg, gpus, &base_outcome, progress);
    // 3. The plan: the smallest GPU's measurements (all of them, searching together, with every
    // GPU's confirmations), every GPU's result, the confirmed split.
    let mut plan = gpus[base].skeleton.clone();
    plan.trials = match shared {
        Some(mut all) => {
            for (g, n) in gpus.iter().zip(&searched) {
                all.extend(g.trials[*n..].iter().cloned());
            }
            all
        }
        None => gpus[base].trials.clone(),
    };
    mark(&mut plan);
    plan.capacity_model = crate::plan::CapacityModel::fit(&plan.trials, plan.limit_bytes);
    plan.warnings.extend(outcome.warnings);
    plan.warnings.extend(failures);
    plan.stop_reason = base_outcome.stop_reason;
    let split = match outcome.split {
        Ok(s) => s,
        Err(stop) => {
            let ending = single::stopped(&mut plan, stop);
            plan.status = Status::Partial;
            if let Some(gs) = plan.gpu.as_mut() {
                gs.per_gpu = per_gpu;
            }
            return Ok((plan, ending));
        }
    };
    for (e, gpu) in per_gpu.iter_mut().zip(gpus.iter()) {
        e.trials = gpu.trials.len();
        let fit = best_fit(&gpu.trials, split.micro_batch);
        e.confirmed = fit.is_some_and(|t| u64::from(t.accumulation) >= split.accumulation);
        e.peak_bytes = fit.and_then(|t| t.outcome.peak_bytes());
    }
    recommend(
        &mut plan,
        &split,
        &base_outcome,
        setup.indices.len(),
        gpus[base].index,
        per_gpu,
    )?;
    Ok((plan, Ending::Complete))
}

/// Every GPU's search, in parallel; the partial plan beside `--out` holds every GPU's trials so far.
/// Each GPU keeps its trials.
fn search_each(
    cfg: &ProbeConfig,
    gpus: &mut [Gpu],
    progress: &mut dyn Progress,
) -> Result<Vec<Option<SearchOutcome>>, ProbeError> {
    let first = gpus[0].skeleton.clone();
    let all_trials: Mutex<Vec<TrialRecord>> = Mutex::new(vec![]);
    let write_error: Mutex<Option<ProbeError>> = Mutex::new(None);
    let outcomes: Vec<Option<SearchOutcome>> = each_gpu(gpus, progress, |g, p| {
        let limit = g.limit;
        let index = g.index;
        let (all_trials, write_error, first) = (&all_trials, &write_error, &first);
        let skeleton = g.skeleton.clone();
        let searched = single::search(
            cfg,
            &mut g.backend,
            &skeleton,
            Some(index),
            move |t, all| {
                p.trial(all.len(), t, limit);
                let mut shared = all_trials.lock().unwrap_or_else(|e| e.into_inner());
                shared.push(t.clone());
                let mut snap = first.clone();
                snap.trials = shared.clone();
                if let Err(e) = report::write(cfg.out.as_deref(), &snap) {
                    *write_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            },
        );
        let single::Searched { outcome, .. } = searched;
        Some(outcome)
    });
    if let Some(e) = write_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    for (g, o) in gpus.iter_mut().zip(&outcomes) {
        g.trials = o.as_ref().map(|o| o.trials.clone()).unwrap_or_default();
    }
    Ok(outcomes)
}

/// One search of identical GPUs, in rounds of one trial per GPU at once, every GPU under the
/// smallest limit (which becomes each GPU's limit, for its confirmations too). Each GPU keeps the
/// trials it ran; every GPU's outcome is the search's; the search's trials in order come second.
fn search_together(
    cfg: &ProbeConfig,
    gpus: &mut [Gpu],
    progress: &mut dyn Progress,
) -> Result<(Vec<Option<SearchOutcome>>, Vec<TrialRecord>), ProbeError> {
    let limit = gpus.iter().map(|g| g.limit).min().expect("GPUs");
    for g in gpus.iter_mut() {
        g.limit = limit;
    }
    let smallest = gpus.iter().position(|g| g.limit == limit).unwrap_or(0);
    let base = gpus[smallest].skeleton.clone();
    let mut snap = base.clone();
    snap.search.parallel = Some(gpus.len() as u32);
    let first = gpus[0].index;
    let mut write_error = None;
    let outcome = {
        let write_error = &mut write_error;
        let lanes = gpus
            .iter_mut()
            .map(|g| Lane {
                backend: &mut g.backend as &mut (dyn Backend + Send),
                gpu: Some(g.index),
            })
            .collect();
        let mut set = Lanes::new(lanes);
        let searched = single::search(cfg, &mut set, &base, Some(first), |t, all| {
            progress.trial(all.len(), t, limit);
            snap.trials = all.to_vec();
            if let Err(e) = report::write(cfg.out.as_deref(), &snap) {
                *write_error = Some(e);
            }
        });
        searched.outcome
    };
    if let Some(e) = write_error {
        return Err(e);
    }
    for g in gpus.iter_mut() {
        g.trials = outcome
            .trials
            .iter()
            .filter(|t| t.gpu_index == Some(g.index))
            .cloned()
            .collect();
    }
    let trials = outcome.trials.clone();
    Ok((vec![Some(outcome); gpus.len()], trials))
}

/// The smallest answer split for the global batch and confirmed, with its accumulation, on every
/// GPU in parallel ([`split::confirmed`]); with the GPUs on which a size did not fit.
fn confirm_on_each(
    cfg: &ProbeConfig,
    gpus: &mut [Gpu],
    base: &SearchOutcome,
    progress: &mut dyn Progress,
) -> (split::SplitOutcome, Vec<String>) {
    let smallest = base.max_fitting.expect("complete searches fit");
    let (g, w) = cfg
        .global
        .unwrap_or((smallest * cfg.world_size, cfg.world_size));
    let mut failures: Vec<String> = vec![];
    let sizes = crate::accumulate::Sizes::new(cfg.search.multiple_of, cfg.search.min_batch);
    let outcome = split::confirmed(
        g,
        w,
        smallest,
        cfg.allow_uneven,
        sizes,
        &mut |b, acc, retest| {
            let purpose = if retest {
                Purpose::Retry
            } else {
                Purpose::Split
            };
            let results = each_gpu(gpus, progress, |gpu, p| {
                let limit = gpu.limit;
                let history = std::mem::take(&mut gpu.trials);
                let job_limit = gpu.skeleton.job_limit_bytes();
                let mut prober = Prober::new(&mut gpu.backend, cfg.search.clone(), limit)
                    .with_job_limit(job_limit)
                    .on_gpu(gpu.index)
                    .with_history(history)
                    .on_trial(move |t, all| p.trial(all.len(), t, limit));
                let r = prober.confirm_split_held(b, acc, purpose);
                let trials = prober.trials().to_vec();
                drop(prober);
                gpu.trials = trials;
                (gpu.index, r)
            });
            let mut combined = Confirmation::Fits;
            for (i, r) in results {
                match r? {
                    Confirmation::Fits => {}
                    Confirmation::OutOfMemory => {
                        failures.push(format!(
                            "micro-batch {b} × accumulation {acc} did not fit on GPU {i}"
                        ));
                        if combined == Confirmation::Fits {
                            combined = Confirmation::OutOfMemory;
                        }
                    }
                    Confirmation::Failed(why) => {
                        combined = Confirmation::Failed(format!("GPU {i}: {why}"));
                    }
                    Confirmation::AboveNoise { why, below } => {
                        failures.push(format!("GPU {i}: {why}"));
                        combined = match combined {
                            Confirmation::AboveNoise { why, below: was } => {
                                Confirmation::AboveNoise {
                                    why,
                                    below: was.min(below),
                                }
                            }
                            Confirmation::Failed(f) => Confirmation::Failed(f),
                            _ => Confirmation::AboveNoise {
                                why: format!("GPU {i}: {why}"),
                                below,
                            },
                        };
                    }
                }
            }
            Ok(combined)
        },
    );
    (outcome, failures)
}

/// The plan's recommendation from the confirmed split, its stop detail and the GPU section.
fn recommend(
    plan: &mut Plan,
    split: &crate::accumulate::Split,
    base: &SearchOutcome,
    gpu_count: usize,
    base_gpu: u32,
    per_gpu: Vec<PerGpu>,
) -> Result<(), ProbeError> {
    let rec_trial = best_fit(&plan.trials, split.micro_batch)
        .cloned()
        .ok_or_else(|| {
            ProbeError::Environment("the confirmed micro-batch has no fitting trial".into())
        })?;
    let smallest = base.max_fitting.expect("complete searches fit");
    plan.recommendation = Some(Recommendation::from_split(
        split,
        smallest,
        base.first_failing,
        &rec_trial,
    ));
    if let Some(w) = &split.warning {
        plan.warnings.push(w.clone());
    }
    plan.stop_detail = format!(
        "{}; the smallest of {gpu_count} GPUs' answers (GPU {base_gpu}), confirmed on every GPU{}",
        base.stop_reason.describe(),
        if base.stop_reason == crate::search::StopReason::Proven {
            super::single::LOCAL_PROOF
        } else {
            ""
        }
    );
    plan.warnings
        .extend(super::single::non_monotone(&plan.trials));
    if let Some(gs) = plan.gpu.as_mut() {
        gs.per_gpu = per_gpu;
        gs.footprint_method = rec_trial.outcome.gpu().map(|m| m.method);
    }
    plan.status = Status::Complete;
    Ok(())
}
