//! `batchfit merge`, `batchfit verify` and `batchfit cache`: the binary's side (arguments, output,
//! exit codes) of [`batchfit::jobs`] and [`batchfit::cache`].

use batchfit::backend::sim::SimSpec;
use batchfit::cache::{self, CacheOptions};
use batchfit::cli::{CacheAction, FormatArg, MergeArgs, ProbeArgs, VerifyArgs};
use batchfit::jobs::{self, JobError, MergeOptions, VerifyEnding};
use batchfit::output;
use batchfit::plan::Plan;
use batchfit::progress::StderrProgress;
use std::path::Path;
use std::process::ExitCode;

fn job_code(e: &JobError) -> u8 {
    match e {
        JobError::Usage(_) | JobError::Read(_) => 2,
        JobError::Environment(_) | JobError::Write(_) => 3,
    }
}

/// How `batchfit probe` uses the cache: none with `--no-cache` (or without a cache directory).
pub fn cache_options(args: &ProbeArgs) -> Option<CacheOptions> {
    if args.no_cache {
        return None;
    }
    let dir = cache::default_dir().ok()?;
    Some(CacheOptions {
        dir,
        read: !args.refresh,
        write: true,
    })
}

fn print_plan(plan: &Plan, format: FormatArg, path: &Path) -> Result<(), ExitCode> {
    match output::render(plan, format, Some(path)) {
        Ok(s) => {
            print!("{s}");
            Ok(())
        }
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// `batchfit merge A B … --global-batch G --out M`.
pub fn merge_main(a: &MergeArgs) -> ExitCode {
    if a.format == FormatArg::Deepspeed && a.allow_uneven {
        eprintln!(
            "batchfit: error: --format deepspeed cannot express micro-batches of unequal size; drop \
             --allow-uneven (or use --format json)"
        );
        return ExitCode::from(2);
    }
    if let Err(e) = batchfit::plan::check_writable(&a.out) {
        eprintln!("batchfit: error: {e}");
        return ExitCode::from(2);
    }
    let opts = MergeOptions {
        plans: a.plans.clone(),
        global_batch: a.global_batch,
        world_size: a.world_size,
        allow_uneven: a.allow_uneven,
    };
    let plan = match jobs::merge(&opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(job_code(&e));
        }
    };
    if let Err(e) = plan.write_atomic(&a.out) {
        eprintln!("batchfit: error: cannot write the plan: {e}");
        return ExitCode::from(3);
    }
    if let Err(c) = print_plan(&plan, a.format, &a.out) {
        return c;
    }
    eprintln!(
        "batchfit: merged plan written to {} (not verified: run `batchfit verify {}` on the machine \
         that trains)",
        a.out.display(),
        a.out.display()
    );
    ExitCode::SUCCESS
}

/// `batchfit verify PLAN [--out FILE] [--sim SPEC]`.
pub fn verify_main(a: &VerifyArgs) -> ExitCode {
    let plan = match Plan::read(&a.plan) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    let sim = match a.sim.as_deref().map(SimSpec::parse).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(2);
        }
    };
    let out = a.out.clone().unwrap_or_else(|| a.plan.clone());
    if let Err(e) = batchfit::plan::check_writable(&out) {
        eprintln!("batchfit: error: {e}");
        return ExitCode::from(2);
    }
    let exe = match crate::trial_setup() {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mut progress = StderrProgress::new(a.quiet);
    let result = jobs::verify(&plan, &exe, sim, &mut progress);
    progress.finish();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(job_code(&e));
        }
    };
    if let Err(e) = report.plan.write_atomic(&out) {
        eprintln!("batchfit: error: cannot write the plan: {e}");
        return ExitCode::from(3);
    }
    if let Err(c) = print_plan(&report.plan, a.format, &out) {
        return c;
    }
    match report.ending {
        VerifyEnding::Verified => {
            eprintln!("batchfit: verified; plan written to {}", out.display());
            ExitCode::SUCCESS
        }
        VerifyEnding::Failed(why) => {
            eprintln!(
                "batchfit: not verified: {why}; the plan (verified: false, with the trial) is in {}",
                out.display()
            );
            ExitCode::from(4)
        }
        VerifyEnding::Interrupted(sig) => {
            eprintln!("batchfit: verification interrupted");
            ExitCode::from((128 + sig) as u8)
        }
    }
}

/// `batchfit cache list|clear`.
pub fn cache_main(action: &CacheAction) -> ExitCode {
    let dir = match cache::default_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("batchfit: error: {e}");
            return ExitCode::from(3);
        }
    };
    match action {
        CacheAction::List => match cache::list(&dir) {
            Ok(entries) => {
                eprintln!("batchfit: cache {}", dir.display());
                println!(
                    "{:<20}  {:<16}  {:<30}  {:>11}  DATE (UTC)",
                    "KEY", "MODEL", "DEVICE", "MICRO-BATCH"
                );
                for e in entries {
                    println!(
                        "{:<20}  {:<16}  {:<30}  {:>11}  {}",
                        e.key,
                        e.model,
                        e.device,
                        e.micro_batch,
                        cache::format_date(e.created_unix)
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("batchfit: error: {e}");
                ExitCode::from(3)
            }
        },
        CacheAction::Clear => match cache::clear(&dir) {
            Ok(n) => {
                eprintln!(
                    "batchfit: removed {n} cached plan(s) from {}",
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("batchfit: error: {e}");
                ExitCode::from(3)
            }
        },
    }
}
