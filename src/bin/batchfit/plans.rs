//! The commands that read and write plans: `show`, `merge`, `verify`, `cache`, `predict`.

use batchfit::cli::{
    CacheAction, FormatArg, MergeArgs, ObserveArg, PredictArgs, PredictFormat, ShowArgs, VerifyArgs,
};
use batchfit::device::sim::SimSpec;
use batchfit::exit::{fail, print_stdout, Exit, Fail};
use batchfit::output;
use batchfit::output::progress::StderrProgress;
use batchfit::plan::merge::{self, MergeError, MergeOptions};
use batchfit::plan::Plan;
use batchfit::platform::files;
use batchfit::probe::cache;
use batchfit::probe::verify::{self, VerifyEnding};
use std::path::Path;

fn print_plan(plan: &Plan, format: Option<FormatArg>, path: &Path) -> Result<(), Fail> {
    let format = batchfit::cli::format_or_default(format);
    let s = output::render(plan, format, Some(path)).map_err(fail(Exit::Usage))?;
    print_stdout(&s)
}

fn write_plan(plan: &Plan, out: &Path) -> Result<(), Fail> {
    plan.write_atomic(out).map_err(fail(Exit::Environment))
}

/// `batchfit show PLAN --format ... [--plot FILE]`: an existing plan in another format.
pub fn show(args: &ShowArgs) -> Result<Exit, Fail> {
    if let Some(p) = args.plot.as_deref() {
        output::plot::check_target(p).map_err(fail(Exit::Usage))?;
        if files::same_target(p, &args.plan) {
            return Err(Fail(
                Exit::Usage,
                anyhow::anyhow!(
                    "--plot {} is the plan file itself: the picture would replace the plan; give \
                     the plot its own name",
                    p.display()
                ),
            ));
        }
    }
    let plan = Plan::read(&args.plan).map_err(fail(Exit::Usage))?;
    print_plan(&plan, args.format, &args.plan)?;
    if let Some(p) = args.plot.as_deref() {
        crate::probe::draw(&plan, p, args.plot_scale.into())?;
    }
    Ok(Exit::Success)
}

/// `batchfit merge A B … --global-batch G --out M`.
pub fn merge(a: &MergeArgs) -> Result<Exit, Fail> {
    if a.format == Some(FormatArg::Deepspeed) {
        return Err(Fail(
            Exit::Usage,
            anyhow::anyhow!(
                "--format deepspeed: a merged plan is not verified (its sizes were proven on other \
                 machines); merge with --format json, run `batchfit verify PLAN` on the machine \
                 that trains, then `batchfit show PLAN --format deepspeed`"
            ),
        ));
    }
    if a.format == Some(FormatArg::Deepspeed) && a.allow_uneven {
        return Err(Fail(
            Exit::Usage,
            anyhow::anyhow!(
                "--format deepspeed cannot express micro-batches of unequal size; drop \
                 --allow-uneven (or use --format json)"
            ),
        ));
    }
    files::check_target(&a.out).map_err(|e| Fail(Exit::Usage, anyhow::anyhow!("--out: {e}")))?;
    if let Some(src) = a.plans.iter().find(|p| files::same_file(&a.out, p)) {
        return Err(Fail(
            Exit::Usage,
            anyhow::anyhow!(
                "--out {} is the plan {} being merged: the merged plan (unverified) would replace \
                 that node's proven plan; give the merged plan its own name, e.g. --out merged.json",
                a.out.display(),
                src.display()
            ),
        ));
    }
    let opts = MergeOptions {
        plans: a.plans.clone(),
        global_batch: a.global_batch,
        world_size: a.world_size,
        allow_uneven: a.allow_uneven,
    };
    let plan = merge::merge(&opts).map_err(|e| match e {
        MergeError::Usage(_) | MergeError::Read(_) => Fail(Exit::Usage, e.into()),
    })?;
    write_plan(&plan, &a.out)?;
    print_plan(&plan, a.format, &a.out)?;
    batchfit::note!(
        "batchfit: merged plan written to {} (not verified: run `batchfit verify {}` on the machine \
         that trains)",
        a.out.display(),
        a.out.display()
    );
    Ok(Exit::Success)
}

