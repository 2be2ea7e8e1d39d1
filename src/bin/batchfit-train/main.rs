//! `batchfit-train`: trains with a plan's micro-batch and accumulation, on the user's own torch.
//!
//! This binary is a launcher without libtorch: it checks the arguments (so `--help` and usage
//! errors need no torch), finds the torch runner and the user's torch
//! ([`batchfit::workload::runner`]), and replaces itself with `batchfit-torch train ARGS…`, which
//! does the training ([`batchfit_torch::train`] in `crates/batchfit-torch`). Exit codes:
//! [`batchfit::exit`] (`Program::Train`).

use batchfit::cli::{self, TrainArgs};
use batchfit::exit::{self, Exit, Fail};
use batchfit::workload::runner::Runner;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Err(exit) = cli::parse_or_exit::<TrainArgs>(std::env::args_os()) {
        return exit.into();
    }
    exit::finish("batchfit-train", launch().map(|()| Exit::Success))
}

/// Replaces this process with the runner's `train` (returns only when that cannot start). The
/// runner must first answer `info`: once replaced, a program that is not the runner (or one whose
/// libtorch does not load) would exit with its own status, 0 for one that does nothing.
fn launch() -> Result<(), Fail> {
    let runner = Runner::locate().map_err(|e| Fail(Exit::Environment, e.into()))?;
    runner
        .info()
        .map_err(|e| Fail(Exit::Environment, e.into()))?;
    let e = runner
        .command()
        .arg("train")
        .args(std::env::args_os().skip(1))
        .exec();
    Err(Fail(
        Exit::Environment,
        anyhow::anyhow!("cannot start {}: {e}", runner.exe.display()),
    ))
}
