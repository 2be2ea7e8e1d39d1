//! The one out-of-memory classifier.
//!
//! A trial's outcome hangs on it: an out-of-memory is proof that a size does not fit, anything else is
//! not (an error or a timeout only bounds the search). So the classifier is fed the *evidence* of a
//! failure, not just a message, and a message alone counts only when it names memory outright:
//!
//! | evidence | verdict |
//! |---|---|
//! | the kernel's OOM killer killed a process of the trial | oom |
//! | a message that says memory ran out (libtorch's CPU and CUDA allocators, `std::bad_alloc`, Rust's allocation failure, Python's `MemoryError`, XLA's `RESOURCE_EXHAUSTED`, cuBLAS's `ALLOC_FAILED`, a `--oom-pattern`) **where the measurements agree with the trial's limit running out**: under a CPU limit (a memory cgroup's, else `RLIMIT_DATA`) the measured peak came within [`agreement_band`] of it (5 %, at least 16 MiB), or the peak plus the allocation the message says failed reaches it, or the CUDA allocator counted an OOM; without a CPU limit (a GPU trial, weighed by its device) the message | oom |
//! | the same message with the peak below that and nothing else agreeing (`the job printed an out-of-memory message at 66% of the limit …`) | error |
//! | a cuDNN or cuBLAS error **after the CUDA allocator counted an OOM** in the trial (cuDNN catches the allocator's OOM and tries smaller workspaces; when none is left it says it found no engine) | oom |
//! | oneDNN's "could not execute a primitive" or a failed thread creation **with the data segment within 5% of `RLIMIT_DATA`** (both allocate and report the failure without saying it was memory) | oom |
//! | the machine's `oom_kill` counter rose and the trial died by SIGKILL, **with its measured peak within 5% of its limit** (outside a memory cgroup; in one, only the group's own counter counts) | oom |
//! | the same without that peak | error |
//! | anything else, including the same cuDNN / oneDNN / thread texts without that evidence | error |
//!
//! In a process's whole output ([`Evidence::output`]) only the *decisive lines* are read: the last
//! exception line (`Name: text` or a bare `Name`, the name ending in `Error` or `Exception`) of each
//! torchrun rank and of the unprefixed output; without one, those of the last five lines that are a
//! runtime's own report (an out-of-memory marker that starts the line, or follows C++'s `terminate
//! called after throwing an instance of` / `what():`), so a log line that mentions memory (`INFO
//! MemoryErrorHandler installed`, `tip: if you see torch.OutOfMemoryError, lower --batch`) is not
//! evidence, wherever it stands and whatever the measurements say: a job that prints such a tip,
//! comes near its limit and exits 1 for another reason did not run out of memory. `MemoryError`
//! counts only as the exception's name, never as part of a word. Text alone never makes an out-of-memory: a message at a measured peak well below a limit
//! that acts on it (a memory cgroup's, [`Evidence::limit_peak`], or `RLIMIT_DATA`, with
//! [`Evidence::data_peak`]) is an error that says so: that limit is not what ran out.
//!
//! A command that exited 0 is judged by [`classify_clean_exit`]: an OOM kill counted by its own
//! cgroup or an OOM its CUDA allocator counted is out of memory; an out-of-memory in its output
//! (an exception line, or an allocator's own message: caught by the job, or hidden by a wrapper's
//! exit status), a descendant killed by a signal or left running is an error. Neither is ever a
//! fit. A report that shows every step done ([`CleanExit::steps_done`]) outweighs the output: the
//! job says it trained the size it was given, so its log is not read.
//!
//! Callers: the tch trial child (a failed step), `batchfit-train` (exit 6 vs 3), the process runner
//! (a trial process that died without a result) and the user-command workload.

/// Message fragments that say, by themselves, that memory ran out.
const OOM_MARKERS: &[&str] = &[
    "DefaultCPUAllocator: can't allocate memory",
    "can't allocate memory",
    "CUDA out of memory",
    "out of memory",
    "OutOfMemoryError",
    "not enough memory",
    "std::bad_alloc",
    "Cannot allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    // XLA / JAX
    "RESOURCE_EXHAUSTED",
    // c10::Error::what() could not build its message (with the backtrace): an allocation failed while
    // formatting the error, which at a memory limit means the limit was reached (seen once, in
    // batchfit-train one size above a probe's answer under its limit).
    "<Error computing Error::what()>",
];

/// A line that starts with one of these is an out-of-memory report (Rust's allocation-error handler
/// prints "memory allocation of N bytes failed" and aborts). Python's `MemoryError` is matched as an
/// exception name ([`exception_name`]).
const OOM_LINE_STARTS: &[&str] = &["memory allocation of "];

/// Lines read at the end of an output without an exception line.
const LAST_LINES: usize = 5;

/// What C++'s `terminate` prints before the exception that ended a process (`terminate called after
/// throwing an instance of 'std::bad_alloc'`, then `what():  CUDA out of memory. …`).
const REPORT_PREFIXES: &[&str] = &["terminate called after throwing an instance of", "what():"];

