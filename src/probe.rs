//! `batchfit probe`: from a validated [`ProbeConfig`] to a written plan.
//!
//! Picks the backend, turns budget/reserve/margin into the limit, runs the search, solves the
//! accumulation split (confirming any size the split picks that no trial ran), and writes the plan.
//! Like hyperfine's exporters, the partial plan is rewritten after every trial, so a crash or an
//! interruption keeps what was measured; only a complete search writes `--out` (atomically).

use crate::accumulate;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Executor};
use crate::backend::sim::SimBackend;
use crate::backend::Backend;
use crate::cache::CacheOptions;
use crate::config::{self, BackendChoice, ProbeConfig};
use crate::gpu::{GpuError, GpuProcess, GpuQuery};
use crate::plan::GpuSection;
use crate::plan::{self, ModelInfo, Plan, Recommendation, Runtime, SearchSettings, Status, Tool};
use crate::search::{Prober, Purpose, SearchOutcome, Stop, StopReason, TrialRecord};
use crate::sysmem;
use crate::throughput;
use crate::trial::TrialSpec;
use crate::units::format_size;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// The smallest limit under which a libtorch process starts at all on CPU (data segment, measured).
pub const CPU_MIN_LIMIT: u64 = 600 << 20;

#[derive(Debug, Error)]
pub enum ProbeError {
    /// Bad input discovered once the device is known (budget vs device).
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Environment(String),
    #[error("cannot write the plan: {0}")]
    Write(#[from] plan::PlanError),
}

/// How the probe ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Complete,
    NothingFits,
    TrialErrors,
    Capped,
    Interrupted(i32),
}

#[derive(Debug)]
pub struct ProbeReport {
    pub plan: Plan,
    pub ending: Ending,
    /// Where the plan was written (the `--out` file or its `.partial` sibling).
    pub written: Option<PathBuf>,
    /// Notices for stderr (backend choice, warnings).
    pub notices: Vec<String>,
}

/// The resolved cuda set-up: NVML (or the fake GPUs of tests), the GPUs to probe, how trials run.
pub struct CudaSetup {
    pub gpus: Arc<dyn GpuQuery + Send + Sync>,
    pub fake: Option<crate::gpu::fake::Fake>,
    pub indices: Vec<u32>,
    pub driver: String,
}

impl CudaSetup {
    fn resolve(cfg: &ProbeConfig) -> Result<CudaSetup, ProbeError> {
        let env = |e: GpuError| match e {
            GpuError::NoSuchDevice { .. } => {
                ProbeError::Usage(format!("--gpus: {e}; `batchfit doctor` lists them"))
            }
            GpuError::Query(m) if m.starts_with("--gpus") => ProbeError::Usage(m),
            other => ProbeError::Environment(other.to_string()),
        };
        let fake = crate::gpu::fake::Fake::from_env()
            .transpose()
            .map_err(env)?;
        let gpus: Arc<dyn GpuQuery + Send + Sync> = match &fake {
            Some(f) => Arc::new(f.gpus.clone()),
            None => {
                if !tch::Cuda::is_available() {
                    // NVML may work while libtorch cannot use the GPU (driver/runtime mismatch).
                    let nvml = crate::gpu::nvml::RealNvml::get().map_err(env)?;
                    return Err(ProbeError::Environment(format!(
                        "NVML sees {} GPU(s) but libtorch sees no CUDA device (driver too old for \
                         CUDA {}, or CUDA_VISIBLE_DEVICES hides them); use --backend cpu or sim",
                        nvml.device_count().unwrap_or(0),
                        "13"
                    )));
                }
                Arc::new(crate::gpu::nvml::RealNvml::get().map_err(env)?)
            }
        };
        // A scheduler's (or the user's) CUDA_VISIBLE_DEVICES limits which GPUs this job may use.
        let visible = crate::gpu::visible_indices(
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            gpus.as_ref(),
        )
        .map_err(env)?;
        let default = match &visible {
            Some(v) => match v.first() {
                Some(i) => i.to_string(),
                None => {
                    return Err(ProbeError::Environment(
                        "CUDA_VISIBLE_DEVICES hides every GPU; unset it or name a GPU".into(),
                    ))
                }
            },
            None => "0".to_string(),
        };
        let mut indices =
            crate::gpu::select(cfg.gpus.as_deref().unwrap_or(&default), gpus.as_ref())
                .map_err(env)?;
        if let Some(v) = &visible {
            if cfg.gpus.as_deref().map(str::trim) == Some("all") {
                indices.retain(|i| v.contains(i));
            } else if let Some(i) = indices.iter().find(|i| !v.contains(i)) {
                return Err(ProbeError::Usage(format!(
                    "--gpus: GPU {i} is hidden by CUDA_VISIBLE_DEVICES={}; pick one of {v:?}",
                    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
                )));
            }
        }
        let driver = gpus.driver_version().map_err(env)?;
        Ok(CudaSetup {
            gpus,
            fake,
            indices,
            driver,
        })
    }

