//! `batchfit probe`: from a validated [`ProbeConfig`] to a written plan.
//!
//! Picks the backend, turns budget/reserve/margin into the limit, runs the search, solves the
//! accumulation split (confirming any size the split picks that no trial ran), and writes the plan.
//! Like hyperfine's exporters, the partial plan is rewritten after every trial, so a crash or an
//! interruption keeps what was measured; only a complete search writes `--out` (atomically).

use crate::accumulate;
use crate::backend::cpu::CpuBackend;
use crate::backend::sim::SimBackend;
use crate::backend::{cuda, Backend};
use crate::cache::CacheOptions;
use crate::config::{self, BackendChoice, ProbeConfig};
use crate::plan::{self, ModelInfo, Plan, Recommendation, Runtime, SearchSettings, Status, Tool};
use crate::search::{Prober, Purpose, SearchOutcome, Stop, StopReason, TrialRecord};
use crate::sysmem;
use crate::throughput;
use crate::trial::TrialSpec;
use crate::units::format_size;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// The smallest limit under which a libtorch process starts at all on CPU (data segment, measured).
pub const CPU_MIN_LIMIT: u64 = 600 << 20;

#[derive(Debug, Error)]
pub enum ProbeError {
    /// Bad input discovered once the device is known (budget vs device).
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Environment(String),
    #[error("cannot write the plan: {0}")]
    Write(#[from] plan::PlanError),
}

/// How the probe ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Complete,
    NothingFits,
    TrialErrors,
    Capped,
    Interrupted(i32),
}

#[derive(Debug)]
pub struct ProbeReport {
    pub plan: Plan,
    pub ending: Ending,
    /// Where the plan was written (the `--out` file or its `.partial` sibling).
    pub written: Option<PathBuf>,
    /// Notices for stderr (backend choice, warnings).
    pub notices: Vec<String>,
}

fn make_backend(
    cfg: &ProbeConfig,
    exe: &Path,
    notices: &mut Vec<String>,
) -> Result<Box<dyn Backend>, ProbeError> {
    let cpu = || -> Result<Box<dyn Backend>, ProbeError> {
        let template = TrialSpec {
            model: cfg.model.clone(),
            batch: 0,
            steps: 0,
            threads: cfg.threads,
            seed: cfg.seed,
            accumulation: 1,
            fault: cfg.fault,
        };
        Ok(Box::new(
            CpuBackend::new(
                exe.to_path_buf(),
                template,
                cfg.trial_timeout,
                cfg.isolation,
            )
            .map_err(|e| ProbeError::Environment(e.to_string()))?,
        ))
    };
    match &cfg.backend {
        BackendChoice::Sim(spec) => Ok(Box::new(SimBackend::new(spec.clone()))),
        BackendChoice::Cpu => cpu(),
        BackendChoice::Cuda => Err(ProbeError::Environment(cuda::unavailable().to_string())),
        BackendChoice::Auto => {
            notices.push(format!(
                "batchfit: --backend auto: using the cpu backend ({})",
                auto_reason()
            ));
            cpu()
        }
    }
}

/// Why `--backend auto` chose the cpu: CUDA is picked only when tch sees CUDA *and* NVML initialises,
/// and GPU trials are available in this build.
fn auto_reason() -> String {
    let nvml = crate::gpu::nvml::RealNvml::get();
    if !tch::Cuda::is_available() {
        return "libtorch sees no CUDA device".into();
    }
    if let Err(e) = nvml {
        return format!("NVML is unavailable: {e}");
    }
    "a GPU is present, but GPU trials are not available in this build yet; --backend cuda says more"
        .into()
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One progress line for stderr.
pub fn progress_line(n: usize, t: &TrialRecord, limit: u64) -> String {
    let peak = t
        .outcome
        .peak_bytes()
        .map(|p| {
            format!(
                "peak {:>10} ({:>3.0}% of limit)",
                format_size(p),
                100.0 * p as f64 / limit.max(1) as f64
            )
        })
        .unwrap_or_default();
    let msg = match (&t.outcome, t.outcome.message()) {
        (o, Some(m)) if !o.is_oom() => format!("  {m}"),
        _ => String::new(),
    };
    format!(
        "trial {n:>3}: batch {:>8} × {} steps {:<8} {:<7} {peak} {:>7.2} s{msg}",
        t.batch,
        t.steps,
        format!("{:?}", t.purpose).to_lowercase(),
        t.outcome.kind(),
        t.seconds
    )
}

/// Receives the probe's progress: lines for stderr, and every trial as it ends.
pub trait Progress {
    fn line(&mut self, line: &str);
    /// Trial number `n` (1-based) ended. Default: one [`progress_line`].
    fn trial(&mut self, n: usize, t: &TrialRecord, limit: u64) {
        self.line(&progress_line(n, t, limit));
    }
}

struct Lines<'a>(&'a mut dyn FnMut(&str));

