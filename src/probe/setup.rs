//! From a validated config to devices ready to run trials: the workload, the device (auto → cuda or
//! cpu), the GPUs of `--gpus`, the budget → limit, and the plan's skeleton. Shared by the probe and
//! `batchfit verify` ([`plan_backend`]).

use super::report::ProbeError;
use crate::accumulate;
use crate::cli::CpuLimitArg;
use crate::config::{self, BackendChoice, Parallel, PeakNoise, ProbeConfig, WorkloadSpec};
use crate::device::cgroup;
use crate::device::cpu::CpuBackend;
use crate::device::cuda::{fake, CudaBackend, Executor};
use crate::device::sim::{SimBackend, SimSpec};
use crate::device::{Backend, DeviceKind, IsolationMode, LimitMechanism};
use crate::gpu::{GpuError, GpuProcess, GpuQuery};
use crate::plan::model::ModelSpec;
use crate::plan::schema::{ExecInfo, WorkloadInfo};
use crate::plan::{GpuSection, Plan, Runtime, SearchSettings, Status, StopReason, Tool};
use crate::platform::units::format_size;
use crate::platform::{now_unix, sysmem};
use crate::protocol::Workload;
use crate::workload::exec::ExecWorkload;
use crate::workload::fault::FaultAt;
use crate::workload::runner::{Runner, TrialSpec};
use crate::workload::{ModelWorkload, LIBTORCH_MIN_DATA};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The tch model workload of `model`: trials are the torch runner's (`batchfit-torch trial …`), on
/// the user's own torch; an error when the runner or a usable torch is missing.
pub fn model_workload(
    model: &ModelSpec,
    threads: u32,
    seed: i64,
    fault: Option<FaultAt>,
) -> Result<Arc<dyn Workload>, ProbeError> {
    let runner = Runner::locate().map_err(|e| ProbeError::Environment(e.to_string()))?;
    Ok(Arc::new(ModelWorkload {
        runner,
        template: TrialSpec {
            model: model.clone(),
            batch: 0,
            steps: 0,
            threads,
            seed,
            accumulation: 1,
            fault,
            cuda_device: None,
        },
    }))
}

/// The user's command of `info` (`batchfit probe --exec`, and `verify` of its plans).
pub fn exec_workload(
    info: &ExecInfo,
    oom_patterns: Vec<regex_lite::Regex>,
    world_size: Option<u64>,
    warm: bool,
    ends_early_below: u32,
    observe: bool,
) -> Result<Arc<dyn Workload>, ProbeError> {
    ExecWorkload::new(info.clone(), oom_patterns, info.threads)
        .and_then(|w| w.with_observe(observe))
        .map(|w| {
            let w = w
                .with_world_size(world_size)
                .with_warm(warm)
                .ending_early_below(ends_early_below);
            Arc::new(w) as Arc<dyn Workload>
        })
        .map_err(|e| {
            ProbeError::Environment(format!("cannot make a folder for the trials' reports: {e}"))
        })
}

/// What `cfg`'s trials run: the user's command (`--exec`), else batchfit's tch model.
fn workload(cfg: &ProbeConfig) -> Result<Arc<dyn Workload>, ProbeError> {
    match &cfg.workload {
        WorkloadSpec::Exec(e) => exec_workload(
            &e.info,
            e.oom_patterns.clone(),
            Some(cfg.world_size),
            e.warm,
            cfg.search.confirm_steps.max(cfg.search.steps),
            e.observe,
        ),
        WorkloadSpec::Model(m) => model_workload(m, cfg.threads, cfg.seed, cfg.fault),
    }
}

/// `--logs DIR`, created when missing, and held for this process (see [`hold_logs_dir`]).
fn logs_dir(cfg: &ProbeConfig) -> Result<Option<std::path::PathBuf>, ProbeError> {
    let Some(d) = &cfg.logs else { return Ok(None) };
    std::fs::create_dir_all(d).map_err(|e| {
        ProbeError::Environment(format!("cannot create --logs {}: {e}", d.display()))
    })?;
    hold_logs_dir(d)?;
    Ok(Some(d.clone()))
}

/// The name of the lock file in a `--logs` directory.
pub const LOGS_LOCK: &str = ".batchfit-logs.lock";

