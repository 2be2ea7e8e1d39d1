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
    // a daemon a trial orphans comes back to batchfit, where its trial finds it
    batchfit::platform::reaper::adopt_orphans();
    let cli = match <Cli as clap::Parser>::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let exit = cli::print_parse_error(&e);
            if e.kind() == clap::error::ErrorKind::UnknownArgument && exec_before_separator() {
                // `--exec python train.py …` unquoted: clap took `python` as the command and
                // refused the next word
                batchfit::note!(
                    "batchfit: --exec takes the command as one argument: {}",
                    batchfit::config::EXEC_FORMS
                );
            }
            return exit.into();
        }
    };
    let _cleanup = Cleanup;
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
    drop(_cleanup);
    exit::finish("batchfit", result)
}

/// What this process made goes with it, whatever its end: success, an error, an interruption that
/// wrote a partial plan, a panic (dropped while unwinding): the lock files (`--logs`, `--out`), and
/// every process a trial left (each trial ends its own; this is the last sweep for this batchfit's
/// trial marker).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        batchfit::platform::lock::release_all();
        batchfit::device::process::end_all();
    }
}

/// Whether `--exec` is among this process's arguments before a `--`.
fn exec_before_separator() -> bool {
    std::env::args_os()
        .take_while(|a| a != "--")
        .any(|a| a == "--exec" || a.to_string_lossy().starts_with("--exec="))
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
