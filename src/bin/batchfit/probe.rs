//! `batchfit probe`: validate → probe → print the chosen format → plot → exit code.

use batchfit::cli::ProbeArgs;
use batchfit::config;
use batchfit::exit::{fail, print_stdout, Exit, Fail};
use batchfit::output::{self, plot, progress::StderrProgress, Format};
use batchfit::plan::Plan;
use batchfit::probe::{self, cache, Ending};

/// How `batchfit probe` uses the cache: none with `--no-cache` (or without a cache directory).
fn cache_options(args: &ProbeArgs) -> Option<cache::CacheOptions> {
    if args.no_cache {
        return None;
    }
    let dir = cache::default_dir().ok()?;
    Some(cache::CacheOptions {
        dir,
        read: !args.refresh,
        write: true,
    })
}

pub fn probe(args: &ProbeArgs) -> Result<Exit, Fail> {
    let cfg = config::validate(args).map_err(fail(Exit::Usage))?;
    crate::trial_setup()?;
    let quiet = cfg.quiet;
    let mut progress = StderrProgress::new(quiet);
    let result = probe::run_cached(&cfg, &mut progress, cache_options(args).as_ref());
    progress.finish();
    let report = result.map_err(|e| Fail(e.exit(), e.into()))?;
    for n in &report.notices {
        batchfit::note!("{n}");
    }
    // BATCHFIT_PLAN only names a complete plan (a partial one has no recommendation to export).
    let plan_path = report
        .written
        .as_deref()
        .filter(|_| report.ending == Ending::Complete);
    match output::render(&report.plan, cfg.format, plan_path) {
        Ok(s) => print_stdout(&s)?,
        // (no recommendation: the exit code and the summary say why; nothing to add)
        Err(output::OutputError::NoRecommendation(_)) => {}
        Err(e) => batchfit::note!("batchfit: error: {e}"),
    }
    if !quiet && cfg.format != Format::Text {
        batchfit::note!("{}", output::text::summary(&report.plan).trim_end());
    }
    if let Some(p) = report.written.as_ref().filter(|_| !quiet) {
        batchfit::note!("batchfit: plan written to {}", p.display());
    }
    // Drawn after the plan is written (partial plans too); a failure leaves the plan as written and
    // exits 3, unless the probe's own exit code already says something went wrong.
    let plotted = match cfg.plot.as_deref() {
        Some(p) => match draw(&report.plan, p, cfg.plot_scale) {
            Ok(()) => {
                if !quiet {
                    batchfit::note!("batchfit: plot drawn to {}", p.display());
                }
                true
            }
            Err(Fail(_, e)) => {
                batchfit::note!("batchfit: error: {e:#}");
                false
            }
        },
        None => true,
    };
    Ok(match report.ending {
        Ending::Complete if !plotted => Exit::Environment,
        ending => ending.exit(),
    })
}

/// `--plot FILE`: draws the plan; a bad file name is a usage error, a failure to draw or write an
/// environment error.
pub fn draw(plan: &Plan, path: &std::path::Path, scale: plot::Scale) -> Result<(), Fail> {
    plot::render_scaled(plan, path, scale).map_err(|e| {
        let exit = match e {
            plot::PlotError::Target(_) => Exit::Usage,
            _ => Exit::Environment,
        };
        Fail(exit, e.into())
    })
}
