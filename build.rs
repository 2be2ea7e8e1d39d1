//! Link set-up that tch's own build script cannot do for our binaries.
//!
//! * torch-sys prints `cargo:libtorch_lib=DIR`; because `torch-sys` is a *direct* dependency we see it
//!   as `DEP_TCH_LIBTORCH_LIB`. We add it as an rpath so both binaries start without `LD_LIBRARY_PATH`.
//! * The linker's `--as-needed` would drop `libtorch_cuda.so` (nothing references it by symbol), and
//!   then CUDA never registers with ATen on a GPU machine. We force-link it with `--no-as-needed`.
//!   The PyPI wheel ships `libtorch_cuda.so` even in its CPU-only use, so this links everywhere.
//! * `src/gpu/shim.cpp` (what tch lacks: CUDA caching-allocator stats, autocast with a dtype; see
//!   `src/gpu/allocator.rs`) is compiled with `cc` against libtorch's headers (`…/torch/lib` →
//!   `…/torch/include`, or `$LIBTORCH/include`). Only the device-agnostic `at::accelerator` API is
//!   used, so no CUDA headers are needed. After the static shim we name `torch_cpu` and `c10` so that
//!   the linker (with `--as-needed`) resolves the shim's references to them.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|d| format!("{d}/lib")));
    if let Some(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:rustc-link-search=native={lib}");
        let has_cuda = std::path::Path::new(&lib).join("libtorch_cuda.so").exists();
        if has_cuda {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-ltorch");
            println!("cargo:rustc-link-arg=-ltorch_cuda");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
        }
        compile_shim(&lib);
        println!("cargo:rustc-env=BATCHFIT_LIBTORCH_LIB={lib}");
        // libtorch's version, from the wheel's torch/version.py (…/torch/lib → …/torch/version.py).
        let version_py = std::path::Path::new(&lib).join("../version.py");
        println!("cargo:rerun-if-changed={}", version_py.display());
        if let Ok(text) = std::fs::read_to_string(&version_py) {
            if let Some(v) = text
                .lines()
                .find_map(|l| l.strip_prefix("__version__ = "))
                .map(|v| v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
            {
                println!("cargo:rustc-env=BATCHFIT_LIBTORCH_VERSION={v}");
            }
        }
    } else {
        println!("cargo:warning=DEP_TCH_LIBTORCH_LIB not set: binaries will need LD_LIBRARY_PATH");
    }
}

/// Compiles `src/gpu/shim.cpp` into a static library linked into the `batchfit` crate.
fn compile_shim(lib: &str) {
    const SHIM: &str = "src/gpu/shim.cpp";
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