/// Everything known about a failure.
#[derive(Debug, Clone, Default)]
pub struct Evidence<'a> {
    /// The error text: a libtorch error message, or a dead process's output.
    pub message: &'a str,
    /// OOMs the CUDA caching allocator counted during the trial.
    pub allocator_ooms: u64,
    /// The sampled peak of the data segment, and the `RLIMIT_DATA` it ran under.
    pub data_peak: Option<u64>,
    pub data_limit: Option<u64>,
    /// A process of the trial was killed by the kernel's OOM killer (SIGKILL while the kernel's
    /// `oom_kill` counter rose).
    pub kernel_oom_kill: bool,
    /// Further signatures that mean out of memory for this workload (`--oom-pattern`).
    pub extra_markers: &'a [regex_lite::Regex],
    /// `message` is a process's whole output (logs included), not an error message: only its
    /// decisive lines are read (see the module doc).
    pub output: bool,
    /// The measured peak and the limit that acts on it (a memory cgroup's), when known.
    pub limit_peak: Option<(u64, u64)>,
    /// The trial died by SIGKILL while the machine-wide `oom_kill` counter rose (weak: proof only
    /// with the peak at the limit).
    pub machine_oom_kill: bool,
}

/// What is known of a command that exited 0.
#[derive(Debug, Clone, Default)]
pub struct CleanExit<'a> {
    /// OOM kills counted by the trial's own memory cgroup.
    pub group_oom_kills: u64,
    /// OOMs the CUDA allocator counted (the command's report).
    pub allocator_ooms: u64,
    /// Descendants seen dead by a signal.
    pub killed_descendants: &'a [String],
    /// Descendants still running when the command's main process exited.
    pub left_behind: &'a [String],
    /// The command's output (stderr, then stdout): read for an out-of-memory that the job caught
    /// (or a wrapper swallowed) before it exited 0, unless `steps_done`.
    pub output: &'a str,
    /// The command's report shows it ran every step asked for at the size it was given: its log
    /// says nothing against that (a tip that names `torch.OutOfMemoryError` is no failure).
    pub steps_done: bool,
    /// `--oom-pattern`s.
    pub extra_markers: &'a [regex_lite::Regex],
}

/// What the evidence proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Out of memory, with the message to record.
    Oom(String),
    /// Anything else, with the message to record.
    Error(String),
    /// Not out of memory either: there was a sign of one (an out-of-memory message, the machine's
    /// OOM killer) that the measured peak does not tie to this trial's limit. The message is the
    /// classifier's account of that weighing, which a caller records in place of the output's last
    /// line: it says what the output alone would hide (the peak, the limit, the line rejected).
    OomRejected(String),
}

impl Verdict {
    pub fn is_oom(&self) -> bool {
        matches!(self, Verdict::Oom(_))
    }
    pub fn message(&self) -> &str {
        match self {
            Verdict::Oom(m) | Verdict::Error(m) | Verdict::OomRejected(m) => m,
        }
    }
}

/// Decides whether the evidence proves an out-of-memory (see the module doc).
pub fn classify(e: &Evidence) -> Verdict {
    if e.kernel_oom_kill {
        return Verdict::Oom("killed by the kernel's OOM killer".into());
    }
    let decisive = if e.output {
        decisive_lines(e.message)
    } else {
        e.message.to_string()
    };
    // `--oom-pattern`s are the user's own signatures: any line of the output may carry them
    let line = oom_line(&decisive, &[])
        .or_else(|| matching_line(e.message, |l| e.extra_markers.iter().any(|r| r.is_match(l))));
    if let Some(line) = line {
        return match disagreement(e, &line) {
            Some(why) => Verdict::OomRejected(why),
            None => Verdict::Oom(line),
        };
    }
    if e.machine_oom_kill {
        let near = near_data_limit(e.data_peak, e.data_limit).or_else(|| {
            e.limit_peak
                .and_then(|(p, l)| near_data_limit(Some(p), Some(l)))
        });
        return match near {
            Some(pct) => Verdict::Oom(format!(
                "killed by the kernel's OOM killer (SIGKILL while the machine's oom_kill counter \
                 rose, with the trial at {pct:.0}% of its memory limit)"
            )),
            None => Verdict::OomRejected(
                "killed by SIGKILL while the kernel's OOM killer killed some process of the machine \
                 (/proc/vmstat oom_kill rose), but the trial's measured peak was not near its limit: \
                 not shown to be this trial running out of memory"
                    .into(),
            ),
        };
    }
    let first = if e.output {
        last_line(e.message)
    } else {
        first_line(e.message)
    };
    if e.allocator_ooms > 0 && is_cuda_library_failure(e.message) {
        return Verdict::Oom(format!(
            "{first} (the CUDA allocator ran out of memory {} time(s) in this trial)",
            e.allocator_ooms
        ));
    }
    if let Some(pct) = near_data_limit(e.data_peak, e.data_limit) {
        if let Some(what) = starved_failure(e.message) {
            return Verdict::Oom(format!(
                "{} ({what} failed with the data segment at {pct:.0}% of the memory limit: an \
                 allocation inside it ran out)",
                matching_line(e.message, |l| starved_failure(l).is_some()).unwrap_or(first)
            ));
        }
    }
    Verdict::Error(first)
}

