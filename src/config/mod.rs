//! Turns parsed arguments into a validated [`ProbeConfig`], in one place, before any backend work.
//! Every check that can fail on user input lives here, so a bad flag never costs a trial.

use crate::accumulate;
use crate::cli::{BackendArg, IsolationArg, ParallelArg, ProbeArgs, StrategyArg};
use crate::device::sim::SimSpec;
use crate::device::IsolationMode;
use crate::output::Format;
use crate::plan::model::Architecture;
use crate::plan::schema::ExecSweepPoint;
use crate::platform::files;
use crate::platform::units::parse_size;
use crate::search::{Grid, SearchConfig, StrategyKind};
use crate::workload::fault::FaultAt;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

mod exec;
mod model;
mod predict;
mod workload;

pub use exec::{ExecConfig, EXEC_FORMS, NO_BATCH_NOTE, NO_BATCH_WARNING};
pub use predict::{validate_predict, PredictConfig};
pub use workload::{AccumulationProof, PeakNoise, WorkloadSpec};

#[derive(Debug, Error, PartialEq)]
#[error("{0}")]
pub struct ConfigError(pub String);

#[derive(Debug, Clone, PartialEq)]
pub enum BackendChoice {
    Auto,
    Cpu,
    Cuda,
    Sim(SimSpec),
}

#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub backend: BackendChoice,
    /// What the trials run: batchfit's model or the user's command (`--exec`).
    pub workload: WorkloadSpec,
    pub budget: Option<u64>,
    pub reserve: u64,
    /// `--reserve` was given (else the cuda backend may apply DDP's default reserve).
    pub reserve_given: bool,
    pub margin: f64,
    /// (global batch, world size)
    pub global: Option<(u64, u64)>,
    pub world_size: u64,
    /// `--world-size` was given (else it defaults to the number of `--gpus` on cuda).
    pub world_size_given: bool,
    /// `--gpus` as given (checked for syntax here, against NVML when the backend starts).
    pub gpus: Option<String>,
    /// `--parallel auto|N`: trials at once on the cpu or sim device.
    pub parallel: Parallel,
    /// `--compare-alloc-conf`.
    pub compare_alloc_conf: bool,
    /// `PYTORCH_CUDA_ALLOC_CONF` for cuda trials (from the environment; recorded in the plan).
    pub alloc_conf: Option<String>,
    pub allow_uneven: bool,
    pub search: SearchConfig,
    pub trial_timeout: Duration,
    pub isolation: IsolationMode,
    pub threads: u32,
    pub seed: i64,
    pub out: Option<PathBuf>,
    /// `--plot FILE.svg|FILE.png`: drawn once the plan is written (format and directory checked here).
    pub plot: Option<PathBuf>,
    pub format: Format,
    /// `--throughput-tolerance`: a smaller tested size within this fraction of the best samples/s is
    /// advised (`fastest_micro_batch`).
    pub throughput_tolerance: f64,
    pub quiet: bool,
    pub fault: Option<FaultAt>,
    /// `--logs DIR`: each trial's whole output.
    pub logs: Option<PathBuf>,
    /// Warnings found while validating, for stderr and the plan (e.g. a command without `{batch}`).
    pub warnings: Vec<String>,
    /// What batchfit decided for the user, said before the search (`batchfit: …` on stderr).
    pub notes: Vec<String>,
    /// `--sweep`: every point's own validated configuration.
    pub sweep: Option<SweepConfig>,
    /// `--plot-scale`: the batch axis of the plot.
    pub plot_scale: crate::output::plot::Scale,
}

/// What `--sweep` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepParam {
    /// Tokens per sample: gpt's `--seq-len`, or a TorchScript input's `S` dimension.
    SeqLen,
    /// Pixels per side: resnet's and vit's `--image-size`, or a TorchScript input's `S` dimension.
    ImageSize,
}

impl SweepParam {
    pub fn as_str(self) -> &'static str {
        match self {
            SweepParam::SeqLen => "seq-len",
            SweepParam::ImageSize => "image-size",
        }
    }
    /// The placeholder `--exec`'s command takes the point in.
    pub fn placeholder(self) -> &'static str {
        match self {
            SweepParam::SeqLen => "{seq}",
            SweepParam::ImageSize => "{image-size}",
        }
    }
    /// The environment variable an `--exec` command's trials get the point in.
    pub fn variable(self) -> &'static str {
        match self {
            SweepParam::SeqLen => "BATCHFIT_SEQ",
            SweepParam::ImageSize => "BATCHFIT_IMAGE_SIZE",
        }
    }
    /// How per-sample memory grows with the parameter, to first order (activations: linear in the
    /// tokens; an image's pixels: the square of its side). Only the first point's guess for the second.
    pub fn exponent(self) -> f64 {
        match self {
            SweepParam::SeqLen => 1.0,
            SweepParam::ImageSize => 2.0,
        }
    }
}

