//! Command-line definitions (clap), and what is generated from them (shell completions, man pages).
//! Parsing only: validation into a [`crate::config::ProbeConfig`] happens in one place,
//! [`crate::config`]; the exit codes in `--help` come from [`crate::exit`].

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use thiserror::Error;

fn exit_codes() -> String {
    crate::exit::help(crate::exit::Program::Batchfit)
}

/// `--max-batch`'s default (when it is this, it was not given).
pub const DEFAULT_MAX_BATCH: u64 = 1_000_000;

#[derive(Debug, Parser)]
#[command(
    name = "batchfit",
    version,
    about = "Finds the largest micro-batch that really fits, by running real training steps, and the \
             gradient accumulation that reaches your global batch",
    after_help = exit_codes()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Search for the largest micro-batch that fits and write a plan.
    // a negative value reaches its flag's own check (`--margin -0.1 is outside [0, 0.9]`), and
    // `--seed -1` is a seed: without this clap says "unexpected argument '-0'" and suggests
    // `-- -0`, which for probe is the --exec command
    #[command(after_help = exit_codes(), allow_negative_numbers = true)]
    Probe(Box<ProbeArgs>),
    /// Print a plan file in another format (for job scripts and DeepSpeed configs).
    Show(ShowArgs),
    /// Show the GPUs, what holds their memory, and why a job can run out of memory while memory looks
    /// free (exit 3 when no GPU can be queried; --json still prints a JSON report with the error).
    Doctor {
        /// Print the report as JSON (always valid JSON, with the error inside when there is no driver).
        #[arg(long)]
        json: bool,
        /// Use this plan's numbers too.
        #[arg(long, value_name = "FILE")]
        plan: Option<std::path::PathBuf>,
    },
    /// List the built-in models: name, parameters, default input shape (`--json` for JSON).
    Models {
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script on stdout (e.g. `batchfit completions bash > ~/.local/share/bash-completion/completions/batchfit`).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout (e.g. `batchfit man > batchfit.1`, `batchfit man probe`).
    Man {
        /// A subcommand's page instead (e.g. `probe` → batchfit-probe(1)).
        subcommand: Option<String>,
    },
    /// Combine complete plans of one model from several nodes or GPU types into one plan: the
    /// smallest largest-fitting micro-batch, the accumulation re-solved (unverified until
    /// `batchfit verify`).
    #[command(allow_negative_numbers = true)]
    Merge(MergeArgs),
    /// Run confirmation trials of a plan's micro-batch sizes on this machine and mark it verified
    /// (exit 4 when a size does not fit here).
    Verify(VerifyArgs),
    /// The plan cache (`${XDG_CACHE_HOME:-~/.cache}/batchfit/plans`, or $BATCHFIT_CACHE_DIR).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Print the optional Python helper for training scripts probed with `--exec` (standard library
    /// only): `batchfit python-helper > batchfit_trial.py`.
    #[command(name = "python-helper")]
    PythonHelper,
    /// Predict the largest micro-batch for other memory sizes from a plan's capacity model (its
    /// measured memory line): predicted, not proven, with an error bar, refused where the line cannot
    /// be extended (a knee or a jump).
    #[command(allow_negative_numbers = true)]
    Predict(PredictArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PredictFormat {
    /// A table, one line per memory size.
    Text,
    /// The predictions as JSON.
    Json,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// The plan (written by `batchfit probe --out`).
    #[arg(value_name = "PLAN")]
    pub plan: PathBuf,
    /// Memory budgets to predict for, comma-separated, as --memory-budget takes them (the memory the
    /// job gets, e.g. 24GiB,40GiB,80GiB,141GiB).
    #[arg(
        long,
        value_name = "SIZE,…",
        value_delimiter = ',',
        required = true,
        allow_hyphen_values = true
    )]
    pub memory: Vec<String>,
    /// Memory kept free (default: the plan's --reserve).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub reserve: Option<String>,
    /// Safety margin (default: the plan's --margin).
    #[arg(long, value_name = "F")]
    pub margin: Option<f64>,
    /// Also write the predictions as JSON here (atomically).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// What to print on stdout (default: text on a terminal, JSON otherwise, as `show` does).
    #[arg(long, value_enum)]
    pub format: Option<PredictFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// CUDA when a GPU is usable, else CPU.
    Auto,
    Cpu,
    Cuda,
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// Predict from measured peaks, then prove (fewest trials).
    Guided,
    /// Doubling, then bisection of the bracket.
    Bisect,
    /// Doubling only (Lightning's `power`): proven only to within a factor of two.
    Power,
}

