//! `batchfit-torch`: the torch runner. Started by `batchfit` (model trials) and by the
//! `batchfit-train` launcher, with the user's torch on the library path; not a command for users.
//!
//! | subcommand | what it does |
//! |---|---|
//! | `trial SPEC` | one model trial in this process ([`batchfit_torch::child::child_main`]) |
//! | `worker TEMPLATE` | trials read from stdin in one process (hybrid isolation) |
//! | `train ARGS…` | `batchfit-train` ([`batchfit_torch::train::main`]) |
//! | `info` | the PyTorch it was built for and whether CUDA works here, as JSON |
//! | `inspect FILE` | loads a TorchScript file and prints its parameter count |

use batchfit::exit::Exit;
use batchfit::workload::runner::{RunnerInfo, CALLER_VERSION_ENV};
use batchfit_torch::{child, cuda, train, BUILT_FOR};
use std::ffi::OsString;
use std::process::ExitCode;

const USAGE: &str = "usage: batchfit-torch trial SPEC | worker TEMPLATE | train ARGS… | info | \
                     inspect FILE\n\
                     (batchfit's torch runner: batchfit and batchfit-train start it; run those)";

fn main() -> ExitCode {
    batchfit::platform::sysmem::configure_malloc();
    const VERSION: &str = env!("CARGO_PKG_VERSION");
    if let Some(caller) = std::env::var_os(CALLER_VERSION_ENV) {
        if caller != VERSION {
            batchfit::note!(
                "batchfit-torch {VERSION} cannot serve batchfit {}: the two speak one version's \
                 protocol. Install them together (pip install batchfit, or cargo build --release \
                 --workspace), or point BATCHFIT_TORCH_RUNNER at the runner of batchfit {}",
                caller.to_string_lossy(),
                caller.to_string_lossy()
            );
            return Exit::Environment.into();
        }
    }
    let _ = cuda::load();
    let mut args = std::env::args_os().skip(1);
    let sub = args.next();
    let rest: Vec<OsString> = args.collect();
    let one = |rest: &[OsString]| match rest {
        [a] => Some(a.to_string_lossy().into_owned()),
        _ => None,
    };
    match (sub.as_ref().and_then(|s| s.to_str()), one(&rest)) {
        (Some("trial"), Some(spec)) => child::child_main(&spec),
        (Some("worker"), Some(template)) => child::worker_main(&template),
        (Some("train"), _) => train::main(rest),
        (Some("info"), _) if rest.is_empty() => info(),
        (Some("--version"), _) => {
            println!(
                "batchfit-torch {} (built for PyTorch {BUILT_FOR})",
                env!("CARGO_PKG_VERSION")
            );
            Exit::Success.into()
        }
        (Some("inspect"), Some(file)) => inspect(&file),
        _ => {
            batchfit::note!("{USAGE}");
            Exit::Usage.into()
        }
    }
}

fn info() -> ExitCode {
    let cuda_available = tch::Cuda::is_available();
    let info = RunnerInfo {
        built_for: BUILT_FOR.into(),
        cuda_available,
        cuda_device_count: if cuda_available {
            tch::Cuda::device_count().max(0) as u32
        } else {
            0
        },
        cuda_runtime: cuda::runtime_version(),
        cuda_library: cuda::load().clone().err(),
    };
    println!("{}", serde_json::to_string(&info).expect("info serialises"));
    Exit::Success.into()
}

/// Loads a TorchScript file on the CPU and prints its parameter count; a file libtorch cannot load
/// is exit 2 with libtorch's message on stderr.
fn inspect(file: &str) -> ExitCode {
    let count = tch::CModule::load(file)
        .and_then(|m| m.named_parameters())
        .map(|ps| ps.iter().map(|(_, t)| t.numel() as u64).sum::<u64>());
    match count {
        Ok(n) => {
            println!("{n}");
            Exit::Success.into()
        }
        Err(e) => {
            batchfit::note!(
                "{}",
                batchfit::protocol::classify::first_line(&e.to_string())
            );
            Exit::Usage.into()
        }
    }
}
