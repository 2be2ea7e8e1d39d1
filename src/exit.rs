//! The exit codes of both binaries, in one type.
//!
//! Job scripts branch on these numbers, so they are part of the contract like the plan: every code a
//! binary can return is an [`Exit`], the `--help` texts are generated from [`help`], and a test holds
//! README's table to [`table`].

/// Which binary a code belongs to (the two share 0, 2 and 3; 5 means a different thing in each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `batchfit` (probe, show, merge, verify, doctor, ...).
    Batchfit,
    /// `batchfit-train`.
    Train,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success,
    /// Even the smallest size ran out of memory (probe).
    NothingFits,
    /// Bad usage or input; nothing ran.
    Usage,
    /// The device or environment failed (no GPU, cannot start trials, cannot write).
    Environment,
    /// Trials failed with errors or timeouts, so no answer was proven; or `verify`: a size did not fit.
    Unproven,
    /// `--max-trials` or `--time-limit` stopped the search before the proof was complete (probe).
    Capped,
    /// The trainer refused the plan (partial, unverified, another model or device; `--force`).
    Refused,
    /// Out of memory during training (trainer).
    OutOfMemory,
    /// SIGINT or SIGTERM: 128 + the signal.
    Interrupted(i32),
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::NothingFits => 1,
            Exit::Usage => 2,
            Exit::Environment => 3,
            Exit::Unproven => 4,
            Exit::Capped | Exit::Refused => 5,
            Exit::OutOfMemory => 6,
            Exit::Interrupted(sig) => (128 + sig.clamp(1, 127)) as u8,
        }
    }

    /// What the code means (the `--help` and README wording).
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::NothingFits => "nothing fits: even the smallest size runs out of memory",
            Exit::Usage => "bad usage or input (nothing ran)",
            Exit::Environment => "device or environment error (no GPU, cannot start trials, cannot write)",
            Exit::Unproven => {
                "no answer could be proven (partial plan written): trials failed with errors or \
                 timeouts, outcomes near the boundary disagreed (noisy-boundary), the batch size was \
                 not shown to reach the job (batch-not-shown), or the global batch has no split under \
                 the proven size; verify: a size did not fit here"
            }
            Exit::Capped => {
                "stopped by --max-trials or --time-limit before the proof was complete (partial plan \
                 written)"
            }
            Exit::Refused => {
                "plan refused: partial, unverified, another model or another device (--force overrides)"
            }
            Exit::OutOfMemory => "out of memory during training",
            Exit::Interrupted(_) => "interrupted by SIGINT / SIGTERM (partial plan written)",
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

/// An error at a binary's edge, with the exit it maps to (`anyhow` carries the context chain).
#[derive(Debug)]
pub struct Fail(pub Exit, pub anyhow::Error);

/// `map_err(fail(Exit::Usage))`: wraps an error with its exit.
pub fn fail<E: Into<anyhow::Error>>(exit: Exit) -> impl FnOnce(E) -> Fail {
    move |e| Fail(exit, e.into())
}

/// Ends a command: prints a failure as `PROGRAM: error: …` on stderr and turns the result into the
/// process's exit code.
pub fn finish(program: &str, result: Result<Exit, Fail>) -> std::process::ExitCode {
    match result {
        Ok(e) => e.into(),
        Err(Fail(exit, e)) => {
            crate::note!("{program}: error: {e:#}");
            exit.into()
        }
    }
}

/// `eprintln!` that never panics: a line for the user on stderr, dropped when stderr is closed
/// (`batchfit probe … 2>&1 | head -3`). A probe whose reader went away still finishes its work,
/// writes its plan, releases its locks and ends its trials; `eprintln!` would panic mid-probe.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes `text` to stdout. A reader that went away (`batchfit show plan.json | head -c 1`) is not
/// an error of ours: the rest is dropped quietly, like other Unix filters do; any other write error is
/// an environment failure.
pub fn print_stdout(text: &str) -> Result<(), Fail> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Fail(
            Exit::Environment,
            anyhow::Error::new(e).context("cannot write to stdout"),
        )),
    }
}

/// Every exit of `program`, in order.
pub fn exits(program: Program) -> Vec<Exit> {
    match program {
        Program::Batchfit => vec![
            Exit::Success,
            Exit::NothingFits,
            Exit::Usage,
            Exit::Environment,
            Exit::Unproven,
            Exit::Capped,
            Exit::Interrupted(libc::SIGINT),
        ],
        Program::Train => vec![
            Exit::Success,
            Exit::Usage,
            Exit::Environment,
            Exit::Refused,
            Exit::OutOfMemory,
        ],
    }
}

/// `(code, meaning)` rows of `program`'s table; the interrupt row reads `130 / 143`.
pub fn table(program: Program) -> Vec<(String, &'static str)> {
    exits(program)
        .into_iter()
        .map(|e| {
            let code = match e {
                Exit::Interrupted(_) => format!(
                    "{} / {}",
                    Exit::Interrupted(libc::SIGINT).code(),
                    Exit::Interrupted(libc::SIGTERM).code()
                ),
                e => e.code().to_string(),
            };
            (code, e.meaning())
        })
        .collect()
}

/// The `Exit codes:` block of `--help`.
pub fn help(program: Program) -> String {
    let mut s = String::from("Exit codes:\n");
    for (code, meaning) in table(program) {
        s.push_str(&format!("  {code:<9}  {meaning}\n"));
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_within_a_program() {
        for p in [Program::Batchfit, Program::Train] {
            let mut codes: Vec<u8> = exits(p).iter().map(|e| e.code()).collect();
            let n = codes.len();
            codes.sort_unstable();
            codes.dedup();
            assert_eq!(codes.len(), n, "{p:?}");
        }
        assert_eq!(Exit::Interrupted(libc::SIGTERM).code(), 143);
        assert!(help(Program::Train).contains("6          out of memory during training"));
    }
}