/// `--sweep PARAM=V1,V2,…`, each point validated as its own probe.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub param: SweepParam,
    /// (value, the probe of that point), in the order given.
    pub points: Vec<(u64, ProbeConfig)>,
    /// The point whose plan carries the recommendation.
    pub plan_point: u64,
}

impl SweepConfig {
    /// Tokens of one sample at `value` for `cfg`'s model: the sequence length; a ViT's patches; a
    /// CNN's (or a TorchScript image's) pixels.
    pub fn tokens_per_sample(&self, cfg: &ProbeConfig, value: u64) -> u64 {
        match (self.param, cfg.workload.model().map(|m| &m.architecture)) {
            (SweepParam::SeqLen, _) => value,
            (SweepParam::ImageSize, Some(Architecture::Vit { patch, .. })) => {
                (value / (*patch).max(1)).pow(2)
            }
            (SweepParam::ImageSize, _) => value * value,
        }
    }
}

/// Most points a sweep takes (each is a whole probe).
const MAX_SWEEP_POINTS: usize = 16;

/// `--sweep`: parsed, and every point's configuration validated (the substituted model, the sim
/// curve scaled, a command's placeholder substituted), so a bad point is refused before any trial.
fn sweep(a: &ProbeArgs, base: &ProbeConfig) -> Result<Option<SweepConfig>, ConfigError> {
    let Some(spec) = a.sweep.as_deref() else {
        return Ok(None);
    };
    let (param, points) = sweep_points(spec)?;
    let err = |m: String| Err(ConfigError(m));
    if a.exec.is_some() && !a.command.iter().any(|w| w.contains(param.placeholder())) {
        return err(format!(
            "--sweep {} with --exec: the command has no {} in its arguments; batchfit passes each \
             point there (and as {} in the environment), so write {} where the command takes its {} \
             (an environment variable alone is refused: nothing would show the command read it, \
             and every point could train the same thing)",
            param.as_str(),
            param.placeholder(),
            param.variable(),
            param.placeholder(),
            param.as_str()
        ));
    }
    if a.compare_alloc_conf {
        return err("--sweep with --compare-alloc-conf: compare one probe at a time".into());
    }
    let (flag, given, default) = sweep_target(a, base, param)?;
    if let Some(g) = given.filter(|g| !points.contains(g)) {
        let values = spec.split_once('=').map_or("", |(_, v)| v);
        return err(format!(
            "{flag} {g} is not one of the --sweep points {values}: the plan's recommendation is for \
             {flag}, so give it among them (or drop it)"
        ));
    }
    let plan_point = given
        .or(default.filter(|d| points.contains(d)))
        .unwrap_or(points[0]);
    let configs = points
        .iter()
        .map(|&v| Ok((v, sweep_point(a, param, v, points[0])?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(Some(SweepConfig {
        param,
        points: configs,
        plan_point,
    }))
}

/// `--sweep PARAM=V1,V2,…` parsed: the parameter and 2 to [`MAX_SWEEP_POINTS`] distinct positive
/// points, in order.
fn sweep_points(spec: &str) -> Result<(SweepParam, Vec<u64>), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    let Some((name, values)) = spec.split_once('=') else {
        return err(format!(
            "--sweep {spec:?}: expected seq-len=V1,V2,… or image-size=V1,V2,…"
        ));
    };
    let param = match name.trim() {
        "seq-len" => SweepParam::SeqLen,
        "image-size" => SweepParam::ImageSize,
        other => {
            return err(format!(
                "--sweep {other:?}: only seq-len (gpt, a TorchScript input's S) and image-size \
                 (resnet18, resnet50, vit, a TorchScript input's S) can be swept"
            ))
        }
    };
    let mut points = vec![];
    for v in values.split(',') {
        let n: u64 = v.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            ConfigError(format!(
                "--sweep {spec:?}: {v:?} is not a positive whole number"
            ))
        })?;
        if points.contains(&n) {
            return err(format!("--sweep {spec:?}: {n} is given twice"));
        }
        points.push(n);
    }
    if points.len() < 2 || points.len() > MAX_SWEEP_POINTS {
        return err(format!(
            "--sweep {spec:?}: give 2 to {MAX_SWEEP_POINTS} points (one point is a plain probe)"
        ));
    }
    Ok((param, points))
}