/// Trial logs are named by the trial's number (`trial-001-b1-a1.stdout`, documented), so two probes
/// writing to one `--logs` directory would overwrite each other's logs and each plan's `details.log`
/// could name the other run's output. The first probe holds [`LOGS_LOCK`] in the directory until it
/// exits ([`crate::platform::lock`]: every backend of one process shares it, the lock file goes at
/// exit); a second process is refused before any trial.
fn hold_logs_dir(d: &Path) -> Result<(), ProbeError> {
    use crate::platform::lock::{self, LockError};
    let env = |why: String| ProbeError::Environment(format!("--logs {}: {why}", d.display()));
    let dir = d.canonicalize().map_err(|e| env(e.to_string()))?;
    lock::hold(&dir.join(LOGS_LOCK)).map_err(|e| match e {
        LockError::Held { .. } => ProbeError::Usage(format!(
            "--logs {}: another batchfit probe is writing its trial logs there ({e}; their names \
             would collide); give each probe its own --logs directory",
            d.display()
        )),
        e => env(e.to_string()),
    })
}

/// The resolved cuda set-up: NVML (or the scripted GPUs of tests), the GPUs to probe.
pub struct CudaSetup {
    pub gpus: Arc<dyn GpuQuery + Send + Sync>,
    pub fake: Option<fake::Fake>,
    pub indices: Vec<u32>,
    pub driver: String,
}

fn gpu_error(e: GpuError) -> ProbeError {
    match e {
        GpuError::NoSuchDevice { .. } => {
            ProbeError::Usage(format!("--gpus: {e}; `batchfit doctor` lists them"))
        }
        e if e.is_usage() => ProbeError::Usage(e.to_string()),
        other => ProbeError::Environment(other.to_string()),
    }
}