/// `--parallel auto|N`: how many trials run at once on the cpu or sim device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelArg {
    /// The proof's cold trials side by side where the cores and the memory hold them; exploration
    /// one trial at a time.
    Auto,
    /// N trials at once, exploration rounds included (1: one at a time).
    Trials(u32),
}

impl std::str::FromStr for ParallelArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ParallelArg::Auto),
            n => n.parse().map(ParallelArg::Trials).map_err(|_| {
                format!("give `auto` or the number of trials to run at once (1 or more), not {n:?}")
            }),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationArg {
    /// Every trial in a fresh process.
    Process,
    /// Exploration trials in one long-lived worker process; the answer and the failure above it are
    /// always proven in fresh processes.
    Hybrid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    Sgd,
    Momentum,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// f32 weights, activations and optimizer state.
    Fp32,
    /// bf16 weights, activations, gradients and optimizer state.
    Bf16,
    /// Autocast to bf16 with f32 master weights (CUDA only).
    #[value(name = "amp-bf16")]
    AmpBf16,
    /// Autocast to f16 with f32 master weights (CUDA only).
    #[value(name = "amp-fp16")]
    AmpFp16,
}

/// What `--model` takes (listed in its help): the zoo names, or a TorchScript file.
pub const MODEL_HELP: &str = "Model to train in each trial: mlp, gpt, gpt2-small, gpt2-medium, \
    resnet18, resnet50, vit-b16 (see `batchfit models`), or a TorchScript file (PATH.pt, exported with \
    scripts/export_torchscript.py) with --input and --loss";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// The plan as JSON.
    Json,
    /// A human summary.
    Text,
    /// Shell `export BATCHFIT_*=...` lines, for `eval "$(batchfit ... --format env)"`.
    Env,
    /// A DeepSpeed config fragment: train_micro_batch_size_per_gpu, gradient_accumulation_steps,
    /// train_batch_size.
    Deepspeed,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The plan file (written by `batchfit probe --out`).
    #[arg(value_name = "PLAN")]
    pub plan: PathBuf,
    /// What to print on stdout. Default: text on a terminal, json otherwise.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Also draw the plan (peak memory and samples/s against the batch size) into FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The batch-size axis of --plot: linear, or log (small sizes are not squashed against zero).
    #[arg(long, value_enum, default_value = "linear")]
    pub plot_scale: PlotScaleArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlotScaleArg {
    Linear,
    Log,
}

