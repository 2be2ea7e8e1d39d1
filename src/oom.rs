//! Recognising out-of-memory failures in libtorch's (and the C++ runtime's) messages.
//!
//! A trial's outcome hangs on this: an OOM is proof that a size does not fit, anything else is not.
//! The texts are the ones libtorch prints (the same ones Lightning and Accelerate match on).

/// Message fragments that mean "the device ran out of memory".
const OOM_MARKERS: &[&str] = &[
    "DefaultCPUAllocator: can't allocate memory",
    "can't allocate memory",
    "CUDA out of memory",
    "out of memory",
    "std::bad_alloc",
    "Cannot allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",
    "CUDNN_STATUS_ALLOC_FAILED",
    // libgomp cannot create its worker threads: under RLIMIT_DATA thread stacks count as data, so at the
    // limit this is the memory limit speaking (seen in trials and in batchfit-train near the limit).
    "Thread creation failed: Resource temporarily unavailable",
    // c10::Error::what() could not build its message (with the backtrace): an allocation failed while
    // formatting the error, which at a memory limit means the limit was reached (seen once, in
    // batchfit-train one size above a probe's answer under its limit).
    "<Error computing Error::what()>",
];

/// Whether `msg` is an error of cuDNN or cuBLAS of the kind they raise after catching a failed
/// allocation (cuDNN tries other algorithms with smaller workspaces and, when none is left, says it
/// found no engine). Counted as out of memory only when the CUDA allocator's OOM counter rose; see
/// [`crate::trial`].
pub fn is_cuda_library_failure(msg: &str) -> bool {
    msg.contains("unable to find an engine")
        || msg.contains("CUDNN_STATUS_")
        || msg.contains("CUBLAS_STATUS_")
        || msg.contains("cuDNN error")
}

/// Whether `msg` is oneDNN's (libtorch's CPU convolution library) failure to create or run a
/// primitive. oneDNN reports a failed allocation of its scratchpad or workspace this way, without
/// saying that memory ran out, so the message alone proves nothing; see
/// [`crate::trial`] for when it counts as out of memory.
pub fn is_onednn_failure(msg: &str) -> bool {
    // ("could not create a primitive" is left out: it usually means a shape or dtype oneDNN does not
    // support, which no amount of memory fixes)
    msg.contains("could not execute a primitive")
}

/// Whether `msg` reports an out-of-memory condition.
pub fn is_oom(msg: &str) -> bool {
    OOM_MARKERS.iter().any(|m| msg.contains(m))
}

/// The first meaningful line of a libtorch error (they carry a long C++ backtrace after it).
pub fn first_line(msg: &str) -> String {
    let line = msg
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(empty message)");
    let mut s: String = line.chars().take(400).collect();
    if line.chars().count() > 400 {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        assert!(is_oom("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes. Error code 12 (Cannot allocate memory)\nException raised from ..."));
        assert!(is_oom("CUDA out of memory. Tried to allocate 2.00 GiB"));
        assert!(is_oom(
            "terminate called after throwing an instance of 'std::bad_alloc'"
        ));
        assert!(!is_oom("shape mismatch: [3, 4] vs [5]"));
        // what libtorch reports when cuBLAS or cuDNN cannot get their workspace on a full card
        assert!(is_oom(
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
        ));
        assert!(is_oom("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."));
        assert!(is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.81 GiB of which 3.19 MiB is free."));
        // the error's own message could not be built at the limit
        assert!(is_oom(
            "Internal torch error: <Error computing Error::what()>"
        ));
        assert!(is_cuda_library_failure(
            "GET was unable to find an engine to execute this computation"
        ));
        assert!(!is_cuda_library_failure(
            "CUDA error: device-side assert triggered"
        ));
        assert!(is_onednn_failure("could not execute a primitive"));
        assert!(!is_onednn_failure(
            "could not create a primitive descriptor"
        ));
        assert_eq!(first_line("\n  first\nsecond"), "first");
    }
}