/// Where a sweep's point goes: the flag (or placeholder, or input dimension) that takes it, the
/// value given for it, and the model's own default; or why this model cannot be swept so.
fn sweep_target(
    a: &ProbeArgs,
    base: &ProbeConfig,
    param: SweepParam,
) -> Result<(&'static str, Option<u64>, Option<u64>), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    let torchscript = Architecture::preset(&a.model).is_none();
    let Some(model) = base.workload.model() else {
        // a command takes the point where it wrote the placeholder
        return Ok((param.placeholder(), None, None));
    };
    match (param, &model.architecture) {
        _ if torchscript && inputs_have_s(a) => Ok(("the S dimension", None, None)),
        (SweepParam::SeqLen, Architecture::Gpt { seq_len, .. }) => {
            Ok(("--seq-len", a.seq_len, Some(*seq_len)))
        }
        (
            SweepParam::ImageSize,
            Architecture::Resnet18 { image_size, .. }
            | Architecture::Resnet50 { image_size, .. }
            | Architecture::Vit { image_size, .. },
        ) => Ok(("--image-size", a.image_size, Some(*image_size))),
        (SweepParam::SeqLen, Architecture::Vit { patch, .. }) => err(format!(
            "--sweep seq-len with --model {}: a ViT's sequence is (image-size / {patch})² patches; \
             sweep image-size instead",
            a.model
        )),
        _ if torchscript => err(format!(
            "--sweep {}: write the swept dimension of the TorchScript model's --input as S, e.g. \
             --input 'i64[B,S]<50257'",
            param.as_str()
        )),
        _ => err(format!(
            "--sweep {}: --model {} has no {}; sweep seq-len with gpt, image-size with resnet18, \
             resnet50 or vit",
            param.as_str(),
            a.model,
            param.as_str()
        )),
    }
}

/// The validated configuration of the sweep's point `v` (`first`: the first point, which the
/// simulated device's curve is relative to).
fn sweep_point(
    a: &ProbeArgs,
    param: SweepParam,
    v: u64,
    first: u64,
) -> Result<ProbeConfig, ConfigError> {
    let torchscript = Architecture::preset(&a.model).is_none();
    let mut p = a.clone();
    p.sweep = None;
    if a.exec.is_some() {
        p.command = a
            .command
            .iter()
            .map(|w| w.replace(param.placeholder(), &v.to_string()))
            .collect();
    } else if torchscript && inputs_have_s(a) {
        p.inputs = a.inputs.iter().map(|i| substitute_s(i, v)).collect();
    } else {
        match param {
            SweepParam::SeqLen => p.seq_len = Some(v),
            SweepParam::ImageSize => p.image_size = Some(v),
        }
    }
    let mut c = validate_one(&p)
        .map_err(|e| ConfigError(format!("--sweep {}={v}: {}", param.as_str(), e.0)))?;
    // The simulated device has no model: per-sample memory scales with the point as activations
    // do (linear in the tokens, the square of an image's side), relative to the first point.
    if let BackendChoice::Sim(s) = &mut c.backend {
        let f = (v as f64 / first as f64).powf(param.exponent());
        s.per_sample = ((s.per_sample as f64) * f).round().max(1.0) as u64;
    }
    // The command's point, also in its environment (the argv above already carries it, so the
    // fingerprint, and the cache, tell the points apart).
    if let WorkloadSpec::Exec(x) = &mut c.workload {
        x.info.environment.push(param.variable().to_string());
        x.info.sweep_point = Some(ExecSweepPoint {
            variable: param.variable().to_string(),
            value: v,
        });
    }
    c.out = None;
    c.plot = None;
    Ok(c)
}

/// A size flag. A bare number is bytes; one that is not 0 but under 1 MiB is almost certainly a
/// missing unit (`--memory-budget 12` meaning 12 GiB), so it is refused with the likely meaning.
fn size(flag: &str, v: &str) -> Result<u64, ConfigError> {
    let bytes = parse_size(v).map_err(|e| ConfigError(format!("{flag}: {e}")))?;
    if crate::platform::units::is_bare_number(v) && bytes > 0 && bytes < 1 << 20 {
        return Err(ConfigError(format!(
            "{flag} {v} is {v} bytes (a number without a unit is bytes), far too little for \
             training; give a unit, e.g. {flag} {v}GiB or {v}MiB ({})",
            crate::platform::units::UNITS_HELP
        )));
    }
    Ok(bytes)
}

