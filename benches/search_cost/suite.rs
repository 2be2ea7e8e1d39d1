//! The suite: the simulated memory curves, the model of a search's cost, the tools compared (batchfit's
//! strategies through its real search engine on the sim backend, and the peers' re-implementations), and
//! running every tool on every curve.
//!
//! Its own module because it is the only part that drives batchfit's library: the report only formats
//! what it returns.

use batchfit::config::limit as config_limit;
use batchfit::device::sim::{SimBackend, SimSpec};
use batchfit::device::{Backend, BackendError, DeviceInfo};
use batchfit::protocol::{Isolation, TrialOutcome, TrialRequest};
use batchfit::search::{Prober, Purpose, SearchConfig, StrategyKind};
use std::fmt::Write as _;

use crate::peers::{
    accelerate_find_executable, lightning_binsearch, lightning_power, replay, ACCELERATE_START,
    LIGHTNING_INIT_VAL, LIGHTNING_MARGIN, LIGHTNING_MAX_TRIALS, LIGHTNING_MAX_VAL_DEFAULT,
    LIGHTNING_MAX_VAL_RAISED,
};

// ---------------------------------------------------------------------------------------------------
// Constants of the model
// ---------------------------------------------------------------------------------------------------

/// batchfit's default margin: limit = capacity × (1 − margin).
pub const MARGIN: f64 = 0.05;
/// Training steps per exploration trial: batchfit's default (`main` checks it against
/// `SearchConfig::default()`).
pub const STEPS: u32 = 2;
/// Lightning's `steps_per_trial` (and the steps of the other in-process peers' trials).
pub const PEER_STEPS: u32 = 3;
/// Start of a process with libtorch loaded (seconds): paid once by the in-process peers; by batchfit per
/// trial with `--isolation process`, and with `--isolation hybrid` once for the exploration
/// worker plus once per proof trial (confirmation, split, fresh re-run of the failure, retry).
pub const START_COST_S: f64 = 2.0;
/// Step time: `STEP_BASE_S + STEP_PER_SAMPLE_S × b` seconds.
pub const STEP_BASE_S: f64 = 0.05;
pub const STEP_PER_SAMPLE_S: f64 = 2e-4;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

pub fn step_cost(b: u64) -> f64 {
    STEP_BASE_S + STEP_PER_SAMPLE_S * b as f64
}

pub fn limit_of(capacity: u64) -> u64 {
    config_limit(capacity, 0, MARGIN)
}

// ---------------------------------------------------------------------------------------------------

pub struct Case {
    pub name: &'static str,
    pub spec: SimSpec,
}

/// Per-sample bytes so that `fixed + per × b` crosses the limit of `capacity` at `target + ½`.
fn per_for(target: u64, fixed: u64, capacity: u64) -> u64 {
    ((limit_of(capacity) - fixed) as f64 / (target as f64 + 0.5)) as u64
}

fn affine(target: u64, base: u64, capacity: u64) -> SimSpec {
    SimSpec::affine(base, per_for(target, base, capacity), capacity)
}

/// A curve whose confirm-step slope crosses at `target`, a fraction `late` of that slope appearing
/// only after 3 steps.
fn with_late(target: u64, base: u64, capacity: u64, late: f64) -> SimSpec {
    let total = per_for(target, base, capacity);
    let late_b = (total as f64 * late) as u64;
    let mut s = SimSpec::affine(base, total - late_b, capacity);
    s.late_per_sample = late_b;
    s
}

