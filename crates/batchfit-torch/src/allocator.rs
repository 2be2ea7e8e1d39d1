//! libtorch's CUDA caching allocator and autocast, through batchfit's own C++ shim
//! (`src/shim.cpp`, compiled by `build.rs` with the `cc` crate against libtorch's headers).
//!
//! Why a shim: `tch 0.24` (and `torch-sys`) bind no CUDA memory statistics at all — no
//! `memory_allocated`/`max_memory_reserved`, no `empty_cache`, no peak reset, no free/total query —
//! and `tch::autocast(enabled, f)` takes no dtype (so no bf16) and is a no-op without CUDA. A GPU
//! probe needs the allocator's own view (allocated vs reserved, peaks, allocation retries and OOM
//! counts) next to NVML's, and mixed-precision trials need a dtype.
//!
//! The shim uses libtorch's device-agnostic `at::accelerator` API (`<ATen/DeviceAccelerator.h>`), so it
//! needs no CUDA headers and builds and links on every machine. Where no CUDA device is present every
//! allocator call returns [`ShimError::NoCudaDevice`] — never zeros that could pass for measurements.
//!
//! Autocast state (enabled, dtype) is **per thread** in libtorch, as in PyTorch: set it on the thread
//! that runs the forward pass. Setting it needs no GPU; it only changes what CUDA ops do.

use std::ffi::{c_char, CStr};
use thiserror::Error;

/// Errors from the shim. `NoCudaDevice` and `NoSuchDevice` are found before libtorch is asked anything.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShimError {
    #[error("no CUDA device: {0}")]
    NoCudaDevice(String),
    #[error("CUDA device {index} does not exist: libtorch sees {count} CUDA device(s)")]
    NoSuchDevice { index: usize, count: usize },
    /// libtorch raised (the first line of its message, without the C++ backtrace).
    #[error("libtorch: {0}")]
    Torch(String),
}