    /// The selected GPUs as `0, 2`.
    pub fn list(&self) -> String {
        self.indices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The backend of GPU `index`.
    pub fn backend(
        &self,
        index: u32,
        cfg: &ProbeConfig,
        exe: &Path,
    ) -> Result<CudaBackend, ProbeError> {
        let exec = match &self.fake {
            Some(f) => Executor::Fake(SimBackend::new(f.sim(index).ok_or_else(|| {
                ProbeError::Environment(format!(
                    "{}: no sim curve for GPU {index}",
                    crate::gpu::fake::ENV
                ))
            })?)),
            None => Executor::Real {
                exe: exe.to_path_buf(),
                template: trial_template(cfg),
            },
        };
        CudaBackend::new(
            self.gpus.clone(),
            index,
            exec,
            cfg.alloc_conf.clone(),
            cfg.trial_timeout,
        )
        .map_err(|e| ProbeError::Environment(e.to_string()))
    }

    /// The plan's `gpu` section for GPU `index` (as NVML saw it at the start).
    fn section(&self, b: &CudaBackend, cfg: &ProbeConfig) -> GpuSection {
        let g = b.gpu();
        let me = std::process::id();
        let others: Vec<GpuProcess> = g
            .processes
            .iter()
            .filter(|p| p.pid != me)
            .cloned()
            .collect();
        GpuSection {
            index: g.index,
            uuid: g.uuid.clone(),
            driver: self.driver.clone(),
            other_processes_bytes: others.iter().filter_map(|p| p.used_bytes).sum(),
            other_processes: others,
            alloc_conf: cfg.alloc_conf.clone(),
            footprint_method: None,
            per_gpu: vec![],
            alloc_conf_comparison: None,
            fake: self.fake.is_some(),
        }
    }
}

pub(crate) fn trial_template(cfg: &ProbeConfig) -> TrialSpec {
    TrialSpec {
        model: cfg.model.clone(),
        batch: 0,
        steps: 0,
        threads: cfg.threads,
        seed: cfg.seed,
        accumulation: 1,
        fault: cfg.fault,
        cuda_device: None,
    }
}

/// A cuda backend for GPU `index` outside a probe (`batchfit verify` of a cuda plan): NVML or the
/// fake GPUs of tests, trials from `template`.
pub fn standalone_cuda_backend(
    index: u32,
    template: TrialSpec,
    alloc_conf: Option<String>,
    timeout: std::time::Duration,
    exe: &Path,
) -> Result<CudaBackend, String> {
    let fake = crate::gpu::fake::Fake::from_env()
        .transpose()
        .map_err(|e| e.to_string())?;
    let (gpus, exec): (Arc<dyn GpuQuery + Send + Sync>, Executor) = match fake {
        Some(f) => {
            let sim = f
                .sim(index)
                .ok_or_else(|| format!("{}: no sim curve", crate::gpu::fake::ENV))?;
            (Arc::new(f.gpus), Executor::Fake(SimBackend::new(sim)))
        }
        None => (
            Arc::new(crate::gpu::nvml::RealNvml::get().map_err(|e| e.to_string())?),
            Executor::Real {
                exe: exe.to_path_buf(),
                template,
            },
        ),
    };
    CudaBackend::new(gpus, index, exec, alloc_conf, timeout).map_err(|e| e.to_string())
}

/// Whether `--backend auto` may pick CUDA: libtorch sees CUDA *and* NVML initialises (or the fake GPUs
/// of tests are set); `Err` says why not.
fn cuda_usable() -> Result<(), String> {
    if std::env::var_os(crate::gpu::fake::ENV).is_some() {
        return Ok(());
    }
    if !tch::Cuda::is_available() {
        return Err("libtorch sees no CUDA device".into());
    }
    crate::gpu::nvml::RealNvml::get()
        .map(|_| ())
        .map_err(|e| format!("NVML is unavailable: {e}"))
}

/// The backend the config asks for, resolved (auto → cuda or cpu, with a notice).
enum Resolved {
    Sim(crate::backend::sim::SimSpec),
    Cpu,
    Cuda(CudaSetup),
}

fn resolve(cfg: &ProbeConfig, notices: &mut Vec<String>) -> Result<Resolved, ProbeError> {
    match &cfg.backend {
        BackendChoice::Sim(spec) => Ok(Resolved::Sim(spec.clone())),
        BackendChoice::Cpu => Ok(Resolved::Cpu),
        BackendChoice::Cuda => Ok(Resolved::Cuda(CudaSetup::resolve(cfg)?)),
        BackendChoice::Auto => match cuda_usable() {
            Ok(()) => {
                if cfg.isolation == crate::backend::cpu::IsolationMode::Hybrid {
                    return Err(ProbeError::Usage(format!(
                        "--backend auto chose cuda: {}",
                        crate::config::HYBRID_ON_CUDA
                    )));
                }
                let setup = CudaSetup::resolve(cfg)?;
                notices.push(format!(
                    "batchfit: --backend auto: using cuda (GPU {})",
                    setup.list()
                ));
                Ok(Resolved::Cuda(setup))
            }
            Err(why) if cfg.model.precision.is_amp() => Err(ProbeError::Usage(format!(
                "--precision {} needs CUDA, and --backend auto chose the cpu ({why}); use --precision \
                 bf16 or fp32 on cpu",
                cfg.model.precision.as_str()
            ))),
            Err(why) if cfg.gpus.is_some() || cfg.compare_alloc_conf => {
                Err(ProbeError::Environment(format!(
                    "--gpus and --compare-alloc-conf need CUDA, and there is none here: {why}"
                )))
            }
            Err(why) => {
                notices.push(format!(
                    "batchfit: --backend auto: using the cpu backend ({why})"
                ));
                Ok(Resolved::Cpu)
            }
        },
    }
}

fn cpu_backend(cfg: &ProbeConfig, exe: &Path) -> Result<Box<dyn Backend>, ProbeError> {
    Ok(Box::new(
        CpuBackend::new(
            exe.to_path_buf(),
            trial_template(cfg),
            cfg.trial_timeout,
            cfg.isolation,
        )
        .map_err(|e| ProbeError::Environment(e.to_string()))?,
    ))
}

/// Gradient bytes per parameter (DDP's buckets hold one copy of the gradients).
fn gradient_bytes(cfg: &ProbeConfig) -> u64 {
    match cfg.model.precision {
        crate::models::Precision::Bf16 => 2,
        _ => 4,
    }
}

/// The cuda config with the world size defaulting to the number of GPUs and, for DDP (world size > 1)
/// without `--reserve`, one copy of the gradients reserved.
fn cuda_effective(
    cfg: &ProbeConfig,
    setup: &CudaSetup,
) -> Result<(ProbeConfig, Option<String>), ProbeError> {
    let mut c = cfg.clone();
    if !c.world_size_given {
        c.world_size = setup.indices.len() as u64;
        if let Some((g, _)) = c.global {
            accumulate::check_global(g, c.world_size).map_err(|e| {
                ProbeError::Usage(format!(
                    "{e} (the world size defaults to the {} GPU(s) of --gpus; give --world-size)",
                    setup.indices.len()
                ))
            })?;
            c.global = Some((g, c.world_size));
        }
    }
    let mut note = None;
    if c.world_size > 1 && !c.reserve_given {
        let bytes = c.model.parameter_count() * gradient_bytes(&c);
        c.reserve = bytes;
        note = Some(format!(
            "--reserve defaulted to {} for world size {}: DDP's gradient buckets hold about one copy of \
             the gradients ({} parameters × {} bytes) beside what a trial measures; give --reserve to \
             change it",
            format_size(bytes),
            c.world_size,
            c.model.parameter_count(),
            gradient_bytes(&c)
        ));
    }
    Ok((c, note))
}

/// `--compare-alloc-conf`: the same probe once more with `expandable_segments:True` added to
/// `PYTORCH_CUDA_ALLOC_CONF` (fewer, growable segments: less fragmentation), reported beside the plan.
fn compare_alloc_conf(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn Progress,
    plan: &Plan,
) -> Result<plan::AllocConfComparison, ProbeError> {
    let conf = match cfg.alloc_conf.as_deref() {
        Some(c) if c.contains("expandable_segments") => c
            .split(',')
            .map(|p| {
                if p.trim().starts_with("expandable_segments") {
                    "expandable_segments:True"
                } else {
                    p
                }
            })
            .collect::<Vec<_>>()
            .join(","),
        Some(c) => format!("{c},expandable_segments:True"),
        None => "expandable_segments:True".to_string(),
    };
    progress.line(&format!(
        "batchfit: --compare-alloc-conf: probing again with PYTORCH_CUDA_ALLOC_CONF={conf}"
    ));
    let mut c = cfg.clone();
    c.compare_alloc_conf = false;
    c.out = None;
    c.global = None;
    c.alloc_conf = Some(conf.clone());
    c.world_size_given = true;
    let other = run_cached(&c, exe, progress, None)?.plan;
    let theirs = other.recommendation.as_ref().map(|r| r.max_fitting_batch);
    let ours = plan.recommendation.as_ref().map(|r| r.max_fitting_batch);
    Ok(plan::AllocConfComparison {
        alloc_conf: conf,
        max_fitting_batch: theirs,
        peak_bytes: other.recommendation.as_ref().map(|r| r.peak_bytes),
        trials: other.trials.len(),
        difference: match (theirs, ours) {
            (Some(t), Some(o)) => Some(t as i64 - o as i64),
            _ => None,
        },
    })
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One progress line for stderr.
pub fn progress_line(n: usize, t: &TrialRecord, limit: u64) -> String {
    let peak = t
        .outcome
        .peak_bytes()
        .map(|p| {
            format!(
                "peak {:>10} ({:>3.0}% of limit)",
                format_size(p),
                100.0 * p as f64 / limit.max(1) as f64
            )
        })
        .unwrap_or_default();
    let msg = match (&t.outcome, t.outcome.message()) {
        (o, Some(m)) if !o.is_oom() => format!("  {m}"),
        _ => String::new(),
    };
    format!(
        "trial {n:>3}: batch {:>8} × {} steps {:<8} {:<7} {peak} {:>7.2} s{msg}",
        t.batch,
        t.steps,
        format!("{:?}", t.purpose).to_lowercase(),
        t.outcome.kind(),
        t.seconds
    )
}

/// Receives the probe's progress: lines for stderr, and every trial as it ends.
pub trait Progress {
    fn line(&mut self, line: &str);
    /// Trial number `n` (1-based) ended. Default: one [`progress_line`].
    fn trial(&mut self, n: usize, t: &TrialRecord, limit: u64) {
        self.line(&progress_line(n, t, limit));
    }
}

struct Lines<'a>(&'a mut dyn FnMut(&str));

impl Progress for Lines<'_> {
    fn line(&mut self, line: &str) {
        (self.0)(line)
    }
}

