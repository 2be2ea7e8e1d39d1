//! `batchfit probe`: from a validated [`ProbeConfig`] to a written plan.
//!
//! ```text
//! run_cached ─ setup::resolve (auto → cuda | cpu | sim) ─ setup::skeleton (budget → limit)
//!            ├ cache::lookup ── hit → the cached plan
//!            ├ single::run    ── one device: search, then split::confirmed
//!            └ multi_gpu::run ── each GPU's search in parallel (single::search), split confirmed on all
//!            → report::write (--out, or NAME.partial.json) → cache::store
//! ```
//! The search ([`crate::search`]) owns the proof; this module wires it to a device, solves the
//! accumulation split (proving each split size with its accumulation), and writes the plan. Like
//! hyperfine's exporters, the partial plan is rewritten after every trial, so a crash or an
//! interruption keeps what was measured; only a complete plan is written to `--out`. `batchfit
//! verify` ([`verify`]) re-runs a plan's sizes with the same set-up.

pub mod cache;
pub mod first_trial;
pub mod multi_gpu;
pub mod report;
pub mod setup;
pub mod single;
pub mod split;
pub mod sweep;
pub mod verify;

pub use report::{progress_line, Ending, ProbeError, ProbeReport, Progress};

use crate::config::{Parallel, ProbeConfig};
use crate::device::lanes::{Lane, Lanes};
use crate::device::sim::SimBackend;
use crate::device::Backend;
use crate::plan::{self, GpuSection, Plan, Status};
use crate::platform::units::format_size;
use cache::CacheOptions;
use setup::Devices;

/// The validated configuration of `batchfit probe ARGS…`, for unit tests.
#[cfg(test)]
pub(crate) fn config_of(args: &[&str]) -> ProbeConfig {
    use clap::Parser;
    let argv = ["batchfit", "probe"].iter().chain(args);
    let cli = crate::cli::Cli::try_parse_from(argv).expect("arguments parse");
    let crate::cli::Command::Probe(args) = cli.command else {
        unreachable!("a probe's arguments")
    };
    crate::config::validate(&args).expect("a valid probe")
}

/// The plan of `batchfit probe ARGS…` (a sim probe, in milliseconds), for the unit tests of the
/// modules that read plans.
#[cfg(test)]
pub(crate) fn sim_plan(args: &[&str]) -> Plan {
    run(&config_of(args), &mut |_| {})
        .expect("the probe runs")
        .plan
}

/// [`run_cached`] without the cache, with progress as plain lines.
pub fn run(cfg: &ProbeConfig, progress: &mut dyn FnMut(&str)) -> Result<ProbeReport, ProbeError> {
    run_cached(cfg, &mut report::Lines(progress), None)
}

/// [`run_cached`] without the cache.
pub fn run_with(cfg: &ProbeConfig, progress: &mut dyn Progress) -> Result<ProbeReport, ProbeError> {
    run_cached(cfg, progress, None)
}

/// Probes as `cfg` says (trials are `exe`'s hidden subcommands), answering from the plan cache
/// ([`cache`]) when `cache` allows it and the key matches, and storing a complete plan there.
pub fn run_cached(
    cfg: &ProbeConfig,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    if let Some(out) = &cfg.out {
        report::hold_out(out)?;
    }
    if let Some(sw) = &cfg.sweep {
        return sweep::run(cfg, sw, progress, cache);
    }
    let mut notices = vec![];
    let devices = setup::resolve(cfg, &mut notices)?;
    // The device choice and the config's warnings are news before the search, not after it.
    for n in notices.drain(..) {
        progress.line(&n);
    }
    for n in &cfg.notes {
        progress.line(n);
    }
    // (the {batch} warning waits for the trials' reports: the plan's summary says it, once; before
    // the trials, a note says how the size reaches the job)
    for w in &cfg.warnings {
        match w.as_str() {
            crate::config::NO_BATCH_WARNING => {
                progress.line(&format!("batchfit: note: {}", crate::config::NO_BATCH_NOTE))
            }
            w => progress.line(&format!("batchfit: warning: {w}")),
        }
    }
    // Fault injection is a test of the trial runner: never answered from, nor stored in, the cache.
    let cache = cache.filter(|_| cfg.fault.is_none());
    match devices {
        Devices::Sim(spec) => {
            let mut sims: Vec<SimBackend> = (0..cfg.parallel.asked().max(1))
                .map(|_| SimBackend::new(spec.clone()))
                .collect();
            let mut set = side_by_side(&mut sims);
            one_device(cfg, &mut set, None, None, progress, cache)
        }
        Devices::Cpu => {
            let mut cpus = setup::cpu_backends(cfg, &mut notices)?;
            for n in notices.drain(..) {
                progress.line(&n);
            }
            let mut set = side_by_side(&mut cpus);
            if cfg.parallel == Parallel::Auto {
                set = set.exploring_alone();
            }
            one_device(cfg, &mut set, None, None, progress, cache)
        }
        Devices::Cuda(_) if cfg.parallel.asked() > 1 => Err(ProbeError::Usage(format!(
            "--parallel {} is for the cpu and sim backends, and --backend auto chose cuda: give \
             --gpus (identical GPUs run one trial each per round by themselves), or --backend cpu",
            cfg.parallel.asked()
        ))),
        Devices::Cuda(gpus) => {
            let (c, note) = setup::cuda_effective(cfg, &gpus)?;
            if gpus.indices.len() > 1 && c.workload.is_the_whole_job() {
                return one_job_on_several_gpus(&c, &gpus, note, progress, cache);
            }
            if gpus.indices.len() > 1 {
                return several_gpus(&c, &gpus, note, progress, cache);
            }
            let mut b = gpus.backend(gpus.indices[0], &c)?;
            let section = gpus.section(&b, &c);
            one_device(&c, &mut b, Some(section), note, progress, cache)
        }
    }
}

