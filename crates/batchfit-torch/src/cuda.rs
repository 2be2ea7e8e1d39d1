//! libtorch's CUDA half, loaded at start-up when the user's torch has one.
//!
//! A CUDA build of torch ships `libtorch_cuda.so`; nothing in this executable references it by
//! symbol, yet CUDA only works once it is loaded (its static initialisers register CUDA with ATen).
//! Linking it (`--no-as-needed`) would make the runner refuse to start on a CPU-only torch, which
//! has no such file; so it is opened here, from the library path the launcher set, before any tch
//! call. Where it is missing the runner works on the CPU, and `batchfit-torch info` says why CUDA
//! is not available.

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// `Ok` when `libtorch_cuda.so` was loaded, else the loader's message.
pub fn load() -> &'static Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let name = CString::new("libtorch_cuda.so").expect("no NUL");
        // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a static, NUL-terminated message (or null).
            let msg = unsafe { libc::dlerror() };
            Err(if msg.is_null() {
                "libtorch_cuda.so could not be loaded".into()
            } else {
                unsafe { CStr::from_ptr(msg) }
                    .to_string_lossy()
                    .into_owned()
            })
        } else {
            Ok(())
        }
    })
}

/// The CUDA runtime version ATen's CUDA hooks report (e.g. 13000), or `None` when libtorch's CUDA
/// half is not registered (ATen panics then; the panic is caught).
pub fn runtime_version() -> Option<i64> {
    load().as_ref().ok()?;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let v = std::panic::catch_unwind(tch::utils::version_cudart).ok();
    std::panic::set_hook(hook);
    v
}
