//! `batchfit`: parse → validate → probe → exit code. Exit codes are listed in `--help` and README.

use batchfit::cli::{Cli, Command, FormatArg};
use batchfit::probe::{self, Ending, ProbeError};
use batchfit::{config, interrupt, sysmem, trial};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    sysmem::configure_malloc();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        Command::Trial { spec } => trial::child_main(&spec),
        Command::Worker { template } => trial::worker_main(&template),
        Command::Probe(args) => probe_main(&args),
    }
}

fn probe_main(args: &batchfit::cli::ProbeArgs) -> ExitCode {
    let cfg = match config::validate(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = interrupt::install() {
        eprintln!("batchfit: error: cannot install signal handlers: {e}");
        return ExitCode::from(3);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("batchfit: error: cannot find my own executable to start trials: {e}");
            return ExitCode::from(3);
        }
    };
    let quiet = cfg.quiet;
    let mut progress = |line: &str| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    let report = match probe::run(&cfg, &exe, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(match e {
                ProbeError::Usage(_) => 2,
                ProbeError::Environment(_) | ProbeError::Write(_) => 3,
            });
        }
    };
    for n in &report.notices {
        eprintln!("{n}");
    }
    match cfg.format {
        FormatArg::Json => println!("{}", report.plan.to_json()),
        FormatArg::Text => print!("{}", probe::summary(&report.plan)),
    }
    if !quiet && cfg.format != FormatArg::Text {
        eprint!("{}", probe::summary(&report.plan));
    }
    if let Some(p) = &report.written {
        eprintln!("batchfit: plan written to {}", p.display());
    }
    ExitCode::from(match report.ending {
        Ending::Complete => 0,
        Ending::NothingFits => 1,
        Ending::TrialErrors => 4,
        Ending::Capped => 5,
        Ending::Interrupted(sig) => (128 + sig) as u8,
    })
}
