//! batchfit's real NVML adapter (`src/gpu/nvml.rs`, through nvml-wrapper) against a stand-in driver
//! library (`tests/support/nvml_stub.c`, built here with the system C compiler): loading it by the
//! loader's search and by `BATCHFIT_NVML_LIB`, the memory figures (the driver's reserve included),
//! the process list with a usage NVML cannot report, a GPU whose process list is not supported, and
//! a driver that refuses to initialise. The scripted GPUs of `tests/cuda_fake.rs` replace this
//! adapter; these tests run it. What only a real driver can show is in scripts/gpu-check.sh.

mod common;
use common::*;
use predicates::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The folder holding the stub, built once per test binary as `libnvidia-ml.so.1`.
fn stub_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/nvml_stub.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(d.path().join("libnvidia-ml.so.1"))
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("{cc} (the C compiler, also needed by build.rs): {e}"));
        assert!(out.status.success(), "building the NVML stub: {out:?}");
        d
    })
    .path()
}

fn stub_lib() -> PathBuf {
    stub_dir().join("libnvidia-ml.so.1")
}

/// Two H200s: GPU 0 with two other processes (one whose usage NVML cannot report), GPU 1 whose
/// process list is not supported (as in some sandboxes).
fn two_gpus(dir: &tempfile::TempDir) -> PathBuf {
    let total = 143_771 * MIB;
    let reserved = 530 * MIB;
    let used0 = 20 * GIB + 300 * MIB;
    let cfg = format!(
        "driver 580.159.03\n\
         gpu NVIDIA H200|GPU-aaaa-0000|{total}|{}|{used0}|{reserved}\n\
         gpu NVIDIA H200|GPU-bbbb-1111|{total}|{}|{}|{reserved}\n\
         proc 0 4242 {}\n\
         proc 0 4343 -1\n\
         procs_unsupported 1\n",
        total - reserved - used0,
        total - reserved - 5 * MIB,
        5 * MIB,
        20 * GIB,
    );
    let p = dir.path().join("nvml.conf");
    std::fs::write(&p, cfg).unwrap();
    p
}

/// `batchfit` with NVML answered by the stub (named by BATCHFIT_NVML_LIB) from `config`.
fn with_stub(config: &Path) -> assert_cmd::Command {
    let mut c = batchfit();
    c.env_remove("BATCHFIT_FAKE_GPUS")
        .env("BATCHFIT_NVML_LIB", stub_lib())
        .env("NVML_STUB_CONFIG", config);
    c
}

fn doctor_json(c: &mut assert_cmd::Command) -> (Option<i32>, Value) {
    let out = c.args(["doctor", "--json"]).output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {out:?}"));
    (out.status.code(), v)
}

#[test]
fn doctor_reads_memory_and_processes_through_the_driver_library() {
    let d = tmp();
    let cfg = two_gpus(&d);
    let (code, v) = doctor_json(&mut with_stub(&cfg));
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["driver_version"], "580.159.03");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{v:#}");
    let g0 = &gpus[0];
    assert_eq!(g0["name"], "NVIDIA H200");
    assert_eq!(g0["uuid"], "GPU-aaaa-0000");
    assert_eq!(g0["total_bytes"], 143_771 * MIB);
    assert_eq!(g0["reserved_bytes"], 530 * MIB);
    assert_eq!(g0["used_bytes"], 20 * GIB + 300 * MIB);
    assert_eq!(
        g0["free_bytes"],
        143_771 * MIB - 530 * MIB - (20 * GIB + 300 * MIB)
    );
    let procs = g0["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{g0:#}");
    assert_eq!(
        (procs[0]["pid"].as_u64(), procs[0]["used_bytes"].as_u64()),
        (Some(4242), Some(20 * GIB))
    );
    assert_eq!(procs[1]["pid"], 4343);
    assert!(
        procs[1]["used_bytes"].is_null(),
        "unavailable is not 0: {g0:#}"
    );
    assert!(g0.get("processes_unavailable").is_none_or(|u| u == false));
    // GPU 1: the process query is not supported; the memory figures still come, the list is marked
    let g1 = &gpus[1];
    assert_eq!(g1["uuid"], "GPU-bbbb-1111");
    assert_eq!(g1["processes_unavailable"], true, "{g1:#}");
    assert_eq!(g1["processes"].as_array().unwrap().len(), 0);

    // the text says the same, with the driver's reserve and CUDA's total
    with_stub(&cfg).arg("doctor").assert().code(0).stdout(
        predicate::str::contains("NVIDIA driver 580.159.03, 2 GPU(s)")
            .and(predicate::str::contains("pid     4242: 20.00 GiB"))
            .and(predicate::str::contains("pid     4343: usage not reported"))
            .and(predicate::str::contains(
                "530.00 MiB reserved by the driver (CUDA's total is 139.88 GiB)",
            )),
    );
}

