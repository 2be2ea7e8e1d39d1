//! What a probe's trials run, chosen once from the arguments: batchfit's own model or the user's
//! command.
//!
//! The two differ in what a trial can be trusted with, and every part of a probe that cares asks
//! the [`WorkloadSpec`] a question named for that difference ([`WorkloadSpec::may_not_train_the_size`],
//! [`WorkloadSpec::peak_noise`], …) rather than which of the two it is: the answers live here,
//! next to the reasons, and the rest of the tree has no branch on the kind of workload
//! (`tests/layout.rs`). `probe::setup` builds the running workload from it, the one place that
//! matches on it.

use super::exec::ExecConfig;
use crate::cli::CpuLimitArg;
use crate::plan::model::{ModelSpec, Precision};
use crate::plan::schema::{ExecInfo, ModelInfo, WorkloadInfo};

/// What a probe's trials run.
#[derive(Debug, Clone)]
pub enum WorkloadSpec {
    /// A tch model (the zoo or a TorchScript file) trained by the torch runner, batchfit's own code.
    Model(ModelSpec),
    /// The user's own training command, unchanged (`--exec`).
    Exec(Box<ExecConfig>),
}

/// How much a trial's peak moves between fresh runs of the same size: what the guard band must
/// cover (`probe::setup::guard_band_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakNoise {
    /// batchfit's own trials: peaks repeat to the byte (the malloc settings fixed); what is left is
    /// the trainer's own process against the trial child's.
    Exact,
    /// A user's job: its heap moves by about a buffer of its largest parameter run to run (glibc's
    /// dynamic mmap threshold; docs/soundness.md).
    Job,
}

/// How a plan's accumulation is known to reach the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumulationProof {
    /// batchfit's own trainer runs the accumulation it is given.
    ByConstruction,
    /// The command takes `{accumulation}` in its arguments.
    InTheArguments,
    /// Only the trial's report can show that the job read `BATCHFIT_ACCUMULATION`.
    ByReport,
}

impl WorkloadSpec {
    /// The plan's `model` section: what the trials ran.
    pub fn info(&self) -> WorkloadInfo {
        match self {
            WorkloadSpec::Model(m) => WorkloadInfo::Model(ModelInfo::of(m)),
            WorkloadSpec::Exec(e) => WorkloadInfo::Exec(e.info.clone()),
        }
    }

    /// The model batchfit trains, for the questions only a model answers (its parameters for DDP's
    /// reserve, its architecture for a sweep's tokens); `None` for a command.
    pub fn model(&self) -> Option<&ModelSpec> {
        match self {
            WorkloadSpec::Model(m) => Some(m),
            WorkloadSpec::Exec(_) => None,
        }
    }

    /// The command's description in the plan (argv, fingerprint, environment), for its cache key;
    /// `None` for batchfit's model, whose spec is its key.
    pub fn command_info(&self) -> Option<&ExecInfo> {
        match self {
            WorkloadSpec::Model(_) => None,
            WorkloadSpec::Exec(e) => Some(&e.info),
        }
    }

    /// Whether the trials' torch DataLoaders are watched (`--observe`, a command's only): a trial
    /// whose loader yielded fewer samples than its size is then an error, so it is part of the
    /// cache key.
    pub fn observes_its_dataloaders(&self) -> bool {
        match self {
            WorkloadSpec::Model(_) => false,
            WorkloadSpec::Exec(e) => e.observe,
        }
    }

    /// Whether a trial may not train the size it was given: a user's job can clamp it, lower it
    /// after an out-of-memory or ignore it, so the search refuses memory that stops growing at the
    /// limit and sizes no report or DataLoader showed. batchfit's own trainer always trains the size
    /// asked.
    pub fn may_not_train_the_size(&self) -> bool {
        matches!(self, WorkloadSpec::Exec(_))
    }