impl CudaSetup {
    fn resolve(cfg: &ProbeConfig) -> Result<CudaSetup, ProbeError> {
        let fake = fake::Fake::from_env().transpose().map_err(gpu_error)?;
        let gpus: Arc<dyn GpuQuery + Send + Sync> = match &fake {
            Some(f) => Arc::new(f.gpus.clone()),
            None => {
                let nvml = crate::gpu::nvml::RealNvml::get().map_err(gpu_error)?;
                if let Err(why) = torch_sees_cuda(cfg) {
                    // NVML may work while libtorch cannot use the GPU (driver/runtime mismatch).
                    return Err(ProbeError::Environment(format!(
                        "NVML sees {} GPU(s) but {why} (driver too old for the torch's CUDA, a \
                         CPU-only torch, or CUDA_VISIBLE_DEVICES hides them); use --backend cpu or sim",
                        nvml.device_count().unwrap_or(0),
                    )));
                }
                Arc::new(nvml)
            }
        };
        // A scheduler's (or the user's) CUDA_VISIBLE_DEVICES limits which GPUs this job may use.
        let visible_env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let visible = crate::gpu::visible_indices(visible_env.as_deref(), gpus.as_ref())
            .map_err(gpu_error)?;
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
                .map_err(gpu_error)?;
        if let Some(v) = &visible {
            if cfg.gpus.as_deref().map(str::trim) == Some("all") {
                indices.retain(|i| v.contains(i));
            } else if let Some(i) = indices.iter().find(|i| !v.contains(i)) {
                return Err(ProbeError::Usage(format!(
                    "--gpus: GPU {i} is hidden by CUDA_VISIBLE_DEVICES={}; pick one of {v:?}",
                    visible_env.unwrap_or_default()
                )));
            }
        }
        let driver = gpus.driver_version().map_err(gpu_error)?;
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

    /// The device of GPU `index`.
    pub fn backend(&self, index: u32, cfg: &ProbeConfig) -> Result<CudaBackend, ProbeError> {
        let exec = match &self.fake {
            Some(f) => Executor::Fake(SimBackend::new(f.sim(index).ok_or_else(|| {
                ProbeError::Environment(format!("{}: no sim curve for GPU {index}", fake::ENV))
            })?)),
            None => Executor::Real(workload(cfg)?),
        };
        let b = CudaBackend::new(
            self.gpus.clone(),
            index,
            exec,
            cfg.alloc_conf.clone(),
            cfg.trial_timeout,
        )
        .map_err(|e| ProbeError::Environment(e.to_string()))?;
        Ok(match logs_dir(cfg)? {
            Some(d) => b.with_logs(d),
            None => b,
        })
    }

    /// The plan's `gpu` section for the GPU of `b` (as NVML saw it at the start).
    pub fn section(&self, b: &CudaBackend, cfg: &ProbeConfig) -> GpuSection {
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

/// Whether `cfg`'s trials can use CUDA beyond NVML: a user's command decides that itself (its own
/// torch); batchfit's model trials need the torch runner's libtorch to see a CUDA device.
fn torch_sees_cuda(cfg: &ProbeConfig) -> Result<(), String> {
    if !cfg.workload.runs_the_torch_runner() {
        return Ok(());
    }
    let runner = Runner::locate().map_err(|e| e.to_string())?;
    match runner.info() {
        Ok(info) if info.cuda_available => Ok(()),
        Ok(_) => Err(format!(
            "the torch at {} sees no CUDA device",
            runner.torch.dir.display()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether `--backend auto` may pick CUDA: NVML initialises *and* the trials' torch sees CUDA (or
/// the fake GPUs of tests are set); `Err` says why not.
fn cuda_usable(cfg: &ProbeConfig) -> Result<(), String> {
    if std::env::var_os(fake::ENV).is_some() {
        return Ok(());
    }
    use crate::gpu::nvml::RealNvml;
    if let Err(e) = RealNvml::get() {
        // a machine without a driver at all gets one short line: where NVML was looked for is
        // `batchfit doctor`'s, not every cpu probe's
        return Err(if RealNvml::no_library() {
            NO_DRIVER.to_string()
        } else {
            format!("NVML is unavailable: {e}")
        });
    }
    torch_sees_cuda(cfg)
}

/// Why `--backend auto` uses the cpu on a machine with no NVIDIA driver.
pub const NO_DRIVER: &str =
    "no NVIDIA driver on this machine; `batchfit doctor` says where it looked";

/// The devices a probe runs on.
pub enum Devices {
    Sim(SimSpec),
    Cpu,
    Cuda(CudaSetup),
}

/// The device the config asks for, resolved (auto → cuda or cpu, with a notice in `notices`).
pub fn resolve(cfg: &ProbeConfig, notices: &mut Vec<String>) -> Result<Devices, ProbeError> {
    match &cfg.backend {
        BackendChoice::Sim(spec) => Ok(Devices::Sim(spec.clone())),
        BackendChoice::Cpu => Ok(Devices::Cpu),
        BackendChoice::Cuda => Ok(Devices::Cuda(CudaSetup::resolve(cfg)?)),
        BackendChoice::Auto => match cuda_usable(cfg) {
            Ok(()) => {
                if cfg.isolation == IsolationMode::Hybrid {
                    return Err(ProbeError::Usage(format!(
                        "--backend auto chose cuda: {}",
                        config::HYBRID_ON_CUDA
                    )));
                }
                let setup = CudaSetup::resolve(cfg)?;
                notices.push(format!(
                    "batchfit: --backend auto: using cuda (GPU {})",
                    setup.list()
                ));
                Ok(Devices::Cuda(setup))
            }
            Err(why) if cfg.workload.cuda_only_precision().is_some() => {
                Err(ProbeError::Usage(format!(
                    "--precision {} needs CUDA, and --backend auto chose the cpu ({why}); use \
                     --precision bf16 or fp32 on cpu",
                    cfg.workload
                        .cuda_only_precision()
                        .map_or("", |p| p.as_str())
                )))
            }
            Err(why) if cfg.gpus.is_some() || cfg.compare_alloc_conf => {
                Err(ProbeError::Environment(format!(
                    "--gpus and --compare-alloc-conf need CUDA, and there is none here: {why}"
                )))
            }
            Err(why) => {
                notices.push(format!(
                    "batchfit: --backend auto: using the cpu backend ({why})"
                ));
                Ok(Devices::Cpu)
            }
        },
    }
}

/// The cpu device running `work` (`cfg`'s workload); a user's command in a memory cgroup per trial
/// where `--cpu-limit` asks for one or `auto` finds one (`notices` says which and why).
fn cpu_backend(
    cfg: &ProbeConfig,
    work: Arc<dyn Workload>,
    notices: &mut Vec<String>,
) -> Result<CpuBackend, ProbeError> {
    let mut b = CpuBackend::new(work, cfg.trial_timeout, cfg.isolation)
        .map_err(|e| ProbeError::Environment(e.to_string()))?;
    if !cfg.workload.forks_warm_trials() {
        b = b.without_fork_server();
    }
    match (cfg.workload.cpu_limit(), cgroup::parent()) {
        (CpuLimitArg::Rlimit, _) => {}
        (_, Ok(parent)) => b = b.with_cgroup(parent),
        (CpuLimitArg::Cgroup, Err(why)) => {
            return Err(ProbeError::Environment(format!(
                "--cpu-limit cgroup: {why}; use --cpu-limit rlimit (RLIMIT_DATA on each process)"
            )))
        }
        (CpuLimitArg::Auto, Err(why)) => notices.push(format!(
            "batchfit: --cpu-limit auto: no memory cgroup for trials ({why}); each process of the \
             command runs under RLIMIT_DATA instead"
        )),
    }
    Ok(match logs_dir(cfg)? {
        Some(d) => b.with_logs(d),
        None => b,
    })
}

/// `--parallel` on the cpu: `N` cpu devices, each running its own trials under its own limit
/// (its own cgroup or `RLIMIT_DATA`), running one workload (so that no two trials share a
/// `BATCHFIT_TRIAL`, a report's file or a temporary folder) and numbered together (so that their
/// trials' cgroups and logs never share a name). `--parallel N` is refused (a usage error) when `N` budgets do not fit in
/// the memory available now: trials at once each take up to the budget. `auto` takes as many as
/// [`auto_width`] allows.
pub fn cpu_backends(
    cfg: &ProbeConfig,
    notices: &mut Vec<String>,
) -> Result<Vec<CpuBackend>, ProbeError> {
    let work = workload(cfg)?;
    let first = cpu_backend(cfg, Arc::clone(&work), notices)?;
    let budget = cfg.budget.unwrap_or_else(|| first.default_budget());
    let available = || {
        sysmem::available_bytes()
            .map_err(|e| ProbeError::Environment(format!("cannot read /proc/meminfo: {e}")))
    };
    let n = match cfg.parallel {
        Parallel::Auto => auto_width(cfg, budget, available()?),
        Parallel::Trials(n) => n.max(1),
    };
    if cfg.parallel != Parallel::Auto && n > 1 {
        let available = available()?;
        if budget.saturating_mul(u64::from(n)) > available {
            return Err(ProbeError::Usage(format!(
                "--parallel {n} runs {n} trials at once, each up to the budget of {} ({}): {} in \
                 all, but {} is available now; give --memory-budget {} or less, or a smaller \
                 --parallel",
                format_size(budget),
                if cfg.budget.is_some() {
                    "--memory-budget".to_string()
                } else {
                    format!(
                        "{:.0}% of the memory available, as no --memory-budget was given",
                        crate::device::cpu::DEFAULT_BUDGET_FRACTION * 100.0
                    )
                },
                format_size(budget.saturating_mul(u64::from(n))),
                format_size(available),
                format_size(available / u64::from(n)),
            )));
        }
    }
    let mut all = vec![];
    for _ in 1..n {
        all.push(cpu_backend(cfg, Arc::clone(&work), &mut vec![])?.numbered_with(&first));
    }
    all.insert(0, first);
    Ok(all)
}

/// `--parallel auto` on the cpu: the proof's cold trials at once (the failure above, the
/// confirmation and its repeats), at most one per core and per budget the memory available now
/// holds; 1 where trials share a worker (`--isolation hybrid`).
pub fn auto_width(cfg: &ProbeConfig, budget: u64, available: u64) -> u32 {
    if cfg.isolation == IsolationMode::Hybrid {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let budgets = available / budget.max(1);
    let proof = 2 + u64::from(cfg.search.repeats);
    cores.min(budgets).min(proof).max(1) as u32
}

/// The cuda config with the world size defaulting to the number of GPUs and, for DDP (world size > 1)
/// without `--reserve`, one copy of the gradients reserved (the note says so).
pub fn cuda_effective(
    cfg: &ProbeConfig,
    setup: &CudaSetup,
) -> Result<(ProbeConfig, Option<String>), ProbeError> {
    let mut c = cfg.clone();
    if !c.world_size_given {
        c.world_size = setup.indices.len() as u64;
        if let Some((g, _)) = c.global {
            accumulate::check_against_sizes(
                g,
                c.world_size,
                accumulate::Sizes::new(c.search.multiple_of, c.search.min_batch),
                c.search.max_batch,
            )
            .map_err(|e| {
                ProbeError::Usage(format!(
                    "{e} (the world size defaults to the {} GPU(s) of --gpus; give --world-size)",
                    setup.indices.len()
                ))
            })?;
            c.global = Some((g, c.world_size));
        }
    }
    let mut note = None;
    // (a trial that is the whole DDP job has its buckets in it already)
    let gradients = c.workload.ddp_gradients();
    if let Some((parameters, per)) = gradients.filter(|_| c.world_size > 1 && !c.reserve_given) {
        let bytes = parameters * per;
        c.reserve = bytes;
        note = Some(format!(
            "--reserve defaulted to {} for world size {}: DDP's gradient buckets hold about one copy of \
             the gradients ({} parameters × {} bytes) beside what a trial measures; give --reserve to \
             change it",
            format_size(bytes),
            c.world_size,
            parameters,
            per
        ));
    }
    Ok((c, note))
}

/// The limit a probe's trials run under, and how it was reached.
struct TrialLimit {
    /// `--memory-budget`, or the device's default.
    budget: u64,
    /// The budget less the reserve and the margin: the job's limit.
    unguarded: u64,
    /// The guard band, as the share of `unguarded` the plan records.
    guard_band: Option<f64>,
    /// `unguarded` less the guard band: the trials' limit.
    limit: u64,
}

/// The trials' limit on `backend`: the budget checked against the device and the reserve, less
/// the reserve, the margin and the guard band; a limit below what batchfit's torch runner starts in
/// on CPU is refused.
fn trial_limit(cfg: &ProbeConfig, backend: &dyn Backend) -> Result<TrialLimit, ProbeError> {
    let device = backend.device();
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
    let unguarded = config::limit(budget, cfg.reserve, cfg.margin);
    let guard_band = guard_band(
        backend.limit_mechanism(),
        cfg.workload.peak_noise(),
        unguarded,
    );
    let limit = guarded(unguarded, guard_band);
    let libtorch = cfg.workload.runs_the_torch_runner();
    if device.kind == DeviceKind::Cpu && libtorch && limit < LIBTORCH_MIN_DATA {
        return Err(ProbeError::Usage(format!(
            "the limit {} (budget {} − reserve {}, less the {:.0}% margin) is below the {} a libtorch process \
             needs to start on CPU; raise --memory-budget",
            format_size(limit),
            format_size(budget),
            format_size(cfg.reserve),
            cfg.margin * 100.0,
            format_size(LIBTORCH_MIN_DATA)
        )));
    }
    Ok(TrialLimit {
        budget,
        unguarded,
        guard_band,
        limit,
    })
}

/// The plan before any trial, on `backend`, and the limit its trials run under: the budget (given,
/// or the device's default) checked against the device, less the reserve and the margin.
pub fn skeleton(
    cfg: &ProbeConfig,
    backend: &dyn Backend,
    gpu: Option<GpuSection>,
    reserve_note: Option<String>,
) -> Result<(Plan, u64), ProbeError> {
    let device = backend.device().clone();
    let TrialLimit {
        budget,
        unguarded,
        guard_band,
        limit,
    } = trial_limit(cfg, backend)?;
    let libtorch = cfg.workload.runs_the_torch_runner();
    let sim_spec = match &cfg.backend {
        BackendChoice::Sim(s) => Some(s.clone()),
        _ => None,
    };
    let mut plan = Plan {
        schema_version: crate::plan::SCHEMA_VERSION,
        status: Status::Partial,
        created_unix: now_unix(),
        tool: match &cfg.backend {
            BackendChoice::Cpu | BackendChoice::Cuda | BackendChoice::Auto if libtorch => {
                Runner::locate()
                    .map_or_else(|_| Tool::current(), |r| Tool::on_torch(&r.torch.version))
            }
            _ => Tool::current(),
        },
        model: cfg.workload.info(),
        runtime: Runtime {
            threads: cfg.threads,
            seed: cfg.seed,
            malloc_mmap_threshold: sysmem::MMAP_THRESHOLD,
            malloc_arena_max: sysmem::ARENA_MAX,
            // trial processes inherit this process's stack limit and environment
            process: (device.kind != DeviceKind::Sim).then(|| crate::plan::ProcessSetup {
                stack_limit_bytes: sysmem::stack_limit(),
                env: sysmem::memory_env(),
            }),
        },
        budget_bytes: budget,
        reserve_bytes: cfg.reserve,
        margin: cfg.margin,
        limit_bytes: limit,
        search: SearchSettings::of(
            &cfg.search,
            cfg.trial_timeout.as_secs_f64(),
            (device.kind != DeviceKind::Sim).then_some(cfg.isolation),
        ),
        device,
        recommendation: None,
        stop_reason: StopReason::Interrupted,
        stop_detail: "search in progress".into(),
        trials: vec![],
        warnings: cfg.warnings.clone(),
        verified: None,
        verification_failure: None,
        sources: vec![],
        sim_spec,
        gpu,
        reserve_note,
        limit_mechanism: Some(backend.limit_mechanism()),
        guard_band,
        // the band as applied (the quarter cap included): what the job has above `limit_bytes`
        guard_band_bytes: guard_band.map(|_| unguarded - limit),
        capacity_model: None,
        trials_elsewhere: vec![],
        sweep: None,
    };
    plan.search.parallel = (backend.width() > 1).then_some(backend.width() as u32);
    if let Some(b) = guard_band_bytes(backend.limit_mechanism(), cfg.workload.peak_noise())
        .filter(|&b| guard_band.is_some() && b > unguarded / 4)
    {
        plan.warnings.push(format!(
            "the guard band was cut to a quarter of the limit ({}, not the {} measured for this \
             limit mechanism): a limit this small leaves less headroom than the boundary's noise, \
             so a fresh run may not fit the recommended size; raise --memory-budget",
            format_size(unguarded / 4),
            format_size(b)
        ));
    }
    Ok((plan, limit))
}

/// The guard band under a memory cgroup, in bytes: how far the trials' limit is set below the budget's
/// limit, so that an answer proven under it also fits a fresh run of the job under the budget's limit.
/// Measured (docs/soundness.md, "Where the noise comes from"; raw numbers in
/// `benches/data/exec_noise.json`): fresh runs of one Python job at one batch size under one cgroup
/// limit peak at levels about one buffer of its largest parameter's size (4 MiB) apart (glibc's
/// dynamic mmap threshold keeps it in the heap in some runs and not in others: with the threshold
/// fixed the levels collapse to one, 0.1 MB wide; with ASLR off or a fixed hash seed they do not):
/// anonymous peaks of 1327.1, 1332.0 and 1335.1–1336.0 MB among the runs that fit, and a run of the
/// same size killed (above 1337.7 MB): a spread of at least 10.7 MB. The page cache charged to the
/// group at the peak was 0–10 MB and is reclaimed at the limit: it is not what moves the boundary.
/// 16 MiB is 1.5 times the spread. A byte count, not a share of the limit: the noise is the job's, not
/// the limit's (2 % of 1.25 GiB cost 47 samples against about 20 of noise); a job whose large
/// tensors are larger can move by more (`--margin` adds room).
pub const CGROUP_GUARD_BAND_BYTES: u64 = 16 << 20;

/// The guard band of a command's trials under `RLIMIT_DATA`, in bytes: the same as under a cgroup,
/// because the noise is the same (the job's heap, glibc's dynamic mmap threshold): the data segment
/// `RLIMIT_DATA` bounds follows the heap. A first 5 MiB, from 15 runs that happened to show only 1 MiB
/// levels (the largest completing size moving by 5 samples, 2.6 MB), was measured too small by the
/// next benchmark run: its trials under B − 5 MiB completed 945 while fresh runs under B failed at
/// 942, 944 and 945 (truth 939), and its own trials' peaks (913 at 1331.5 MB, 923 at 1324.0 MB) put
/// levels 12.7 MB apart, as under the cgroup.
pub const EXEC_RLIMIT_GUARD_BAND_BYTES: u64 = CGROUP_GUARD_BAND_BYTES;

/// The guard band of batchfit's own trials (the tch models) under `RLIMIT_DATA`, in bytes. Their
/// peaks repeat to the byte (the mmap threshold fixed), but `batchfit-train` at the plan's size is
/// not the trial child: in one CI run (gpu-check's CPU smoke) the probe proved 1819 with 160 KB
/// left under a 651.86 MB limit, and the trainer, run under that limit, failed a 72 KB allocation;
/// here the same trainer peaked 200 KB under it. 1 MiB is 5 times that difference (28 samples of
/// the default MLP); the trainer's `--memory-limit plan` is the job's limit, the band above the
/// trials' (`Plan::job_limit_bytes`).
pub const TCH_RLIMIT_GUARD_BAND_BYTES: u64 = 1 << 20;

/// The guard band, in bytes, of a limit mechanism for trials whose peaks move by `noise`; `None`:
/// none (cuda, sim).
pub fn guard_band_bytes(m: LimitMechanism, noise: PeakNoise) -> Option<u64> {
    match (m, noise) {
        (LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2, _) => Some(CGROUP_GUARD_BAND_BYTES),
        (LimitMechanism::RlimitData, PeakNoise::Job) => Some(EXEC_RLIMIT_GUARD_BAND_BYTES),
        (LimitMechanism::RlimitData, PeakNoise::Exact) => Some(TCH_RLIMIT_GUARD_BAND_BYTES),
        _ => None,
    }
}

/// The guard band of a limit mechanism as the share of `limit` (the budget's limit, before the band)
/// that the plan records (`guard_band`; `verify` re-applies it to the same limit, [`guarded`], and gets
/// the same `limit_bytes`): [`guard_band_bytes`] of it, at most a quarter of it (a limit that small is
/// below what a Python or libtorch job starts in; the band must not eat the limit).
pub fn guard_band(m: LimitMechanism, noise: PeakNoise, limit: u64) -> Option<f64> {
    let bytes = guard_band_bytes(m, noise)?;
    if limit == 0 {
        return None;
    }
    Some((bytes.min(limit / 4)) as f64 / limit as f64)
}

/// `limit` less its guard band (a share of it, [`guard_band`]), rounded to the byte.
pub fn guarded(limit: u64, guard_band: Option<f64>) -> u64 {
    match guard_band {
        Some(g) if g > 0.0 && g < 1.0 => limit.saturating_sub((limit as f64 * g).round() as u64),
        _ => limit,
    }
}

/// The device to re-run `plan`'s trials on here (`batchfit verify`): the plan's kind of device, its
/// model, threads, seed and allocator settings; `sim` replaces a sim plan's curve; `observe` watches
/// a command's DataLoaders (`--observe`).
pub fn plan_backend(
    plan: &Plan,
    sim: Option<SimSpec>,
    observe: bool,
) -> Result<Box<dyn Backend>, ProbeError> {
    let timeout = Duration::from_secs_f64(plan.search.trial_timeout_seconds.max(1.0));
    let workload = || -> Result<Arc<dyn Workload>, ProbeError> {
        match &plan.model {
            WorkloadInfo::Model(m) => {
                model_workload(&m.config, plan.runtime.threads, plan.runtime.seed, None)
            }
            WorkloadInfo::Exec(e) => {
                for f in &e.fingerprint_files {
                    let now = crate::platform::files::sha256(Path::new(&f.path)).map_err(|err| {
                        ProbeError::Usage(format!(
                            "the plan's command file {} cannot be read here ({err}); run verify where \
                             the job's files are",
                            f.path
                        ))
                    })?;
                    if now != f.sha256 {
                        return Err(ProbeError::Usage(format!(
                            "{} changed since the plan was made; probe the command again",
                            f.path
                        )));
                    }
                }
                let patterns = e
                    .oom_patterns
                    .iter()
                    .map(|p| regex_lite::Regex::new(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|err| ProbeError::Usage(format!("a plan's --oom-pattern: {err}")))?;
                exec_workload(
                    e,
                    patterns,
                    plan.recommendation.as_ref().map(|r| r.world_size),
                    false,
                    0,
                    observe,
                )
            }
        }
    };
    let env = |e: String| ProbeError::Environment(e);
    Ok(match plan.device.kind {
        DeviceKind::Sim => {
            let spec = sim.or_else(|| plan.sim_spec.clone()).ok_or_else(|| {
                ProbeError::Usage(
                    "this sim plan does not record its simulated device (sim_spec); give --sim SPEC"
                        .into(),
                )
            })?;
            Box::new(SimBackend::new(spec))
        }
        DeviceKind::Cpu => {
            let b = CpuBackend::new(workload()?, timeout, IsolationMode::Process)
                .map_err(|e| env(e.to_string()))?;
            Box::new(match plan.limit_mechanism {
                Some(LimitMechanism::CgroupV1 | LimitMechanism::CgroupV2) => {
                    b.with_cgroup(cgroup::parent().map_err(|why| {
                        env(format!(
                            "the plan was proven with a memory cgroup per trial, and none can be \
                             made here: {why}"
                        ))
                    })?)
                }
                _ => b,
            })
        }
        DeviceKind::Cuda => {
            let index = plan.gpu.as_ref().map_or(0, |g| g.index);
            let fake = fake::Fake::from_env()
                .transpose()
                .map_err(|e| env(e.to_string()))?;
            let (gpus, exec): (Arc<dyn GpuQuery + Send + Sync>, Executor) = match fake {
                Some(f) => {
                    let sim = f
                        .sim(index)
                        .ok_or_else(|| env(format!("{}: no sim curve", fake::ENV)))?;
                    (Arc::new(f.gpus), Executor::Fake(SimBackend::new(sim)))
                }
                None => (
                    Arc::new(crate::gpu::nvml::RealNvml::get().map_err(|e| env(e.to_string()))?),
                    Executor::Real(workload()?),
                ),
            };
            let alloc_conf = plan.gpu.as_ref().and_then(|g| g.alloc_conf.clone());
            Box::new(
                CudaBackend::new(gpus, index, exec, alloc_conf, timeout)
                    .map_err(|e| env(e.to_string()))?,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory cgroup's trials, and a command's under RLIMIT_DATA, run under the limit less a guard
    /// band of a fixed number of bytes (the measured noise of a job's peak, not a share of the limit);
    /// batchfit's own trials under RLIMIT_DATA 1 MiB (the trainer is not the trial child); cuda and
    /// sim keep the whole limit. `verify` re-applies
    /// the recorded share to the same limit and must get the same `limit_bytes`, to the byte.
    #[test]
    fn guard_bands_are_the_measured_noise_in_bytes() {
        let b = 1_342_177_280u64; // the benchmark's 1.25 GiB
        for m in [LimitMechanism::CgroupV1, LimitMechanism::CgroupV2] {
            for exec in [PeakNoise::Exact, PeakNoise::Job] {
                assert_eq!(guard_band_bytes(m, exec), Some(16 << 20));
                // 1.25 GiB less 16 MiB (the flat 2 % gave 1_315_333_734)
                assert_eq!(guarded(b, guard_band(m, exec, b)), 1_325_400_064);
            }
        }
        // batchfit's own trials under RLIMIT_DATA: 1 MiB (the trainer is not the trial child)
        assert_eq!(
            guard_band_bytes(LimitMechanism::RlimitData, PeakNoise::Exact),
            Some(1 << 20)
        );
        assert_eq!(
            guarded(
                b,
                guard_band(LimitMechanism::RlimitData, PeakNoise::Exact, b)
            ),
            b - (1 << 20)
        );
        assert_eq!(
            guard_band_bytes(LimitMechanism::RlimitData, PeakNoise::Job),
            Some(16 << 20)
        );
        // 1.25 GiB less 16 MiB (the flat 0.5 % gave 1_335_466_393)
        assert_eq!(
            guarded(b, guard_band(LimitMechanism::RlimitData, PeakNoise::Job, b)),
            1_325_400_064
        );
        for m in [LimitMechanism::CudaFraction, LimitMechanism::Simulated] {
            assert_eq!(guard_band(m, PeakNoise::Job, b), None);
        }
        // the same bytes whatever the limit: the share shrinks as the limit grows, and the plan's
        // share re-applied (verify) gives the probe's limit to the byte
        for l in [400u64 << 20, b, 3 << 30, 64 << 30, (1 << 40) + 12_345] {
            for (m, exec, bytes) in [
                (LimitMechanism::CgroupV1, PeakNoise::Exact, 16u64 << 20),
                (LimitMechanism::CgroupV2, PeakNoise::Job, 16 << 20),
                (LimitMechanism::RlimitData, PeakNoise::Job, 16 << 20),
            ] {
                let g = guard_band(m, exec, l).unwrap();
                assert_eq!(guarded(l, Some(g)), l - bytes, "limit {l} {m:?}");
                assert!((g - bytes as f64 / l as f64).abs() < 1e-12);
            }
        }
        // a limit so small that the band would be more than a quarter of it keeps three quarters
        let small = 32u64 << 20;
        assert_eq!(
            guarded(
                small,
                guard_band(LimitMechanism::CgroupV1, PeakNoise::Job, small)
            ),
            small - small / 4
        );
        assert_eq!(
            guard_band(LimitMechanism::CgroupV1, PeakNoise::Job, 0),
            None
        );
        assert_eq!(guarded(b, Some(1.5)), b);
        assert_eq!(guarded(b, Some(0.0)), b);
    }
}
