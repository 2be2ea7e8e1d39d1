//! Turns parsed arguments into a validated [`ProbeConfig`], in one place, before any backend work.
//! Every check that can fail on user input lives here, so a bad flag never costs a trial.

use crate::accumulate;
use crate::cli::{
    BackendArg, CpuLimitArg, IsolationArg, ObserveArg, OptimizerArg, PrecisionArg, ProbeArgs,
    StrategyArg, WarmArg,
};
use crate::device::sim::SimSpec;
use crate::device::IsolationMode;
use crate::output::Format;
use crate::plan::model::{Architecture, InputSpec, LossSpec, ModelSpec, OptimizerKind, Precision};
use crate::plan::schema::{exec_fingerprint, ExecInfo, ExecKind, ExecSweepPoint, FileHash};
use crate::platform::files;
use crate::platform::units::parse_size;
use crate::search::{Grid, SearchConfig, StrategyKind};
use crate::workload::fault::FaultAt;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

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
    pub model: ModelSpec,
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
    /// `--parallel N`: trials at once on the cpu or sim device (1: one at a time).
    pub parallel: u32,
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
    /// `--exec`: the user's command is the workload (`model` is then unused).
    pub exec: Option<ExecConfig>,
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
        match (self.param, &cfg.model.architecture) {
            (SweepParam::SeqLen, _) => value,
            (SweepParam::ImageSize, Architecture::Vit { patch, .. }) => {
                (value / (*patch).max(1)).pow(2)
            }
            (SweepParam::ImageSize, _) => value * value,
        }
    }
}

/// Most points a sweep takes (each is a whole probe).
const MAX_SWEEP_POINTS: usize = 16;