/// The longest `--time-limit` or `--trial-timeout` (a year): longer is no limit at all, and
/// durations near the top of the range overflow clocks.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// How many trials run at once on the cpu or sim device (`--parallel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// On the cpu, the proof's cold trials side by side, up to one per core and per budget the
    /// memory holds ([`crate::probe::setup::cpu_backends`]), exploration one trial at a time: a
    /// size explored beside the strategy's own is worth less than the time it takes from it where
    /// both share the cores, but the proof's trials are all needed, and each starts its interpreter
    /// and imports alone. Elsewhere one trial at a time.
    Auto,
    /// `--parallel N`: N trials at once, exploration rounds included.
    Trials(u32),
}

impl Parallel {
    /// The trials at once that were asked for: N, or 1 for `auto` until the cpu device sizes it.
    pub fn asked(self) -> u32 {
        match self {
            Parallel::Auto => 1,
            Parallel::Trials(n) => n,
        }
    }
}

/// Why `--parallel N` cannot run as given, if it cannot: N is 0, the trials share one worker
/// (`--isolation hybrid`), or the device is a GPU (identical GPUs of `--gpus` run in rounds by
/// themselves).
fn parallel_refused(a: &ProbeArgs, backend: &BackendChoice) -> Option<String> {
    let n = match a.parallel {
        ParallelArg::Auto | ParallelArg::Trials(1) => return None,
        ParallelArg::Trials(0) => {
            return Some(
                "--parallel 0: give the number of trials to run at once (1 or more), or auto"
                    .into(),
            )
        }
        ParallelArg::Trials(n) => n,
    };
    if a.isolation == IsolationArg::Hybrid {
        return Some(format!(
            "--parallel {n} runs each trial in its own process, and --isolation hybrid runs \
             exploration in one worker; drop one of them"
        ));
    }
    if *backend == BackendChoice::Cuda || a.gpus.is_some() {
        return Some(format!(
            "--parallel {n} is for the cpu and sim backends: on cuda, give --gpus (identical GPUs \
             run one trial each per round by themselves)"
        ));
    }
    None
}

/// Why `--isolation hybrid` is refused on cuda (explicit, or chosen by `--backend auto`).
pub const HYBRID_ON_CUDA: &str = "--isolation hybrid is for the cpu backend: on cuda every trial runs \
     in a fresh process, because a long-lived worker keeps its CUDA context and whatever the caching \
     allocator could not return, so NVML could not attribute a trial's footprint cleanly; drop \
     --isolation hybrid";

pub fn validate(a: &ProbeArgs) -> Result<ProbeConfig, ConfigError> {
    let words = exec::exec_words(a)?;
    let line_warnings = words.as_ref().map(|(_, w)| w.clone()).unwrap_or_default();
    let a = words.as_ref().map(|(b, _)| b).unwrap_or(a);
    // With --sweep, an input's S is the point: the probe's own settings are checked at the first.
    let first = a
        .sweep
        .as_deref()
        .and_then(|s| s.split_once('='))
        .and_then(|(_, v)| v.split(',').next())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut c = match first.filter(|_| inputs_have_s(a)) {
        Some(v) => {
            let mut b = a.clone();
            b.inputs = a.inputs.iter().map(|i| substitute_s(i, v)).collect();
            validate_one(&b)?
        }
        None => validate_one(a)?,
    };
    c.sweep = sweep(a, &c)?;
    c.warnings.extend(line_warnings);
    Ok(c)
}

/// [`validate`] of one probe (a `--sweep` is taken apart by [`sweep`]). The checks run in the
/// order a reader meets the flags: the device, the workload, the memory, the sizes, the clocks,
/// the outputs; the first that fails is the error.
fn validate_one(a: &ProbeArgs) -> Result<ProbeConfig, ConfigError> {
    let backend = backend(a)?;
    let (workload, warnings) = match exec::exec(a, &backend)? {
        Some((e, warnings)) => (WorkloadSpec::Exec(Box::new(e)), warnings),
        None => (WorkloadSpec::Model(model::model(a)?), vec![]),
    };
    device_flags(a, &backend, &workload)?;
    let (budget, reserve) = memory(a)?;
    let sizes = sizes(a, workload.may_not_train_the_size())?;
    let (time_limit, trial_timeout) = clocks(a)?;
    let threads = match a.threads {
        Some(0) => return Err(ConfigError("--threads must be at least 1".into())),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    };
    fractions(a)?;
    outputs(a)?;
    let fault = a
        .inject_fault
        .as_deref()
        .map(FaultAt::parse)
        .transpose()
        .map_err(ConfigError)?;
    Ok(ProbeConfig {
        backend,
        budget,
        reserve,
        reserve_given: a.reserve.is_some(),
        margin: a.margin + 0.0,
        global: sizes.global,
        world_size: sizes.world_size,
        world_size_given: a.world_size.is_some(),
        gpus: a.gpus.clone(),
        parallel: match a.parallel {
            ParallelArg::Auto => Parallel::Auto,
            ParallelArg::Trials(n) => Parallel::Trials(n),
        },
        compare_alloc_conf: a.compare_alloc_conf,
        alloc_conf: std::env::var("PYTORCH_CUDA_ALLOC_CONF")
            .ok()
            .filter(|v| !v.trim().is_empty()),
        allow_uneven: a.allow_uneven,
        search: search_config(a, &workload, sizes.max_batch, time_limit),
        workload,
        trial_timeout,
        isolation: match a.isolation {
            IsolationArg::Process => IsolationMode::Process,
            IsolationArg::Hybrid => IsolationMode::Hybrid,
        },
        threads,
        seed: a.seed,
        out: a.out.clone(),
        plot: a.plot.clone(),
        format: crate::cli::format_or_default(a.format),
        throughput_tolerance: a.throughput_tolerance,
        quiet: a.quiet,
        fault,
        logs: a.logs.clone(),
        warnings,
        notes: sizes.notes,
        sweep: None,
        plot_scale: a.plot_scale.into(),
    })
}

