//! Turns parsed arguments into a validated [`ProbeConfig`], in one place, before any backend work.
//! Every check that can fail on user input lives here, so a bad flag never costs a trial.

use crate::accumulate;
use crate::backend::cpu::IsolationMode;
use crate::backend::sim::SimSpec;
use crate::cli::{
    BackendArg, FormatArg, IsolationArg, ModelArg, OptimizerArg, ProbeArgs, StrategyArg,
};
use crate::models::{Architecture, ModelSpec, OptimizerKind, Precision};
use crate::plan;
use crate::search::{Grid, SearchConfig, StrategyKind};
use crate::trial::FaultAt;
use crate::units::parse_size;
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
    pub margin: f64,
    /// (global batch, world size)
    pub global: Option<(u64, u64)>,
    pub world_size: u64,
    pub allow_uneven: bool,
    pub search: SearchConfig,
    pub trial_timeout: Duration,
    pub isolation: IsolationMode,
    pub threads: u32,
    pub seed: i64,
    pub out: Option<PathBuf>,
    pub format: FormatArg,
    /// `--throughput-tolerance`: a smaller tested size within this fraction of the best samples/s is
    /// advised (`fastest_micro_batch`).
    pub throughput_tolerance: f64,
    pub quiet: bool,
    pub fault: Option<FaultAt>,
}

fn size(flag: &str, v: &str) -> Result<u64, ConfigError> {
    parse_size(v).map_err(|e| ConfigError(format!("{flag}: {e}")))
}

