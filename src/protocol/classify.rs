//! The one out-of-memory classifier.
//!
//! A trial's outcome hangs on it: an out-of-memory is proof that a size does not fit, anything else is
//! not (an error or a timeout only bounds the search). So the classifier is fed the *evidence* of a
//! failure, not just a message, and a message alone counts only when it names memory outright:
//!
//! | evidence | verdict |
//! |---|---|
//! | the kernel's OOM killer killed a process of the trial | oom |
//! | a message that says memory ran out (libtorch's CPU and CUDA allocators, `std::bad_alloc`, Rust's allocation failure, Python's `MemoryError`, XLA's `RESOURCE_EXHAUSTED`, cuBLAS's `ALLOC_FAILED`) | oom |
//! | a cuDNN or cuBLAS error **after the CUDA allocator counted an OOM** in the trial (cuDNN catches the allocator's OOM and tries smaller workspaces; when none is left it says it found no engine) | oom |
//! | oneDNN's "could not execute a primitive" or a failed thread creation **with the data segment within 5% of `RLIMIT_DATA`** (both allocate and report the failure without saying it was memory) | oom |
//! | anything else, including the same cuDNN / oneDNN / thread texts without that evidence | error |
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
/// prints "memory allocation of N bytes failed" and aborts; Python ends a traceback with
/// "MemoryError" or "MemoryError: ...").
const OOM_LINE_STARTS: &[&str] = &["memory allocation of ", "MemoryError"];

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
}

/// What the evidence proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Out of memory, with the message to record.
    Oom(String),
    /// Anything else, with the message to record.
    Error(String),
}

impl Verdict {
    pub fn is_oom(&self) -> bool {
        matches!(self, Verdict::Oom(_))
    }
    pub fn message(&self) -> &str {
        match self {
            Verdict::Oom(m) | Verdict::Error(m) => m,
        }
    }
}

/// Decides whether the evidence proves an out-of-memory (see the module doc).
pub fn classify(e: &Evidence) -> Verdict {
    if e.kernel_oom_kill {
        return Verdict::Oom("killed by the kernel's OOM killer".into());
    }
    if let Some(line) = oom_line(e.message, e.extra_markers) {
        return Verdict::Oom(line);
    }
    let first = first_line(e.message);
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

/// The line of `msg` that says memory ran out, if one does.
fn oom_line(msg: &str, extra: &[regex_lite::Regex]) -> Option<String> {
    matching_line(msg, |l| {
        OOM_MARKERS.iter().any(|m| l.contains(m))
            || OOM_LINE_STARTS.iter().any(|s| l.starts_with(s))
            || extra.iter().any(|r| r.is_match(l))
    })
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
