//! What people and job scripts see: the plan in each `--format` (one [`Exporter`] per format, one
//! file each, as hyperfine's exporters), the progress on stderr ([`progress`]) and the picture of a
//! plan ([`plot`]).
//!
//! Only the chosen format goes to stdout; callers print progress and messages on stderr. Nothing
//! here knows clap: the command line's `--format` maps to [`Format`] in [`crate::cli`].

pub mod deepspeed;
pub mod env;
pub mod json;
pub mod plot;
pub mod progress;
pub mod text;

use crate::plan::Plan;
use std::path::Path;
use thiserror::Error;

/// The formats of `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The plan as JSON.
    Json,
    /// A human summary.
    Text,
    /// Shell `export BATCHFIT_*=...` lines.
    Env,
    /// A DeepSpeed config fragment.
    Deepspeed,
}

#[derive(Debug, Error)]
pub enum OutputError {
    #[error(
        "--format deepspeed cannot express this plan: its micro-batches differ in size ({0:?}); \
         probe again without --allow-uneven, or use --format json"
    )]
    Uneven(Vec<u64>),
    #[error(
        "--format deepspeed: the plan is {0} and recommends nothing, so there is no config to give; \
         probe again to completion (its exit code and the text say why it stopped)"
    )]
    NoRecommendation(crate::plan::Status),
    #[error(
        "--format deepspeed: this merged plan is not verified (its sizes were proven on other \
         machines); run `batchfit verify PLAN` on the machine that trains, then export"
    )]
    Unverified,
    #[error(
        "--format deepspeed: a `batchfit verify` of this plan failed ({0}); its sizes did not hold \
         here: probe this machine (batchfit probe) for a plan of its own"
    )]
    FailedVerification(String),
}

/// One output format of a plan.
pub trait Exporter {
    /// The plan as this format's text. `plan_path` is where the plan file is (for `BATCHFIT_PLAN`).
    fn render(&self, plan: &Plan, plan_path: Option<&Path>) -> Result<String, OutputError>;
}

/// The exporter of `format`.
pub fn exporter(format: Format) -> &'static dyn Exporter {
    match format {
        Format::Json => &json::Json,
        Format::Text => &text::Text,
        Format::Env => &env::Env,
        Format::Deepspeed => &deepspeed::DeepSpeed,
    }
}

/// The plan as `format` (`deepspeed` refuses a plan without a recommendation or unverified).
pub fn render(
    plan: &Plan,
    format: Format,
    plan_path: Option<&Path>,
) -> Result<String, OutputError> {
    exporter(format).render(plan, plan_path)
}
