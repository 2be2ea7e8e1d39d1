//! `batchfit`: parse → validate → probe → exit code. Exit codes are listed in `--help` and README.

use batchfit::cli::{Cli, Command, FormatArg, ShowArgs};
use batchfit::plan::Plan;
use batchfit::probe::{self, Ending, ProbeError};
use batchfit::progress::StderrProgress;
use batchfit::{config, interrupt, output, sysmem, trial};
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

mod jobs_cmd;

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
        Command::Show(args) => show_main(&args),
        Command::Doctor { json, plan } => doctor_main(json, plan.as_deref()),
        Command::Models { json } => models_main(json),
        Command::Merge(args) => jobs_cmd::merge_main(&args),
        Command::Verify(args) => jobs_cmd::verify_main(&args),
        Command::Cache { action } => jobs_cmd::cache_main(&action),
        Command::Completions { shell } => {
            let mut out = std::io::stdout().lock();
            output::completions(shell, &mut out);
            finish_stdout(out)
        }
        Command::Man { subcommand } => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = output::man_page(subcommand.as_deref(), &mut out) {
                eprintln!("batchfit: error: {e}");
                return ExitCode::from(match e {
                    output::OutputError::Io(_) => 3,
                    _ => 2,
                });
            }
            finish_stdout(out)
        }
    }
}

fn finish_stdout(mut out: std::io::StdoutLock) -> ExitCode {
    match out.flush() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("batchfit: error: cannot write to stdout: {e}");
            ExitCode::from(3)
        }
    }
}

/// `batchfit show PLAN --format ...`: an existing plan in another format.
fn show_main(args: &ShowArgs) -> ExitCode {
    if let Some(Err(e)) = args.plot.as_deref().map(batchfit::plot::check_target) {
        eprintln!("batchfit: error: {e}");
        return ExitCode::from(2);
    }
    let plan = match Plan::read(&args.plan) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    match output::render(&plan, args.format, Some(&args.plan)) {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    }
    match args.plot.as_deref().map(|p| plot_plan(&plan, p)) {
        Some(Err(code)) => code,
        _ => ExitCode::SUCCESS,
    }
}

/// `--plot FILE`: draws the plan; a failure is reported and exits 3 (2 for a bad file name).
fn plot_plan(plan: &Plan, path: &std::path::Path) -> Result<(), ExitCode> {
    batchfit::plot::render(plan, path).map_err(|e| {
        eprintln!("batchfit: error: {e}");
        ExitCode::from(match e {
            batchfit::plot::PlotError::Target(_) => 2,
            _ => 3,
        })
    })
}

fn probe_main(args: &batchfit::cli::ProbeArgs) -> ExitCode {
    let cfg = match config::validate(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match trial_setup() {
        Ok(p) => p,
        Err(code) => return code,
    };
    let quiet = cfg.quiet;
    let mut progress = StderrProgress::new(quiet);
    let cache = jobs_cmd::cache_options(args);
    let result = probe::run_cached(&cfg, &exe, &mut progress, cache.as_ref());
    progress.finish();
    let report = match result {
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
    // BATCHFIT_PLAN only names a complete plan (a partial one has no recommendation to export).
    let plan_path = report
        .written
        .as_deref()
        .filter(|_| report.ending == Ending::Complete);
    match output::render(&report.plan, cfg.format, plan_path) {
        Ok(s) => print!("{s}"),
        Err(e) => eprintln!("batchfit: error: {e}"),
    }
    if !quiet && cfg.format != FormatArg::Text {
        eprint!("{}", probe::summary(&report.plan));
    }
    if let Some(p) = report.written.as_ref().filter(|_| !quiet) {
        eprintln!("batchfit: plan written to {}", p.display());
    }
    // Drawn after the plan is written (partial plans too); a failure leaves the plan as written and
    // exits 3, unless the probe's own exit code already says something went wrong.
    let plotted = match cfg.plot.as_deref() {
        Some(p) => match plot_plan(&report.plan, p) {
            Ok(()) => {
                if !quiet {
                    eprintln!("batchfit: plot drawn to {}", p.display());
                }
                true
            }
            Err(_) => false,
        },
        None => true,
    };
    ExitCode::from(match report.ending {
        Ending::Complete if !plotted => 3,
        Ending::Complete => 0,
        Ending::NothingFits => 1,
        Ending::TrialErrors => 4,
        Ending::Capped => 5,
        Ending::Interrupted(sig) => (128 + sig) as u8,
    })
}

fn doctor_main(json: bool, plan: Option<&std::path::Path>) -> ExitCode {
    let plan = match plan.map(batchfit::plan::Plan::read).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match batchfit::gpu::fake::query() {
        Ok(n) => batchfit::gpu::doctor::diagnose(n.as_ref(), plan.as_ref()),
        Err(e) => batchfit::gpu::doctor::diagnose(
            &batchfit::gpu::FakeGpus {
                fail: Some(e),
                ..Default::default()
            },
            plan.as_ref(),
        ),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serialises")
        );
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::from(if report.ok { 0 } else { 3 })
}

/// `batchfit models`: every built-in model with its parameter count and default input shape.
fn models_main(json: bool) -> ExitCode {
    let rows: Vec<(&str, u64, String)> = batchfit::models::ZOO
        .iter()
        .map(|name| {
            let spec = batchfit::models::ModelSpec {
                architecture: batchfit::models::Architecture::preset(name).expect("zoo preset"),
                optimizer: Default::default(),
                precision: Default::default(),
            };
            (*name, spec.parameter_count(), spec.input_spec())
        })
        .collect();
    let mut out = std::io::stdout().lock();
    let written = if json {
        #[derive(serde::Serialize)]
        struct Row<'a> {
            name: &'a str,
            parameter_count: u64,
            input_spec: &'a str,
        }
        let v: Vec<Row> = rows
            .iter()
            .map(|(n, p, i)| Row {
                name: n,
                parameter_count: *p,
                input_spec: i,
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).expect("list serialises")
        )
    } else {
        let mut s = format!("{:<12} {:>13}  {}\n", "MODEL", "PARAMETERS", "INPUT");
        for (n, p, i) in &rows {
            s.push_str(&format!("{n:<12} {p:>13}  {i}\n"));
        }
        out.write_all(s.as_bytes())
    };
    if let Err(e) = written {
        eprintln!("batchfit: error: cannot write to stdout: {e}");
        return ExitCode::from(3);
    }
    finish_stdout(out)
}

/// What every command that runs trials needs first: signal handlers (so an interruption kills the
/// trials and keeps a partial plan) and this executable's path (trials are its hidden subcommands).
fn trial_setup() -> Result<std::path::PathBuf, ExitCode> {
    if let Err(e) = interrupt::install() {
        eprintln!("batchfit: error: cannot install signal handlers: {e}");
        return Err(ExitCode::from(3));
    }
    std::env::current_exe().map_err(|e| {
        eprintln!("batchfit: error: cannot find my own executable to start trials: {e}");
        ExitCode::from(3)
    })
}
