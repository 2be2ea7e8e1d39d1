//! What a probe gives back: the plan, how it ended, where it was written. (The progress it reports
//! while it runs goes through [`Progress`], from [`crate::output::progress`].)

pub use crate::output::progress::{progress_line, Lines, Progress};

use crate::exit::Exit;
use crate::plan::{self, Plan, PlanError, Status};
use crate::search::StopReason;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProbeError {
    /// Bad input discovered once the device is known (budget vs device).
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Environment(String),
    #[error("cannot write the plan: {0}")]
    Write(#[from] PlanError),
}

impl ProbeError {
    pub fn exit(&self) -> Exit {
        match self {
            ProbeError::Usage(_) => Exit::Usage,
            ProbeError::Environment(_) | ProbeError::Write(_) => Exit::Environment,
        }
    }
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

impl Ending {
    /// The ending of a search that stopped for `reason` (`signal`: the one that interrupted it).
    pub fn of(reason: StopReason, signal: Option<i32>) -> Ending {
        match reason {
            r if r.is_complete() => Ending::Complete,
            StopReason::NothingFits => Ending::NothingFits,
            StopReason::Interrupted => Ending::Interrupted(signal.unwrap_or(libc::SIGINT)),
            StopReason::MaxTrials | StopReason::TimeLimit => Ending::Capped,
            _ => Ending::TrialErrors,
        }
    }

    pub fn exit(self) -> Exit {
        match self {
            Ending::Complete => Exit::Success,
            Ending::NothingFits => Exit::NothingFits,
            Ending::TrialErrors => Exit::Unproven,
            Ending::Capped => Exit::Capped,
            Ending::Interrupted(sig) => Exit::Interrupted(sig),
        }
    }
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

/// Writes `plan` where `--out` asks: a complete plan to `out` (its `.partial` sibling removed),
/// anything else to the `.partial` sibling, leaving `out` as it was. Returns the path written.
pub fn write(out: Option<&Path>, plan: &Plan) -> Result<Option<PathBuf>, ProbeError> {
    let Some(out) = out else {
        return Ok(None);
    };
    let partial = plan::partial_path(out);
    if plan.status == Status::Complete {
        plan.write_atomic(out)?;
        let _ = std::fs::remove_file(&partial);
        Ok(Some(out.to_path_buf()))
    } else {
        plan.write_atomic(&partial)?;
        Ok(Some(partial))
    }
}