/// `devices` as one device that runs a round of trials at once, one on each (one device: trials
/// one at a time, as always).
fn side_by_side<B: Backend + Send>(devices: &mut [B]) -> Lanes<'_> {
    Lanes::new(
        devices
            .iter_mut()
            .map(|b| Lane {
                backend: b as &mut (dyn Backend + Send),
                gpu: None,
            })
            .collect(),
    )
}

/// The plan for `key` from the cache, written to `--out`, when the cache has a usable one; a
/// rejected entry adds a notice to `notices` (and the probe runs).
fn from_cache(
    cfg: &ProbeConfig,
    cache: Option<&CacheOptions>,
    key: Option<&String>,
    skeleton: Option<&Plan>,
    notices: &mut Vec<String>,
) -> Result<Option<ProbeReport>, ProbeError> {
    let (Some(c), Some(key)) = (cache.filter(|c| c.read), key) else {
        return Ok(None);
    };
    let mut plan = match cache::lookup(&c.dir, key, skeleton) {
        cache::Lookup::Hit(p) => *p,
        cache::Lookup::Miss => return Ok(None),
        cache::Lookup::Rejected(why) => {
            notices.push(format!(
                "batchfit: warning: cache entry not used, probing again: {why}"
            ));
            return Ok(None);
        }
    };
    // A plan cached by an earlier build has no capacity model: every plan gets one.
    if plan.capacity_model.is_none() {
        plan.capacity_model = plan::CapacityModel::fit(&plan.trials, plan.limit_bytes);
    }
    let notice = format!(
        "batchfit: plan from cache ({}, probed {}; --refresh re-probes, --no-cache ignores the cache)",
        c.dir.join(format!("{key}.json")).display(),
        cache::format_date(plan.created_unix)
    );
    let written = report::write(cfg.out.as_deref(), &plan)?;
    Ok(Some(ProbeReport {
        plan,
        ending: Ending::Complete,
        written,
        notices: vec![notice],
    }))
}

/// Writes the finished plan (`--out` or its `.partial` sibling) and stores a complete one in the cache.
fn finish(
    cfg: &ProbeConfig,
    plan: Plan,
    ending: Ending,
    cache: Option<&CacheOptions>,
    key: Option<&String>,
    mut notices: Vec<String>,
) -> Result<ProbeReport, ProbeError> {
    let mut plan = plan;
    let (uncacheable, environment) = record_read_files(&mut plan);
    let written = report::write(cfg.out.as_deref(), &plan)?;
    let cache = cache.filter(|c| c.write);
    if let (Some(_), Status::Complete, Some(why)) = (cache, plan.status, uncacheable) {
        notices.push(format!("batchfit: {why}"));
    }
    let cache = cache.filter(|_| uncacheable.is_none());
    if let (Some(c), Some(key), Status::Complete) = (cache, key, plan.status) {
        if let Err(e) = cache::store(&c.dir, key, &plan, environment.as_deref()) {
            notices.push(format!("batchfit: warning: the plan was not cached: {e}"));
        }
    }
    Ok(ProbeReport {
        plan,
        ending,
        written,
        notices,
    })
}