    /// How far a trial's peak moves between fresh runs (the guard band's size).
    pub fn peak_noise(&self) -> PeakNoise {
        match self {
            WorkloadSpec::Model(_) => PeakNoise::Exact,
            WorkloadSpec::Exec(_) => PeakNoise::Job,
        }
    }

    /// Whether the trials start batchfit's torch runner (libtorch, on the user's torch): the plan's
    /// tool names that torch, a CPU limit below what libtorch needs to start is refused, and CUDA
    /// must be seen by that torch. A command brings its own torch and decides all three itself.
    pub fn runs_the_torch_runner(&self) -> bool {
        matches!(self, WorkloadSpec::Model(_))
    }

    /// Whether one trial is one whole job across every GPU of `--gpus` (a command launched by
    /// torchrun or another launcher spans them itself, DDP's buckets included), rather than one
    /// trial per GPU with DDP's gradient buckets reserved beside it (batchfit's model).
    pub fn is_the_whole_job(&self) -> bool {
        matches!(self, WorkloadSpec::Exec(_))
    }

    /// The precision that needs CUDA (an autocast one), if the trials train in one.
    pub fn cuda_only_precision(&self) -> Option<Precision> {
        self.model().map(|m| m.precision).filter(|p| p.is_amp())
    }

    /// Gradient bytes per parameter in DDP's buckets, and the parameters: the reserve a world size
    /// above one needs beside a trial that measured one rank of batchfit's model; `None` where the
    /// trial is the whole job already ([`Self::is_the_whole_job`]).
    pub fn ddp_gradients(&self) -> Option<(u64, u64)> {
        let m = self.model().filter(|_| !self.is_the_whole_job())?;
        let per = match m.precision {
            Precision::Bf16 => 2,
            _ => 4,
        };
        Some((m.parameter_count(), per))
    }

    /// Whether warm trials may fork from a fork server (a Python command's, `--warm auto` or `on`;
    /// the device forks only under `RLIMIT_DATA`).
    pub fn forks_warm_trials(&self) -> bool {
        matches!(self, WorkloadSpec::Exec(e) if e.fork)
    }

    /// How the trials are limited on the cpu: a command as `--cpu-limit` asks (a memory cgroup
    /// around its tree, or `RLIMIT_DATA` on each process); the torch runner's one trial process is
    /// always under `RLIMIT_DATA`.
    pub fn cpu_limit(&self) -> CpuLimitArg {
        match self {
            WorkloadSpec::Model(_) => CpuLimitArg::Rlimit,
            WorkloadSpec::Exec(e) => e.cpu_limit,
        }
    }

    /// Whether the first trial's limit was the user's choice of mechanism and budget alone, so that
    /// a first trial over it can be answered with the budget (or mechanism) that would let it run.
    /// batchfit's model is refused before any trial under a limit libtorch cannot start in.
    pub fn explains_a_first_trial_over_the_limit(&self) -> bool {
        matches!(self, WorkloadSpec::Exec(_))
    }

    /// Fresh runs of the answer beyond its confirmation (`--repeats`' default): a job's peak moves
    /// run to run ([`PeakNoise::Job`]), so its answer is run again; batchfit's own repeat to the byte.
    pub fn default_repeats(&self) -> u32 {
        match self.peak_noise() {
            PeakNoise::Exact => 0,
            PeakNoise::Job => crate::search::noise::EXEC_REPEATS,
        }
    }

    /// How the accumulation is known to reach the trial.
    pub fn accumulation_proof(&self) -> AccumulationProof {
        match self {
            WorkloadSpec::Model(_) => AccumulationProof::ByConstruction,
            WorkloadSpec::Exec(e)
                if e.info
                    .argv
                    .iter()
                    .any(|a| crate::workload::exec::has_placeholder(a, "{accumulation}")) =>
            {
                AccumulationProof::InTheArguments
            }
            WorkloadSpec::Exec(_) => AccumulationProof::ByReport,
        }
    }
}