/// The CUDA caching allocator's counters for one device (`torch.cuda.memory_stats`' aggregate pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in live tensors (`allocated_bytes.all.current`).
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since start or the last [`reset_peak`].
    pub peak_allocated_bytes: u64,
    /// Bytes the allocator holds from the driver, used or cached (`reserved_bytes.all.current`).
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` since start or the last [`reset_peak`].
    pub peak_reserved_bytes: u64,
    /// cudaMalloc failures that were retried after freeing the cache (`num_alloc_retries`). The
    /// allocator also counts one before each OOM it raises: retries that succeeded are this less
    /// `ooms`.
    pub alloc_retries: u64,
    /// Allocations that failed even after freeing the cache (`num_ooms`).
    pub ooms: u64,
}

/// Lower-precision dtype for CUDA autocast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AutocastDtype {
    Bf16,
    Fp16,
}

impl AutocastDtype {
    fn code(self) -> i32 {
        match self {
            AutocastDtype::Bf16 => 1,
            AutocastDtype::Fp16 => 2,
        }
    }
}

/// CUDA autocast on the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutocastState {
    pub enabled: bool,
    /// The dtype autocast casts to when enabled (libtorch keeps it while disabled; default fp16).
    pub dtype: AutocastDtype,
}

/// What libtorch's accelerator is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceleratorInfo {
    /// Lower-case device type name (`"cuda"`), `None` when libtorch has no accelerator (CPU-only build
    /// or `libtorch_cuda` not linked).
    pub name: Option<String>,
    /// Whether the accelerator is CUDA.
    pub is_cuda: bool,
    /// Its devices (0 without a GPU or a driver).
    pub device_count: usize,
}

#[repr(C)]
#[derive(Default)]
struct RawStats {
    allocated_bytes: i64,
    peak_allocated_bytes: i64,
    reserved_bytes: i64,
    peak_reserved_bytes: i64,
    alloc_retries: i64,
    ooms: i64,
}

extern "C" {
    fn batchfit_shim_free(s: *mut c_char);
    fn batchfit_accel_available(
        device_type: *mut i32,
        name: *mut c_char,
        name_cap: usize,
        device_count: *mut i64,
        err: *mut *mut c_char,
    ) -> i32;
    fn batchfit_accel_stats(device_index: i64, out: *mut RawStats, err: *mut *mut c_char) -> i32;
    fn batchfit_accel_empty_cache(err: *mut *mut c_char) -> i32;
    fn batchfit_accel_reset_peak(device_index: i64, err: *mut *mut c_char) -> i32;
    fn batchfit_accel_mem_info(
        device_index: i64,
        free_bytes: *mut u64,
        total_bytes: *mut u64,
        err: *mut *mut c_char,
    ) -> i32;
    fn batchfit_autocast_set(enabled: i32, dtype: i32, err: *mut *mut c_char) -> i32;
    fn batchfit_autocast_get(
        enabled: *mut i32,
        dtype: *mut i32,
        scalar_type: *mut i32,
        err: *mut *mut c_char,
    ) -> i32;
    fn batchfit_autocast_clear_cache(err: *mut *mut c_char) -> i32;
    fn batchfit_autocast_nesting(increment: i32, depth: *mut i32, err: *mut *mut c_char) -> i32;
}

/// Calls a shim function with an error slot and turns its status into a `Result`. `device` is the
/// index the call was about, for [`ShimError::NoSuchDevice`].
fn call(device: usize, f: impl FnOnce(*mut *mut c_char) -> i32) -> Result<(), ShimError> {
    let mut err: *mut c_char = std::ptr::null_mut();
    let rc = f(&mut err);
    let msg = if err.is_null() {
        String::new()
    } else {
        // SAFETY: the shim hands out a malloc'd NUL-terminated string, freed here exactly once.
        let s = unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned();
        unsafe { batchfit_shim_free(err) };
        s
    };
    let first_line = || msg.lines().next().unwrap_or("").trim().to_string();
    match rc {
        0 => Ok(()),
        1 => Err(ShimError::NoCudaDevice(first_line())),
        2 => Err(ShimError::NoSuchDevice {
            index: device,
            count: cuda_device_count(),
        }),
        _ if msg.is_empty() => Err(ShimError::Torch(format!(
            "shim call failed with status {rc} and no message (out of memory for the message?)"
        ))),
        _ => Err(ShimError::Torch(first_line())),
    }
}

/// Device indices are `int8_t` in libtorch; a larger index cannot exist.
fn index(device: usize) -> Result<i64, ShimError> {
    if device > i8::MAX as usize {
        return Err(ShimError::NoSuchDevice {
            index: device,
            count: cuda_device_count(),
        });
    }
    Ok(device as i64)
}

/// libtorch's accelerator and its device count.
pub fn accelerator() -> Result<AcceleratorInfo, ShimError> {
    let mut device_type = -1i32;
    let mut name = [0 as c_char; 64];
    let mut count = 0i64;
    // SAFETY: all out-pointers are valid for the call; `name` has the capacity passed.
    call(0, |err| unsafe {
        batchfit_accel_available(
            &mut device_type,
            name.as_mut_ptr(),
            name.len(),
            &mut count,
            err,
        )
    })?;
    // SAFETY: the shim always NUL-terminates within `name_cap`.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(AcceleratorInfo {
        is_cuda: device_type == 1, // c10::DeviceType::CUDA
        name: (device_type >= 0).then_some(name),
        device_count: count.max(0) as usize,
    })
}

/// CUDA devices libtorch can use (0 without a GPU, a driver, or a CUDA accelerator; never fails).
pub fn cuda_device_count() -> usize {
    match accelerator() {
        Ok(a) if a.is_cuda => a.device_count,
        _ => 0,
    }
}

/// The caching allocator's counters for CUDA device `device`. Initialises CUDA in libtorch first (as
/// a CUDA tensor would), so a process that has allocated nothing reads true zeros, not an error.
pub fn stats(device: usize) -> Result<AllocatorStats, ShimError> {
    let i = index(device)?;
    let mut raw = RawStats::default();
    // SAFETY: `raw` is a valid #[repr(C)] out-struct matching batchfit_accel_stats_t.
    call(device, |err| unsafe {
        batchfit_accel_stats(i, &mut raw, err)
    })?;
    let u = |v: i64| v.max(0) as u64;
    Ok(AllocatorStats {
        allocated_bytes: u(raw.allocated_bytes),
        peak_allocated_bytes: u(raw.peak_allocated_bytes),
        reserved_bytes: u(raw.reserved_bytes),
        peak_reserved_bytes: u(raw.peak_reserved_bytes),
        alloc_retries: u(raw.alloc_retries),
        ooms: u(raw.ooms),
    })
}

/// Returns the allocator's cached, unused blocks to the driver, on every CUDA device
/// (`torch.cuda.empty_cache()`). Err without a CUDA device: nothing was released.
pub fn empty_cache() -> Result<(), ShimError> {
    // SAFETY: only the error slot is passed.
    call(0, |err| unsafe { batchfit_accel_empty_cache(err) })
}

/// Resets the peak counters of `device` to their current values (`torch.cuda.reset_peak_memory_stats`).
pub fn reset_peak(device: usize) -> Result<(), ShimError> {
    let i = index(device)?;
    // SAFETY: only the error slot is passed.
    call(device, |err| unsafe { batchfit_accel_reset_peak(i, err) })
}

/// `(free, total)` bytes of `device` as the driver reports them (`torch.cuda.mem_get_info`). Like
/// PyTorch's, this creates a CUDA context on `device` (hundreds of MiB of device memory) if the process
/// has none: a process that must not hold GPU memory (the probe's parent) should ask NVML instead.
pub fn mem_info(device: usize) -> Result<(u64, u64), ShimError> {
    let i = index(device)?;
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: both out-pointers are valid for the call.
    call(device, |err| unsafe {
        batchfit_accel_mem_info(i, &mut free, &mut total, err)
    })?;
    Ok((free, total))
}

/// Enables CUDA autocast with `dtype` on the calling thread, or disables it (`None`; the dtype is left
/// as it was, and autocast's weight-cast cache is cleared as PyTorch does when autocast exits). For a
/// region that restores the previous state, use [`autocast`].
pub fn set_autocast(dtype: Option<AutocastDtype>) -> Result<(), ShimError> {
    match dtype {
        // SAFETY: only plain values and the error slot are passed.
        Some(d) => call(0, |err| unsafe { batchfit_autocast_set(1, d.code(), err) }),
        None => {
            call(0, |err| unsafe { batchfit_autocast_set(0, 0, err) })?;
            clear_autocast_cache()
        }
    }
}

/// CUDA autocast on the calling thread. Err only if libtorch's dtype is neither bf16 nor fp16 (set by
/// other code).
pub fn autocast_state() -> Result<AutocastState, ShimError> {
    let (mut enabled, mut dtype, mut scalar_type) = (0i32, 0i32, 0i32);
    // SAFETY: all out-pointers are valid for the call.
    call(0, |err| unsafe {
        batchfit_autocast_get(&mut enabled, &mut dtype, &mut scalar_type, err)
    })?;
    let dtype = match dtype {
        1 => AutocastDtype::Bf16,
        2 => AutocastDtype::Fp16,
        _ => {
            return Err(ShimError::Torch(format!(
                "CUDA autocast dtype is c10::ScalarType {scalar_type}, neither bf16 nor fp16"
            )))
        }
    };
    Ok(AutocastState {
        enabled: enabled != 0,
        dtype,
    })
}

/// Drops autocast's cached lower-precision copies of weights (`torch.clear_autocast_cache()`).
pub fn clear_autocast_cache() -> Result<(), ShimError> {
    // SAFETY: only the error slot is passed.
    call(0, |err| unsafe { batchfit_autocast_clear_cache(err) })
}

/// Runs `f` with CUDA autocast set to `dtype` (`None`: disabled) on this thread, as `torch.autocast`
/// does: nesting is counted, the cast cache is cleared when the outermost region exits, and the
/// previous state is restored afterwards, also when `f` panics.
pub fn autocast<T>(dtype: Option<AutocastDtype>, f: impl FnOnce() -> T) -> Result<T, ShimError> {
    struct Restore(AutocastState);
    impl Drop for Restore {
        fn drop(&mut self) {
            let mut depth = 0i32;
            // SAFETY: out-pointer valid for the call. Errors cannot be returned from drop; these calls
            // only touch thread-local state and do not fail in practice.
            let _ = call(0, |err| unsafe {
                batchfit_autocast_nesting(0, &mut depth, err)
            });
            if depth == 0 {
                let _ = clear_autocast_cache();
            }
            let prev = self.0;
            let _ = call(0, |err| unsafe {
                batchfit_autocast_set(i32::from(prev.enabled), prev.dtype.code(), err)
            });
        }
    }
    let prev = autocast_state()?;
    match dtype {
        // SAFETY: plain values and the error slot.
        Some(d) => call(0, |err| unsafe { batchfit_autocast_set(1, d.code(), err) })?,
        None => call(0, |err| unsafe { batchfit_autocast_set(0, 0, err) })?,
    }
    let mut depth = 0i32;
    // SAFETY: out-pointer valid for the call.
    if let Err(e) = call(0, |err| unsafe {
        batchfit_autocast_nesting(1, &mut depth, err)
    }) {
        let _ = call(0, |err| unsafe {
            batchfit_autocast_set(i32::from(prev.enabled), prev.dtype.code(), err)
        });
        return Err(e);
    }
    let _restore = Restore(prev);
    Ok(f())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no GPU; on a GPU machine these expectations do not apply. (libtorch's CUDA
    /// half is loaded first, as the runner does at start-up.)
    fn no_gpu_here() -> bool {
        crate::cuda::load()
            .as_ref()
            .expect("the test's torch has libtorch_cuda.so");
        !tch::Cuda::is_available()
    }

    #[test]
    fn accelerator_is_cuda_build_with_zero_devices_here() {
        if !no_gpu_here() {
            batchfit::note!(
                "skipped: this machine has a GPU; the test checks the no-GPU behaviour"
            );
            return;
        }
        let a = accelerator().unwrap();
        // libtorch_cuda is loaded (crate::cuda), so CUDA is registered as the accelerator even here.
        assert_eq!(a.name.as_deref(), Some("cuda"), "{a:?}");
        assert!(a.is_cuda);
        assert_eq!(a.device_count, 0);
        assert_eq!(cuda_device_count(), 0);
    }

    #[test]
    fn allocator_calls_are_errors_not_zeros_without_a_gpu() {
        if !no_gpu_here() {
            batchfit::note!(
                "skipped: this machine has a GPU; the test checks the no-GPU behaviour"
            );
            return;
        }
        for r in [
            stats(0).map(|_| ()),
            empty_cache(),
            reset_peak(0),
            mem_info(0).map(|_| ()),
        ] {
            let e = r.unwrap_err();
            assert!(matches!(e, ShimError::NoCudaDevice(_)), "{e:?}");
            let msg = e.to_string();
            batchfit::note!("{msg}");
            assert!(
                msg.starts_with("no CUDA device: ") && msg.contains("0 CUDA devices"),
                "{msg}"
            );
        }
        // An index libtorch cannot even represent is reported as a missing device, not passed on.
        assert_eq!(
            stats(1000).unwrap_err(),
            ShimError::NoSuchDevice {
                index: 1000,
                count: 0
            }
        );
    }

    // Autocast state is thread-local in libtorch and each test runs on its own thread, so these
    // tests do not disturb each other.
    #[test]
    fn autocast_dtype_round_trips_through_libtorch() {
        let start = autocast_state().unwrap();
        assert_eq!(
            start,
            AutocastState {
                enabled: false,
                dtype: AutocastDtype::Fp16
            },
            "libtorch's default for CUDA"
        );
        set_autocast(Some(AutocastDtype::Bf16)).unwrap();
        assert_eq!(
            autocast_state().unwrap(),
            AutocastState {
                enabled: true,
                dtype: AutocastDtype::Bf16
            }
        );
        set_autocast(Some(AutocastDtype::Fp16)).unwrap();
        assert_eq!(
            autocast_state().unwrap(),
            AutocastState {
                enabled: true,
                dtype: AutocastDtype::Fp16
            }
        );
        set_autocast(None).unwrap();
        assert_eq!(autocast_state().unwrap(), start);
        clear_autocast_cache().unwrap();
    }

    #[test]
    fn autocast_region_restores_previous_state_even_on_panic() {
        let start = autocast_state().unwrap();
        let inside = autocast(Some(AutocastDtype::Bf16), || {
            let outer = autocast_state().unwrap();
            let inner = autocast(None, || autocast_state().unwrap()).unwrap();
            (outer, inner, autocast_state().unwrap())
        })
        .unwrap();
        assert_eq!(
            inside.0,
            AutocastState {
                enabled: true,
                dtype: AutocastDtype::Bf16
            }
        );
        assert!(!inside.1.enabled);
        assert_eq!(inside.2, inside.0, "inner region restored the outer state");
        assert_eq!(autocast_state().unwrap(), start);

        let r = std::panic::catch_unwind(|| {
            autocast(Some(AutocastDtype::Bf16), || panic!("inside autocast")).unwrap()
        });
        assert!(r.is_err());
        assert_eq!(autocast_state().unwrap(), start);
    }

    /// Proves the stats on a real GPU: allocating a CUDA tensor raises allocated/reserved bytes.
    #[test]
    #[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it when the lib test binary is carried as BIN/batchfit-lib-tests (or cargo test --release -p batchfit-torch --lib -- --ignored on a GPU machine, with the torch lib/ on LD_LIBRARY_PATH)"]
    fn stats_follow_a_cuda_allocation() {
        let _ = crate::cuda::load();
        assert!(
            tch::Cuda::is_available(),
            "this test needs a CUDA GPU; it proves nothing without one"
        );
        assert!(cuda_device_count() >= 1);
        let before = stats(0).unwrap();
        let t = tch::Tensor::zeros([64 << 20], (tch::Kind::Float, tch::Device::Cuda(0))); // 256 MiB
        let during = stats(0).unwrap();
        assert!(
            during.allocated_bytes >= before.allocated_bytes + (256 << 20),
            "{before:?} → {during:?}"
        );
        assert!(during.reserved_bytes >= during.allocated_bytes);
        assert!(during.peak_allocated_bytes >= during.allocated_bytes);
        drop(t);
        let after = stats(0).unwrap();
        assert!(after.allocated_bytes < during.allocated_bytes);
        assert!(after.peak_allocated_bytes >= during.allocated_bytes);
        reset_peak(0).unwrap();
        let reset = stats(0).unwrap();
        assert_eq!(reset.peak_allocated_bytes, reset.allocated_bytes);
        empty_cache().unwrap();
        assert!(stats(0).unwrap().reserved_bytes < during.reserved_bytes);
        let (free, total) = mem_info(0).unwrap();
        assert!(total > 0 && free <= total, "{free} / {total}");
    }
}