/// `--backend` with `--sim`.
fn backend(a: &ProbeArgs) -> Result<BackendChoice, ConfigError> {
    let err = |m: &str| Err(ConfigError(m.into()));
    match (a.backend, &a.sim) {
        (BackendArg::Sim, Some(s)) => Ok(BackendChoice::Sim(
            SimSpec::parse(s).map_err(|e| ConfigError(e.to_string()))?,
        )),
        (BackendArg::Sim, None) => {
            err("--backend sim needs --sim base=SIZE,per-sample=SIZE,capacity=SIZE")
        }
        (_, Some(_)) => err("--sim is only used with --backend sim"),
        (BackendArg::Auto, None) => Ok(BackendChoice::Auto),
        (BackendArg::Cpu, None) => Ok(BackendChoice::Cpu),
        (BackendArg::Cuda, None) => Ok(BackendChoice::Cuda),
    }
}

/// The flags that only one device kind runs: cuda's `--gpus`, `--compare-alloc-conf`,
/// `--allow-retries` and autocast precisions, cpu's `--isolation hybrid`, and `--parallel`.
fn device_flags(
    a: &ProbeArgs,
    backend: &BackendChoice,
    workload: &WorkloadSpec,
) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    // --allow-retries also applies to sim curves with retries=N (the search logic without a GPU).
    let cuda_only = [
        ("--gpus", a.gpus.is_some(), true),
        ("--compare-alloc-conf", a.compare_alloc_conf, true),
        ("--allow-retries", a.allow_retries, false),
    ];
    for (flag, _, not_sim) in cuda_only.iter().filter(|(_, given, _)| *given) {
        let refused = match backend {
            BackendChoice::Cpu => true,
            BackendChoice::Sim(_) => *not_sim,
            _ => false,
        };
        if refused {
            return err(format!(
                "{flag} is a cuda option; drop it, or use --backend cuda (or auto on a GPU machine)"
            ));
        }
    }
    if a.isolation == IsolationArg::Hybrid && *backend == BackendChoice::Cuda {
        return err(HYBRID_ON_CUDA.into());
    }
    if let Some(why) = parallel_refused(a, backend) {
        return err(why);
    }
    if let Some(g) = &a.gpus {
        let ok = g.trim() == "all"
            || g.split(',')
                .all(|p| !p.trim().is_empty() && p.trim().parse::<u32>().is_ok());
        if !ok {
            return err(format!(
                "--gpus {g:?}: expected `all` or GPU indices like 0,2 (see `batchfit doctor`)"
            ));
        }
    }
    if let (Some(p), BackendChoice::Cpu) = (workload.cuda_only_precision(), backend) {
        return err(format!(
            "--precision {} is autocast mixed precision, which batchfit runs on CUDA only; on cpu use \
             --precision bf16 (or fp32)",
            p.as_str()
        ));
    }
    Ok(())
}

/// `--memory-budget`, `--reserve` and `--margin`: the budget and the reserve.
fn memory(a: &ProbeArgs) -> Result<(Option<u64>, u64), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    let budget = a
        .memory_budget
        .as_deref()
        .map(|v| size("--memory-budget", v))
        .transpose()?;
    if budget == Some(0) {
        return err("--memory-budget must be greater than 0".into());
    }
    let reserve = size("--reserve", a.reserve.as_deref().unwrap_or("0"))?;
    if let Some(b) = budget {
        if reserve >= b {
            return err(format!(
                "--reserve ({}) must be smaller than --memory-budget ({})",
                a.reserve.as_deref().unwrap_or("0"),
                a.memory_budget.as_deref().unwrap_or("")
            ));
        }
    }
    if !a.margin.is_finite() || !(0.0..=0.9).contains(&a.margin) {
        return err(format!(
            "--margin {} is outside [0, 0.9]; it is a fraction, e.g. 0.05 for 5%",
            a.margin
        ));
    }
    Ok((budget, reserve))
}

