//! What a trial runs.
//!
//! A workload knows how to start one trial of itself at a [`TrialRequest`] and what the trial's end
//! means ([`crate::protocol::Workload`]); it knows nothing of limits or measurement, which are the
//! device's ([`crate::device`]). Two kinds:
//!
//! * [`ModelWorkload`]: a tch model (a zoo model or a TorchScript file, described by
//!   [`crate::plan::model::ModelSpec`]) trained by the torch runner's `trial` subcommand
//!   ([`runner`]: a separate executable that links libtorch, on the user's own torch);
//! * [`exec::ExecWorkload`]: the user's own training command, unchanged (`--exec`).
//!
//! Adding a workload: implement [`crate::protocol::Workload`] (the command of one trial at
//! `(batch, steps, accumulation)` on a [`Placement`], and the outcome of a finished process, using
//! [`crate::protocol::classify`]), give it a plan `model` section, and let `probe::setup` build it.

pub mod exec;
pub mod fault;
pub mod runner;
pub mod script;

use crate::platform::units::format_size;
use crate::protocol::classify::{classify, first_line, Evidence, Verdict};
use crate::protocol::{
    Finished, Placement, Trial, TrialDetails, TrialOutcome, TrialRequest, Workload,
};
use runner::{Runner, TrialSpec};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// The smallest data segment under which a libtorch process starts at all on CPU (measured).
pub const LIBTORCH_MIN_DATA: u64 = 600 << 20;

/// A tch model trained by `batchfit-torch trial SPEC` (the torch runner).
pub struct ModelWorkload {
    pub runner: Runner,
    /// Model, threads, seed, fault injection; batch, steps and accumulation are set per trial.
    pub template: TrialSpec,
}

impl ModelWorkload {
    fn spec(&self, req: &TrialRequest, at: &Placement) -> TrialSpec {
        TrialSpec {
            batch: req.batch,
            steps: req.steps,
            accumulation: req.accumulation,
            cuda_device: match at {
                Placement::Cpu => None,
                Placement::Cuda { nvml_index, .. } => Some(*nvml_index),
            },
            ..self.template.clone()
        }
    }
}

impl Workload for ModelWorkload {
    fn command(&self, req: &TrialRequest, at: &Placement) -> (Command, Trial) {
        let mut cmd = self.runner.command();
        cmd.arg("trial")
            .arg(serde_json::to_string(&self.spec(req, at)).expect("spec serialises"));
        (cmd, Trial::of(*req))
    }

    fn worker_command(&self, at: &Placement) -> Option<Command> {
        let template = self.spec(
            &TrialRequest {
                batch: 0,
                steps: 0,
                fresh: false,
                accumulation: 1,
            },
            at,
        );
        let mut cmd = self.runner.command();
        cmd.arg("worker")
            .arg(serde_json::to_string(&template).expect("spec serialises"));
        Some(cmd)
    }

    /// The child's own result line when it exited cleanly; otherwise the evidence of its death (its
    /// stderr, the kernel's OOM killer) through the classifier. Out of memory before the child
    /// started is not a measurement of the trial: an error saying the limit is too small.
    fn outcome(&self, _trial: &Trial, f: &Finished) -> (TrialOutcome, Option<TrialDetails>) {
        (self.judge(f), None)
    }
}

impl ModelWorkload {
    fn judge(&self, f: &Finished) -> TrialOutcome {
        if f.status.success() {
            return crate::protocol::parse_result(&f.stdout).unwrap_or_else(|| {
                TrialOutcome::Error {
                    message: format!(
                        "the trial process exited without a result; stderr: {}",
                        first_line(&f.stderr)
                    ),
                }
            });
        }
        let what = match (f.status.code(), f.status.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => "unknown status".into(),
        };
        let verdict = classify(&Evidence {
            message: &f.stderr,
            kernel_oom_kill: f.kernel_oom_kill,
            ..Default::default()
        });
        match verdict {
            Verdict::Oom(_) if !crate::protocol::started(&f.stdout) && !f.kernel_oom_kill => {
                TrialOutcome::Error {
                    message: format!(
                        "the trial process ran out of memory before it started ({what}): the memory \
                         limit is below what libtorch itself needs (about {} of data segment); raise \
                         --memory-budget",
                        format_size(LIBTORCH_MIN_DATA)
                    ),
                }
            }
            Verdict::Oom(message) => TrialOutcome::Oom {
                message,
                peak_bytes: None,
                rss_peak_bytes: None,
                gpu: None,
            },
            Verdict::Error(_) | Verdict::OomRejected(_) => TrialOutcome::Error {
                message: format!(
                    "the trial process died ({what}) without a result; stderr: {}",
                    first_line(&f.stderr)
                ),
            },
        }
    }
}
