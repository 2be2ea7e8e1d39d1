//! Progress of a probe: the [`Progress`] trait the probe reports to (a line, a finished trial), and
//! its implementation on stderr, [`StderrProgress`]:
//!
//! * stderr a terminal (and not `--quiet`): every trial's line is printed above a live status line
//!   (indicatif) that shows the trials so far, the last trial (batch, outcome, peak, seconds) and the
//!   elapsed time, and ticks while a trial runs;
//! * stderr not a terminal (logs, CI, tests): the plain lines, one per trial, `trial   1: batch ...`;
//! * `--quiet`: nothing.

use crate::platform::units::format_size;
use crate::search::TrialRecord;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// One progress line for stderr. Its peak is the figure the limit is judged by
/// ([`TrialRecord::footprint`]: under `RLIMIT_DATA`, the larger of the largest process's data
/// segment and the process tree's `Pss`), so that a fit printed under a ceiling is one.
pub fn progress_line(n: usize, t: &TrialRecord, limit: u64) -> String {
    let peak = (t.footprint())
        .or(t.outcome.peak_bytes())
        .map(|p| {
            format!(
                "peak {:>10} ({:>3.0}% of limit)",
                format_size(p),
                100.0 * p as f64 / limit.max(1) as f64
            )
        })
        .unwrap_or_default();
    let msg = match (&t.outcome, t.outcome.message()) {
        (o, Some(m)) if !o.is_oom() => format!("  {m}"),
        _ => String::new(),
    };
    let acc = if t.accumulation > 1 {
        format!(" × accumulation {}", t.accumulation)
    } else {
        String::new()
    };
    let line = format!(
        "trial {n:>3}: batch {:>8}{acc} × {} steps {:<8} {:<7} {peak} {:>7.2} s{msg}",
        t.batch,
        t.steps,
        format!("{:?}", t.purpose).to_lowercase(),
        t.outcome.kind(),
        t.seconds
    );
    match t.details.as_ref().and_then(|d| d.left_behind) {
        Some(left) => format!("{line}\n{}", left_behind_line(n, left)),
        None => line,
    }
}

/// What trial `n` left running after its command exited, and what batchfit did about it.
pub fn left_behind_line(n: usize, left: crate::protocol::LeftBehind) -> String {
    let (what, them) = match left.count {
        1 => ("1 process".to_string(), "it"),
        k => (format!("{k} processes"), "them"),
    };
    if left.killed {
        format!(
            "trial {n}'s command exited and left {what} of the trial running; batchfit killed {them}"
        )
    } else {
        format!(
            "trial {n}'s command exited and left {what} of the trial running; batchfit could not \
             kill {them} all (stuck in the kernel?): check `ps` for processes of the command"
        )
    }
}

/// Receives the probe's progress: lines for stderr, and every trial as it ends.
pub trait Progress {
    fn line(&mut self, line: &str);
    /// Trial number `n` (1-based) ended. Default: one [`progress_line`].
    fn trial(&mut self, n: usize, t: &TrialRecord, limit: u64) {
        self.line(&progress_line(n, t, limit));
    }
    /// Trial number `n` (1-based) is starting at `batch`. Default: nothing (its line follows).
    fn starting(&mut self, _n: usize, _batch: u64, _accumulation: u32) {}
}

/// The live status line while trial `n` runs: the size it runs.
pub fn running_line(n: usize, batch: u64, accumulation: u32) -> String {
    let acc = if accumulation > 1 {
        format!(" × accumulation {accumulation}")
    } else {
        String::new()
    };
    format!("trial {n} running: batch {batch}{acc}")
}

/// Progress as plain lines handed to a closure.
pub struct Lines<'a>(pub &'a mut dyn FnMut(&str));

impl Progress for Lines<'_> {
    fn line(&mut self, line: &str) {
        (self.0)(line)
    }
}

pub enum StderrProgress {
    Quiet,
    Plain,
    Live(ProgressBar),
}

impl StderrProgress {
    /// Live when stderr is a terminal, plain otherwise, nothing when `quiet`.
    pub fn new(quiet: bool) -> Self {
        if quiet {
            StderrProgress::Quiet
        } else if std::io::stderr().is_terminal() {
            let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.set_message("searching: the first trial is running");
            pb.enable_steady_tick(Duration::from_millis(120));
            StderrProgress::Live(pb)
        } else {
            StderrProgress::Plain
        }
    }