/// How close to its limit a measured peak must have come for an out-of-memory message to be this
/// limit running out: 5 % of the limit, at least the guard band's 16 MiB (the measured run-to-run
/// noise of a job's peak; the samples also lag the last allocations by a few milliseconds).
pub fn agreement_band(limit: u64) -> u64 {
    (limit / 20).max(16 << 20)
}

/// The bytes a failed allocation asked for, when the out-of-memory line says (libtorch's CPU
/// allocator: `you tried to allocate N bytes`; Rust: `memory allocation of N bytes failed`). A GPU's
/// request (`Tried to allocate 2.00 GiB` of CUDA) is no request of a CPU limit and is not read.
pub fn requested_bytes(line: &str) -> Option<u64> {
    ["you tried to allocate ", "memory allocation of "]
        .iter()
        .find_map(|key| {
            let rest = &line[line.find(key)? + key.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
}

/// Why an out-of-memory message (`line`) is not this limit running out, if the evidence says so:
/// with a CPU limit known (a memory cgroup's, else `RLIMIT_DATA`), the message counts only when the
/// measured peak came within [`agreement_band`] of the limit, or the peak and the allocation the
/// message says failed reach it together, or the CUDA allocator counted an OOM. Text alone never
/// makes an out-of-memory: a job may print those words for anything (an HTTP 507, a hint about
/// lowering the batch). Without a known limit (a GPU trial) or a measured peak under it there is
/// nothing to weigh: `None`.
fn disagreement(e: &Evidence, line: &str) -> Option<String> {
    if e.allocator_ooms > 0 {
        return None;
    }
    let (peak, limit) = match (e.limit_peak, e.data_peak.zip(e.data_limit)) {
        (Some(pl), _) | (None, Some(pl)) => pl,
        // no limit, or no sample of the peak under it: nothing to weigh
        (None, None) => return None,
    };
    if limit == 0 {
        return None;
    }
    let floor = limit.saturating_sub(agreement_band(limit));
    let asked = requested_bytes(line);
    if peak >= floor || asked.is_some_and(|r| peak.saturating_add(r) >= floor) {
        return None;
    }
    let asked = asked
        .map(|r| {
            format!(
                ", and the allocation it names, {} MiB, would not have reached it",
                r >> 20
            )
        })
        .unwrap_or_default();
    Some(format!(
        "the job printed an out-of-memory message at {:.0}% of the limit (measured peak {} MiB of \
         {} MiB{asked}): not this budget running out, so not counted as out of memory: {line}",
        peak as f64 / limit as f64 * 100.0,
        peak >> 20,
        limit >> 20
    ))
}

/// The allocators' own out-of-memory messages (PyTorch's CUDA and CPU allocators): on any line of a
/// command that exited 0 they say the job caught an out-of-memory and went on (a batch-size finder,
/// a retry at a smaller size), wherever it printed them. A hint that only names the problem or its
/// exception class (`if you see CUDA out of memory, lower the batch`, `tip: if you see
/// torch.OutOfMemoryError, lower --batch`) has none of them.
const CAUGHT_OOM: [&str; 2] = [
    "CUDA out of memory. Tried to allocate",
    "DefaultCPUAllocator: can't allocate memory",
];

/// What a command that exited 0 proves, if anything stops it from being a fit (see the module doc).
pub fn classify_clean_exit(c: &CleanExit) -> Option<Verdict> {
    if c.group_oom_kills > 0 {
        return Some(Verdict::Oom(format!(
            "the command exited 0, but the kernel's OOM killer killed {} process(es) of the trial's \
             memory cgroup (a DataLoader worker or another child): this size ran out of memory",
            c.group_oom_kills
        )));
    }
    if c.allocator_ooms > 0 {
        return Some(Verdict::Oom(format!(
            "the command exited 0, but its report says the CUDA allocator ran out of memory {} \
             time(s) (the job caught it): this size ran out of memory",
            c.allocator_ooms
        )));
    }
    if let Some(line) = caught_oom(c) {
        return Some(Verdict::Error(format!(
            "the command exited 0, but its output reports an out-of-memory ({line}): the job caught \
             an out-of-memory and carried on (or a wrapper hides its exit code); batchfit cannot \
             tell what batch it finally ran; not a fit, and not counted as out of memory. Let the \
             job exit non-zero when it runs out of memory"
        )));
    }
    if !c.killed_descendants.is_empty() {
        return Some(Verdict::Error(format!(
            "the command exited 0, but a process it started was killed by a signal ({}): not a \
             fit, and not shown to be out of memory",
            c.killed_descendants.join(", ")
        )));
    }
    if !c.left_behind.is_empty() {
        return Some(Verdict::Error(format!(
            "the command exited 0, but the job left processes behind, still running when its main \
             process exited ({}); batchfit killed them: not a fit while they could still allocate",
            c.left_behind.join(", ")
        )));
    }
    None
}

/// The line of a clean exit's output that says the job caught an out-of-memory, unless its report
/// shows every step done: an exception line (the job's last, per rank), the user's own
/// `--oom-pattern`, or an allocator's own message ([`CAUGHT_OOM`]); a clean run's last lines may be
/// any log (`Tip: if you see CUDA out of memory, lower the batch`).
fn caught_oom(c: &CleanExit) -> Option<String> {
    if c.steps_done {
        return None;
    }
    oom_line(&exception_lines(c.output).join("\n"), &[])
        .or_else(|| matching_line(c.output, |l| c.extra_markers.iter().any(|r| r.is_match(l))))
        .or_else(|| matching_line(c.output, |l| CAUGHT_OOM.iter().any(|m| l.contains(m))))
}

/// The name of the exception a line reports (`Name` or `Name: text`, the name's last dotted part
/// ending in `Error` or `Exception`), if it is such a line.
pub fn exception_name(line: &str) -> Option<&str> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(line.len());
    let (name, rest) = line.split_at(end);
    let last = name.rsplit('.').next()?;
    let starts = name.chars().next()?;
    ((starts.is_ascii_alphabetic() || starts == '_')
        && (last.ends_with("Error") || last.ends_with("Exception"))
        && (rest.is_empty() || rest.starts_with(':')))
    .then_some(name)
}

/// The torchrun rank tag of a line (`[rank1]: `), if any.
fn rank_tag(line: &str) -> Option<&str> {
    let l = line.trim();
    let rest = l.strip_prefix('[')?;
    let (tag, _) = rest.split_once("]:")?;
    let name = tag.trim_end_matches(|c: char| c.is_ascii_digit());
    ((name == "rank" || name == "default") && name.len() < tag.len()).then_some(tag)
}

/// The decisive lines of a process's output: the last exception line of each rank's lines and of
/// the unprefixed ones, else the runtime reports ([`report_line`]) among the last [`LAST_LINES`].
fn decisive_lines(msg: &str) -> String {
    let last = exception_lines(msg);
    if !last.is_empty() {
        return last.join("\n");
    }
    let lines: Vec<&str> = msg.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LAST_LINES)..]
        .iter()
        .copied()
        .filter(|l| report_line(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a line is a runtime's own out-of-memory report: an out-of-memory marker at its start,
/// or right after C++'s [`REPORT_PREFIXES`] (`what():  std::bad_alloc`), not in the middle of prose
/// that mentions one (`hint: if training stops with 'out of memory', lower --batch-size`).
fn report_line(line: &str) -> bool {
    let l = unprefixed(line);
    let rest = REPORT_PREFIXES
        .iter()
        .find_map(|p| l.strip_prefix(p))
        .unwrap_or(l)
        .trim_start_matches([' ', '\'']);
    OOM_MARKERS
        .iter()
        .chain(OOM_LINE_STARTS)
        .any(|m| rest.starts_with(m))
}

/// The last exception line of each torchrun rank and of the unprefixed output.
fn exception_lines(msg: &str) -> Vec<&str> {
    let mut last: Vec<(Option<&str>, &str)> = vec![];
    for line in msg.lines() {
        if exception_name(unprefixed(line)).is_some() {
            let tag = rank_tag(line);
            match last.iter_mut().find(|(t, _)| *t == tag) {
                Some(slot) => slot.1 = line,
                None => last.push((tag, line)),
            }
        }
    }
    last.into_iter().map(|(_, l)| l).collect()
}

/// The line of `msg` that says memory ran out, if one does.
fn oom_line(msg: &str, extra: &[regex_lite::Regex]) -> Option<String> {
    matching_line(msg, |l| {
        OOM_MARKERS.iter().any(|m| l.contains(m))
            || OOM_LINE_STARTS.iter().any(|s| l.starts_with(s))
            || exception_name(l).is_some_and(is_memory_error)
            || extra.iter().any(|r| r.is_match(l))
    })
}

/// Python's `MemoryError` by its name, qualified or not, and numpy's subclass of it
/// (`numpy._core._exceptions._ArrayMemoryError: Unable to allocate 698. MiB for an array ...`).
fn is_memory_error(name: &str) -> bool {
    matches!(
        name.rsplit('.').next(),
        Some("MemoryError" | "_ArrayMemoryError")
    )
}

fn matching_line(msg: &str, pred: impl Fn(&str) -> bool) -> Option<String> {
    msg.lines().map(unprefixed).find(|l| pred(l)).map(clip)
}

/// A line without its indentation and without the `[rank1]: ` / `[default0]: ` prefix torchrun puts
/// before each line of a worker's output (so a rank's `MemoryError` is seen as one).
fn unprefixed(line: &str) -> &str {
    let l = line.trim();
    if let Some(rest) = l.strip_prefix('[') {
        if let Some((tag, after)) = rest.split_once("]:") {
            let name = tag.trim_end_matches(|c: char| c.is_ascii_digit());
            if (name == "rank" || name == "default") && name.len() < tag.len() {
                return after.trim();
            }
        }
    }
    l
}

/// The data segment's share of its limit in percent, when it had reached 95% of it.
fn near_data_limit(peak: Option<u64>, limit: Option<u64>) -> Option<f64> {
    let (peak, limit) = (peak?, limit.filter(|&l| l > 0)?);
    (peak.saturating_mul(20) >= limit.saturating_mul(19))
        .then(|| peak as f64 / limit as f64 * 100.0)
}

/// Failures that are memory only when the data segment was at its limit: oneDNN (libtorch's CPU
/// convolutions) reports a failed scratchpad allocation as "could not execute a primitive" ("could
/// not create a primitive" is left out: it usually means a shape or dtype oneDNN does not support),
/// and a thread's stack counts as data under `RLIMIT_DATA` (elsewhere the same failure comes from
/// `pids.max` or `RLIMIT_NPROC`, which no batch size fixes).
fn starved_failure(msg: &str) -> Option<&'static str> {
    if msg.contains("could not execute a primitive") {
        Some("oneDNN")
    } else if msg.contains("Thread creation failed") || msg.contains("pthread_create failed") {
        Some("creating a thread")
    } else {
        None
    }
}

/// Whether `msg` is an error of cuDNN or cuBLAS of the kind they raise after catching a failed
/// allocation (counted as out of memory only when the CUDA allocator's OOM counter rose).
pub fn is_cuda_library_failure(msg: &str) -> bool {
    msg.contains("unable to find an engine")
        || msg.contains("CUDNN_STATUS_")
        || msg.contains("CUBLAS_STATUS_")
        || msg.contains("cuDNN error")
}

fn clip(line: &str) -> String {
    let mut s: String = line.chars().take(400).collect();
    if line.chars().count() > 400 {
        s.push('…');
    }
    s
}

/// The last meaningful line of an output (where a traceback ends with its exception).
pub fn last_line(msg: &str) -> String {
    clip(
        msg.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("(empty message)"),
    )
}

/// The first meaningful line of an error (libtorch's carry a long C++ backtrace after it).
pub fn first_line(msg: &str) -> String {
    clip(
        msg.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("(empty message)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &str) -> Verdict {
        classify(&Evidence {
            message: m,
            ..Default::default()
        })
    }

    #[test]
    fn messages_that_name_memory() {
        for m in [
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes. Error code 12 (Cannot allocate memory)\nException raised from ...",
            "CUDA out of memory. Tried to allocate 2.00 GiB",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.81 GiB of which 3.19 MiB is free.",
            "Internal torch error: <Error computing Error::what()>",
            "memory allocation of 8589934592 bytes failed",
            "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nMemoryError",
            "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 698. MiB for an array with shape (91488256,) and data type float64",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
        ] {
            assert!(text(m).is_oom(), "{m}");
        }
        // a torchrun worker's lines carry its rank
        assert_eq!(
            text("[rank1]: Traceback (most recent call last):\n[rank1]: MemoryError").message(),
            "MemoryError"
        );
        assert!(!text(
            "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:547] Connection closed by peer"
        )
        .is_oom());
        // the line that says so is recorded, not whatever came first
        assert_eq!(
            text("warning: slow\nMemoryError: cannot grow").message(),
            "MemoryError: cannot grow"
        );
        for m in [
            "shape mismatch: [3, 4] vs [5]",
            // a user's variable named after memory is not a memory error
            "NameError: name 'MemoryErrorCount' is not defined",
            "CUDA error: device-side assert triggered",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ] {
            assert!(!text(m).is_oom(), "{m}");
        }
    }

    fn output(m: &str) -> Verdict {
        classify(&Evidence {
            message: m,
            output: true,
            ..Default::default()
        })
    }

    /// A log line that mentions memory is not evidence: only the final exception line of an output
    /// (per torchrun rank) is read, and `MemoryError` is an exception's name, never part of a word.
    #[test]
    fn only_the_decisive_lines_of_an_output_count() {
        for m in [
            "INFO MemoryErrorHandler installed\nTraceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: mat1 and mat2 shapes cannot be multiplied",
            "Tip: if you see CUDA out of memory, lower the batch\nTraceback (most recent call last):\nValueError: bad label 7",
            "Tip: if you see CUDA out of memory, lower the batch\nstep 1\nstep 2\nstep 3\nstep 4\nstep 5\nSegmentation fault",
            "MemoryErrorHandler: ready\nKeyError: 'x'",
            // an earlier exception caught and logged, then another one ended the job
            "torch.OutOfMemoryError: CUDA out of memory (caught, retrying)\nTraceback (most recent call last):\nAssertionError: loss is NaN",
        ] {
            assert!(!output(m).is_oom(), "{m}");
            // as an error message (not an output) the old, whole-text reading stays for the tch child
        }
        assert!(!text("INFO MemoryErrorHandler installed").is_oom());
        for (m, line) in [
            (
                "INFO all good\nTraceback (most recent call last):\n  File \"t.py\"\nMemoryError",
                "MemoryError",
            ),
            ("x\nbuiltins.MemoryError: cannot grow", "builtins.MemoryError: cannot grow"),
            (
                "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\nAborted",
                "terminate called after throwing an instance of 'std::bad_alloc'",
            ),
            (
                "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n[rank0]: RuntimeError: Connection closed by peer\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            ),
        ] {
            let v = output(m);
            assert!(v.is_oom(), "{m}: {v:?}");
            assert_eq!(v.message(), line);
        }
        // without an exception line, the last lines of an output are read, and said
        assert_eq!(output("a\nb\nfatal: it broke").message(), "fatal: it broke");
    }

    /// An out-of-memory text while the measured peak was below the cgroup's limit, by more than the
    /// agreement band, is an error that says so (was: only below half of it); near the limit it
    /// stays an out-of-memory.
    #[test]
    fn an_oom_claimed_far_below_the_limit_is_an_error() {
        let gib = 1u64 << 30;
        let at = |peak: u64| {
            classify(&Evidence {
                message: "Traceback (most recent call last):\nMemoryError",
                output: true,
                limit_peak: Some((peak, gib)),
                ..Default::default()
            })
        };
        let v = at(gib / 4);
        assert!(!v.is_oom(), "{v:?}");
        assert!(
            v.message().contains(
                "out-of-memory message at 25% of the limit (measured peak 256 MiB of 1024 MiB)"
            ),
            "{v:?}"
        );
        let v = at(gib * 2 / 3);
        assert!(
            !v.is_oom() && v.message().contains("at 67% of the limit"),
            "{v:?}"
        );
        assert!(!at(gib * 9 / 10).is_oom());
        assert!(at(gib * 96 / 100).is_oom());
    }

    /// Under RLIMIT_DATA too: an out-of-memory text (libtorch's, Python's, a user's pattern, an
    /// HTTP 507 that says "out of memory") counts only when the data segment came near the limit, or
    /// the allocation the message names would have reached it.
    #[test]
    fn an_oom_text_counts_only_where_the_measured_peak_agrees_with_the_limit() {
        let gib = 1u64 << 30;
        let mib = 1u64 << 20;
        let at = |m: &str, peak: u64| {
            classify(&Evidence {
                message: m,
                output: true,
                data_peak: Some(peak),
                data_limit: Some(gib),
                ..Default::default()
            })
        };
        let upload = "Traceback (most recent call last):\nRuntimeError: checkpoint upload failed: remote said 'out of memory' (HTTP 507)";
        for m in [
            upload,
            "MemoryError",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ] {
            let v = at(m, 40 * mib);
            assert!(!v.is_oom(), "{m}: {v:?}");
            assert!(
                v.message().contains("at 4% of the limit")
                    && v.message().contains("not this budget running out"),
                "{v:?}"
            );
            assert!(at(m, gib - 20 * mib).is_oom(), "{m}");
        }
        // a hint that names the problem is no out-of-memory text at all, at any peak
        let hint = "step 1\nhint: if you see 'out of memory', lower --batch-size";
        for peak in [40 * mib, gib - 20 * mib] {
            let v = at(hint, peak);
            assert_eq!(
                v,
                Verdict::Error(hint.lines().last().unwrap().into()),
                "{v:?}"
            );
        }
        // libtorch's CPU allocator names its request: far below the limit, a request that would have
        // crossed it is this limit running out; one that would not is not
        let cpu = |n: u64| {
            format!(
                "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate {n} bytes. Error code 12 (Cannot allocate memory)"
            )
        };
        assert!(at(&cpu(700 * mib), 400 * mib).is_oom());
        let v = at(&cpu(100 * mib), 400 * mib);
        assert!(
            !v.is_oom() && v.message().contains("the allocation it names, 100 MiB"),
            "{v:?}"
        );
        assert!(at("memory allocation of 1073741824 bytes failed", 10 * mib).is_oom());
        // a --oom-pattern is held to the same evidence
        let re = [regex_lite::Regex::new("^OOM!").unwrap()];
        let pattern = |peak: u64| {
            classify(&Evidence {
                message: "OOM! at batch 9",
                output: true,
                data_peak: Some(peak),
                data_limit: Some(gib),
                extra_markers: &re,
                ..Default::default()
            })
        };
        assert!(!pattern(10 * mib).is_oom());
        assert!(pattern(gib - mib).is_oom());
        // the CUDA allocator's own count agrees whatever the CPU peak; without a limit or a
        // measured peak nothing is weighed
        assert!(classify(&Evidence {
            message: "torch.OutOfMemoryError: CUDA out of memory.",
            allocator_ooms: 1,
            data_peak: Some(mib),
            data_limit: Some(gib),
            ..Default::default()
        })
        .is_oom());
        assert!(text("MemoryError").is_oom());
        assert_eq!(requested_bytes("Tried to allocate 2.00 GiB"), None);
        assert_eq!(requested_bytes(&cpu(123)), Some(123));
    }

    /// The machine's oom_kill counter with a SIGKILL proves nothing by itself (another process may
    /// have been killed): only with the trial's peak at its limit.
    #[test]
    fn the_machines_oom_counter_needs_the_peak_at_the_limit() {
        let gib = 1u64 << 30;
        let at = |peak: u64| {
            classify(&Evidence {
                message: "",
                output: true,
                machine_oom_kill: true,
                data_peak: Some(peak),
                data_limit: Some(gib),
                ..Default::default()
            })
        };
        let far = at(gib / 10);
        assert!(!far.is_oom());
        assert!(
            far.message().contains("not shown to be this trial"),
            "{far:?}"
        );
        assert!(at(gib * 98 / 100).is_oom());
    }

    /// A sign of out-of-memory that the measured peak contradicts is its own verdict, so that a
    /// caller records the classifier's weighing without reading its words back; a job's plain
    /// failure, even one that prints those words itself, is an ordinary error.
    #[test]
    fn a_sign_of_oom_the_peak_contradicts_is_a_rejected_oom_not_a_plain_error() {
        let gib = 1u64 << 30;
        let far = |message: &str, machine_oom_kill: bool| {
            classify(&Evidence {
                message,
                output: true,
                machine_oom_kill,
                data_peak: Some(gib / 10),
                data_limit: Some(gib),
                ..Default::default()
            })
        };
        assert!(matches!(far("MemoryError", false), Verdict::OomRejected(_)));
        assert!(matches!(far("", true), Verdict::OomRejected(_)));
        let echoed = "ValueError: this run is not shown to be this trial's";
        assert_eq!(far(echoed, false), Verdict::Error(echoed.into()));
    }

    /// Exit 0 is no fit with an OOM kill in the trial's group or an allocator OOM (out of memory),
    /// nor with a killed or left-behind descendant (errors).
    #[test]
    fn a_clean_exit_with_evidence_is_no_fit() {
        assert_eq!(classify_clean_exit(&CleanExit::default()), None);
        let v = classify_clean_exit(&CleanExit {
            group_oom_kills: 1,
            ..Default::default()
        })
        .unwrap();
        assert!(
            v.is_oom() && v.message().contains("OOM killer killed 1"),
            "{v:?}"
        );
        let v = classify_clean_exit(&CleanExit {
            allocator_ooms: 3,
            ..Default::default()
        })
        .unwrap();
        assert!(v.is_oom() && v.message().contains("3 time(s)"), "{v:?}");
        let killed = ["pid 7 (python): signal 9".to_string()];
        let v = classify_clean_exit(&CleanExit {
            killed_descendants: &killed,
            ..Default::default()
        })
        .unwrap();
        assert!(
            !v.is_oom() && v.message().contains("pid 7 (python): signal 9"),
            "{v:?}"
        );
        let left = ["pid 8 (sleep)".to_string()];
        let v = classify_clean_exit(&CleanExit {
            left_behind: &left,
            ..Default::default()
        })
        .unwrap();
        assert!(
            !v.is_oom() && v.message().contains("left processes behind"),
            "{v:?}"
        );
    }

    /// Exit 0 after an allocator's out-of-memory message anywhere in the output, not only in the
    /// last exception line (a job that caught it, logged it and retried at a smaller size), is an
    /// error that says so; a hint that only names the problem is not.
    #[test]
    fn a_job_that_caught_an_oom_and_carried_on_is_no_fit() {
        for out in [
            "caught torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; batch 32\nok\n",
            "warning: CUDA out of memory. Tried to allocate 2.00 GiB; halving the batch\nepoch 1\n",
            "retry: DefaultCPUAllocator: can't allocate memory: you tried 8 GiB\nok\n",
        ] {
            let v = classify_clean_exit(&CleanExit {
                output: out,
                ..Default::default()
            })
            .unwrap_or_else(|| panic!("a fit: {out:?}"));
            assert!(
                !v.is_oom()
                    && v.message()
                        .contains("caught an out-of-memory and carried on"),
                "{v:?}"
            );
        }
        for tip in [
            "Tip: if you see CUDA out of memory, lower the batch\nINFO MemoryErrorHandler\n",
            // the exception class named in prose is a mention, not the allocator's report
            "tip: if you see torch.OutOfMemoryError, lower --batch\nstep 1\nstep 2\n",
        ] {
            assert_eq!(
                classify_clean_exit(&CleanExit {
                    output: tip,
                    ..Default::default()
                }),
                None,
                "{tip:?}"
            );
        }
    }

    /// A log line that names an out-of-memory (a tip printed at start) is no evidence whatever the
    /// exit: exit 1 for another reason is an error that quotes the failure, not the tip, even with
    /// the measured peak at the limit (was: an out-of-memory there, and far below it an error that
    /// quoted the tip telling the user to lower the batch); a runtime's own report at the end of an
    /// output without an exception line still counts.
    #[test]
    fn a_log_line_naming_an_oom_is_no_evidence_whatever_the_exit() {
        let gib = 1u64 << 30;
        let tip = "tip: if you see torch.OutOfMemoryError, lower --batch\nstep 1 loss 2.31\nconfig: no learning rate given";
        for peak in [None, Some(gib / 20), Some(gib - (1 << 20))] {
            let v = classify(&Evidence {
                message: tip,
                output: true,
                data_peak: peak,
                data_limit: peak.map(|_| gib),
                ..Default::default()
            });
            assert_eq!(
                v,
                Verdict::Error("config: no learning rate given".into()),
                "{peak:?}"
            );
        }
        let hint = "step 1\nhint: if training stops with 'out of memory', lower --batch-size";
        assert!(!output(hint).is_oom());
        for report in [
            "step 3\nterminate called after throwing an instance of 'c10::OutOfMemoryError'\n  what():  CUDA out of memory. Tried to allocate 2.00 GiB",
            "loading\nmemory allocation of 8589934592 bytes failed\nAborted (core dumped)",
            "step 1\nCUDA out of memory. Tried to allocate 20.00 MiB",
        ] {
            assert!(output(report).is_oom(), "{report}");
        }
    }

    /// Exit 0 with a report of every step done is no failure whatever the log says (an allocator's
    /// message, an exception line); the counts the report and the kernel give still are.
    #[test]
    fn a_report_of_every_step_done_outweighs_the_log() {
        let log = "warning: CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last):\nMemoryError\n";
        let done = |allocator_ooms| {
            classify_clean_exit(&CleanExit {
                output: log,
                steps_done: true,
                allocator_ooms,
                ..Default::default()
            })
        };
        assert_eq!(done(0), None);
        assert!(done(1).is_some_and(|v| v.is_oom()));
        assert!(classify_clean_exit(&CleanExit {
            output: log,
            ..Default::default()
        })
        .is_some());
    }

    /// Exit 0 whose decisive lines say memory ran out (a caught `torch.OutOfMemoryError`, a
    /// wrapper that hides the exit code) is no fit: an error, since the text alone is no proof either.
    #[test]
    fn a_clean_exit_whose_output_ends_in_an_oom_is_no_fit() {
        for out in [
            "step 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            "Traceback (most recent call last):\nMemoryError\ndone\n",
            "[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n[rank0]: step 5\n",
            "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes\n",
        ] {
            let v = classify_clean_exit(&CleanExit {
                output: out,
                ..Default::default()
            })
            .unwrap_or_else(|| panic!("a fit: {out:?}"));
            assert!(
                !v.is_oom() && v.message().contains("exited 0, but its output reports an out-of-memory"),
                "{v:?}"
            );
        }
        // log lines that mention memory before a clean end are not evidence, even among the last
        // lines (sneaky.py's log-lines)
        for quiet in [
            "INFO MemoryErrorHandler installed\nTip: if you see CUDA out of memory, lower the batch\n",
            "INFO MemoryErrorHandler installed\nTip: if you see CUDA out of memory, lower the batch\nValueError: x\nstep 1\ndone\n",
        ] {
            assert_eq!(
                classify_clean_exit(&CleanExit {
                    output: quiet,
                    ..Default::default()
                }),
                None,
                "{quiet:?}"
            );
        }
        // the user's own --oom-pattern counts too
        let re = [regex_lite::Regex::new("^OOM at batch").unwrap()];
        assert!(classify_clean_exit(&CleanExit {
            output: "OOM at batch 64, skipped\n",
            extra_markers: &re,
            ..Default::default()
        })
        .is_some());
    }

    #[test]
    fn cuda_library_errors_need_the_allocators_oom_count() {
        let engine = "GET was unable to find an engine to execute this computation";
        let unsupported = "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.";
        for m in [engine, unsupported] {
            assert!(!text(m).is_oom(), "without an allocator OOM: {m}");
            let v = classify(&Evidence {
                message: m,
                allocator_ooms: 2,
                ..Default::default()
            });
            assert!(v.is_oom(), "{m}");
            assert!(v.message().contains("ran out of memory 2 time(s)"), "{v:?}");
        }
        // other errors stay errors after a caught OOM
        let v = classify(&Evidence {
            message: "CUDA error: device-side assert triggered",
            allocator_ooms: 1,
            ..Default::default()
        });
        assert!(!v.is_oom());
    }

    #[test]
    fn failures_at_the_data_limit() {
        let gib = 1u64 << 30;
        let at = |m: &str, peak: u64, limit: Option<u64>| {
            classify(&Evidence {
                message: m,
                data_peak: Some(peak),
                data_limit: limit,
                ..Default::default()
            })
        };
        let primitive = "could not execute a primitive";
        let v = at(primitive, gib * 97 / 100, Some(gib));
        assert!(v.is_oom());
        assert!(v.message().contains("at 97% of the memory limit"), "{v:?}");
        assert!(!at(primitive, gib * 9 / 10, Some(gib)).is_oom());
        assert!(!at(primitive, gib, None).is_oom());
        // creating a primitive fails for shapes oneDNN does not support: never an OOM
        assert!(!at("could not create a primitive descriptor", gib, Some(gib)).is_oom());
        // a thread that cannot be created is memory only at the data limit (else pids.max, NPROC)
        let thread = "libgomp: Thread creation failed: Resource temporarily unavailable";
        assert!(at(thread, gib, Some(gib)).is_oom());
        assert!(!at(thread, gib / 2, Some(gib)).is_oom());
        assert!(!text(thread).is_oom());
    }

    #[test]
    fn kernel_kills_and_extra_patterns() {
        let v = classify(&Evidence {
            kernel_oom_kill: true,
            ..Default::default()
        });
        assert!(v.is_oom() && v.message().contains("OOM killer"));
        let extra = [regex_lite::Regex::new(r"HBM exhausted").unwrap()];
        let v = classify(&Evidence {
            message: "fatal: HBM exhausted on core 3",
            extra_markers: &extra,
            ..Default::default()
        });
        assert!(v.is_oom());
        assert_eq!(first_line("\n  first\nsecond"), "first");
    }
}