fn suite() -> Vec<Case> {
    let mut v = vec![];
    let mut add = |name: &'static str, spec: SimSpec| v.push(Case { name, spec });

    // Affine, largest fit from 1 to the 1 000 000 cap.
    add("affine-1", affine(1, 14 * GIB, 16 * GIB));
    add("affine-7", affine(7, 62 * GIB, 80 * GIB));
    add("affine-100", affine(100, 3 * GIB, 16 * GIB));
    add("affine-128", affine(128, 4 * GIB, 24 * GIB));
    add("affine-1000", affine(1000, GIB, 8 * GIB));
    add("affine-4096", affine(4096, 6 * GIB, 40 * GIB));
    add("affine-10k", affine(10_000, 500 * MIB, 24 * GIB));
    add("affine-100k", affine(100_000, 300 * MIB, 80 * GIB));
    add("affine-all-fit", SimSpec::affine(GIB, 32 * 1024, 80 * GIB));

    // Knee: flat below it.
    add("knee-64-at-64", {
        let mut s = affine(64, 4 * GIB, 16 * GIB);
        s.knee = 64;
        s
    });
    add("knee-256-300", {
        let mut s = affine(300, 2 * GIB, 16 * GIB);
        s.knee = 256;
        s
    });
    add("knee-2048-5000", {
        let mut s = affine(5000, GIB, 24 * GIB);
        s.knee = 2048;
        s
    });
    add("knee-512-50k", {
        let mut s = affine(50_000, 2 * GIB, 80 * GIB);
        s.knee = 512;
        s
    });

    // Step jumps (algorithm switches).
    add("jump-early-700", {
        let mut s = affine(700, 4 * GIB, 16 * GIB);
        s.base = GIB;
        s.jumps = vec![(32, 3 * GIB)];
        s
    });
    add("jump-cliff-2000", {
        // The line alone would cross at 3000; 8 GiB more from 2000 on makes 1999 the answer.
        let mut s = affine(3000, 2 * GIB, 24 * GIB);
        s.jumps = vec![(2000, 8 * GIB)];
        s
    });
    add("jump-multi-20k", {
        let mut s = affine(20_000, 9 * GIB, 40 * GIB);
        s.base = 2 * GIB;
        s.jumps = vec![(1000, GIB), (8000, 2 * GIB), (16_000, 4 * GIB)];
        s
    });
    add("jump-late-90k", {
        let mut s = affine(90_000, 3 * GIB, 80 * GIB);
        s.base = GIB;
        s.jumps = vec![(65_536, 2 * GIB)];
        s
    });

    // Noisy reported peaks (the fit decision uses the true curve).
    add("noise-0.002-1000", {
        let mut s = affine(1000, GIB, 8 * GIB);
        s.noise = 0.002;
        s.seed = 1;
        s
    });
    add("noise-0.005-10k", {
        let mut s = affine(10_000, GIB, 24 * GIB);
        s.noise = 0.005;
        s.seed = 2;
        s
    });
    add("noise-0.01-100k", {
        let mut s = affine(100_000, 500 * MIB, 80 * GIB);
        s.noise = 0.01;
        s.seed = 3;
        s
    });
    add("noise-0.01-knee8-50", {
        let mut s = affine(50, 5 * GIB, 16 * GIB);
        s.knee = 8;
        s.noise = 0.01;
        s.seed = 4;
        s
    });

    // Late memory: appears only after 3 steps (the confirmation sees it).
    add("late-25%-1000", with_late(1000, 2 * GIB, 16 * GIB, 0.25));
    add("late-5%-10k", with_late(10_000, 2 * GIB, 40 * GIB, 0.05));
    add("late-10%-knee64-noise-300", {
        let mut s = with_late(300, 3 * GIB, 16 * GIB, 0.10);
        s.knee = 64;
        s.noise = 0.005;
        s.seed = 5;
        s
    });

    // Combined.
    add("bigmodel-knee2-jump-noise-7", {
        let mut s = affine(7, 67 * GIB, 80 * GIB);
        s.base = 66 * GIB;
        s.knee = 2;
        s.jumps = vec![(4, GIB)];
        s.noise = 0.005;
        s.seed = 6;
        s
    });
    add("combo-knee-late-jump-noise-100k", {
        let mut s = with_late(100_000, 3 * GIB, 80 * GIB, 0.02);
        s.base = GIB;
        s.knee = 1024;
        s.jumps = vec![(32_768, 2 * GIB)];
        s.noise = 0.003;
        s.seed = 7;
        s
    });
    v
}

/// The curve in `--sim` syntax, exactly: `batchfit probe --backend sim --sim '<this>'` reproduces it.
pub fn describe(s: &SimSpec) -> String {
    let sz = |b: u64| {
        if b > 0 && b % GIB == 0 {
            format!("{}GiB", b / GIB)
        } else if b > 0 && b % MIB == 0 {
            format!("{}MiB", b / MIB)
        } else {
            b.to_string()
        }
    };
    let mut d = format!(
        "base={},per-sample={},capacity={}",
        sz(s.base),
        sz(s.per_sample),
        sz(s.capacity)
    );
    if s.knee > 0 {
        let _ = write!(d, ",knee={}", s.knee);
    }
    for (n, j) in &s.jumps {
        let _ = write!(d, ",jump={n}:{}", sz(*j));
    }
    if s.late_per_sample > 0 {
        let _ = write!(d, ",late={}", sz(s.late_per_sample));
    }
    if s.noise > 0.0 {
        let _ = write!(d, ",noise={},seed={}", s.noise, s.seed);
    }
    d
}

// ---------------------------------------------------------------------------------------------------
// Running the tools
// ---------------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
pub enum Tool {
    Batchfit(StrategyKind),
    LightningPower(u64),
    LightningBinsearch(u64),
    Accelerate,
}

