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
    /// Not marked as the error's source: its text is already in this message, and the binary prints
    /// the chain of sources (it was printed twice).
    #[error("cannot write the plan: {0}")]
    Write(PlanError),
}

impl From<PlanError> for ProbeError {
    fn from(e: PlanError) -> Self {
        ProbeError::Write(e)
    }
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

/// One writer per `--out`: this process holds the lock file beside the plan
/// ([`crate::platform::lock::beside`], `.NAME.batchfit-lock`) until it exits, and a second probe
/// writing the same plan (or its partial sibling) is refused before any trial. Called before the
/// probe does anything else (the cache too answers to `--out`).
pub fn hold_out(out: &Path) -> Result<(), ProbeError> {
    use crate::platform::lock::{self, LockError};
    let env = |why: String| ProbeError::Environment(format!("--out {}: {why}", out.display()));
    let lock_path = lock::beside(out).map_err(|e| env(e.to_string()))?;
    lock::hold(&lock_path).map_err(|e| match e {
        LockError::Held { .. } => ProbeError::Usage(format!(
            "--out {}: another batchfit probe is writing this plan ({e}); wait for it to end, or \
             give this probe another --out",
            out.display()
        )),
        e => env(e.to_string()),
    })
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
        // only a regular file: a link at that name (its target written through while the search
        // ran) and anything else are left as they are
        if std::fs::symlink_metadata(&partial).is_ok_and(|m| m.file_type().is_file()) {
            let _ = std::fs::remove_file(&partial);
        }
        Ok(Some(out.to_path_buf()))
    } else {
        plan.write_atomic(&partial)?;
        Ok(Some(partial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan's write error is said once: it is the message, not also its source (the binary
    /// prints the chain of sources, and the same sentence appeared twice).
    #[test]
    fn a_write_error_is_said_once() {
        let e = ProbeError::from(PlanError::Write(
            crate::platform::files::FileError::Directory {
                path: "p.json".into(),
            },
        ));
        assert!(std::error::Error::source(&e).is_none());
        let text = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(text.matches("is a directory").count(), 1, "{text}");
    }

    /// Exit 4's meaning (`--help`, docs/exit-codes.md) names every stop reason that gives it, so a
    /// script that sees 4 knows to look for each of them in the plan.
    #[test]
    fn exit_4_names_every_stop_reason_that_gives_it() {
        let all = [
            StopReason::Proven,
            StopReason::MaxBatch,
            StopReason::PowerResolution,
            StopReason::NothingFits,
            StopReason::MaxTrials,
            StopReason::TimeLimit,
            StopReason::TrialErrors,
            StopReason::Interrupted,
            StopReason::ProvenWithinTolerance,
            StopReason::ProvenBelowNoise,
            StopReason::NoisyBoundary,
            StopReason::BatchNotShown,
        ];
        // a new stop reason fails to compile here until it is listed above
        for r in all {
            match r {
                StopReason::Proven
                | StopReason::MaxBatch
                | StopReason::PowerResolution
                | StopReason::NothingFits
                | StopReason::MaxTrials
                | StopReason::TimeLimit
                | StopReason::TrialErrors
                | StopReason::Interrupted
                | StopReason::ProvenWithinTolerance
                | StopReason::ProvenBelowNoise
                | StopReason::NoisyBoundary
                | StopReason::BatchNotShown => {}
            }
        }
        let meaning = Exit::Unproven.meaning();
        for r in all.into_iter().filter(|&r| {
            Ending::of(r, None).exit() == Exit::Unproven && r != StopReason::TrialErrors
        }) {
            let name = serde_json::to_value(r).unwrap();
            let name = name.as_str().unwrap();
            assert!(
                meaning.contains(name),
                "exit 4's meaning omits {name}: {meaning}"
            );
        }
    }
}