    /// Removes the live line (before the summary is printed).
    pub fn finish(&self) {
        if let StderrProgress::Live(pb) = self {
            pb.finish_and_clear();
        }
    }
}

impl Drop for StderrProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The live status line after trial `n`.
pub fn status_line(n: usize, t: &TrialRecord, limit: u64) -> String {
    let peak = (t.footprint())
        .or(t.outcome.peak_bytes())
        .map(|p| {
            format!(
                ", peak {} ({:.0}%)",
                format_size(p),
                100.0 * p as f64 / limit.max(1) as f64
            )
        })
        .unwrap_or_default();
    // Only what is known: whether another trial follows is the search's to decide, so the line does
    // not promise one (it would still say "running" after the last trial).
    format!(
        "{n} trial{} so far; last: batch {} {}{peak}, {:.2} s",
        if n == 1 { "" } else { "s" },
        t.batch,
        t.outcome.kind(),
        t.seconds,
    )
}

impl Progress for StderrProgress {
    fn line(&mut self, line: &str) {
        match self {
            StderrProgress::Quiet => {}
            StderrProgress::Plain => crate::note!("{line}"),
            StderrProgress::Live(pb) => pb.println(line),
        }
    }

    fn trial(&mut self, n: usize, t: &TrialRecord, limit: u64) {
        let line = progress_line(n, t, limit);
        self.line(&line);
        if let StderrProgress::Live(pb) = self {
            pb.set_message(status_line(n, t, limit));
        }
    }

    fn starting(&mut self, n: usize, batch: u64, accumulation: u32) {
        if let StderrProgress::Live(pb) = self {
            pb.set_message(running_line(n, batch, accumulation));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Isolation, TrialOutcome};
    use crate::search::Purpose;

    #[test]
    fn the_running_line_names_the_size() {
        assert_eq!(running_line(3, 512, 1), "trial 3 running: batch 512");
        assert_eq!(
            running_line(4, 256, 2),
            "trial 4 running: batch 256 × accumulation 2"
        );
    }

    #[test]
    fn the_status_line_promises_no_further_trial() {
        let t = TrialRecord {
            batch: 4096,
            steps: 5,
            purpose: Purpose::Confirm,
            isolation: Isolation::None,
            accumulation: 1,
            outcome: TrialOutcome::Fits {
                peak_bytes: 1 << 30,
                rss_peak_bytes: None,
                step_seconds: 0.1,
                gpu: None,
            },
            seconds: 1.0,
            gpu_index: None,
            details: None,
            round: None,
        };
        let s = status_line(5, &t, 2 << 30);
        assert!(
            s.starts_with("5 trials so far; last: batch 4096 fits"),
            "{s}"
        );
        assert!(!s.contains("running"), "{s}");
        assert!(status_line(1, &t, 2 << 30).starts_with("1 trial so far"));
    }

    /// A fit's line prints the figure the limit judges it by: under `RLIMIT_DATA` the process
    /// tree's `Pss` where it is above the largest process's data segment (a job with DataLoader
    /// workers printed 930.9 MiB, the data segment, while the ceiling read its tree's 984 MiB).
    #[test]
    fn a_trial_line_prints_the_footprint_the_limit_judges() {
        let t = TrialRecord {
            batch: 1068,
            steps: 5,
            purpose: Purpose::Confirm,
            isolation: Isolation::Process,
            accumulation: 1,
            outcome: TrialOutcome::Fits {
                peak_bytes: 930 << 20,
                rss_peak_bytes: None,
                step_seconds: 0.1,
                gpu: None,
            },
            seconds: 1.0,
            gpu_index: None,
            details: Some(crate::protocol::TrialDetails {
                tree_pss_peak_bytes: Some(984 << 20),
                ..Default::default()
            }),
            round: None,
        };
        let line = progress_line(7, &t, 1024 << 20);
        assert!(line.contains("peak 984.00 MiB ( 96% of limit)"), "{line}");
        assert!(status_line(7, &t, 1024 << 20).contains("peak 984.00 MiB (96%)"));
    }
}