/// An `--exec` plan records the files its trials' reports say the command read, with their hashes,
/// and the summary of the installed packages they ran with (moved out of each trial's report).
/// Why the plan may not be answered from the cache later, if not: an `--exec` plan that does not
/// know what the command reads (neither the helper's reports nor `--fingerprint-file`), or whose
/// helper reports what it reads but not its installed packages; and the record of those packages
/// that the cache stores beside the plan.
fn record_read_files(plan: &mut Plan) -> (Option<&'static str>, Option<Vec<u8>>) {
    let read = cache::read_files(&plan.trials);
    let environment = cache::python_environment(&plan.trials);
    for d in plan.trials.iter_mut().filter_map(|t| t.details.as_mut()) {
        for r in d.report.iter_mut().chain(d.rank_reports.iter_mut()) {
            r.read_files = None;
            r.python_environment = None;
        }
    }
    let plan::WorkloadInfo::Exec(info) = &mut plan.model else {
        return (None, None);
    };
    let (summary, record) = environment
        .as_ref()
        .map(plan::schema::EnvironmentSummary::of)
        .unzip();
    info.read_files = read;
    info.python_environment = summary.map(plan::schema::PlanEnvironment::Summary);
    let why = if info.read_files.is_none() && info.fingerprint_files.is_empty() {
        Some(cache::NO_HELPER_DATA)
    } else if info.read_files.is_some() && info.python_environment.is_none() {
        Some(cache::NO_ENVIRONMENT_DATA)
    } else {
        None
    };
    (why, record)
}

fn one_device(
    cfg: &ProbeConfig,
    backend: &mut dyn Backend,
    gpu: Option<GpuSection>,
    reserve_note: Option<String>,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    let (skeleton, limit) = setup::skeleton(cfg, backend, gpu, reserve_note)?;
    let key = cache.map(|_| cache::key(&skeleton, cfg));
    let mut notices = vec![];
    if let Some(hit) = from_cache(cfg, cache, key.as_ref(), Some(&skeleton), &mut notices)? {
        return Ok(hit);
    }
    progress.line(&format!(
        "batchfit: {} on {} ({}): budget {}, limit {} ({})",
        skeleton.model.name(),
        skeleton.device.kind,
        skeleton.device.name,
        format_size(skeleton.budget_bytes),
        format_size(limit),
        match skeleton.model.parameter_count() {
            Some(n) => format!("{n} params"),
            None => format!(
                "limited by {}",
                skeleton
                    .limit_mechanism
                    .map_or("the device", |m| m.as_str())
            ),
        }
    ));
    if let Some(n) = first_contact(cfg, &skeleton) {
        progress.line(&n);
    }
    let (mut plan, ending) = single::run(cfg, backend, &skeleton, limit, progress)?;
    if cfg.compare_alloc_conf && plan.status == Status::Complete && plan.gpu.is_some() {
        let comparison = compare_alloc_conf(cfg, progress, &plan)?;
        if let Some(g) = plan.gpu.as_mut() {
            g.alloc_conf_comparison = Some(comparison);
        }
    }
    finish(cfg, plan, ending, cache, key.as_ref(), notices)
}

/// What a probe without `--memory-budget` on the cpu is about to do, said before it does it: it
/// takes most of the machine's memory, runs real training steps, and may take minutes.
fn first_contact(cfg: &ProbeConfig, skeleton: &Plan) -> Option<String> {
    if cfg.budget.is_some() || skeleton.device.kind != crate::device::DeviceKind::Cpu {
        return None;
    }
    Some(format!(
        "batchfit: no --memory-budget given, so the budget is {:.0}% of the memory available now \
         ({} of {}). Each trial is a fresh process running real training steps of {}; a cpu probe \
         usually takes a few minutes (each trial is reported as it ends; Ctrl-C stops it and keeps \
         a partial plan). --memory-budget SIZE sets the budget; --backend sim --sim \
         base=1GiB,per-sample=3MiB,capacity=16GiB shows the search in milliseconds.",
        crate::device::cpu::DEFAULT_BUDGET_FRACTION * 100.0,
        format_size(skeleton.device.free_bytes_at_start),
        format_size(skeleton.device.total_bytes),
        skeleton.model.name()
    ))
}

