//! What tch's own build script does not do for the runner.
//!
//! * No RUNPATH: the runner runs on the user's torch, whose `lib/` the `batchfit` and
//!   `batchfit-train` launchers put on `LD_LIBRARY_PATH` (`batchfit::workload::runner`); a path into
//!   this build machine's directories would be wrong anywhere else. `libtorch_cuda.so` is not linked
//!   either (a CPU-only torch has none): `src/cuda.rs` loads it at start-up where it exists.
//! * The PyTorch version built against (read from the torch package's `version.py`) becomes
//!   `BATCHFIT_LIBTORCH_VERSION`, what `batchfit-torch info` reports; a torch of another minor
//!   version than tch binds is refused here, naming both.
//! * `src/shim.cpp` (what tch lacks: CUDA caching-allocator stats, autocast with a dtype; see
//!   `src/allocator.rs`) is compiled with `cc` against libtorch's headers. Only the device-agnostic
//!   `at::accelerator` API is used, so no CUDA headers are needed. After the static shim we name
//!   `torch_cpu` and `c10` so that the linker (with `--as-needed`) resolves its references to them.

/// The PyTorch minor version tch 0.24 binds (`batchfit::workload::runner::TORCH_MINOR`; a test
/// holds the two equal).
const TORCH_MINOR: &str = "2.11";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|d| format!("{d}/lib")))
        .expect("torch-sys found libtorch but did not say where (DEP_TCH_LIBTORCH_LIB)");
    println!("cargo:rustc-link-search=native={lib}");
    let version = torch_version(&lib);
    let minor_ok = version
        .strip_prefix(TORCH_MINOR)
        .is_some_and(|r| r.is_empty() || r.starts_with(['.', '+', 'a', 'b', 'r']));
    assert!(
        minor_ok,
        "the torch at {lib}/.. is version {version}; batchfit's runner builds against PyTorch \
         {TORCH_MINOR} (what tch 0.24 binds): point LIBTORCH or LIBTORCH_USE_PYTORCH at a torch \
         {TORCH_MINOR}.x"
    );
    println!("cargo:rustc-env=BATCHFIT_LIBTORCH_VERSION={version}");
    compile_shim(&lib);
}

/// `__version__` from the torch package's `version.py` (`…/torch/lib` → `…/torch/version.py`).
fn torch_version(lib: &str) -> String {
    let version_py = std::path::Path::new(lib).join("../version.py");
    println!("cargo:rerun-if-changed={}", version_py.display());
    let text = std::fs::read_to_string(&version_py).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}): build against an installed PyTorch (LIBTORCH=…/site-packages/torch \
             or LIBTORCH_USE_PYTORCH=1)",
            version_py.display()
        )
    });
    text.lines()
        .find_map(|l| l.strip_prefix("__version__"))
        .and_then(|rest| rest.split_once('='))
        .map(|(_, v)| v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
        .unwrap_or_else(|| panic!("no __version__ in {}", version_py.display()))
}

/// Compiles `src/shim.cpp` into a static library linked into this crate.
fn compile_shim(lib: &str) {
    const SHIM: &str = "src/shim.cpp";
    println!("cargo:rerun-if-changed={SHIM}");
    println!("cargo:rerun-if-env-changed=LIBTORCH_INCLUDE");
    let mut candidates = vec![std::path::Path::new(lib).join("../include")];
    for var in ["LIBTORCH_INCLUDE", "LIBTORCH"] {
        if let Ok(dir) = std::env::var(var) {
            candidates.push(std::path::Path::new(&dir).join("include"));
        }
    }
    let Some(include) = candidates
        .iter()
        .find(|d| d.join("ATen/DeviceAccelerator.h").exists())
    else {
        panic!(
            "libtorch's C++ headers (ATen/DeviceAccelerator.h) are not in any of {candidates:?}; \
             {SHIM} needs them. Set LIBTORCH to the torch directory (export LIBTORCH=$(scripts/setup-libtorch.sh))"
        );
    };
    let api_include = include.join("torch/csrc/api/include");
    cc::Build::new()
        .cpp(true)
        .file(SHIM)
        // -isystem: libtorch's headers warn under -Wextra; our own file keeps its warnings.
        .flag("-isystem")
        .flag(include)
        .flag("-isystem")
        .flag(&api_include)
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .compile("batchfit_shim");
    // After the static shim on the link line, so its references to libtorch resolve.
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
