//! The user's own training command, unchanged (`batchfit probe --exec -- CMD ARG…`): a plain PyTorch
//! script, Lightning, Hugging Face Trainer, torchrun — the job the user will actually run, so the proof
//! holds for it and not only for a replay of its model.
//!
//! Each trial runs the command fresh with `{batch}`, `{steps}` and `{accumulation}` substituted in its
//! arguments and `BATCHFIT_BATCH`, `BATCHFIT_STEPS`, `BATCHFIT_ACCUMULATION`, `BATCHFIT_TRIAL` and
//! `BATCHFIT_RESULT` added to its environment — nothing else of the user's environment is changed (no
//! malloc tuning; threads only when `--threads` asks). The device limits and measures its whole
//! process tree. What the end means:
//!
//! * exit 0 → fits (the device has kept it under the limit); when the command wrote a report
//!   ([`crate::protocol::TrialReport`], `batchfit python-helper`), it must say it trained the size it
//!   was given, with the steps and accumulation asked for, or the trial is an error;
//! * a non-zero exit → the one classifier ([`crate::protocol::classify`]) decides from the output,
//!   the kernel's OOM kills of the tree and the data segment against its limit, plus `--oom-pattern`;
//!   anything else is an error with the output's last line, never a fit and never an out-of-memory.

use crate::plan::schema::ExecInfo;
use crate::protocol::classify::{classify, Evidence, Verdict};
use crate::protocol::{
    AllocatorReport, Finished, FootprintMethod, GpuMeasure, Placement, StepTime, TrialDetails,
    TrialOutcome, TrialReport, TrialRequest, Workload, REPORT_SCHEMA,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// `batchfit python-helper`: the optional helper for training scripts (standard library only).
pub const PYTHON_HELPER: &str = include_str!("batchfit_trial.py");

/// The placeholders substituted in the command's arguments.
pub const PLACEHOLDERS: [&str; 3] = ["{batch}", "{steps}", "{accumulation}"];

/// The environment variables set in every trial (values per trial).
pub const ENVIRONMENT: [&str; 5] = [
    "BATCHFIT_BATCH",
    "BATCHFIT_STEPS",
    "BATCHFIT_ACCUMULATION",
    "BATCHFIT_TRIAL",
    "BATCHFIT_RESULT",
];

/// How many lines of a trial's output its record keeps.
const TAIL_LINES: usize = 20;

/// A user's command as a workload.
pub struct ExecWorkload {
    info: ExecInfo,
    oom_patterns: Vec<regex_lite::Regex>,
    /// `OMP_NUM_THREADS` when the user asked (`--threads`).
    threads: Option<u32>,
    /// Where the trials' reports go.
    results: tempfile::TempDir,
    trials: AtomicU32,
    /// The last trial started: its request and report path (trials of one workload run one at a
    /// time).
    last: Mutex<Option<(TrialRequest, PathBuf)>>,
}

/// The argv of a trial: placeholders replaced.
pub fn substitute(argv: &[String], req: &TrialRequest) -> Vec<String> {
    argv.iter()
        .map(|a| {
            a.replace("{batch}", &req.batch.to_string())
                .replace("{steps}", &req.steps.to_string())
                .replace("{accumulation}", &req.accumulation.to_string())
        })
        .collect()
}

impl ExecWorkload {
    pub fn new(
        info: ExecInfo,
        oom_patterns: Vec<regex_lite::Regex>,
        threads: Option<u32>,
    ) -> std::io::Result<Self> {
        Ok(ExecWorkload {
            info,
            oom_patterns,
            threads,
            results: tempfile::Builder::new()
                .prefix("batchfit-reports-")
                .tempdir()?,
            trials: AtomicU32::new(0),
            last: Mutex::new(None),
        })
    }

    fn last(&self) -> Option<(TrialRequest, PathBuf)> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The last `n` non-empty lines of stderr, then of stdout.
fn tail(f: &Finished, n: usize) -> Vec<String> {
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.chars().take(300).collect())
            .collect()
    };
    let mut v = lines(&f.stderr);
    v.extend(lines(&f.stdout));
    let k = v.len().saturating_sub(n);
    v.split_off(k)
}