pub fn validate(a: &ProbeArgs) -> Result<ProbeConfig, ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    let backend = match (a.backend, &a.sim) {
        (BackendArg::Sim, Some(s)) => {
            BackendChoice::Sim(SimSpec::parse(s).map_err(|e| ConfigError(e.to_string()))?)
        }
        (BackendArg::Sim, None) => {
            return err("--backend sim needs --sim base=SIZE,per-sample=SIZE,capacity=SIZE".into())
        }
        (_, Some(_)) => return err("--sim is only used with --backend sim".into()),
        (BackendArg::Auto, None) => BackendChoice::Auto,
        (BackendArg::Cpu, None) => BackendChoice::Cpu,
        (BackendArg::Cuda, None) => BackendChoice::Cuda,
    };
    let model = ModelSpec {
        architecture: architecture(a)?,
        optimizer: match a.optimizer {
            OptimizerArg::Sgd => OptimizerKind::Sgd,
            OptimizerArg::Momentum => OptimizerKind::Momentum,
            OptimizerArg::Adam => OptimizerKind::Adam,
            OptimizerArg::Adamw => OptimizerKind::Adamw,
        },
        precision: Precision::Fp32,
    };
    model.validate().map_err(ConfigError)?;

    let budget = a
        .memory_budget
        .as_deref()
        .map(|v| size("--memory-budget", v))
        .transpose()?;
    if budget == Some(0) {
        return err("--memory-budget must be greater than 0".into());
    }
    let reserve = size("--reserve", &a.reserve)?;
    if let Some(b) = budget {
        if reserve >= b {
            return err(format!(
                "--reserve ({}) must be smaller than --memory-budget ({})",
                a.reserve,
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
    if a.world_size == 0 {
        return err("--world-size must be at least 1".into());
    }
    let global = match a.global_batch {
        Some(g) => {
            accumulate::check_global(g, a.world_size).map_err(|e| ConfigError(e.to_string()))?;
            Some((g, a.world_size))
        }
        None => None,
    };
    if a.steps == 0 {
        return err("--steps must be at least 1 (3 or more counts Adam's state)".into());
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
    if a.max_trials == Some(0) {
        return err("--max-trials must be at least 1".into());
    }
    let positive_secs = |flag: &str, v: f64| -> Result<Duration, ConfigError> {
        if !v.is_finite() || v <= 0.0 {
            Err(ConfigError(format!(
                "{flag} must be a positive number of seconds"
            )))
        } else {
            Ok(Duration::from_secs_f64(v))
        }
    };
    let time_limit = a
        .time_limit
        .map(|t| positive_secs("--time-limit", t))
        .transpose()?;
    let trial_timeout = positive_secs("--trial-timeout", a.trial_timeout)?;
    let threads = match a.threads {
        Some(0) => return err("--threads must be at least 1".into()),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    };
    if !a.throughput_tolerance.is_finite() || !(0.0..1.0).contains(&a.throughput_tolerance) {
        return err(format!(
            "--throughput-tolerance {} is outside [0, 1); it is a fraction, e.g. 0.03 for 3%",
            a.throughput_tolerance
        ));
    }
    if a.format == FormatArg::Deepspeed && a.allow_uneven {
        return err(
            "--format deepspeed cannot express micro-batches of unequal size; drop --allow-uneven \
             (or use --format json)"
                .into(),
        );
    }
    if let Some(out) = &a.out {
        plan::check_writable(out).map_err(ConfigError)?;
    }
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
        margin: a.margin,
        global,
        world_size: a.world_size,
        allow_uneven: a.allow_uneven,
        search: SearchConfig {
            strategy: match a.strategy {
                StrategyArg::Guided => StrategyKind::Guided,
                StrategyArg::Bisect => StrategyKind::Bisect,
                StrategyArg::Power => StrategyKind::Power,
            },
            steps: a.steps,
            confirm_steps: a.confirm_steps,
            min_batch: a.min_batch,
            max_batch: a.max_batch,
            multiple_of: a.multiple_of,
            max_trials: a.max_trials,
            time_limit,
        },
        trial_timeout,
        isolation: match a.isolation {
            IsolationArg::Process => IsolationMode::Process,
            IsolationArg::Hybrid => IsolationMode::Hybrid,
        },
        threads,
        seed: a.seed,
        out: a.out.clone(),
        format: a.format,
        throughput_tolerance: a.throughput_tolerance,
        quiet: a.quiet,
        fault,
    })
}

/// The architecture of `--model` with its knobs: a preset's defaults, overridden by the flags given.
/// A knob of another model family is refused (it would silently do nothing).
fn architecture(a: &ProbeArgs) -> Result<Architecture, ConfigError> {
    let gpt_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--heads", a.heads),
        ("--seq-len", a.seq_len),
        ("--vocab", a.vocab),
    ];
    let refuse = |flags: &[(&str, Option<u64>)], family: &str| -> Result<(), ConfigError> {
        match flags.iter().find(|(_, v)| v.is_some()) {
            Some((flag, _)) => Err(ConfigError(format!(
                "{flag} is a {family} option; --model {} does not use it",
                a.model.name()
            ))),
            None => Ok(()),
        }
    };
    let image = [("--image-size", a.image_size)];
    if a.model == ModelArg::Mlp {
        refuse(&gpt_flags, "GPT")?;
        refuse(&image, "ResNet")?;
        return Ok(Architecture::Mlp {
            input: a.mlp_input,
            hidden: a.mlp_hidden.clone(),
            classes: a.mlp_classes,
        });
    }
    let preset = Architecture::preset(a.model.name()).expect("every --model is a preset");
    Ok(match preset {
        Architecture::Gpt {
            layers,
            d_model,
            heads,
            seq_len,
            vocab,
        } => {
            refuse(&image, "ResNet")?;
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
            refuse(&gpt_flags, "GPT")?;
            Architecture::Resnet18 {
                image_size: a.image_size.unwrap_or(image_size),
                classes,
            }
        }
        Architecture::Resnet50 {
            image_size,
            classes,
        } => {
            refuse(&gpt_flags, "GPT")?;
            Architecture::Resnet50 {
                image_size: a.image_size.unwrap_or(image_size),
                classes,
            }
        }
        Architecture::Mlp { .. } => unreachable!("handled above"),
    })
}

/// The limit a trial must fit under: `(budget − reserve) × (1 − margin)`.
pub fn limit(budget: u64, reserve: u64, margin: f64) -> u64 {
    (budget.saturating_sub(reserve) as f64 * (1.0 - margin)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_definition() {
        assert_eq!(limit(1000, 0, 0.05), 950);
        assert_eq!(limit(1000, 200, 0.5), 400);
        assert_eq!(limit(1000, 0, 0.0), 1000);
    }
}