/// `--sweep`: parsed, and every point's configuration validated (the substituted model, the sim
/// curve scaled), so a bad point is refused before any trial. The exec workload would substitute
/// the point into its command (`{seq}`): not yet.
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
    match (param, &base.model.architecture) {
        _ if a.exec.is_some() => Ok((param.placeholder(), None, None)),
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
    if let Some(x) = &mut c.exec {
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

/// `--exec`: the command and how its trials are judged and limited.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// The plan's description of it (argv, fingerprint, environment set).
    pub info: ExecInfo,
    pub oom_patterns: Vec<regex_lite::Regex>,
    /// `--threads`, when given: `OMP_NUM_THREADS` of every trial (else the user's environment).
    pub threads: Option<u32>,
    pub cpu_limit: CpuLimitArg,
    /// Trials after the first may run in warm processes (`--warm`; a Python launch).
    pub warm: bool,
    /// The trials' torch DataLoaders are watched (`--observe`).
    pub observe: bool,
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

/// Why `--parallel N` cannot run as given, if it cannot: N is 0, the trials share one worker
/// (`--isolation hybrid`), or the device is a GPU (identical GPUs of `--gpus` run in rounds by
/// themselves).
fn parallel_refused(a: &ProbeArgs, backend: &BackendChoice) -> Option<String> {
    if a.parallel == 0 {
        return Some("--parallel 0: give the number of trials to run at once (1 or more)".into());
    }
    if a.parallel == 1 {
        return None;
    }
    if a.isolation == IsolationArg::Hybrid {
        return Some(format!(
            "--parallel {} runs each trial in its own process, and --isolation hybrid runs \
             exploration in one worker; drop one of them",
            a.parallel
        ));
    }
    if *backend == BackendChoice::Cuda || a.gpus.is_some() {
        return Some(format!(
            "--parallel {} is for the cpu and sim backends: on cuda, give --gpus (identical GPUs \
             run one trial each per round by themselves)",
            a.parallel
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
    let words = exec_words(a)?;
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
    let (exec, warnings) = exec(a)?;
    let model = workload_model(a, &backend, exec.is_some())?;
    device_flags(a, &backend, &model)?;
    let (budget, reserve) = memory(a)?;
    let sizes = sizes(a, exec.is_some())?;
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
        model,
        budget,
        reserve,
        reserve_given: a.reserve.is_some(),
        margin: a.margin + 0.0,
        global: sizes.global,
        world_size: sizes.world_size,
        world_size_given: a.world_size.is_some(),
        gpus: a.gpus.clone(),
        parallel: a.parallel,
        compare_alloc_conf: a.compare_alloc_conf,
        alloc_conf: std::env::var("PYTORCH_CUDA_ALLOC_CONF")
            .ok()
            .filter(|v| !v.trim().is_empty()),
        allow_uneven: a.allow_uneven,
        search: search_config(a, sizes.max_batch, time_limit),
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
        exec,
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

/// The model batchfit trains (`--model` and its flags), or, with `--exec`, the placeholder the
/// configuration carries for a command it does not build.
fn workload_model(
    a: &ProbeArgs,
    backend: &BackendChoice,
    exec: bool,
) -> Result<ModelSpec, ConfigError> {
    if exec && matches!(backend, BackendChoice::Sim(_)) {
        return Err(ConfigError(
            "--exec runs your command on a real device, and --backend sim runs nothing (it \
             simulates batchfit's own model from --sim): use --backend cpu, cuda or auto with --exec"
                .into(),
        ));
    }
    let model = ModelSpec {
        architecture: if exec {
            ModelSpec::default_mlp().architecture
        } else {
            architecture(a)?
        },
        optimizer: match a.optimizer {
            OptimizerArg::Sgd => OptimizerKind::Sgd,
            OptimizerArg::Momentum => OptimizerKind::Momentum,
            OptimizerArg::Adam => OptimizerKind::Adam,
            OptimizerArg::Adamw => OptimizerKind::Adamw,
        },
        precision: match a.precision {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::AmpBf16 => Precision::AmpBf16,
            PrecisionArg::AmpFp16 => Precision::AmpFp16,
        },
    };
    model.validate().map_err(ConfigError)?;
    if model.precision == Precision::Bf16
        && matches!(model.architecture, Architecture::Torchscript { .. })
    {
        return Err(ConfigError(
            "--precision bf16 with a TorchScript model: batchfit can cast its parameters but not its \
             buffers (e.g. BatchNorm statistics); export the model in bf16 (model.to(torch.bfloat16)) with \
             bf16 --input specs and probe it with --precision fp32, or use --precision amp-bf16 on cuda"
                .into(),
        ));
    }
    Ok(model)
}

/// The flags that only one device kind runs: cuda's `--gpus`, `--compare-alloc-conf`,
/// `--allow-retries` and autocast precisions, cpu's `--isolation hybrid`, and `--parallel`.
fn device_flags(
    a: &ProbeArgs,
    backend: &BackendChoice,
    model: &ModelSpec,
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
    if model.precision.is_amp() && *backend == BackendChoice::Cpu {
        return err(format!(
            "--precision {} is autocast mixed precision, which batchfit runs on CUDA only; on cpu use \
             --precision bf16 (or fp32)",
            model.precision.as_str()
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
fn search_config(a: &ProbeArgs, max_batch: u64, time_limit: Option<Duration>) -> SearchConfig {
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
        repeats: a.repeats.unwrap_or(if a.exec.is_some() {
            crate::search::noise::EXEC_REPEATS
        } else {
            0
        }),
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

/// The two ways to give `--exec` its command, for the messages that refuse another.
pub const EXEC_FORMS: &str = "give it after `--`, as separate words (batchfit probe --exec -- python \
     train.py --batch-size {batch}), or as one quoted string (batchfit probe --exec 'python train.py \
     --batch-size {batch}')";

/// `--exec 'CMD ARG…'`: the command given as one string becomes the command after `--`, split into
/// words as a POSIX shell splits them (quotes and backslashes; no shell runs it, nothing is
/// expanded), so the two forms are the same probe (argv, fingerprint, cache key), with the warnings
/// of [`shell_syntax`]. `None` when there is no string to split.
fn exec_words(a: &ProbeArgs) -> Result<Option<(ProbeArgs, Vec<String>)>, ConfigError> {
    let Some(Some(line)) = &a.exec else {
        return Ok(None);
    };
    if !a.command.is_empty() {
        return Err(ConfigError(format!(
            "--exec was given the command twice, as {} and after `--` ({}); {EXEC_FORMS}, not both",
            crate::output::env::shell_quote(line),
            a.command.join(" ")
        )));
    }
    let words = shell_words::split(line).map_err(|e| {
        ConfigError(format!(
            "--exec {}: the command cannot be split into words ({e}); {EXEC_FORMS}",
            crate::output::env::shell_quote(line)
        ))
    })?;
    if words.is_empty() {
        return Err(ConfigError(format!(
            "--exec was given an empty command; {EXEC_FORMS}"
        )));
    }
    let warnings = shell_syntax(line, &words)?;
    let mut b = a.clone();
    b.exec = Some(None);
    b.command = words;
    Ok(Some((b, warnings)))
}

/// The words of a command given as one string that a shell would have acted on, though none runs
/// it: an operator word (`>`, `|`, `&&`, …) is refused, since the job would get it as an argument
/// and its output would go nowhere it was sent; a `$NAME` is kept as written, with a warning (a
/// regular expression may mean it). A command that runs its own shell (`sh -c '…'`) holds these
/// inside one word and is not touched.
fn shell_syntax(line: &str, words: &[String]) -> Result<Vec<String>, ConfigError> {
    const OPERATORS: &[&str] = &[
        ">", ">>", "<", "<<", "|", "||", "&&", ";", "&", "2>", "2>>", "2>&1", "&>", ">&",
    ];
    let fix = |what: &str| {
        format!(
            "no shell runs a command given to --exec, so {what}; run it through one: batchfit \
             probe --exec -- sh -c {}",
            crate::output::env::shell_quote(line)
        )
    };
    let redirects = |w: &str| {
        [">", "1>", "2>", "&>", "|"]
            .iter()
            .any(|p| w.starts_with(p))
    };
    if let Some(op) = words
        .iter()
        .find(|w| OPERATORS.contains(&w.as_str()) || redirects(w))
    {
        return Err(ConfigError(format!(
            "--exec {}: `{op}` would reach the command as an argument; {}",
            crate::output::env::shell_quote(line),
            fix("redirections, pipes and command lists do nothing there")
        )));
    }
    if let Some(e) = tilde_program(line, words) {
        return Err(e);
    }
    let variable = regex_lite::Regex::new(
        r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)|^~[A-Za-z0-9_.-]*(/|$)",
    )
    .expect("a valid expression");
    Ok(words
        .iter()
        .filter_map(|w| variable.find(w))
        .map(|m| {
            format!(
                "the command's `{}` reaches it as written ({})",
                m.as_str(),
                fix("nothing is expanded")
            )
        })
        .take(1)
        .collect())
}

/// A program word that starts with `~` (`~/venv/bin/python`) in a command given as one string: no
/// shell expands it, so the program would be looked for in a folder named `~`. Refused with the path
/// written in full where `HOME` says what a shell would have made of `~/`.
fn tilde_program(line: &str, words: &[String]) -> Option<ConfigError> {
    let program = words.first().filter(|w| w.starts_with('~'))?;
    if std::path::Path::new(program).exists() {
        return None;
    }
    let full = match (program.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) if !home.is_empty() => {
            format!(" (here {}/{rest})", home.trim_end_matches('/'))
        }
        _ => String::new(),
    };
    Some(ConfigError(format!(
        "--exec {}: no shell runs a command given as one string, so `~` is not expanded and the \
         program `{program}` would be looked for in a folder named `~`; write its path in full{full}, \
         or give the command after `--` so that your shell expands it (batchfit probe --exec -- \
         {line})",
        crate::output::env::shell_quote(line),
    )))
}

/// A command after `--` that is one word with whitespace in it and no such file (`--exec -- "python
/// train.py --batch {batch}"`): quoted by mistake, it would be looked for as one program named by the
/// whole line. Refused with the two forms that work.
fn quoted_command(command: &[String]) -> Result<(), ConfigError> {
    let [word] = command else {
        return Ok(());
    };
    if !word.contains(char::is_whitespace) || std::path::Path::new(word).exists() {
        return Ok(());
    }
    Err(ConfigError(format!(
        "the command after `--` is one quoted word with spaces ({}): batchfit runs its words as \
         given, so it would look for a program named by the whole line; pass the command unquoted, \
         as separate words after `--` (batchfit probe --exec -- {word}), or as one string without \
         `--` (batchfit probe --exec {})",
        crate::output::env::shell_quote(word),
        crate::output::env::shell_quote(word)
    )))
}

/// A `{name}` in the command that is not a placeholder but looks meant as one (`{batc}`,
/// `{BATCH}`, `{batch_size}`, `$batch`): batchfit passes it as written, so the job would get the
/// text, not a size.
fn placeholder_typos(command: &[String]) -> Vec<String> {
    const NAMES: [&str; 3] = ["batch", "steps", "accumulation"];
    const ALIASES: [(&str, &str); 6] = [
        ("batch_size", "batch"),
        ("batchsize", "batch"),
        ("bs", "batch"),
        ("micro_batch", "batch"),
        ("accum", "accumulation"),
        ("step", "steps"),
    ];
    let braces = regex_lite::Regex::new(r"\$?\{([A-Za-z_]+)\}|\$([A-Za-z_]+)").expect("valid");
    let meant = |name: &str| {
        let lower = name.to_lowercase();
        NAMES
            .into_iter()
            .find(|n| n[..1] == lower[..1.min(lower.len())] && strsim::levenshtein(n, &lower) <= 2)
            .or_else(|| ALIASES.iter().find(|(a, _)| *a == lower).map(|(_, n)| *n))
    };
    let has_placeholder = crate::workload::exec::has_placeholder;
    let mut out = vec![];
    for word in command {
        for c in braces.captures_iter(word) {
            let (whole, name) = (&c[0], c.get(1).or(c.get(2)).map_or("", |m| m.as_str()));
            let real = NAMES.contains(&name);
            if whole.starts_with('{') && real {
                continue;
            }
            let given = |n: &str| {
                command
                    .iter()
                    .any(|w| has_placeholder(w, &format!("{{{n}}}")))
            };
            // `${batch}`: the placeholder is replaced, and the job gets a `$` before the size
            let dollar_brace = real && whole.starts_with("${");
            let typo = meant(name)
                .filter(|n| dollar_brace || (!given(n) && !has_placeholder_at(word, whole)));
            if let Some(n) = typo {
                out.push(format!(
                    "the command's `{whole}` (in {}) is not a placeholder batchfit replaces, so the \
                     job gets it as written; did you mean `{{{n}}}`?",
                    crate::output::env::shell_quote(word)
                ));
            }
        }
    }
    out
}

/// Whether `part` of `word` is inside a doubled-brace escape (`{{batch}}`, a literal on purpose).
fn has_placeholder_at(word: &str, part: &str) -> bool {
    word.contains(&format!("{{{part}}}"))
}

/// `--exec -- CMD ARG…`: the command checked (it can be started), its fingerprint files hashed, its
/// patterns compiled, the built-in model's flags refused (the command trains its own model).
fn exec(a: &ProbeArgs) -> Result<(Option<ExecConfig>, Vec<String>), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if a.exec.is_none() {
        return exec_flags_without_exec(a).map(|()| (None, vec![]));
    }
    if a.command.is_empty() {
        return err(format!("--exec needs the command: {EXEC_FORMS}"));
    }
    quoted_command(&a.command)?;
    model_flags_refused(a)?;
    find_program(&a.command[0])?;
    let mut files = vec![];
    for f in &a.fingerprint_file {
        let sha256 = files::sha256(f)
            .map_err(|e| ConfigError(format!("--fingerprint-file {}: {e}", f.display())))?;
        files.push(FileHash {
            path: f.display().to_string(),
            sha256,
        });
    }
    let oom_patterns = a
        .oom_pattern
        .iter()
        .map(|p| {
            regex_lite::Regex::new(p).map_err(|e| {
                ConfigError(format!(
                    "--oom-pattern {p:?} is not a regular expression: {e}"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    sweep_placeholders_swept(a)?;
    let mut warnings = vec![];
    if !a
        .command
        .iter()
        .any(|w| crate::workload::exec::has_placeholder(w, "{batch}"))
    {
        // said once, in the plan and its summary, unless the trials' reports prove the job read it
        warnings.push(NO_BATCH_WARNING.to_string());
    }
    warnings.extend(placeholder_typos(&a.command));
    let python = crate::workload::exec::warm::python_launch(&a.command).is_some();
    if a.warm == WarmArg::On && !python {
        return err(format!(
            "--warm on needs a Python interpreter running a script or a module (python train.py \
             …, python -m pkg …); {} is not one: use --warm auto or off",
            a.command[0]
        ));
    }
    let threads = a.threads;
    let mut environment: Vec<String> = crate::workload::exec::ENVIRONMENT
        .iter()
        .map(|s| s.to_string())
        .collect();
    if threads.is_some() {
        environment.push("OMP_NUM_THREADS".into());
    }
    let info = ExecInfo {
        kind: ExecKind::Exec,
        fingerprint: exec_fingerprint(&a.command, &files),
        argv: a.command.clone(),
        fingerprint_files: files,
        environment,
        oom_patterns: a.oom_pattern.clone(),
        threads,
        auto_fingerprint_files: crate::plan::schema::auto_fingerprint(&a.command),
        sweep_point: None,
        environment_sha256: crate::plan::schema::environment_sha256(),
        read_files: None,
        python_environment: None,
    };
    Ok((
        Some(ExecConfig {
            info,
            oom_patterns,
            threads,
            cpu_limit: a.cpu_limit,
            warm: python && a.warm != WarmArg::Off,
            observe: a.observe == ObserveArg::On,
        }),
        warnings,
    ))
}

/// Without `--exec`: no command after `--`, and none of the flags that judge one.
fn exec_flags_without_exec(a: &ProbeArgs) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if !a.command.is_empty() {
        return err(format!(
            "a command after `--` ({}) is probed only with --exec: batchfit probe --exec -- {}",
            a.command.join(" "),
            a.command.join(" ")
        ));
    }
    for (flag, given) in [
        ("--fingerprint-file", !a.fingerprint_file.is_empty()),
        ("--oom-pattern", !a.oom_pattern.is_empty()),
        ("--cpu-limit", a.cpu_limit != CpuLimitArg::Auto),
        ("--warm", a.warm != WarmArg::Auto),
        ("--observe", a.observe != ObserveArg::On),
    ] {
        if given {
            return err(format!(
                "{flag} goes with --exec (probing your own command)"
            ));
        }
    }
    Ok(())
}

/// With `--exec`: none of the flags that describe batchfit's own model.
fn model_flags_refused(a: &ProbeArgs) -> Result<(), ConfigError> {
    let model_flags = [
        ("--model", a.model != "mlp"),
        ("--input", !a.inputs.is_empty()),
        ("--loss", a.loss.is_some()),
        ("--precision", a.precision != PrecisionArg::Fp32),
        ("--optimizer", a.optimizer != OptimizerArg::Adam),
        (
            "--mlp-input/--mlp-hidden/--mlp-classes",
            a.mlp_input != 1024 || a.mlp_hidden != [2048, 2048] || a.mlp_classes != 10,
        ),
        ("--layers", a.layers.is_some()),
        ("--d-model", a.d_model.is_some()),
        ("--heads", a.heads.is_some()),
        ("--seq-len", a.seq_len.is_some()),
        ("--vocab", a.vocab.is_some()),
        ("--image-size", a.image_size.is_some()),
        ("--patch", a.patch.is_some()),
        ("--isolation hybrid", a.isolation == IsolationArg::Hybrid),
        ("--inject-fault", a.inject_fault.is_some()),
    ];
    if let Some((flag, _)) = model_flags.iter().find(|(_, given)| *given) {
        return Err(ConfigError(format!(
            "{flag} describes batchfit's own model; with --exec your command trains its own, so drop \
             {flag}"
        )));
    }
    Ok(())
}

/// The command's program is a file that exec can run: found (on PATH when it has no `/`), with an
/// execute bit.
fn find_program(program: &str) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    // what exec would run: a file with an execute bit (execvp skips the others on PATH)
    let executable = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![std::path::PathBuf::from(program)]
    } else {
        std::env::var_os("PATH")
            .map(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(program))
                    .collect()
            })
            .unwrap_or_default()
    };
    if !candidates.iter().any(|p| executable(p)) {
        if let Some(file) = candidates.iter().find(|p| p.is_file()) {
            // found now, not as every trial failing to start (`Permission denied`) after the set-up
            return err(format!(
                "--exec: {} is not executable (no execute permission); make it executable (chmod \
                 +x {}) or run it through its interpreter, e.g. --exec -- sh {} …",
                file.display(),
                file.display(),
                file.display()
            ));
        }
        return err(format!(
            "--exec: cannot find the program {program:?} (not a file{}); give its path or check PATH",
            if program.contains('/') { "" } else { " in any PATH directory" }
        ));
    }
    Ok(())
}

/// `{S}` and `{image}` in the command only where `--sweep` varies them.
fn sweep_placeholders_swept(a: &ProbeArgs) -> Result<(), ConfigError> {
    for param in [SweepParam::SeqLen, SweepParam::ImageSize] {
        let ph = param.placeholder();
        let swept = a
            .sweep
            .as_deref()
            .and_then(|s| s.split_once('='))
            .map(|x| x.0.trim());
        if swept != Some(param.as_str()) && a.command.iter().any(|w| w.contains(ph)) {
            return Err(ConfigError(format!(
                "the command has {ph} in its arguments but there is no --sweep {}=V1,V2,…: \
                 {ph} is the sweep's point (give that --sweep, or write the value itself)",
                param.as_str()
            )));
        }
    }
    Ok(())
}

/// The architecture of `--model` with its knobs: a preset's defaults, overridden by the flags given,
/// or a TorchScript file with its inputs and loss. A knob of another model family is refused (it
/// would silently do nothing).
fn architecture(a: &ProbeArgs) -> Result<Architecture, ConfigError> {
    let model = a.model.as_str();
    let transformer = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--heads", a.heads),
    ];
    let gpt_only = [("--seq-len", a.seq_len), ("--vocab", a.vocab)];
    let image = [("--image-size", a.image_size)];
    let patch = [("--patch", a.patch)];
    let refuse = |flags: &[(&str, Option<u64>)], family: &str| -> Result<(), ConfigError> {
        match flags.iter().find(|(_, v)| v.is_some()) {
            Some((flag, _)) => Err(ConfigError(format!(
                "{flag} is a {family} option; --model {model} does not use it"
            ))),
            None => Ok(()),
        }
    };
    let Some(preset) = Architecture::preset(model) else {
        return torchscript(a);
    };
    if !a.inputs.is_empty() || a.loss.is_some() {
        return Err(ConfigError(format!(
            "--input and --loss describe a TorchScript model; the built-in --model {model} has its own \
             ({})",
            ModelSpec {
                architecture: preset,
                optimizer: OptimizerKind::Adam,
                precision: Precision::Fp32,
            }
            .input_spec()
        )));
    }
    let mlp_flags_given =
        a.mlp_input != 1024 || a.mlp_hidden != [2048, 2048] || a.mlp_classes != 10;
    if !matches!(preset, Architecture::Mlp { .. }) && mlp_flags_given {
        return Err(ConfigError(format!(
            "--mlp-input, --mlp-hidden and --mlp-classes are MLP options; --model {model} does not use them"
        )));
    }
    Ok(match preset {
        Architecture::Mlp { .. } => {
            refuse(&transformer, "GPT and ViT")?;
            refuse(&gpt_only, "GPT")?;
            refuse(&image, "ResNet and ViT")?;
            refuse(&patch, "ViT")?;
            Architecture::Mlp {
                input: a.mlp_input,
                hidden: a.mlp_hidden.clone(),
                classes: a.mlp_classes,
            }
        }
        Architecture::Gpt {
            layers,
            d_model,
            heads,
            seq_len,
            vocab,
        } => {
            refuse(&image, "ResNet and ViT")?;
            refuse(&patch, "ViT")?;
            Architecture::Gpt {
                layers: a.layers.unwrap_or(layers),
                d_model: a.d_model.unwrap_or(d_model),
                heads: a.heads.unwrap_or(heads),
                seq_len: a.seq_len.unwrap_or(seq_len),
                vocab: a.vocab.unwrap_or(vocab),
            }
        }
        Architecture::Resnet18 {
            image_size,
            classes,
        } => {
            refuse(&transformer, "GPT and ViT")?;
            refuse(&gpt_only, "GPT")?;
            refuse(&patch, "ViT")?;
            Architecture::Resnet18 {
                image_size: a.image_size.unwrap_or(image_size),
                classes,
            }
        }
        Architecture::Resnet50 {
            image_size,
            classes,
        } => {
            refuse(&transformer, "GPT and ViT")?;
            refuse(&gpt_only, "GPT")?;
            refuse(&patch, "ViT")?;
            Architecture::Resnet50 {
                image_size: a.image_size.unwrap_or(image_size),
                classes,
            }
        }
        Architecture::Vit {
            layers,
            d_model,
            heads,
            patch,
            image_size,
            classes,
        } => {
            refuse(&gpt_only, "GPT")?;
            Architecture::Vit {
                layers: a.layers.unwrap_or(layers),
                d_model: a.d_model.unwrap_or(d_model),
                heads: a.heads.unwrap_or(heads),
                patch: a.patch.unwrap_or(patch),
                image_size: a.image_size.unwrap_or(image_size),
                classes,
            }
        }
        Architecture::Torchscript { .. } => unreachable!("not a preset"),
    })
}

/// `--model PATH`: a TorchScript file, checked now (exists, readable, really TorchScript) so a bad file
/// never costs a trial; its content hash goes into the fingerprint.
fn torchscript(a: &ProbeArgs) -> Result<Architecture, ConfigError> {
    let model = a.model.as_str();
    let path = std::path::Path::new(model);
    let looks_like_file = model.contains('/')
        || [".pt", ".pth", ".ts", ".jit", ".zip"]
            .iter()
            .any(|e| model.ends_with(e))
        || path.exists();
    if !looks_like_file {
        return Err(ConfigError(format!(
            "unknown model {model:?}: use one of {} (see `batchfit models`), or a TorchScript file \
             PATH.pt with --input and --loss",
            crate::plan::model::ZOO.join(", ")
        )));
    }
    let zoo_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--heads", a.heads),
        ("--seq-len", a.seq_len),
        ("--vocab", a.vocab),
        ("--image-size", a.image_size),
        ("--patch", a.patch),
    ];
    if let Some((flag, _)) = zoo_flags.iter().find(|(_, v)| v.is_some()) {
        return Err(ConfigError(format!(
            "{flag} is an option of the built-in models; a TorchScript model's shapes come from --input"
        )));
    }
    if a.inputs.is_empty() {
        return Err(ConfigError(format!(
            "--model {model} is a TorchScript file: give its inputs with --input, e.g. --input \
             'f32[B,3,224,224]' (repeat --input for each argument of forward())"
        )));
    }
    let inputs = a
        .inputs
        .iter()
        .map(|s| s.parse::<InputSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError(e.to_string()))?;
    let loss: LossSpec = a
        .loss
        .as_deref()
        .ok_or_else(|| {
            ConfigError(format!(
                "--model {model} is a TorchScript file: say how to form its loss with --loss \
                 cross-entropy:NUM_CLASSES, mse or mean"
            ))
        })?
        .parse()
        .map_err(|e: crate::plan::input::LossSpecError| ConfigError(e.to_string()))?;
    let file = crate::workload::script::inspect(path).map_err(|e| ConfigError(e.to_string()))?;
    Ok(Architecture::Torchscript {
        file: file.path,
        sha256: file.sha256,
        parameters: file.parameters,
        inputs,
        loss,
    })
}

/// The limit a trial must fit under: `(budget − reserve) × (1 − margin)`.
pub fn limit(budget: u64, reserve: u64, margin: f64) -> u64 {
    (budget.saturating_sub(reserve) as f64 * (1.0 - margin)) as u64
}

/// The warning for a command without `{batch}` (kept in the plan unless the trials' reports show the
/// job read `BATCHFIT_BATCH`).
pub const NO_BATCH_WARNING: &str =
    "the command has no {batch} in its arguments: it must read the size from BATCHFIT_BATCH \
     (or batchfit_trial.batch_size()), or every trial trains the same size";

/// What a probe says of a command without `{batch}` before its first trial, when nothing has yet
/// shown whether the job reads the size from its environment.
pub const NO_BATCH_NOTE: &str =
    "no {batch} in the command: each trial's size reaches it only as BATCHFIT_BATCH in its \
     environment (batchfit_trial.batch_size() reads it); a job that reads neither trains one size \
     whatever batchfit asks, and the plan will say so";

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        shell_words::split(line).unwrap()
    }

    #[test]
    fn a_mistyped_placeholder_gets_did_you_mean() {
        let said = |line: &str| placeholder_typos(&words(line)).join("\n");
        for (line, meant) in [
            ("python t.py --batch-size {batc}", "{batch}"),
            ("python t.py --batch-size {BATCH}", "{batch}"),
            ("python t.py --batch-size {batch_size}", "{batch}"),
            ("python t.py --batch-size=$batch", "{batch}"),
            ("python t.py --bs ${batch}", "{batch}"),
            ("python t.py --batch {batch} --steps {stpes}", "{steps}"),
            (
                "python t.py --batch {batch} --accum {acumulation}",
                "{accumulation}",
            ),
        ] {
            assert!(
                said(line).contains(&format!("did you mean `{meant}`")),
                "{line}: {}",
                said(line)
            );
        }
    }

    #[test]
    fn placeholders_escapes_and_unrelated_braces_are_not_typos() {
        for line in [
            "python t.py --batch-size {batch} --steps {steps} --accumulation {accumulation}",
            "python t.py --batch-size {batch} --name {{batc}}",
            "python t.py --batch-size {batch} --ckpt ckpt-{epoch}-{bs}.pt",
            "python t.py --batch-size {batch} --fmt {match} --x $HOME",
        ] {
            assert_eq!(
                placeholder_typos(&words(line)),
                Vec::<String>::new(),
                "{line}"
            );
        }
    }

    #[test]
    fn shell_operators_in_a_one_string_command_are_refused_with_sh_c() {
        for line in [
            "python t.py --batch-size {batch} > log.txt",
            "python t.py --batch-size {batch} 2>&1",
            "python t.py --batch-size {batch} >log.txt",
            "python t.py --batch-size {batch} | tee log",
            "cd /data && python t.py --batch-size {batch}",
        ] {
            let e = shell_syntax(line, &words(line)).unwrap_err().0;
            assert!(e.contains("sh -c"), "{line}: {e}");
        }
        let line = "sh -c 'python t.py --batch-size {batch} > log.txt'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
        let line = "python t.py --batch-size {batch} --token '<s>' --expr 'a>b'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_variable_in_a_one_string_command_is_kept_with_a_warning() {
        let line = "python t.py --batch-size {batch} --data $DATA/train";
        let w = shell_syntax(line, &words(line)).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("`$DATA`") && w[0].contains("sh -c"), "{w:?}");
        let line = "python t.py --batch-size {batch} --pattern '^a$'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_tilde_in_a_one_string_command_is_refused_as_the_program_and_warned_as_an_argument() {
        let line = "~/no-such-venv-here/bin/python t.py --batch-size {batch}";
        let e = shell_syntax(line, &words(line)).unwrap_err().0;
        assert!(
            e.contains("`~` is not expanded") && e.contains("--exec -- "),
            "{e}"
        );
        let line = "python t.py --batch-size {batch} --data ~/data";
        let w = shell_syntax(line, &words(line)).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("`~/`") && w[0].contains("nothing is expanded"),
            "{w:?}"
        );
        let line = "python t.py --batch-size {batch} --name a~b";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn limit_definition() {
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