impl Tool {
    pub fn label(&self) -> String {
        match self {
            Tool::Batchfit(k) => format!("batchfit {}", format!("{k:?}").to_lowercase()),
            Tool::LightningPower(m) => format!("Lightning power, max_val {}", max_val_label(*m)),
            Tool::LightningBinsearch(m) => {
                format!("Lightning binsearch, max_val {}", max_val_label(*m))
            }
            Tool::Accelerate => "Accelerate (start 128, ×0.9)".into(),
        }
    }
    pub fn short(&self) -> String {
        match self {
            Tool::Batchfit(k) => format!("bf-{}", format!("{k:?}").to_lowercase()),
            Tool::LightningPower(m) => format!("L-pow-{}", max_val_label(*m)),
            Tool::LightningBinsearch(m) => format!("L-bin-{}", max_val_label(*m)),
            Tool::Accelerate => "Acc-128".into(),
        }
    }
    pub fn in_process(&self) -> bool {
        !matches!(self, Tool::Batchfit(_))
    }
}

fn max_val_label(m: u64) -> String {
    if m == LIGHTNING_MAX_VAL_RAISED {
        "1M".into()
    } else {
        m.to_string()
    }
}

/// One search's measured result.
pub struct SearchRun {
    /// (batch, steps, fits)
    pub trials: Vec<(u64, u32, bool)>,
    pub answer: Option<u64>,
    pub note: String,
    in_process: bool,
    /// batchfit only: the same search as `--isolation hybrid` runs it (the engine adds a fresh-process
    /// re-run of the failure found by the worker): (batch, steps, fits, explore).
    hybrid: Option<Vec<(u64, u32, bool, bool)>>,
}

impl SearchRun {
    /// Trials and modeled seconds under hybrid isolation: one worker start for all exploration trials,
    /// a process start for each proof trial.
    pub fn hybrid(&self) -> Option<(usize, f64)> {
        let h = self.hybrid.as_ref()?;
        let steps: f64 = h.iter().map(|&(b, s, _, _)| s as f64 * step_cost(b)).sum();
        let fresh = h.iter().filter(|t| !t.3).count();
        let worker = usize::from(h.iter().any(|t| t.3));
        Some((h.len(), (fresh + worker) as f64 * START_COST_S + steps))
    }
    pub fn n(&self) -> usize {
        self.trials.len()
    }
    pub fn tested(&self) -> bool {
        self.answer
            .is_some_and(|a| self.trials.iter().any(|&(b, _, f)| b == a && f))
    }
    pub fn exact(&self, truth: u64) -> bool {
        self.answer.unwrap_or(0) == truth
    }
    pub fn above(&self, truth: u64) -> bool {
        self.answer.unwrap_or(0) > truth
    }
    /// Modeled seconds: a process start per trial (batchfit) or once (in-process peers), plus the steps.
    pub fn seconds(&self) -> f64 {
        let steps: f64 = self
            .trials
            .iter()
            .map(|&(b, s, _)| s as f64 * step_cost(b))
            .sum();
        let starts = if self.in_process {
            1.0
        } else {
            self.trials.len() as f64
        };
        starts * START_COST_S + steps
    }
}

/// The sim backend as `--isolation hybrid` would place its trials: exploration in the worker, the rest
/// fresh. Same outcomes; only the isolation it reports differs, so the engine schedules the fresh re-run
/// of a failure found in the worker exactly as it does on the CPU backend.
struct HybridSim(SimBackend);

impl Backend for HybridSim {
    fn device(&self) -> &DeviceInfo {
        self.0.device()
    }
    fn default_budget(&self) -> u64 {
        self.0.default_budget()
    }
    fn set_limit(&mut self, limit_bytes: u64) {
        self.0.set_limit(limit_bytes)
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.0.run_trial(req)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        if req.fresh {
            Isolation::Process
        } else {
            Isolation::Worker
        }
    }
}