/// Without BATCHFIT_NVML_LIB the library is found by the loader's search, as the driver's is.
#[test]
fn the_library_is_found_by_the_loaders_search() {
    let d = tmp();
    let cfg = two_gpus(&d);
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", stub_dir().display()),
        _ => stub_dir().display().to_string(),
    };
    let (code, v) = doctor_json(
        batchfit()
            .env_remove("BATCHFIT_FAKE_GPUS")
            .env_remove("BATCHFIT_NVML_LIB")
            .env("LD_LIBRARY_PATH", ld)
            .env("NVML_STUB_CONFIG", &cfg),
    );
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2, "{v:#}");
}

/// The search for the library: past places where it is missing (here only the last name, the
/// unversioned `libnvidia-ml.so`, is found), and not past a library that loads and refuses (the
/// first name, found by the loader: the error names it and nothing else).
#[test]
fn the_search_goes_past_missing_libraries_but_stops_at_a_refusal() {
    let d = tmp();
    let cfg = two_gpus(&d);
    let search = |dir: &Path, config: &Path| {
        let mut c = batchfit();
        c.env_remove("BATCHFIT_FAKE_GPUS")
            .env_remove("BATCHFIT_NVML_LIB")
            .env("LD_LIBRARY_PATH", dir)
            .env("NVML_STUB_CONFIG", config);
        c
    };
    let system_copies: Vec<&str> = [
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    ]
    .into_iter()
    .filter(|p| Path::new(p).exists())
    .collect();
    if system_copies.is_empty() {
        let only_unversioned = tmp();
        std::fs::copy(stub_lib(), only_unversioned.path().join("libnvidia-ml.so")).unwrap();
        let (code, v) = doctor_json(&mut search(only_unversioned.path(), &cfg));
        assert_eq!(code, Some(0), "{v:#}");
        assert_eq!(v["gpus"].as_array().unwrap().len(), 2, "{v:#}");
    } else {
        eprintln!("not testing the search past missing places: this machine has {system_copies:?}");
    }

    let refuses = d.path().join("refuses.conf");
    std::fs::write(&refuses, "init_error 9\n").unwrap();
    let (code, v) = doctor_json(&mut search(stub_dir(), &refuses));
    assert_eq!(code, Some(3), "{v:#}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("libnvidia-ml.so.1"), "{e}");
    assert!(
        !e.contains("also tried"),
        "the search went on after a refusal: {e}"
    );
}

/// A library that loads but whose nvmlInit fails is the answer (no other copy is tried), and a
/// missing library named by BATCHFIT_NVML_LIB says so: both exit 3 with the error inside valid JSON,
/// naming the cpu and sim backends, never a GPU with zeros.
#[test]
fn a_driver_that_refuses_or_is_missing_is_an_environment_error() {
    let d = tmp();
    let cfg = d.path().join("refuses.conf");
    std::fs::write(&cfg, "init_error 9\ngpu NVIDIA H200|GPU-x|1|1|0|0\n").unwrap();
    let (code, v) = doctor_json(&mut with_stub(&cfg));
    assert_eq!(code, Some(3), "{v:#}");
    assert_eq!(v["ok"], false);
    let e = v["error"].as_str().unwrap();
    assert!(e.contains(&stub_lib().display().to_string()), "{e}");
    assert!(!e.contains("also tried"), "{e}");
    assert!(
        e.contains("--backend cpu") && e.contains("--backend sim"),
        "{e}"
    );
    assert!(v["gpus"].as_array().unwrap().is_empty(), "{v:#}");

    let (code, v) = doctor_json(with_stub(&cfg).env(
        "BATCHFIT_NVML_LIB",
        d.path().join("no-such-libnvidia-ml.so.1"),
    ));
    assert_eq!(code, Some(3), "{v:#}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("no-such-libnvidia-ml.so.1") && e.contains("BATCHFIT_NVML_LIB"),
        "{e}"
    );
}

/// NVML sees a GPU but libtorch sees no CUDA (this machine: a driver library without a GPU behind
/// it): `--backend cuda` stops before any trial with a sentence, and auto keeps to the cpu.
#[test]
fn nvml_without_cuda_in_libtorch_is_refused_before_any_trial() {
    if common::torch_sees_cuda() {
        eprintln!("not testing NVML-without-CUDA: libtorch sees a CUDA device on this machine");
        return;
    }
    let d = tmp();
    let cfg = two_gpus(&d);
    let out = path(&d, "plan.json");
    with_stub(&cfg)
        .args(["probe", "--backend", "cuda", "--quiet", "--out"])
        .arg(&out)
        .assert()
        .code(3)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("sees no CUDA device"))
        .stderr(predicate::str::contains("NVML sees 2 GPU(s)"));
    assert!(!out.exists());
}
