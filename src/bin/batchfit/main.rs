//! `batchfit`: parse → dispatch → exit code. Each subcommand's edge (its arguments, what it prints,
//! its exit code) is one function in [`probe`], [`plans`] or [`info`]; the work is the library's.

mod info;
mod plans;
mod probe;

use batchfit::cli::{self, Cli, Command};
use batchfit::exit::{self, Exit, Fail};
use batchfit::platform::{interrupt, sysmem};
use std::process::ExitCode;

fn main() -> ExitCode {
    sysmem::configure_malloc();
    let cli: Cli = match cli::parse_or_exit(std::env::args_os()) {
        Ok(c) => c,
        Err(exit) => return exit.into(),
    };
    let result = match cli.command {
        Command::Probe(args) => probe::probe(&args),
        Command::Show(args) => plans::show(&args),
        Command::Merge(args) => plans::merge(&args),
        Command::Verify(args) => plans::verify(&args),
        Command::Cache { action } => plans::cache(&action),
        Command::Doctor { json, plan } => info::doctor(json, plan.as_deref()),
        Command::Models { json } => info::models(json),
        Command::Completions { shell } => info::completions(shell),
        Command::Man { subcommand } => info::man(subcommand.as_deref()),
        Command::PythonHelper => info::python_helper(),
        Command::Predict(args) => plans::predict(&args),
    };
    exit::finish("batchfit", result)
}

/// What every command that runs trials needs first: signal handlers (so an interruption kills the
/// trials and keeps a partial plan).
fn trial_setup() -> Result<(), Fail> {
    interrupt::install().map_err(|e| {
        Fail(
            Exit::Environment,
            anyhow::Error::new(e).context("cannot install signal handlers"),
        )
    })
}