impl From<PlotScaleArg> for crate::output::plot::Scale {
    fn from(s: PlotScaleArg) -> Self {
        match s {
            PlotScaleArg::Linear => crate::output::plot::Scale::Linear,
            PlotScaleArg::Log => crate::output::plot::Scale::Log,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Device to probe.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,

    /// Simulated device for --backend sim: base=SIZE,per-sample=SIZE,capacity=SIZE, optionally
    /// knee=N, jump=N:SIZE (repeatable), late=SIZE (per sample, trials of > 3 steps only),
    /// dip=N:SIZE (repeatable), noise=F (reported peak ±F), seed=N, boundary-noise=SIZE (each trial's footprint ±SIZE: a noisy boundary), fail-at=N (trials at N end in
    /// error), retries=N (fits from N on need allocator retries), accumulation=SIZE (extra memory of
    /// trials with gradient accumulation).
    #[arg(long, value_name = "SPEC")]
    pub sim: Option<String>,

    #[arg(long, default_value = "mlp", value_name = "NAME|FILE.pt", help = MODEL_HELP)]
    pub model: String,
    /// TorchScript model input, repeatable in the order of forward()'s arguments: DTYPE[DIMS] with B
    /// for the batch dimension, integers with their value range, e.g. 'f32[B,3,224,224]',
    /// 'i64[B,1024]<50257'.
    #[arg(long = "input", value_name = "SPEC")]
    pub inputs: Vec<String>,
    /// TorchScript model loss on its output: cross-entropy:NUM_CLASSES (logits [B,…,C]), mse, or mean
    /// (the output is already a loss per sample).
    #[arg(long, value_name = "LOSS")]
    pub loss: Option<String>,
    /// Numeric precision (recorded in the model fingerprint).
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: PrecisionArg,
    /// MLP input features.
    #[arg(long, default_value_t = 1024)]
    pub mlp_input: u64,
    /// MLP hidden layer widths, comma-separated.
    #[arg(long, default_value = "2048,2048", value_delimiter = ',')]
    pub mlp_hidden: Vec<u64>,
    /// MLP output classes (cross-entropy).
    #[arg(long, default_value_t = 10)]
    pub mlp_classes: u64,
    /// GPT, ViT: transformer blocks (overrides the preset's).
    #[arg(long)]
    pub layers: Option<u64>,
    /// GPT, ViT: model width (a multiple of --heads).
    #[arg(long)]
    pub d_model: Option<u64>,
    /// GPT, ViT: attention heads.
    #[arg(long)]
    pub heads: Option<u64>,
    /// GPT: tokens per sample (the batch counts sequences).
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// GPT: vocabulary size.
    #[arg(long)]
    pub vocab: Option<u64>,
    /// ResNet, ViT: image height and width (default 224).
    #[arg(long)]
    pub image_size: Option<u64>,
    /// ViT: patch side (default 16; --image-size must be a multiple).
    #[arg(long)]
    pub patch: Option<u64>,
    /// Optimizer (its state is part of the memory).
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: OptimizerArg,

    /// Memory budget, e.g. 1.5GiB, 800MiB (K, M, G, T and KiB, MiB, GiB, TiB are ×1024; KB, MB,
    /// GB, TB are ×1000; case does not matter; a bare number is bytes). Trials run under the limit
    /// (budget − reserve) × (1 − margin), which `batchfit-train --memory-limit plan` applies too.
    /// Default: cpu 80% of what is available now (MemAvailable, and what the cgroup can still take);
    /// cuda NVML's free memory; sim its capacity.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub memory_budget: Option<String>,
    /// Memory kept free for what a trial does not contain (evaluation, data loaders, pinned memory).
    /// Default 0; on cuda with --world-size > 1, one copy of the gradients (DDP's gradient buckets),
    /// stated in the plan.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub reserve: Option<String>,
    /// Safety margin: the limit is (budget − reserve) × (1 − margin). In [0, 0.9].
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,

    /// Global batch to reach with micro-batch × accumulation × world size.
    #[arg(long)]
    pub global_batch: Option<u64>,
    /// Data-parallel ranks sharing the global batch. Default: the number of --gpus (cuda), else 1.
    #[arg(long)]
    pub world_size: Option<u64>,
    /// Split the global batch into micro-batches of unequal size (differing by at most one) instead of
    /// requiring an exact split.
    #[arg(long)]
    pub allow_uneven: bool,

    /// Search strategy.
    #[arg(long, value_enum, default_value = "guided")]
    pub strategy: StrategyArg,
    /// Training steps per exploration trial (≥ 2 counts the optimizer's state: Adam's appears at the
    /// first step and is resident through the second's forward and backward).
    #[arg(long, default_value_t = 2)]
    pub steps: u32,
    /// Training steps of the confirmation trial of the final size.
    #[arg(long, default_value_t = 5)]
    pub confirm_steps: u32,
    /// Fresh re-runs of the answer after its confirmation: it must fit every time, and the spread of
    /// their peaks (the job's own run-to-run noise) must fit under the budget with the answer's peak
    /// (default: 2 with --exec, whose jobs vary from run to run; 0 otherwise).
    #[arg(long, value_name = "N")]
    pub repeats: Option<u32>,
    /// Only try multiples of this (e.g. 8 for tensor cores).
    #[arg(long, default_value_t = 1)]
    pub multiple_of: u64,
    /// Smallest batch to try.
    #[arg(long, default_value_t = 1)]
    pub min_batch: u64,
    /// Largest batch to try (e.g. the dataset size).
    /// With --exec and --global-batch G, the default is G / world size (a larger micro-batch is
    /// never used).
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: u64,
    /// Stop after this many trials (the plan is then partial).
    #[arg(long)]
    pub max_trials: Option<u32>,
    /// Stop after this many seconds (the plan is then partial).
    #[arg(long, value_name = "SECONDS")]
    pub time_limit: Option<f64>,
    /// How trials are isolated (cpu).
    #[arg(long, value_enum, default_value = "process")]
    pub isolation: IsolationArg,
    /// GPUs to probe (cuda): `all` or indices like 0,2 (NVML order). Each is probed in parallel; the
    /// plan takes the smallest micro-batch, confirms it on every GPU and records each GPU's result.
    /// Default: 0.
    #[arg(long, value_name = "all|0,2,…")]
    pub gpus: Option<String>,
    /// cpu and sim: run N trials at once, each its own process under its own limit (the search
    /// proposes N sizes per round, and runs the proof's cold trials N at a time); on the cpu, N
    /// budgets must fit in the memory available now. `auto` (default): on the cpu, the proof's cold
    /// trials run side by side, up to one per core and per budget the memory available holds,
    /// exploration one trial at a time; elsewhere one at a time. On cuda, identical GPUs of --gpus
    /// run one trial each per round by themselves.
    #[arg(long, value_name = "auto|N", default_value = "auto")]
    pub parallel: ParallelArg,
    /// cuda: count a trial that completes only after the caching allocator flushed its cache and
    /// retried (outcome `retries`: slow, and close to an OOM) as a fit.
    #[arg(long)]
    pub allow_retries: bool,
    /// cuda: probe once more with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and report the
    /// difference in the plan.
    #[arg(long)]
    pub compare_alloc_conf: bool,
    /// Kill a trial after this many seconds (recorded as `timeout`, never a fit).
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub trial_timeout: f64,

    /// libtorch threads per trial (the trainer uses the same). Default: all cores.
    #[arg(long)]
    pub threads: Option<u32>,
    /// Seed for weights and synthetic data.
    #[arg(long, default_value_t = 0)]
    pub seed: i64,

    /// Write the plan here (atomically). A search that does not complete writes
    /// NAME.partial.EXT beside it instead and leaves this file as it was.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Draw the plan (peak memory and samples/s against the batch size, the limit and margin, the
    /// capacity model's line) into FILE.svg or FILE.png once the plan is written (partial plans too).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// What to print on stdout (only that; progress and messages go to stderr). Default: text on a
    /// terminal, json otherwise (so scripts that capture stdout get the plan as JSON).
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Advise a smaller tested size when its samples/s is within this fraction of the best measured
    /// (0.03 = 3%). In [0, 1).
    #[arg(long, value_name = "F", default_value_t = 0.03)]
    pub throughput_tolerance: f64,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,

    /// Neither read nor write the plan cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Ignore a cached plan: probe again and overwrite the cache entry.
    #[arg(long, conflicts_with = "no_cache")]
    pub refresh: bool,

    /// Fault injection for tests of the trial runner: hang|crash|kill|nan|no-result[@MIN_BATCH].
    #[arg(long, hide = true)]
    pub inject_fault: Option<String>,

    /// Probe your own training command instead of a built-in model, given after `--` (`--exec --
    /// python train.py --batch-size {batch} --max-steps {steps}`) or as one quoted string (`--exec
    /// 'python train.py --batch-size {batch} --max-steps {steps}'`, split into words as a POSIX
    /// shell splits them; no shell runs it): each trial runs it fresh with {batch}, {steps},
    /// {accumulation} in its arguments replaced and BATCHFIT_BATCH, BATCHFIT_STEPS,
    /// BATCHFIT_ACCUMULATION, BATCHFIT_TRIAL, BATCHFIT_RESULT in its environment.
    // `Some(None)`: the command is after `--`; `Some(Some(line))`: it is `line` (config splits it)
    #[arg(
        long,
        value_name = "'CMD ARG…'",
        num_args = 0..=1,
        help_heading = "Your own command"
    )]
    pub exec: Option<Option<String>>,
    /// A file whose content is part of the command's fingerprint (the training script, its config);
    /// repeatable. The plan cache and `verify` tell another version of it from this one.
    #[arg(long, value_name = "FILE", help_heading = "Your own command")]
    pub fingerprint_file: Vec<PathBuf>,
    /// Keep each trial's whole output in DIR (trial-NNN-bB-aA.stdout/.stderr); the plan keeps the
    /// last lines of each.
    #[arg(long, value_name = "DIR", help_heading = "Your own command")]
    pub logs: Option<PathBuf>,
    /// A regular expression that means out of memory in the command's output (beside PyTorch's,
    /// Python's, the C++ runtime's and XLA's), repeatable.
    #[arg(long, value_name = "REGEX", help_heading = "Your own command")]
    pub oom_pattern: Vec<String>,
    /// cpu, --exec: how a trial's memory is limited: a memory cgroup around its whole process tree
    /// (as a job's cgroup limits it), RLIMIT_DATA on each of its processes, or auto (cgroup where
    /// this process may create one, else rlimit; the plan records which).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        help_heading = "Your own command"
    )]
    pub cpu_limit: CpuLimitArg,
    /// cpu, --exec: run exploration trials after the first in warm processes with the job's
    /// packages imported, then handed the trial: under RLIMIT_DATA forked from one fork server,
    /// under a memory cgroup started ahead of the trial in its own cgroup; every trial that proves
    /// starts cold. auto: for a Python interpreter running a script or -m module; on: the same, an
    /// error for another command; ahead: processes started ahead only, never forked; off: every
    /// trial a cold start.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        help_heading = "Your own command"
    )]
    pub warm: WarmArg,
    /// --exec: watch the job's torch DataLoaders (a `sitecustomize` put first on the trials'
    /// PYTHONPATH; the user's own still runs): a trial whose DataLoader yielded fewer samples per
    /// batch than the size given (a dataset shorter than the batch, a clamped batch size) is an
    /// error, not a fit. off: for a job that deliberately trains another size through its
    /// DataLoader. A job that writes the helper's report is judged by the report.
    #[arg(
        long,
        value_enum,
        default_value = "on",
        help_heading = "Your own command"
    )]
    pub observe: ObserveArg,
    /// The batch-size axis of --plot: linear, or log (small sizes are not squashed against zero).
    #[arg(long, value_enum, default_value = "linear")]
    pub plot_scale: PlotScaleArg,
    /// The command (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,

    /// Tolerance of the proof, a fraction in [0, 0.1]: the search may stop when b fits (confirmed)
    /// and a size b' ≤ b + max(1, ⌊F·b⌋) runs out of memory (multiples of --multiple-of: at least
    /// one step). 0: exact (b + 1 runs out of memory). Sizes below 1/F are always exact.
    #[arg(long, value_name = "F", default_value_t = crate::search::DEFAULT_TOLERANCE)]
    pub tolerance: f64,
    /// Probe at several sequence lengths (gpt; a TorchScript model's `S` dimension) or image sizes
    /// (resnet18, resnet50, vit; `S` too): one proven largest micro-batch per point, each point's
    /// search started from what the points before it measured, e.g. seq-len=256,512,1024,2048. The
    /// plan's recommendation is for --seq-len/--image-size (the model's default, else the first
    /// point) and its `sweep` table has every point.
    #[arg(long, value_name = "seq-len|image-size=V1,V2,…")]
    pub sweep: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuLimitArg {
    Auto,
    Cgroup,
    Rlimit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObserveArg {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WarmArg {
    Auto,
    On,
    Ahead,
    Off,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Complete plans of one model (from `batchfit probe --out` on each node or GPU type).
    #[arg(value_name = "PLAN", required = true)]
    pub plans: Vec<PathBuf>,
    /// Global batch to reach with micro-batch × accumulation × world size.
    #[arg(long)]
    pub global_batch: u64,
    /// Data-parallel ranks sharing the global batch.
    #[arg(long, default_value_t = 1)]
    pub world_size: u64,
    /// Allow micro-batches of unequal size (differing by at most one).
    #[arg(long)]
    pub allow_uneven: bool,
    /// Write the merged plan here (atomically).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// What to print on stdout. Default: text on a terminal, json otherwise.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The plan to verify.
    #[arg(value_name = "PLAN")]
    pub plan: PathBuf,
    /// Write the result here (atomically); default: PLAN itself.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The simulated device to verify on (sim plans; default: the plan's own `sim_spec`).
    #[arg(long, value_name = "SPEC")]
    pub sim: Option<String>,
    /// What to print on stdout. Default: text on a terminal, json otherwise.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// A plan of a command: watch its torch DataLoaders as `probe --observe` does (a trial whose
    /// DataLoader yielded fewer samples per batch than the size is an error).
    #[arg(long, value_enum, default_value = "on")]
    pub observe: ObserveArg,
}

#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// List the cached plans: key, model, device, micro-batch, date.
    List,
    /// Remove every cached plan (only the plans folder; libtorch next to it is never touched).
    Clear,
}

/// `--format` as given, or its default: text when stdout is a terminal (a person reads it), json
/// otherwise (a script or a file gets the plan itself).
pub fn format_or_default(f: Option<FormatArg>) -> crate::output::Format {
    use std::io::IsTerminal;
    match f {
        Some(f) => f.into(),
        None if std::io::stdout().is_terminal() => crate::output::Format::Text,
        None => crate::output::Format::Json,
    }
}

impl From<FormatArg> for crate::output::Format {
    fn from(f: FormatArg) -> Self {
        use crate::output::Format;
        match f {
            FormatArg::Json => Format::Json,
            FormatArg::Text => Format::Text,
            FormatArg::Env => Format::Env,
            FormatArg::Deepspeed => Format::Deepspeed,
        }
    }
}

#[derive(Debug, Error)]
pub enum ManError {
    #[error("no subcommand {0:?}; try `batchfit man` for the list")]
    NoSubcommand(String),
    #[error("cannot write: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "batchfit", out);
}

/// Writes the man page (roff) of `batchfit`, or of one of its subcommands (`batchfit-probe`).
pub fn man_page(subcommand: Option<&str>, out: &mut dyn Write) -> Result<(), ManError> {
    let mut cmd = Cli::command();
    cmd.build();
    let page = match subcommand {
        None => cmd,
        Some(name) => cmd
            .get_subcommands()
            .find(|c| c.get_name() == name && !c.is_hide_set())
            .cloned()
            // built: its display name is `batchfit-NAME`, which clap_mangen uses for the title
            .ok_or_else(|| ManError::NoSubcommand(name.to_string()))?,
    };
    clap_mangen::Man::new(page).render(out)?;
    Ok(())
}

/// `batchfit-train`'s arguments: parsed by the launcher (usage errors and `--help` need no torch)
/// and again by the torch runner's `train`.
#[derive(Debug, Parser)]
// allow_negative_numbers: `--lr -1` reaches its own check, not clap's "unexpected argument '-1'"
#[command(name = "batchfit-train", version, about = "Trains with the micro-batch and accumulation of a batchfit plan", after_help = crate::exit::help(crate::exit::Program::Train), allow_negative_numbers = true)]
pub struct TrainArgs {
    /// The plan written by `batchfit probe --out`.
    #[arg(long)]
    pub plan: PathBuf,
    /// Optimizer steps to run (each of `accumulation` micro-batches).
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Override the plan's micro-batch (for experiments; reported as an override).
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// Override the plan's accumulation (for experiments; reported as an override).
    #[arg(long)]
    pub accumulation: Option<u64>,
    /// Learning rate (Adam's usual 1e-3 overshoots at the first steps on the zoo's models).
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// Train even with a plan that is partial or made for another model or device.
    #[arg(long)]
    pub force: bool,
    /// Run under a memory limit: `plan` (the job's limit: the probe's --memory-budget less --reserve
    /// and --margin; the trials ran under it less the plan's guard band, `limit_bytes`), a size like
    /// 1GiB, or `none`. On cpu
    /// the limit is RLIMIT_DATA on the data segment (the "peak" the probe measured), with the trial
    /// process's set-up from the plan's runtime (stack limit, OpenMP stack size, threads); on cuda,
    /// the caching allocator's per-process memory fraction.
    #[arg(long, default_value = "none", allow_hyphen_values = true)]
    pub memory_limit: String,
    /// Train on real data: a .safetensors or .npz file with tensors `x` (inputs; `x0`, `x1`, … for
    /// several) and `y` (targets), samples along the first dimension. Default: synthetic data of the
    /// model's shapes, as in probing.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Where the TorchScript model file is now (default: the path in the plan). Its SHA-256 must
    /// match the plan's.
    #[arg(long, value_name = "FILE.pt")]
    pub model_file: Option<PathBuf>,
    /// Only the final summary.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Parses `argv` (program name first) as `T`; on `--help`, `--version` or a usage error clap's text
/// is printed and the exit to end with is returned (0 for help and version, 2 for bad usage).
pub fn parse_or_exit<T: Parser>(
    argv: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, crate::exit::Exit> {
    T::try_parse_from(argv).map_err(|e| print_parse_error(&e))
}

/// Prints clap's text for a failed parse and returns the exit it means (0 for `--help` and
/// `--version`, 2 for bad usage).
pub fn print_parse_error(e: &clap::Error) -> crate::exit::Exit {
    let _ = e.print();
    if e.use_stderr() {
        crate::exit::Exit::Usage
    } else {
        crate::exit::Exit::Success
    }
}