/// The sizes a probe may try and the global batch they serve.
struct Sizes {
    world_size: u64,
    /// (global batch, world size)
    global: Option<(u64, u64)>,
    /// `--max-batch`, or with `--exec` the global batch per rank where that is smaller.
    max_batch: u64,
    /// What was decided for the user (the search's narrowed top).
    notes: Vec<String>,
}

/// `--world-size`, `--steps`, `--confirm-steps`, the grid of sizes, `--global-batch` against it,
/// and `--max-trials`.
fn sizes(a: &ProbeArgs, exec: bool) -> Result<Sizes, ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    let world_size = a.world_size.unwrap_or(1);
    if world_size == 0 {
        return err("--world-size must be at least 1".into());
    }
    if a.steps == 0 {
        return err("--steps must be at least 1 (2 or more counts the optimizer's state)".into());
    }
    if a.confirm_steps == 0 {
        return err("--confirm-steps must be at least 1".into());
    }
    if a.min_batch == 0 || a.max_batch == 0 || a.multiple_of == 0 {
        return err("--min-batch, --max-batch and --multiple-of must be at least 1".into());
    }
    if a.min_batch > a.max_batch {
        return err(format!(
            "--min-batch {} is larger than --max-batch {}",
            a.min_batch, a.max_batch
        ));
    }
    if Grid::new(a.min_batch, a.max_batch, a.multiple_of).is_none() {
        return err(format!(
            "no multiple of {} lies between --min-batch {} and --max-batch {}",
            a.multiple_of, a.min_batch, a.max_batch
        ));
    }
    // The global batch against the grid of sizes: on it, at least one --min-batch per rank, and
    // splittable into at most accumulate::MAX_ACCUMULATION micro-batches of --max-batch.
    let global = match a.global_batch {
        Some(g) => {
            accumulate::check_against_sizes(
                g,
                world_size,
                accumulate::Sizes::new(a.multiple_of, a.min_batch),
                a.max_batch,
            )
            .map_err(|e| ConfigError(e.to_string()))?;
            Some((g, world_size))
        }
        None => None,
    };
    // With --exec and a global batch, a micro-batch above the global batch per rank is never used:
    // the search stops there unless --max-batch asks for more.
    let mut notes = vec![];
    let mut max_batch = a.max_batch;
    if let (Some((g, w)), true) = (global, exec && a.max_batch == crate::cli::DEFAULT_MAX_BATCH) {
        let per_rank = g / w.max(1);
        if per_rank < max_batch && Grid::new(a.min_batch, per_rank, a.multiple_of).is_some() {
            max_batch = per_rank;
            notes.push(format!(
                "batchfit: the search stops at micro-batch {per_rank} (--global-batch {g} / world \
                 size {w}: a larger micro-batch is never used); --max-batch N searches further"
            ));
        }
    }
    if a.max_trials == Some(0) {
        return err("--max-trials must be at least 1".into());
    }
    Ok(Sizes {
        world_size,
        global,
        max_batch,
        notes,
    })
}

/// `--time-limit` and `--trial-timeout`: positive, at most [`MAX_SECONDS`].
fn clocks(a: &ProbeArgs) -> Result<(Option<Duration>, Duration), ConfigError> {
    let positive_secs = |flag: &str, v: f64| -> Result<Duration, ConfigError> {
        if !v.is_finite() || v <= 0.0 {
            Err(ConfigError(format!(
                "{flag} must be a positive number of seconds"
            )))
        } else if v > MAX_SECONDS {
            Err(ConfigError(format!(
                "{flag} {v:e} is more than a year ({MAX_SECONDS} seconds); give a number of \
                 seconds up to that, or leave the flag out"
            )))
        } else {
            Ok(Duration::from_secs_f64(v))
        }
    };
    let time_limit = a
        .time_limit
        .map(|t| positive_secs("--time-limit", t))
        .transpose()?;
    Ok((
        time_limit,
        positive_secs("--trial-timeout", a.trial_timeout)?,
    ))
}

