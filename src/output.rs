//! The plan in the formats of `--format` (json, text, env, deepspeed), shared by `batchfit probe` and
//! `batchfit show`, plus the shell completions and the man page generated from the clap definitions.
//!
//! Only the chosen format goes to stdout; callers print progress and messages on stderr.

use crate::cli::{Cli, FormatArg};
use crate::plan::{Plan, Status};
use clap::CommandFactory;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum OutputError {
    #[error(
        "--format deepspeed cannot express this plan: its micro-batches differ in size ({0:?}); \
         probe again without --allow-uneven, or use --format json"
    )]
    Uneven(Vec<u64>),
    #[error("no subcommand {0:?}; try `batchfit man` for the list")]
    NoSubcommand(String),
    #[error("cannot write: {0}")]
    Io(#[from] std::io::Error),
}

/// The plan as `format`. `plan_path` is where the plan file is (`BATCHFIT_PLAN` in `env`).
/// Empty for `deepspeed` when the plan has no recommendation.
pub fn render(
    plan: &Plan,
    format: FormatArg,
    plan_path: Option<&Path>,
) -> Result<String, OutputError> {
    Ok(match format {
        FormatArg::Json => format!("{}\n", plan.to_json()),
        FormatArg::Text => crate::probe::summary(plan),
        FormatArg::Env => env(plan, plan_path),
        FormatArg::Deepspeed => deepspeed(plan)?,
    })
}

/// `s` quoted for a POSIX shell: unchanged when it has only safe characters, else in single quotes
/// (a `'` inside becomes `'\''`).
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:@%+,=".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Complete => "complete",
        Status::Partial => "partial",
        Status::NothingFits => "nothing-fits",
    }
}

/// `export BATCHFIT_*=...` lines for `eval`. Without a recommendation only `BATCHFIT_STATUS`.
pub fn env(plan: &Plan, plan_path: Option<&Path>) -> String {
    let mut vars: Vec<(&str, String)> = vec![];
    match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => {
            vars.push(("BATCHFIT_MICRO_BATCH", r.micro_batch.to_string()));
            vars.push(("BATCHFIT_ACCUMULATION", r.accumulation.to_string()));
            vars.push(("BATCHFIT_GLOBAL_BATCH", r.global_batch.to_string()));
            vars.push(("BATCHFIT_WORLD_SIZE", r.world_size.to_string()));
            vars.push((
                "BATCHFIT_MAX_FITTING_BATCH",
                r.max_fitting_batch.to_string(),
            ));
            if let Some(f) = r.fastest_micro_batch {
                vars.push(("BATCHFIT_FASTEST_MICRO_BATCH", f.to_string()));
            }
            vars.push(("BATCHFIT_STATUS", status_name(plan.status).into()));
            if let Some(p) = plan_path {
                let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
                vars.push(("BATCHFIT_PLAN", p.to_string_lossy().into_owned()));
            }
        }
        _ => vars.push(("BATCHFIT_STATUS", status_name(plan.status).into())),
    }
    vars.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

/// The DeepSpeed config keys batchfit determines, in DeepSpeed's order.
#[derive(Debug, Serialize)]
struct DeepSpeedFragment {
    train_micro_batch_size_per_gpu: u64,
    gradient_accumulation_steps: u64,
    train_batch_size: u64,
}

/// A DeepSpeed config fragment (pretty JSON), or "" when the plan has no recommendation.
pub fn deepspeed(plan: &Plan) -> Result<String, OutputError> {
    let r = match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => r,
        _ => return Ok(String::new()),
    };
    if r.uneven || r.micro_batches.iter().any(|&m| m != r.micro_batch) {
        return Err(OutputError::Uneven(r.micro_batches.clone()));
    }
    let f = DeepSpeedFragment {
        train_micro_batch_size_per_gpu: r.micro_batch,
        gradient_accumulation_steps: r.accumulation,
        train_batch_size: r.global_batch,
    };
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&f).expect("fragment serialises")
    ))
}

/// Writes the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "batchfit", out);
}

/// Writes the man page (roff) of `batchfit`, or of one of its subcommands (`batchfit-probe`).
pub fn man_page(subcommand: Option<&str>, out: &mut dyn Write) -> Result<(), OutputError> {
    let mut cmd = Cli::command();
    cmd.build();
    let page = match subcommand {
        None => cmd,
        Some(name) => {
            let sub = cmd
                .get_subcommands()
                .find(|c| c.get_name() == name && !c.is_hide_set())
                .cloned()
                .ok_or_else(|| OutputError::NoSubcommand(name.to_string()))?;
            // built: its display name is `batchfit-NAME`, which clap_mangen uses for the title
            sub
        }
    };
    clap_mangen::Man::new(page).render(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("4096"), "4096");
        assert_eq!(shell_quote("/tmp/a-b/plan.json"), "/tmp/a-b/plan.json");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's $HOME"), r"'it'\''s $HOME'");
    }
}