fn run_tool(tool: Tool, spec: &SimSpec, limit: u64) -> SearchRun {
    match tool {
        Tool::Batchfit(kind) => {
            let cfg = SearchConfig {
                strategy: kind,
                ..Default::default()
            };
            let mut backend = SimBackend::new(spec.clone());
            let mut prober = Prober::new(&mut backend, cfg.clone(), limit);
            let out = prober.search();
            let mut hybrid_backend = HybridSim(SimBackend::new(spec.clone()));
            let hy = Prober::new(&mut hybrid_backend, cfg, limit).search();
            assert_eq!(
                hy.max_fitting, out.max_fitting,
                "hybrid and process isolation disagree"
            );
            SearchRun {
                hybrid: Some(
                    hy.trials
                        .iter()
                        .map(|t| {
                            (
                                t.batch,
                                t.steps,
                                t.outcome.fits(),
                                t.purpose == Purpose::Explore,
                            )
                        })
                        .collect(),
                ),
                trials: out
                    .trials
                    .iter()
                    .map(|t| (t.batch, t.steps, t.outcome.fits()))
                    .collect(),
                answer: out.max_fitting,
                note: format!("{:?}", out.stop_reason),
                in_process: false,
            }
        }
        _ => {
            let mut oracle = |b: u64| Some(spec.peak(b, PEER_STEPS) <= limit);
            let run = match tool {
                Tool::LightningPower(m) => {
                    lightning_power(LIGHTNING_INIT_VAL, LIGHTNING_MAX_TRIALS, m, &mut oracle)
                }
                Tool::LightningBinsearch(m) => lightning_binsearch(
                    LIGHTNING_INIT_VAL,
                    LIGHTNING_MAX_TRIALS,
                    LIGHTNING_MARGIN,
                    m,
                    &mut oracle,
                ),
                Tool::Accelerate => accelerate_find_executable(ACCELERATE_START, &mut oracle),
                Tool::Batchfit(_) => unreachable!(),
            };
            SearchRun {
                trials: run
                    .trials
                    .iter()
                    .map(|&(b, f)| (b, PEER_STEPS, f))
                    .collect(),
                answer: run.answer,
                note: run.note.unwrap_or_default(),
                in_process: tool.in_process(),
                hybrid: None,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Statistics and output
// ---------------------------------------------------------------------------------------------------

/// Every tool's search on every curve, and each curve's true maximum.
pub struct Suite {
    pub cases: Vec<Case>,
    pub tools: Vec<Tool>,
    /// truths[case]
    pub truths: Vec<u64>,
    /// results[case][tool]
    pub results: Vec<Vec<SearchRun>>,
    /// batchfit's default confirmation steps and `--max-batch` (what the truth is measured with).
    pub confirm_steps: u32,
    pub cap: u64,
}

/// Index in `Suite::tools` of batchfit guided, the default strategy.
pub const GUIDED_IDX: usize = 0;
/// Index in `Suite::tools` of Lightning binsearch with `max_val` raised, the baseline of the targets.
pub const LBIN_RAISED_IDX: usize = 6;

/// Runs every tool on every curve of the suite.
pub fn run() -> Suite {
    let cfg = SearchConfig::default();
    let (confirm_steps, cap) = (cfg.confirm_steps, cfg.max_batch);
    let tools: Vec<Tool> = vec![
        // Every batchfit strategy, listed explicitly.
        Tool::Batchfit(StrategyKind::Guided),
        Tool::Batchfit(StrategyKind::Bisect),
        Tool::Batchfit(StrategyKind::Power),
        Tool::LightningPower(LIGHTNING_MAX_VAL_DEFAULT),
        Tool::LightningPower(LIGHTNING_MAX_VAL_RAISED),
        Tool::LightningBinsearch(LIGHTNING_MAX_VAL_DEFAULT),
        Tool::LightningBinsearch(LIGHTNING_MAX_VAL_RAISED),
        Tool::Accelerate,
    ];

    let cases = suite();
    assert!(cases.len() >= 20);
    // results[case][tool]
    let mut truths = vec![];
    let mut results: Vec<Vec<SearchRun>> = vec![];
    for c in &cases {
        let limit = limit_of(c.spec.capacity);
        let truth = c.spec.true_max(limit, confirm_steps, cap);
        truths.push(truth);
        results.push(tools.iter().map(|&t| run_tool(t, &c.spec, limit)).collect());
    }
    Suite {
        cases,
        tools,
        truths,
        results,
        confirm_steps,
        cap,
    }
}

/// Replays the peers' own runs on the suite (must match) and the same runs with the first outcome flipped
/// (must not): the replay machinery cannot pass silently. Panics otherwise.
pub fn self_check_replay(cases: &[Case], tools: &[Tool]) -> (usize, usize) {
    let (mut ok, mut flipped) = (0, 0);
    for c in cases {
        let limit = limit_of(c.spec.capacity);
        for &t in tools.iter().filter(|t| t.in_process()) {
            let r = run_tool(t, &c.spec, limit);
            let (name, params) = match t {
                Tool::LightningPower(m) => ("lightning-power", serde_json::json!({ "max_val": m })),
                Tool::LightningBinsearch(m) => {
                    ("lightning-binsearch", serde_json::json!({ "max_val": m }))
                }
                Tool::Accelerate => ("accelerate", serde_json::json!({})),
                Tool::Batchfit(_) => unreachable!(),
            };
            let seq: Vec<(u64, bool)> = r.trials.iter().map(|&(b, _, f)| (b, f)).collect();
            let rep = replay(name, &params, &seq, r.answer);
            assert!(
                rep.matched(),
                "self-check: {name} on {}: {}",
                c.name,
                rep.detail
            );
            ok += 1;
            let mut bad = seq.clone();
            bad[0].1 = !bad[0].1;
            let rep = replay(name, &params, &bad, r.answer);
            assert!(
                !rep.matched(),
                "self-check: flipped {name} on {} still matches",
                c.name
            );
            flipped += 1;
        }
    }
    (ok, flipped)
}