/// `--throughput-tolerance` and `--tolerance`: fractions in their ranges.
fn fractions(a: &ProbeArgs) -> Result<(), ConfigError> {
    if !a.throughput_tolerance.is_finite() || !(0.0..1.0).contains(&a.throughput_tolerance) {
        return Err(ConfigError(format!(
            "--throughput-tolerance {} is outside [0, 1); it is a fraction, e.g. 0.03 for 3%",
            a.throughput_tolerance
        )));
    }
    if !a.tolerance.is_finite() || !(0.0..=0.1).contains(&a.tolerance) {
        return Err(ConfigError(format!(
            "--tolerance {} is outside [0, 0.1]; it is a fraction, e.g. 0.005 for 0.5% (0: exact)",
            a.tolerance
        )));
    }
    Ok(())
}

/// `--format`, `--out` (and the partial plan beside it), `--logs` and `--plot`: each can be
/// written, and none replaces an input or another output.
fn outputs(a: &ProbeArgs) -> Result<(), ConfigError> {
    if a.format == Some(crate::cli::FormatArg::Deepspeed) && a.allow_uneven {
        return Err(ConfigError(
            "--format deepspeed cannot express micro-batches of unequal size; drop --allow-uneven \
             (or use --format json)"
                .into(),
        ));
    }
    if let Some(out) = &a.out {
        files::check_target(out).map_err(|e| ConfigError(format!("--out: {e}")))?;
        // the partial plan is written beside it during the search: a directory, FIFO or dangling
        // link there must be found now, not after the search
        let partial = crate::plan::partial_path(out);
        files::check_target(&partial).map_err(|e| {
            ConfigError(format!(
                "--out {}: its partial plan (written during the search) cannot be written: {e}",
                out.display()
            ))
        })?;
        check_out_is_no_input(a, out, &partial)?;
    }
    if let Some(d) = &a.logs {
        check_logs_dir(d)?;
    }
    if let Some(p) = &a.plot {
        crate::output::plot::check_target(p).map_err(|e| ConfigError(e.to_string()))?;
        if let Some(out) = a.out.as_ref().filter(|out| files::same_target(p, out)) {
            return Err(ConfigError(format!(
                "--plot {} and --out {} are the same file: the picture would replace the plan; \
                 give the plot its own name, e.g. --plot plan.svg",
                p.display(),
                out.display()
            )));
        }
    }
    Ok(())
}

/// The search's settings: the strategy, the steps, the grid and its budget of trials and time.
fn search_config(
    a: &ProbeArgs,
    workload: &WorkloadSpec,
    max_batch: u64,
    time_limit: Option<Duration>,
) -> SearchConfig {
    SearchConfig {
        strategy: match a.strategy {
            StrategyArg::Guided => StrategyKind::Guided,
            StrategyArg::Bisect => StrategyKind::Bisect,
            StrategyArg::Power => StrategyKind::Power,
        },
        steps: a.steps,
        confirm_steps: a.confirm_steps,
        min_batch: a.min_batch,
        max_batch,
        multiple_of: a.multiple_of,
        max_trials: a.max_trials,
        time_limit,
        allow_retries: a.allow_retries,
        // `--tolerance=-0` is 0 (the plan would say -0.0)
        tolerance: a.tolerance + 0.0,
        prior: None,
        repeats: a.repeats.unwrap_or(workload.default_repeats()),
    }
}