/// [`run_with`] with progress as plain lines.
pub fn run(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<ProbeReport, ProbeError> {
    run_with(cfg, exe, &mut Lines(progress))
}

pub fn run_with(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn Progress,
) -> Result<ProbeReport, ProbeError> {
    run_cached(cfg, exe, progress, None)
}

/// [`run_with`], answering from the plan cache ([`crate::cache`]) when `cache` allows it and the key
/// matches, and storing a complete plan there.
pub fn run_cached(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    let mut notices = vec![];
    let resolved = resolve(cfg, &mut notices)?;
    // The backend choice is news before the search, not after it.
    for n in notices.drain(..) {
        progress.line(&n);
    }
    let (owned_cfg, gpu_section, reserve_note, mut backend): (
        Option<ProbeConfig>,
        Option<GpuSection>,
        Option<String>,
        Box<dyn Backend>,
    ) = match resolved {
        Resolved::Sim(spec) => (None, None, None, Box::new(SimBackend::new(spec))),
        Resolved::Cpu => (None, None, None, cpu_backend(cfg, exe)?),
        Resolved::Cuda(setup) => {
            let (c, note) = cuda_effective(cfg, &setup)?;
            if setup.indices.len() > 1 {
                return crate::multi_gpu::run(&c, note, exe, progress, &setup);
            }
            let b = setup.backend(setup.indices[0], &c, exe)?;
            let section = setup.section(&b, &c);
            (Some(c), Some(section), note, Box::new(b))
        }
    };
    let cfg = owned_cfg.as_ref().unwrap_or(cfg);
    let device = backend.device().clone();
    let device_kind = device.kind.clone();
    let budget = cfg.budget.unwrap_or_else(|| backend.default_budget());
    if budget > device.total_bytes {
        return Err(ProbeError::Usage(format!(
            "--memory-budget {} is larger than the device's {} ({}); give at most {}",
            format_size(budget),
            format_size(device.total_bytes),
            device.name,
            format_size(device.total_bytes)
        )));
    }
    if cfg.reserve >= budget {
        return Err(ProbeError::Usage(format!(
            "--reserve {} leaves nothing of the {} budget; lower --reserve",
            format_size(cfg.reserve),
            format_size(budget)
        )));
    }
    let limit = config::limit(budget, cfg.reserve, cfg.margin);
    if device.kind == "cpu" && limit < CPU_MIN_LIMIT {
        return Err(ProbeError::Usage(format!(
            "the limit {} (budget {} − reserve {}, less the {:.0}% margin) is below the {} a libtorch process \
             needs to start on CPU; raise --memory-budget",
            format_size(limit),
            format_size(budget),
            format_size(cfg.reserve),
            cfg.margin * 100.0,
            format_size(CPU_MIN_LIMIT)
        )));
    }
    let world = cfg.world_size;
    let skeleton = Plan {
        schema_version: plan::SCHEMA_VERSION,
        status: Status::Partial,
        created_unix: now_unix(),
        tool: Tool::current(),
        device,
        model: ModelInfo::of(&cfg.model),
        runtime: Runtime {
            threads: cfg.threads,
            seed: cfg.seed,
            malloc_mmap_threshold: sysmem::MMAP_THRESHOLD,
            malloc_arena_max: sysmem::ARENA_MAX,
        },
        budget_bytes: budget,
        reserve_bytes: cfg.reserve,
        margin: cfg.margin,
        limit_bytes: limit,
        search: SearchSettings::of(
            &cfg.search,
            cfg.trial_timeout.as_secs_f64(),
            (device_kind != "sim").then_some(cfg.isolation),
        ),
        recommendation: None,
        stop_reason: StopReason::Interrupted,
        stop_detail: "search in progress".into(),
        trials: vec![],
        warnings: vec![],
        verified: None,
        sources: vec![],
        sim_spec: match &cfg.backend {
            BackendChoice::Sim(s) => Some(s.clone()),
            _ => None,
        },
        gpu: gpu_section,
        reserve_note,
    };
    let partial = cfg.out.as_deref().map(plan::partial_path);
    // Fault injection is a test of the trial runner: never answered from, nor stored in, the cache.
    let cache = cache.filter(|_| cfg.fault.is_none());
    let cache_key = cache.map(|_| crate::cache::key(&skeleton, cfg));
    if let (Some(c), Some(key)) = (cache.filter(|c| c.read), &cache_key) {
        if let Some(plan) = crate::cache::lookup(&c.dir, key) {
            notices.push(format!(
                "batchfit: plan from cache ({}, probed {}; --refresh re-probes, --no-cache ignores the cache)",
                c.dir.join(format!("{key}.json")).display(),
                crate::cache::format_date(plan.created_unix)
            ));
            let written = match &cfg.out {
                Some(out) => {
                    plan.write_atomic(out)?;
                    if let Some(p) = &partial {
                        let _ = std::fs::remove_file(p);
                    }
                    Some(out.clone())
                }
                None => None,
            };
            return Ok(ProbeReport {
                plan,
                ending: Ending::Complete,
                written,
                notices,
            });
        }
    }
    progress.line(&format!(
        "batchfit: {} on {} ({}): budget {}, limit {} ({} params)",
        skeleton.model.name,
        skeleton.device.kind,
        skeleton.device.name,
        format_size(budget),
        format_size(limit),
        skeleton.model.parameter_count
    ));

    let mut write_error = None;
    let mut non_monotonic: Vec<(u64, bool)> = vec![];
    let mut accumulation_failures: Vec<(u64, u32)> = vec![];
    let (outcome, split_result) = {
        let sk = &skeleton;
        let partial = partial.clone();
        let write_error = &mut write_error;
        let progress = &mut *progress;
        let mut prober =
            Prober::new(backend.as_mut(), cfg.search.clone(), limit).on_trial(move |t, all| {
                progress.trial(all.len(), t, limit);
                if let Some(p) = &partial {
                    let mut snap = sk.clone();
                    snap.trials = all.to_vec();
                    if let Err(e) = snap.write_atomic(p) {
                        *write_error = Some(e);
                    }
                }
            });
        let outcome = prober.search();
        // Accumulation split, and a confirmation trial for a split size no trial ran.
        let split_result = match (outcome.max_fitting, outcome.stop_reason.is_complete()) {
            (Some(max), true) => {
                let (g, w) = cfg.global.unwrap_or((max * world, world));
                // Each split is proven the way the trainer runs it: its micro-batch with its
                // accumulation (accumulating holds more memory than one micro-batch alone). If that
                // fails, the split is recomputed below the failing size (a few times at most).
                let mut cap = max;
                let mut result = None;
                for _ in 0..8 {
                    let s = match accumulate::split(g, w, cap, cfg.allow_uneven) {
                        Ok(s) => s,
                        Err(e) => {
                            result = Some(Err(Stop::Fatal(e.to_string())));
                            break;
                        }
                    };
                    let acc = s.accumulation.min(u32::MAX as u64) as u32;
                    let mut sizes = s.micro_batches.clone();
                    sizes.sort_unstable();
                    sizes.dedup();
                    let mut confirmed: Result<(), Stop> = Ok(());
                    let mut lower_cap = None;
                    for b in sizes.into_iter().rev() {
                        // A failure of a size below a proven fit (accumulation 1) means memory is
                        // not monotonic in the batch size here: re-test once, then resolve
                        // conservatively (no recommendation of that split) and flag it.
                        let first = prober.confirm_split(b, acc, Purpose::Split);
                        if acc > 1 {
                            match first {
                                Ok(true) => continue,
                                Ok(false) => {
                                    accumulation_failures.push((b, acc));
                                    lower_cap = Some(b - 1);
                                }
                                Err(e) => confirmed = Err(e),
                            }
                            break;
                        }
                        let again = match first {
                            Ok(false) => {
                                let retest = prober.confirm_split(b, acc, Purpose::Retry);
                                non_monotonic.push((b, matches!(retest, Ok(true))));
                                retest.map(|_| false)
                            }
                            other => other,
                        };
                        match again {
                            Ok(true) => {}
                            Ok(false) => {
                                confirmed = Err(Stop::Fatal(format!(
                                    "micro-batch {b} chosen by the accumulation split did not fit although {max} \
                                     did: memory is not monotonic in the batch size here; re-run with --global-batch \
                                     a multiple of {max}"
                                )));
                                break;
                            }
                            Err(e) => {
                                confirmed = Err(e);
                                break;
                            }
                        }
                    }
                    match lower_cap {
                        Some(c) if c > 0 => cap = c,
                        Some(_) => {
                            result = Some(Err(Stop::Fatal(
                                "no micro-batch fits with gradient accumulation".into(),
                            )));
                            break;
                        }
                        None => {
                            result = Some(confirmed.map(|_| s));
                            break;
                        }
                    }
                }
                Some(result.unwrap_or_else(|| {
                    Err(Stop::Fatal(
                        "every accumulation split tried ran out of memory; lower the global batch or the budget's \
                         pressure"
                            .into(),
                    ))
                }))
            }
            _ => None,
        };
        let outcome = SearchOutcome {
            trials: prober.trials().to_vec(),
            ..outcome
        };
        (outcome, split_result)
    };
    if let Some(e) = write_error {
        return Err(e.into());
    }

    let mut plan = skeleton.clone();
    plan.trials = outcome.trials.clone();
    for (b, a) in &accumulation_failures {
        plan.warnings.push(format!(
            "micro-batch {b} fits alone but ran out of memory with {a} accumulated micro-batches (gradient \
             accumulation holds more memory); the split was recomputed below {b}"
        ));
    }
    for (b, retest_fit) in &non_monotonic {
        plan.warnings.push(format!(
            "non-monotonic memory: micro-batch {b} ran out of memory although {} fit; the re-test {}; \
             resolved conservatively: no recommendation relies on {b}",
            outcome.max_fitting.unwrap_or(0),
            if *retest_fit { "fit (flaky near the limit)" } else { "ran out of memory again" }
        ));
    }
    plan.stop_reason = outcome.stop_reason;
    plan.stop_detail = outcome
        .fatal
        .clone()
        .unwrap_or_else(|| outcome.stop_reason.describe().to_string());
    let mut ending = match outcome.stop_reason {
        r if r.is_complete() => Ending::Complete,
        StopReason::NothingFits => Ending::NothingFits,
        StopReason::Interrupted => {
            Ending::Interrupted(outcome.interrupted_by.unwrap_or(libc::SIGINT))
        }
        StopReason::MaxTrials | StopReason::TimeLimit => Ending::Capped,
        StopReason::TrialErrors => Ending::TrialErrors,
        _ => Ending::TrialErrors,
    };
    match split_result {
        Some(Ok(s)) => {
            let max = outcome.max_fitting.expect("split only with a fit");
            let rec = outcome
                .trials
                .iter()
                .filter(|t| t.batch == s.micro_batch && t.outcome.fits())
                .max_by_key(|t| (t.accumulation, t.steps))
                .expect("split size confirmed");
            let mut r = Recommendation::from_split(&s, max, outcome.first_failing, rec);
            if let Some(a) = throughput::advise(
                &outcome.trials,
                cfg.search.steps,
                cfg.search.confirm_steps,
                cfg.throughput_tolerance,
                r.micro_batch,
            ) {
                r.fastest_micro_batch = Some(a.fastest.batch);
                r.fastest_samples_per_second = Some(a.fastest.samples_per_second);
            }
            plan.recommendation = Some(r);
            if let Some(w) = &s.warning {
                plan.warnings.push(w.clone());
            }
            plan.status = Status::Complete;
        }
        Some(Err(stop)) => {
            match stop {
                Stop::Interrupted(sig) => {
                    plan.stop_reason = StopReason::Interrupted;
                    plan.stop_detail = StopReason::Interrupted.describe().into();
                    ending = Ending::Interrupted(sig);
                }
                Stop::Reason(r) => {
                    plan.stop_reason = r;
                    plan.stop_detail = r.describe().into();
                    ending = Ending::Capped;
                }
                Stop::Fatal(m) => {
                    plan.stop_reason = StopReason::TrialErrors;
                    plan.stop_detail = m;
                    ending = Ending::TrialErrors;
                }
            }
            plan.status = Status::Partial;
        }
        None => {
            plan.status = if ending == Ending::NothingFits {
                Status::NothingFits
            } else {
                Status::Partial
            };
        }
    }

    if let (Some(g), Some(r)) = (plan.gpu.as_mut(), plan.recommendation.as_ref()) {
        g.footprint_method = plan
            .trials
            .iter()
            .filter(|t| t.batch == r.micro_batch && t.outcome.fits())
            .find_map(|t| t.outcome.gpu().map(|m| m.method));
    }
    if cfg.compare_alloc_conf && plan.status == Status::Complete && plan.gpu.is_some() {
        let comparison = compare_alloc_conf(cfg, exe, progress, &plan)?;
        if let Some(g) = plan.gpu.as_mut() {
            g.alloc_conf_comparison = Some(comparison);
        }
    }
    let written = match (&cfg.out, plan.status) {
        (Some(out), Status::Complete) => {
            plan.write_atomic(out)?;
            if let Some(p) = &partial {
                let _ = std::fs::remove_file(p);
            }
            Some(out.clone())
        }
        (Some(_), _) => {
            let p = partial.expect("partial path with --out");
            plan.write_atomic(&p)?;
            Some(p)
        }
        (None, _) => None,
    };
    if let (Some(c), Some(key), Status::Complete) =
        (cache.filter(|c| c.write), &cache_key, plan.status)
    {
        if let Err(e) = crate::cache::store(&c.dir, key, &plan) {
            notices.push(format!("batchfit: warning: the plan was not cached: {e}"));
        }
    }
    Ok(ProbeReport {
        plan,
        ending,
        written,
        notices,
    })
}

/// A human summary of a plan.
pub fn summary(plan: &Plan) -> String {
    let mut s = String::new();
    let n = plan.trials.len();
    let secs: f64 = plan.trials.iter().map(|t| t.seconds).sum();
    match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => {
            s += &format!(
                "micro-batch {} × accumulation {} × world size {} = global batch {}\n",
                r.micro_batch, r.accumulation, r.world_size, r.global_batch
            );
            s += &format!(
                "largest fitting micro-batch: {}{} ; peak {} of the {} limit ({:.0}%); {:.0} samples/s\n",
                r.max_fitting_batch,
                r.first_failing_batch.map(|f| format!(" ({f} ran out of memory)")).unwrap_or_default(),
                format_size(r.peak_bytes),
                format_size(plan.limit_bytes),
                100.0 * r.peak_bytes as f64 / plan.limit_bytes.max(1) as f64,
                r.samples_per_second
            );
        }
        _ => s += &format!("no recommendation: status {:?}\n", plan.status),
    }
    if plan.status == Status::Complete {
        if let Some(line) = throughput::summary_line(plan) {
            s += &line;
        }
    }
    s += &format!("stopped: {}\n", plan.stop_detail);
    s += &format!("{n} trials, {secs:.1} s of trials\n");
    for w in &plan.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}