/// A user's command over several GPUs (`--exec -- torchrun --nproc-per-node N …`): one job, each
/// trial on all of them, each GPU held to the limit; every GPU's peak of the recommended size in
/// `gpu.per_gpu`.
fn one_job_on_several_gpus(
    cfg: &ProbeConfig,
    gpus: &setup::CudaSetup,
    reserve_note: Option<String>,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    let (first, rest) = gpus.indices.split_first().expect("several GPUs");
    let mut b = gpus
        .backend(*first, cfg)?
        .with_group(rest)
        .map_err(|e| ProbeError::Environment(e.to_string()))?;
    let section = gpus.section(&b, cfg);
    progress.line(&format!(
        "batchfit: one job on GPUs {} (CUDA_VISIBLE_DEVICES holds all of them in every trial)",
        gpus.list()
    ));
    let mut report = one_device(cfg, &mut b, Some(section), reserve_note, progress, cache)?;
    let plan = &mut report.plan;
    let peaks: Vec<(u32, u64)> = plan
        .recommendation
        .as_ref()
        .and_then(|r| single::best_fit(&plan.trials, r.micro_batch))
        .and_then(|t| t.details.as_ref())
        .map(|d| d.gpu_peaks.clone())
        .unwrap_or_default();
    let per_gpu = gpus
        .indices
        .iter()
        .filter_map(|&i| gpus.gpus.device(i).ok())
        .map(|g| plan::PerGpu {
            index: g.index,
            name: g.name.clone(),
            uuid: g.uuid.clone(),
            free_bytes_at_start: g.free_bytes,
            max_fitting_batch: plan.recommendation.as_ref().map(|r| r.max_fitting_batch),
            first_failing_batch: plan
                .recommendation
                .as_ref()
                .and_then(|r| r.first_failing_batch),
            trials: plan.trials.len(),
            confirmed: plan.status == Status::Complete,
            peak_bytes: peaks.iter().find(|(j, _)| *j == g.index).map(|(_, p)| *p),
        })
        .collect();
    if let Some(g) = plan.gpu.as_mut() {
        g.per_gpu = per_gpu;
    }
    if let Some(w) = &report.written {
        plan.write_atomic(w)?;
    }
    Ok(report)
}

fn several_gpus(
    cfg: &ProbeConfig,
    gpus: &setup::CudaSetup,
    reserve_note: Option<String>,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    if cfg.compare_alloc_conf {
        return Err(ProbeError::Usage(format!(
            "--compare-alloc-conf compares two probes of one GPU, and --gpus selects {} ({}); give \
             one GPU, e.g. --gpus {}",
            gpus.indices.len(),
            gpus.list(),
            gpus.indices[0]
        )));
    }
    let mut devices = vec![];
    for &i in &gpus.indices {
        let b = gpus.backend(i, cfg)?;
        let section = gpus.section(&b, cfg);
        let (skeleton, limit) = setup::skeleton(cfg, &b, Some(section), reserve_note.clone())?;
        devices.push(multi_gpu::Gpu::new(i, b, skeleton, limit));
    }
    let key = cache.map(|_| {
        let keys: Vec<String> = devices
            .iter()
            .map(|g| cache::key(&g.skeleton, cfg))
            .collect();
        cache::combine(&keys)
    });
    let mut notices = vec![];
    if let Some(hit) = from_cache(cfg, cache, key.as_ref(), None, &mut notices)? {
        return Ok(hit);
    }
    let (plan, ending) = multi_gpu::run(cfg, gpus, &mut devices, progress)?;
    finish(cfg, plan, ending, cache, key.as_ref(), notices)
}

/// `--compare-alloc-conf`: the same probe once more with `expandable_segments:True` added to
/// `PYTORCH_CUDA_ALLOC_CONF` (fewer, growable segments: less fragmentation), reported beside the plan.
fn compare_alloc_conf(
    cfg: &ProbeConfig,
    progress: &mut dyn Progress,
    plan: &Plan,
) -> Result<plan::AllocConfComparison, ProbeError> {
    let conf = match cfg.alloc_conf.as_deref() {
        Some(c) if c.contains("expandable_segments") => c
            .split(',')
            .map(|p| {
                if p.trim().starts_with("expandable_segments") {
                    "expandable_segments:True"
                } else {
                    p
                }
            })
            .collect::<Vec<_>>()
            .join(","),
        Some(c) => format!("{c},expandable_segments:True"),
        None => "expandable_segments:True".to_string(),
    };
    progress.line(&format!(
        "batchfit: --compare-alloc-conf: probing again with PYTORCH_CUDA_ALLOC_CONF={conf}"
    ));
    let mut c = cfg.clone();
    c.compare_alloc_conf = false;
    c.out = None;
    c.global = None;
    c.alloc_conf = Some(conf.clone());
    c.world_size_given = true;
    let other = run_cached(&c, progress, None)?.plan;
    let theirs = other.recommendation.as_ref().map(|r| r.max_fitting_batch);
    let ours = plan.recommendation.as_ref().map(|r| r.max_fitting_batch);
    Ok(plan::AllocConfComparison {
        alloc_conf: conf,
        max_fitting_batch: theirs,
        peak_bytes: other.recommendation.as_ref().map(|r| r.peak_bytes),
        trials: other.trials.len(),
        difference: match (theirs, ours) {
            (Some(t), Some(o)) => Some(t as i64 - o as i64),
            _ => None,
        },
    })
}