impl Progress for Lines<'_> {
    fn line(&mut self, line: &str) {
        (self.0)(line)
    }
}

/// [`run_with`] with progress as plain lines.
pub fn run(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<ProbeReport, ProbeError> {
    run_with(cfg, exe, &mut Lines(progress))
}

pub fn run_with(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn Progress,
) -> Result<ProbeReport, ProbeError> {
    run_cached(cfg, exe, progress, None)
}

/// [`run_with`], answering from the plan cache ([`crate::cache`]) when `cache` allows it and the key
/// matches, and storing a complete plan there.
pub fn run_cached(
    cfg: &ProbeConfig,
    exe: &Path,
    progress: &mut dyn Progress,
    cache: Option<&CacheOptions>,
) -> Result<ProbeReport, ProbeError> {
    let mut notices = vec![];
    let mut backend = make_backend(cfg, exe, &mut notices)?;
    // The backend choice is news before the search, not after it.
    for n in notices.drain(..) {
        progress.line(&n);
    }
    let device = backend.device().clone();
    let device_kind = device.kind.clone();
    let budget = cfg.budget.unwrap_or_else(|| backend.default_budget());
    if budget > device.total_bytes {
        return Err(ProbeError::Usage(format!(
            "--memory-budget {} is larger than the device's {} ({}); give at most {}",
            format_size(budget),
            format_size(device.total_bytes),
            device.name,
            format_size(device.total_bytes)
        )));
    }
    if cfg.reserve >= budget {
        return Err(ProbeError::Usage(format!(
            "--reserve {} leaves nothing of the {} budget; lower --reserve",
            format_size(cfg.reserve),
            format_size(budget)
        )));
    }
    let limit = config::limit(budget, cfg.reserve, cfg.margin);
    if device.kind == "cpu" && limit < CPU_MIN_LIMIT {
        return Err(ProbeError::Usage(format!(
            "the limit {} (budget {} − reserve {}, less the {:.0}% margin) is below the {} a libtorch process \
             needs to start on CPU; raise --memory-budget",
            format_size(limit),
            format_size(budget),
            format_size(cfg.reserve),
            cfg.margin * 100.0,
            format_size(CPU_MIN_LIMIT)
        )));
    }
    let world = cfg.world_size;
    let skeleton = Plan {
        schema_version: plan::SCHEMA_VERSION,
        status: Status::Partial,
        created_unix: now_unix(),
        tool: Tool::current(),
        device,
        model: ModelInfo::of(&cfg.model),
        runtime: Runtime {
            threads: cfg.threads,
            seed: cfg.seed,
            malloc_mmap_threshold: sysmem::MMAP_THRESHOLD,
            malloc_arena_max: sysmem::ARENA_MAX,
        },
        budget_bytes: budget,
        reserve_bytes: cfg.reserve,
        margin: cfg.margin,
        limit_bytes: limit,
        search: SearchSettings::of(
            &cfg.search,
            cfg.trial_timeout.as_secs_f64(),
            (device_kind != "sim").then_some(cfg.isolation),
        ),
        recommendation: None,
        stop_reason: StopReason::Interrupted,
        stop_detail: "search in progress".into(),
        trials: vec![],
        warnings: vec![],
        verified: None,
        sources: vec![],
        sim_spec: match &cfg.backend {
            BackendChoice::Sim(s) => Some(s.clone()),
            _ => None,
        },
    };
    let partial = cfg.out.as_deref().map(plan::partial_path);
    // Fault injection is a test of the trial runner: never answered from, nor stored in, the cache.
    let cache = cache.filter(|_| cfg.fault.is_none());
    let cache_key = cache.map(|_| crate::cache::key(&skeleton, cfg));
    if let (Some(c), Some(key)) = (cache.filter(|c| c.read), &cache_key) {
        if let Some(plan) = crate::cache::lookup(&c.dir, key) {
            notices.push(format!(
                "batchfit: plan from cache ({}, probed {}; --refresh re-probes, --no-cache ignores the cache)",
                c.dir.join(format!("{key}.json")).display(),
                crate::cache::format_date(plan.created_unix)
            ));
            let written = match &cfg.out {
                Some(out) => {
                    plan.write_atomic(out)?;
                    if let Some(p) = &partial {
                        let _ = std::fs::remove_file(p);
                    }
                    Some(out.clone())
                }
                None => None,
            };
            return Ok(ProbeReport {
                plan,
                ending: Ending::Complete,
                written,
                notices,
            });
        }
    }
    progress.line(&format!(
        "batchfit: {} on {} ({}): budget {}, limit {} ({} params)",
        skeleton.model.name,
        skeleton.device.kind,
        skeleton.device.name,
        format_size(budget),
        format_size(limit),
        skeleton.model.parameter_count
    ));

    let mut write_error = None;
    let mut non_monotonic: Vec<(u64, bool)> = vec![];
    let mut accumulation_failures: Vec<(u64, u32)> = vec![];
    let (outcome, split_result) = {
        let sk = &skeleton;
        let partial = partial.clone();
        let write_error = &mut write_error;
        let progress = &mut *progress;
        let mut prober =
            Prober::new(backend.as_mut(), cfg.search.clone(), limit).on_trial(move |t, all| {
                progress.trial(all.len(), t, limit);
                if let Some(p) = &partial {
                    let mut snap = sk.clone();
                    snap.trials = all.to_vec();
                    if let Err(e) = snap.write_atomic(p) {
                        *write_error = Some(e);
                    }
                }
            });
        let outcome = prober.search();
        // Accumulation split, and a confirmation trial for a split size no trial ran.
        let split_result = match (outcome.max_fitting, outcome.stop_reason.is_complete()) {
            (Some(max), true) => {
                let (g, w) = cfg.global.unwrap_or((max * world, world));
                // Each split is proven the way the trainer runs it: its micro-batch with its
                // accumulation (accumulating holds more memory than one micro-batch alone). If that
                // fails, the split is recomputed below the failing size (a few times at most).
                let mut cap = max;
                let mut result = None;
                for _ in 0..8 {
                    let s = match accumulate::split(g, w, cap, cfg.allow_uneven) {
                        Ok(s) => s,
                        Err(e) => {
                            result = Some(Err(Stop::Fatal(e.to_string())));
                            break;
                        }
                    };
                    let acc = s.accumulation.min(u32::MAX as u64) as u32;
                    let mut sizes = s.micro_batches.clone();
                    sizes.sort_unstable();
                    sizes.dedup();
                    let mut confirmed: Result<(), Stop> = Ok(());
                    let mut lower_cap = None;
                    for b in sizes.into_iter().rev() {
                        // A failure of a size below a proven fit (accumulation 1) means memory is
                        // not monotonic in the batch size here: re-test once, then resolve
                        // conservatively (no recommendation of that split) and flag it.
                        let first = prober.confirm_split(b, acc, Purpose::Split);
                        if acc > 1 {
                            match first {
                                Ok(true) => continue,
                                Ok(false) => {
                                    accumulation_failures.push((b, acc));
                                    lower_cap = Some(b - 1);
                                }
                                Err(e) => confirmed = Err(e),
                            }
                            break;
                        }
                        let again = match first {
                            Ok(false) => {
                                let retest = prober.confirm_split(b, acc, Purpose::Retry);
                                non_monotonic.push((b, matches!(retest, Ok(true))));
                                retest.map(|_| false)
                            }
                            other => other,
                        };
                        match again {
                            Ok(true) => {}
                            Ok(false) => {
                                confirmed = Err(Stop::Fatal(format!(
                                    "micro-batch {b} chosen by the accumulation split did not fit although {max} \
                                     did: memory is not monotonic in the batch size here; re-run with --global-batch \
                                     a multiple of {max}"
                                )));
                                break;
                            }
                            Err(e) => {
                                confirmed = Err(e);
                                break;
                            }
                        }
                    }
                    match lower_cap {
                        Some(c) if c > 0 => cap = c,
                        Some(_) => {
                            result = Some(Err(Stop::Fatal(
                                "no micro-batch fits with gradient accumulation".into(),
                            )));
                            break;
                        }
                        None => {
                            result = Some(confirmed.map(|_| s));
                            break;
                        }
                    }
                }
                Some(result.unwrap_or_else(|| {
                    Err(Stop::Fatal(
                        "every accumulation split tried ran out of memory; lower the global batch or the budget's \
                         pressure"
                            .into(),
                    ))
                }))
            }
            _ => None,
        };
        let outcome = SearchOutcome {
            trials: prober.trials().to_vec(),
            ..outcome
        };
        (outcome, split_result)
    };
    if let Some(e) = write_error {
        return Err(e.into());
    }

    let mut plan = skeleton.clone();
    plan.trials = outcome.trials.clone();
    for (b, a) in &accumulation_failures {
        plan.warnings.push(format!(
            "micro-batch {b} fits alone but ran out of memory with {a} accumulated micro-batches (gradient \
             accumulation holds more memory); the split was recomputed below {b}"
        ));
    }
    for (b, retest_fit) in &non_monotonic {
        plan.warnings.push(format!(
            "non-monotonic memory: micro-batch {b} ran out of memory although {} fit; the re-test {}; \
             resolved conservatively: no recommendation relies on {b}",
            outcome.max_fitting.unwrap_or(0),
            if *retest_fit { "fit (flaky near the limit)" } else { "ran out of memory again" }
        ));
    }
    plan.stop_reason = outcome.stop_reason;
    plan.stop_detail = outcome
        .fatal
        .clone()
        .unwrap_or_else(|| outcome.stop_reason.describe().to_string());
    let mut ending = match outcome.stop_reason {
        r if r.is_complete() => Ending::Complete,
        StopReason::NothingFits => Ending::NothingFits,
        StopReason::Interrupted => {
            Ending::Interrupted(outcome.interrupted_by.unwrap_or(libc::SIGINT))
        }
        StopReason::MaxTrials | StopReason::TimeLimit => Ending::Capped,
        StopReason::TrialErrors => Ending::TrialErrors,
        _ => Ending::TrialErrors,
    };
    match split_result {
        Some(Ok(s)) => {
            let max = outcome.max_fitting.expect("split only with a fit");
            let rec = outcome
                .trials
                .iter()
                .filter(|t| t.batch == s.micro_batch && t.outcome.fits())
                .max_by_key(|t| (t.accumulation, t.steps))
                .expect("split size confirmed");
            let mut r = Recommendation::from_split(&s, max, outcome.first_failing, rec);
            if let Some(a) = throughput::advise(
                &outcome.trials,
                cfg.search.steps,
                cfg.search.confirm_steps,
                cfg.throughput_tolerance,
                r.micro_batch,
            ) {
                r.fastest_micro_batch = Some(a.fastest.batch);
                r.fastest_samples_per_second = Some(a.fastest.samples_per_second);
            }
            plan.recommendation = Some(r);
            if let Some(w) = &s.warning {
                plan.warnings.push(w.clone());
            }
            plan.status = Status::Complete;
        }
        Some(Err(stop)) => {
            match stop {
                Stop::Interrupted(sig) => {
                    plan.stop_reason = StopReason::Interrupted;
                    plan.stop_detail = StopReason::Interrupted.describe().into();
                    ending = Ending::Interrupted(sig);
                }
                Stop::Reason(r) => {
                    plan.stop_reason = r;
                    plan.stop_detail = r.describe().into();
                    ending = Ending::Capped;
                }
                Stop::Fatal(m) => {
                    plan.stop_reason = StopReason::TrialErrors;
                    plan.stop_detail = m;
                    ending = Ending::TrialErrors;
                }
            }
            plan.status = Status::Partial;
        }
        None => {
            plan.status = if ending == Ending::NothingFits {
                Status::NothingFits
            } else {
                Status::Partial
            };
        }
    }

    let written = match (&cfg.out, plan.status) {
        (Some(out), Status::Complete) => {
            plan.write_atomic(out)?;
            if let Some(p) = &partial {
                let _ = std::fs::remove_file(p);
            }
            Some(out.clone())
        }
        (Some(_), _) => {
            let p = partial.expect("partial path with --out");
            plan.write_atomic(&p)?;
            Some(p)
        }
        (None, _) => None,
    };
    if let (Some(c), Some(key), Status::Complete) =
        (cache.filter(|c| c.write), &cache_key, plan.status)
    {
        if let Err(e) = crate::cache::store(&c.dir, key, &plan) {
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

/// A human summary of a plan.
pub fn summary(plan: &Plan) -> String {
    let mut s = String::new();
    let n = plan.trials.len();
    let secs: f64 = plan.trials.iter().map(|t| t.seconds).sum();
    match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => {
            s += &format!(
                "micro-batch {} × accumulation {} × world size {} = global batch {}\n",
                r.micro_batch, r.accumulation, r.world_size, r.global_batch
            );
            s += &format!(
                "largest fitting micro-batch: {}{} ; peak {} of the {} limit ({:.0}%); {:.0} samples/s\n",
                r.max_fitting_batch,
                r.first_failing_batch.map(|f| format!(" ({f} ran out of memory)")).unwrap_or_default(),
                format_size(r.peak_bytes),
                format_size(plan.limit_bytes),
                100.0 * r.peak_bytes as f64 / plan.limit_bytes.max(1) as f64,
                r.samples_per_second
            );
        }
        _ => s += &format!("no recommendation: status {:?}\n", plan.status),
    }
    if plan.status == Status::Complete {
        if let Some(line) = throughput::summary_line(plan) {
            s += &line;
        }
    }
    s += &format!("stopped: {}\n", plan.stop_detail);
    s += &format!("{n} trials, {secs:.1} s of trials\n");
    for w in &plan.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}