/// `batchfit verify PLAN [--out FILE] [--sim SPEC]`.
pub fn verify(a: &VerifyArgs) -> Result<Exit, Fail> {
    let plan = Plan::read(&a.plan).map_err(fail(Exit::Usage))?;
    let sim = a
        .sim
        .as_deref()
        .map(SimSpec::parse)
        .transpose()
        .map_err(fail(Exit::Usage))?;
    let out = a.out.clone().unwrap_or_else(|| a.plan.clone());
    files::check_target(&out).map_err(|e| Fail(Exit::Usage, anyhow::anyhow!("--out: {e}")))?;
    crate::trial_setup()?;
    let mut progress = StderrProgress::new(a.quiet);
    let result = verify::verify(&plan, sim, a.observe == ObserveArg::On, &mut progress);
    progress.finish();
    let report = result.map_err(|e| Fail(e.exit(), e.into()))?;
    write_plan(&report.plan, &out)?;
    print_plan(&report.plan, a.format, &out)?;
    Ok(match report.ending {
        VerifyEnding::Verified => {
            batchfit::note!("batchfit: verified; plan written to {}", out.display());
            Exit::Success
        }
        VerifyEnding::Failed(why) => {
            batchfit::note!(
                "batchfit: not verified: {why}; the plan (verified: false, with the trial) is in {}",
                out.display()
            );
            // the next probe of this job runs again rather than answer from the cached plan
            if let Ok(dir) = cache::default_dir() {
                match cache::forget(&dir, &plan) {
                    Ok(0) => {}
                    Ok(_) => batchfit::note!(
                        "batchfit: the cached plan of this probe is removed (the next probe runs)"
                    ),
                    Err(e) => batchfit::note!("batchfit: warning: the cached plan stays: {e}"),
                }
            }
            Exit::Unproven
        }
        VerifyEnding::Interrupted(sig) => {
            batchfit::note!("batchfit: verification interrupted");
            Exit::Interrupted(sig)
        }
    })
}

/// `batchfit cache list|clear`.
pub fn cache(action: &CacheAction) -> Result<Exit, Fail> {
    let dir = cache::default_dir().map_err(fail(Exit::Environment))?;
    match action {
        CacheAction::List => {
            let entries = cache::list(&dir).map_err(fail(Exit::Environment))?;
            batchfit::note!("batchfit: cache {}", dir.display());
            let mut s = format!(
                "{:<20}  {:<16}  {:<30}  {:>11}  DATE (UTC)\n",
                "KEY", "MODEL", "DEVICE", "MICRO-BATCH"
            );
            for e in entries {
                s += &format!(
                    "{:<20}  {:<16}  {:<30}  {:>11}  {}\n",
                    e.key,
                    e.model,
                    e.device,
                    e.micro_batch,
                    cache::format_date(e.created_unix)
                );
            }
            print_stdout(&s)?;
        }
        CacheAction::Clear => {
            let n = cache::clear(&dir).map_err(fail(Exit::Environment))?;
            batchfit::note!(
                "batchfit: removed {n} cached plan(s) from {}",
                dir.display()
            );
        }
    }
    Ok(Exit::Success)
}

/// `batchfit predict PLAN --memory SIZES [--reserve SIZE] [--margin F] [--out FILE]`: the capacity
/// model's predictions (never proof), printed and, with `--out`, written as JSON.
pub fn predict(a: &PredictArgs) -> Result<Exit, Fail> {
    if let Some(out) = &a.out {
        files::check_target(out).map_err(|e| Fail(Exit::Usage, anyhow::anyhow!("--out: {e}")))?;
        if files::same_file(out, &a.plan) {
            return Err(Fail(
                Exit::Usage,
                anyhow::anyhow!(
                    "--out {} is the plan file itself: the predictions would replace the plan; \
                     give them their own name, e.g. --out pred.json",
                    out.display()
                ),
            ));
        }
    }
    let asked = batchfit::config::validate_predict(a).map_err(fail(Exit::Usage))?;
    let plan = Plan::read(&a.plan).map_err(fail(Exit::Usage))?;
    let report = batchfit::plan::capacity::report(
        &plan,
        &a.plan.display().to_string(),
        &asked.memory,
        asked.reserve,
        asked.margin,
    )
    .map_err(fail(Exit::Usage))?;
    let json = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
    if let Some(out) = &a.out {
        files::write_atomic(out, json.as_bytes()).map_err(fail(Exit::Environment))?;
    }
    let text = match a.format {
        Some(f) => f == PredictFormat::Text,
        None => std::io::IsTerminal::is_terminal(&std::io::stdout()),
    };
    if text {
        print_stdout(&batchfit::output::text::predict(&report))?;
    } else {
        print_stdout(&json)?;
    }
    Ok(Exit::Success)
}