/// `--logs DIR` before any trial: a directory (following a link to one) that batchfit can write, or
/// a path whose nearest existing ancestor is a writable directory (it is created then).
fn check_logs_dir(d: &std::path::Path) -> Result<(), ConfigError> {
    let writable = |dir: &std::path::Path| {
        tempfile::Builder::new()
            .prefix(".batchfit-check-")
            .tempfile_in(dir)
            .map(drop)
    };
    match std::fs::metadata(d) {
        Ok(m) if m.is_dir() => writable(d).map_err(|e| {
            ConfigError(format!(
                "--logs {} is a directory batchfit cannot write in ({e}); make it writable or give \
                 another directory",
                d.display()
            ))
        }),
        Ok(_) => Err(ConfigError(format!(
            "--logs {} is not a directory; give a directory (it is created when missing)",
            d.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(d).is_ok() {
                return Err(ConfigError(format!(
                    "--logs {} is a symbolic link to nothing; give a directory",
                    d.display()
                )));
            }
            let mut up = d.parent();
            while let Some(p) = up {
                let p = if p.as_os_str().is_empty() {
                    std::path::Path::new(".")
                } else {
                    p
                };
                match std::fs::metadata(p) {
                    Ok(m) if m.is_dir() => {
                        return writable(p).map_err(|e| {
                            ConfigError(format!(
                                "--logs {}: cannot create it, {} is not writable ({e})",
                                d.display(),
                                p.display()
                            ))
                        })
                    }
                    Ok(_) => {
                        return Err(ConfigError(format!(
                            "--logs {}: cannot create it, {} is not a directory",
                            d.display(),
                            p.display()
                        )))
                    }
                    Err(_) => up = p.parent(),
                }
            }
            Ok(())
        }
        Err(e) => Err(ConfigError(format!("--logs {}: {e}", d.display()))),
    }
}

/// `--out` (and its partial plan) must not be one of the files the probe reads or writes otherwise:
/// the command's script (any argument that is an existing regular file), a `--fingerprint-file`, a
/// trial log under `--logs`. Compared as files (device and inode), so links and `..` do not hide it.
fn check_out_is_no_input(
    a: &ProbeArgs,
    out: &std::path::Path,
    partial: &std::path::Path,
) -> Result<(), ConfigError> {
    let mut inputs: Vec<(String, PathBuf)> = vec![];
    if a.exec.is_some() {
        for w in &a.command {
            let p = std::path::Path::new(w);
            if std::fs::metadata(p).is_ok_and(|m| m.is_file()) {
                inputs.push((format!("the command's file {w}"), p.to_path_buf()));
            }
        }
    }
    for f in &a.fingerprint_file {
        inputs.push((format!("--fingerprint-file {}", f.display()), f.clone()));
    }
    for (what, input) in &inputs {
        for (flag, o) in [("--out", out), ("the partial plan of --out", partial)] {
            if files::same_file(o, input) {
                return Err(ConfigError(format!(
                    "{flag} {} is {what}: the plan would replace it; give the plan its own name, \
                     e.g. --out plan.json",
                    o.display()
                )));
            }
        }
    }
    if let Some(logs) = &a.logs {
        for (flag, o) in [("--out", out), ("the partial plan of --out", partial)] {
            let dir = o.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = dir.unwrap_or(std::path::Path::new("."));
            let name = o.file_name().map(|n| n.to_string_lossy().into_owned());
            if files::same_file(dir, logs)
                && name.is_some_and(|n| crate::device::process::is_log_name(&n))
            {
                return Err(ConfigError(format!(
                    "{flag} {} is a trial log's name under --logs {}: a trial would overwrite the \
                     plan; give the plan another name or directory",
                    o.display(),
                    logs.display()
                )));
            }
        }
    }
    Ok(())
}

/// An input spec with its `S` dimension(s) replaced by `v`.
fn substitute_s(input: &str, v: u64) -> String {
    let Some((head, rest)) = input.split_once('[') else {
        return input.to_string();
    };
    let Some((dims, tail)) = rest.split_once(']') else {
        return input.to_string();
    };
    let dims: Vec<String> = dims
        .split(',')
        .map(|d| {
            if d.trim() == "S" {
                v.to_string()
            } else {
                d.to_string()
            }
        })
        .collect();
    format!("{head}[{}]{tail}", dims.join(","))
}

/// Whether a TorchScript `--input` has an `S` dimension (the `--sweep` point).
fn inputs_have_s(a: &ProbeArgs) -> bool {
    a.inputs.iter().any(|i| {
        i.split(['[', ']'])
            .nth(1)
            .is_some_and(|dims| dims.split(',').any(|d| d.trim() == "S"))
    })
}

/// The limit a trial must fit under (one definition, the plan's).
pub use crate::plan::capacity::limit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_budget_less_the_reserve_less_the_margin() {
        assert_eq!(limit(1000, 0, 0.05), 950);
        assert_eq!(limit(1000, 200, 0.5), 400);
        assert_eq!(limit(1000, 0, 0.0), 1000);
    }

    /// A TorchScript input's `S` dimension takes the sweep's point; other dimensions, the dtype and
    /// the range stay.
    #[test]
    fn the_s_dimension_takes_the_point() {
        assert_eq!(substitute_s("i64[B,S]<50257", 512), "i64[B,512]<50257");
        assert_eq!(substitute_s("f32[B, S ,S]", 8), "f32[B,8,8]");
        assert_eq!(substitute_s("f32[B,3,224,224]", 8), "f32[B,3,224,224]");
        let args = |inputs: &[&str]| {
            use clap::Parser;
            let mut v = vec!["batchfit", "probe", "--model", "m.pt"];
            for i in inputs {
                v.extend(["--input", i]);
            }
            match crate::cli::Cli::try_parse_from(v).unwrap().command {
                crate::cli::Command::Probe(a) => a,
                _ => unreachable!(),
            }
        };
        assert!(inputs_have_s(&args(&["i64[B,S]<100"])));
        assert!(inputs_have_s(&args(&["f32[B,4]", "i64[B,S]<100"])));
        assert!(!inputs_have_s(&args(&["f32[B,SS]", "f32[B,3]"])));
    }
}