/// The line that says what went wrong: the last non-empty line of stderr (a Python traceback ends
/// with the exception), else of stdout.
fn error_line(f: &Finished) -> String {
    let last = |s: &str| {
        s.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(400).collect::<String>())
    };
    last(&f.stderr)
        .or_else(|| last(&f.stdout))
        .unwrap_or_else(|| "(no output)".into())
}

/// Reads the report at `path`: `Ok(None)` when the command wrote none.
fn read_report(path: &Path) -> Result<Option<TrialReport>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "cannot read the trial report {}: {e}",
                path.display()
            ))
        }
    };
    let r: TrialReport = serde_json::from_str(&text)
        .map_err(|e| format!("the command's trial report is not valid ({e})"))?;
    if r.schema != REPORT_SCHEMA {
        return Err(format!(
            "the command's trial report has schema {:?}, not {REPORT_SCHEMA:?} (get the helper of \
             this batchfit: batchfit python-helper)",
            r.schema
        ));
    }
    Ok(Some(r))
}

/// Why a report does not match the request, if it does not. The accumulation is checked when the
/// command was given it (`{accumulation}`) or asked for it (the helper's `accumulation()`).
fn mismatch(r: &TrialReport, req: &TrialRequest, takes_accumulation: bool) -> Option<String> {
    let mut why = vec![];
    if r.batch != req.batch {
        why.push(format!("batch {} (asked {})", r.batch, req.batch));
    }
    if r.steps < u64::from(req.steps) {
        why.push(format!("{} optimizer steps (asked {})", r.steps, req.steps));
    }
    if (r.reads_accumulation || takes_accumulation) && r.accumulation != u64::from(req.accumulation)
    {
        why.push(format!(
            "accumulation {} (asked {})",
            r.accumulation, req.accumulation
        ));
    }
    (!why.is_empty()).then(|| {
        format!(
            "the command did not train the size it was given: its report says {}",
            why.join(", ")
        )
    })
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

impl Workload for ExecWorkload {
    fn command(&self, req: &TrialRequest, at: &Placement) -> Command {
        let n = self.trials.fetch_add(1, Ordering::SeqCst);
        let report = self.results.path().join(format!("trial-{n}.json"));
        let _ = std::fs::remove_file(&report);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((*req, report.clone()));
        let argv = substitute(&self.info.argv, req);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("BATCHFIT_BATCH", req.batch.to_string())
            .env("BATCHFIT_STEPS", req.steps.to_string())
            .env("BATCHFIT_ACCUMULATION", req.accumulation.to_string())
            .env("BATCHFIT_TRIAL", n.to_string())
            .env("BATCHFIT_RESULT", &report);
        if let Some(t) = self.threads {
            cmd.env("OMP_NUM_THREADS", t.to_string());
        }
        if let Some(p) = &self.info.sweep_point {
            cmd.env(&p.variable, p.value.to_string());
        }
        // the cuda device adds CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF itself
        let _ = at;
        cmd
    }

    fn measured_by_device(&self) -> bool {
        true
    }

    fn outcome(&self, f: &Finished) -> (TrialOutcome, Option<TrialDetails>) {
        let Some((req, report_path)) = self.last() else {
            return (
                TrialOutcome::Error {
                    message: "internal error: a trial ended that was never started".into(),
                },
                None,
            );
        };
        let m = &f.measure;
        let mut details = TrialDetails {
            output_tail: tail(f, TAIL_LINES),
            log: m
                .log
                .as_ref()
                .map(|p| format!("{}.stdout/.stderr", p.display())),
            report: None,
            tree_rss_peak_bytes: m.rss_peak,
            processes: Some(m.processes),
            step_time: None,
            gpu_peaks: vec![],
        };
        // What the limit acts on: the cgroup's peak, else the largest data segment of the tree.
        let peak = m.cgroup_peak.or(m.data_peak).or(m.rss_peak);
        if !f.status.success() {
            let message = format!("{}\n{}", f.stderr, f.stdout);
            let verdict = classify(&Evidence {
                message: &message,
                data_peak: m.data_peak,
                data_limit: m.data_limit,
                kernel_oom_kill: f.kernel_oom_kill,
                extra_markers: &self.oom_patterns,
                ..Default::default()
            });
            let outcome = match verdict {
                Verdict::Oom(message) => TrialOutcome::Oom {
                    message,
                    peak_bytes: peak,
                    rss_peak_bytes: m.rss_peak,
                    gpu: None,
                },
                Verdict::Error(_) => {
                    let how = match (
                        f.status.code(),
                        std::os::unix::process::ExitStatusExt::signal(&f.status),
                    ) {
                        (Some(c), _) => format!("exit code {c}"),
                        (_, Some(s)) => format!("signal {s}"),
                        _ => "an unknown status".into(),
                    };
                    TrialOutcome::Error {
                        message: format!("the command failed ({how}): {}", error_line(f)),
                    }
                }
            };
            return (outcome, Some(details));
        }
        let report = match read_report(&report_path) {
            Ok(r) => r,
            Err(message) => return (TrialOutcome::Error { message }, Some(details)),
        };
        let takes = self.info.argv.iter().any(|a| a.contains("{accumulation}"));
        if let Some(why) = report.as_ref().and_then(|r| mismatch(r, &req, takes)) {
            details.report = report;
            return (TrialOutcome::Error { message: why }, Some(details));
        }
        let Some(peak) = peak.filter(|&p| p > 0) else {
            return (
                TrialOutcome::Error {
                    message:
                        "the command exited 0, but no memory of its process tree was measured \
                              (it ended before the first sample)"
                            .into(),
                },
                Some(details),
            );
        };
        let (step_seconds, source) = match report.as_ref().and_then(|r| {
            let s = if r.step_seconds.len() >= 2 {
                &r.step_seconds[1..]
            } else {
                &r.step_seconds[..]
            };
            median(s)
        }) {
            Some(s) => (s / f64::from(req.accumulation.max(1)), StepTime::Report),
            None => (
                m.seconds / f64::from(req.steps.max(1)) / f64::from(req.accumulation.max(1)),
                StepTime::WallClock,
            ),
        };
        details.step_time = Some(source);
        let allocator = report
            .as_ref()
            .and_then(|r| r.cuda.as_ref())
            .map(|c| AllocatorReport {
                peak_allocated_bytes: c.peak_allocated_bytes,
                peak_reserved_bytes: c.peak_reserved_bytes,
                reserved_bytes: c.reserved_bytes,
                alloc_retries: c.alloc_retries,
                ooms: c.ooms,
            });
        details.report = report;
        // The allocator's view (the cuda device adds NVML's, which decides); a trial that fit only
        // by flushing the cache bounds the search, as for batchfit's own trials.
        let gpu = allocator.map(|a| GpuMeasure {
            nvml_peak_bytes: 0,
            method: FootprintMethod::NvmlDeviceDelta,
            allocator: Some(a),
        });
        let outcome = match allocator.map(|a| a.alloc_retries.saturating_sub(a.ooms)) {
            Some(retries) if retries > 0 => TrialOutcome::Retries {
                retries,
                peak_bytes: peak,
                step_seconds,
                gpu,
            },
            _ => TrialOutcome::Fits {
                peak_bytes: peak,
                rss_peak_bytes: m.rss_peak,
                step_seconds,
                gpu,
            },
        };
        (outcome, Some(details))
    }
}
