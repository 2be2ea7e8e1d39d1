use super::Strategy;
use super::*;
use crate::device::sim::{SimBackend, SimSpec};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// The most trials any search test may run: a search that runs more fails its test at once instead
/// of hanging it (the engine stops a strategy that re-proposes a settled size, but a test must not
/// rely on the code it tests to end).
const TRIAL_CAP: u64 = 500;

/// A sim device that panics after [`TRIAL_CAP`] trials.
struct Capped(SimBackend);

impl Backend for Capped {
    fn device(&self) -> &crate::device::DeviceInfo {
        self.0.device()
    }
    fn default_budget(&self) -> u64 {
        self.0.default_budget()
    }
    fn set_limit(&mut self, l: u64) {
        self.0.set_limit(l)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        self.0.isolation(req)
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        assert!(
            self.0.trials_run < TRIAL_CAP,
            "the search ran more than {TRIAL_CAP} trials (last: batch {}): it does not end",
            req.batch
        );
        self.0.run_trial(req)
    }
}

fn run(spec: SimSpec, cfg: SearchConfig) -> (SearchOutcome, u64) {
    let limit = spec.capacity;
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, cfg, limit).search();
    let n = be.0.trials_run;
    (out, n)
}

/// The exact proof (`--tolerance 0`).
fn exact(cfg: SearchConfig) -> SearchConfig {
    SearchConfig {
        tolerance: 0.0,
        ..cfg
    }
}

/// A strategy that proposes `bad` once the bracket has both ends (a settled size), else bisects.
struct Misbehaving {
    bad: fn(&SearchState) -> u64,
}

impl Strategy for Misbehaving {
    fn propose(&mut self, st: &SearchState) -> Proposal {
        Proposal::explore(match (st.lo, upper_bound(st.hi, st.ceiling)) {
            (Some(_), Some(_)) => (self.bad)(st),
            (Some(l), None) => (2 * l + 1).min(st.grid.last_index),
            (None, Some(u)) => u / 2,
            (None, None) => 0,
        })
    }
}

#[test]
fn a_strategy_proposing_outside_the_bracket_stops_the_search() {
    let proposals: [fn(&SearchState) -> u64; 3] = [
        |st| st.hi.unwrap_or(st.grid.last_index), // the known failing size
        |st| st.lo.unwrap(),                      // the known fit
        |st| st.grid.last_index + 1,              // off the grid
    ];
    for bad in proposals {
        let spec = SimSpec::affine(0, MIB, 1000 * MIB);
        let mut be = Capped(SimBackend::new(spec));
        let out = Prober::new(&mut be, SearchConfig::default(), 1000 * MIB)
            .with_strategy(Box::new(Misbehaving { bad }))
            .search();
        assert_eq!(out.stop_reason, StopReason::TrialErrors);
        assert_eq!(out.max_fitting, None, "nothing is reported as proven");
        let fatal = out.fatal.expect("says why");
        assert!(
            fatal.contains("outside the open bracket (largest fit"),
            "{fatal}"
        );
        assert!(be.0.trials_run < 40, "{} trials", be.0.trials_run);
    }
}

#[test]
#[should_panic(expected = "it does not end")]
fn the_trial_cap_fails_a_search_that_does_not_end() {
    // Fits never end when every size fits and there is no cap: the cap must catch that.
    let spec = SimSpec::affine(0, 1, u64::MAX / 2);
    let mut be = Capped(SimBackend::new(spec));
    let cfg = SearchConfig {
        max_batch: u64::MAX / 4,
        ..SearchConfig::default()
    };
    // a strategy that only ever steps up by one
    struct OneUp;
    impl Strategy for OneUp {
        fn propose(&mut self, st: &SearchState) -> Proposal {
            Proposal::explore(st.lo.map_or(0, |l| l + 1))
        }
    }
    let _ = Prober::new(&mut be, cfg, u64::MAX / 2)
        .with_strategy(Box::new(OneUp))
        .search();
}

/// Every reported size must have been tested with the confirm steps and fit, and a size above it
/// (the next one, or one within the tolerance) must have been tested and run out of memory (or the
/// cap reached).
pub(super) fn check_invariant(out: &SearchOutcome, cfg: &SearchConfig) {
    if let Some(b) = out.max_fitting {
        let rec = out.best_record(b).expect("reported size was tested");
        assert!(rec.steps >= cfg.confirm_steps, "reported size confirmed");
        match out.stop_reason {
            StopReason::Proven | StopReason::ProvenWithinTolerance => {
                let f = out.first_failing.unwrap();
                if out.stop_reason == StopReason::Proven {
                    assert_eq!(f, b + cfg.multiple_of);
                } else {
                    assert!(f > b + cfg.multiple_of);
                    assert!(within_tolerance(b, f, cfg.tolerance, cfg.multiple_of));
                }
                assert!(out
                    .trials
                    .iter()
                    .any(|t| t.batch == f && t.outcome.is_oom()));
            }
            StopReason::MaxBatch => assert!(b + cfg.multiple_of > cfg.max_batch),
            other => panic!("unexpected stop {other:?}"),
        }
    }
}

#[test]
fn finds_exact_max_on_generated_curves() {
    let mut n = 0;
    for base in [0, 300 * MIB, 2 << 30] {
        for per in [1024, 37 * 1024, MIB, 7 * MIB + 3, 200 * MIB] {
            for cap in [512 * MIB, 3 << 30, 24 << 30, 80 << 30] {
                for knee in [0, 64] {
                    let mut spec = SimSpec::affine(base, per, cap);
                    spec.knee = knee;
                    for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
                        let cfg = exact(SearchConfig {
                            strategy,
                            ..SearchConfig::default()
                        });
                        let truth = spec.true_max(cap, cfg.confirm_steps, cfg.max_batch);
                        let (out, _) = run(spec.clone(), cfg.clone());
                        if truth == 0 {
                            assert_eq!(out.stop_reason, StopReason::NothingFits, "{spec:?}");
                            assert_eq!(out.max_fitting, None);
                        } else {
                            assert_eq!(out.max_fitting, Some(truth), "{spec:?}");
                            check_invariant(&out, &cfg);
                        }
                        n += 1;
                    }
                }
            }
        }
    }
    assert_eq!(n, 240);
}

proptest! {
    #[test]
    fn exact_max_property(base in 0u64..(4u64<<30), per in 1u64..(64*MIB), cap in (64*MIB)..(100u64<<30),
                          knee in 0u64..200, jump_at in 1u64..100_000, jump in 0u64..(512*MIB),
                          late in 0u64..(64*1024), mult in prop::sample::select(vec![1u64, 2, 8, 64]),
                          strategy in prop::sample::select(vec![StrategyKind::Bisect, StrategyKind::Guided])) {
        let mut spec = SimSpec::affine(base, per, cap);
        spec.knee = knee;
        spec.jumps = vec![(jump_at, jump)];
        spec.late_per_sample = late;
        let cfg = exact(SearchConfig { multiple_of: mult, strategy, ..SearchConfig::default() });
        let (out, n) = run(spec.clone(), cfg.clone());
        prop_assert!(n <= 80, "{} trials", n);
        // Ground truth on the grid with the confirm steps (the stricter); the curve is monotonic.
        let grid = Grid::new(cfg.min_batch, cfg.max_batch, mult).unwrap();
        let (mut a, mut b, mut exact) = (0u64, grid.last_index + 1, None);
        while a < b {
            let m = a + (b - a) / 2;
            if spec.peak(grid.batch(m), cfg.confirm_steps) <= cap { exact = Some(grid.batch(m)); a = m + 1 } else { b = m }
        }
        prop_assert_eq!(out.max_fitting, exact);
        check_invariant(&out, &cfg);
    }
}

proptest! {
    /// With a tolerance: the answer is never above the truth, it ran and fit with the confirmation's
    /// steps, and the out-of-memory above it lies within the tolerance (so the answer is less than
    /// one gap below the truth).
    #[test]
    fn tolerance_property(base in 0u64..(4u64<<30), per in 1u64..(64*MIB), cap in (64*MIB)..(100u64<<30),
                          knee in 0u64..200, jump_at in 1u64..100_000, jump in 0u64..(512*MIB),
                          late in 0u64..(64*1024), noise in prop::sample::select(vec![0.0, 0.002, 0.01]),
                          mult in prop::sample::select(vec![1u64, 2, 8, 64]),
                          tolerance in prop::sample::select(vec![0.001, DEFAULT_TOLERANCE, 0.01, 0.05, 0.1]),
                          strategy in prop::sample::select(vec![StrategyKind::Bisect, StrategyKind::Guided])) {
        let mut spec = SimSpec::affine(base, per, cap);
        spec.knee = knee;
        spec.jumps = vec![(jump_at, jump)];
        spec.late_per_sample = late;
        spec.noise = noise;
        spec.seed = base ^ per;
        let cfg = SearchConfig { multiple_of: mult, strategy, tolerance, ..SearchConfig::default() };
        let (out, n) = run(spec.clone(), cfg.clone());
        prop_assert!(n <= 80, "{} trials", n);
        let grid = Grid::new(cfg.min_batch, cfg.max_batch, mult).unwrap();
        let (mut a, mut b, mut truth) = (0u64, grid.last_index + 1, None);
        while a < b {
            let m = a + (b - a) / 2;
            if spec.peak(grid.batch(m), cfg.confirm_steps) <= cap { truth = Some(grid.batch(m)); a = m + 1 } else { b = m }
        }
        match (truth, out.max_fitting) {
            (None, found) => prop_assert_eq!(found, None),
            (Some(t), Some(found)) => {
                prop_assert!(found <= t, "answer {} above the truth {}", found, t);
                let gap = tolerance_gap(found, tolerance, mult);
                prop_assert!(found + gap > t, "answer {} more than a gap ({}) below the truth {}", found, gap, t);
                if let Some(f) = out.first_failing {
                    prop_assert!(within_tolerance(found, f, tolerance, mult), "bracket {}..{} wider than {}", found, f, gap);
                }
                check_invariant(&out, &cfg);
            }
            (Some(t), None) => prop_assert!(false, "no answer, truth {}", t),
        }
    }
}

#[test]
fn tolerance_gap_is_at_least_one_step() {
    assert_eq!(tolerance_gap(1, 0.005, 1), 1);
    assert_eq!(tolerance_gap(399, 0.005, 1), 1);
    assert_eq!(tolerance_gap(400, 0.005, 1), 2);
    assert_eq!(tolerance_gap(17529, 0.005, 1), 87);
    assert_eq!(tolerance_gap(17529, 0.0, 1), 1);
    assert_eq!(tolerance_gap(1000, 0.005, 8), 8);
    assert_eq!(tolerance_gap(100_000, 0.005, 8), 500);
    assert!(within_tolerance(100, 101, 0.0, 1));
    assert!(!within_tolerance(100, 102, 0.0, 1));
    assert!(!within_tolerance(100, 100, 0.5, 1));
    assert!(within_tolerance(10_000, 10_050, 0.005, 1));
    assert!(!within_tolerance(10_000, 10_051, 0.005, 1));
}

#[test]
fn tolerance_stops_early_and_says_so() {
    // Affine, truth 10 000: exact needs the out-of-memory at 10 001, 0.5 % accepts one up to 10 050.
    let spec = SimSpec::affine(500 * MIB, 2_395_582, 24 << 30);
    let limit = (24u64 << 30) / 20 * 19;
    let truth = spec.true_max(limit, 5, 1_000_000);
    for (tolerance, reason) in [
        (0.0, StopReason::Proven),
        (DEFAULT_TOLERANCE, StopReason::ProvenWithinTolerance),
    ] {
        let cfg = SearchConfig {
            tolerance,
            ..SearchConfig::default()
        };
        let mut be = SimBackend::new(spec.clone());
        let out = Prober::new(&mut be, cfg.clone(), limit).search();
        assert_eq!(out.stop_reason, reason);
        assert!(out.stop_reason.is_complete());
        // Exact: the truth. Within the tolerance: the candidate runs half a gap below the line
        // (so a few samples of memory that the 3-step line misses do not make it fail), a fit
        // there is closed by the out-of-memory a gap above it.
        let b = out.max_fitting.unwrap();
        if tolerance == 0.0 {
            assert_eq!(b, truth);
        } else {
            assert!(
                b <= truth && b + tolerance_gap(b, tolerance, 1) > truth,
                "{b}"
            );
        }
        let f = out.first_failing.unwrap();
        assert!(within_tolerance(b, f, tolerance, 1));
        // The answer ran with the confirmation's steps at once: no separate confirmation trial.
        assert!(out.trials.iter().all(|t| t.purpose != Purpose::Confirm));
        assert!(out.trials.len() <= 4, "{:?}", out.trials);
    }
}

#[test]
fn confirmation_catches_late_memory() {
    // Fits at 3 steps up to 1000, but extra memory after step 3 lowers the real max.
    let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
    spec.late_per_sample = MIB / 10;
    let cfg = SearchConfig::default();
    let (out, _) = run(spec.clone(), cfg.clone());
    assert_eq!(out.max_fitting, Some(909)); // 909 × 1.1 MiB ≤ 1000 MiB < 910 × 1.1 MiB
    check_invariant(&out, &cfg);
    assert!(out.trials.len() < 40, "{} trials", out.trials.len());
    // Only a trial with the confirmation's steps can have seen it.
    assert!(out
        .trials
        .iter()
        .any(|t| t.steps >= cfg.confirm_steps && t.outcome.is_oom() && t.batch <= 1000));
    // Exact as well.
    let cfg = exact(SearchConfig::default());
    let (out, _) = run(spec, cfg.clone());
    assert_eq!(out.max_fitting, Some(909));
    check_invariant(&out, &cfg);
}

#[test]
fn multiple_of_and_caps() {
    let spec = SimSpec::affine(0, MIB, 1000 * MIB);
    let cfg = SearchConfig {
        multiple_of: 8,
        strategy: StrategyKind::Bisect,
        ..Default::default()
    };
    let (out, _) = run(spec.clone(), cfg.clone());
    assert_eq!(out.max_fitting, Some(1000));
    assert_eq!(out.first_failing, Some(1008));
    let cfg = SearchConfig {
        max_batch: 300,
        ..Default::default()
    };
    let (out, _) = run(spec.clone(), cfg.clone());
    assert_eq!(
        (out.max_fitting, out.stop_reason),
        (Some(300), StopReason::MaxBatch)
    );
    let cfg = SearchConfig {
        min_batch: 2000,
        ..Default::default()
    };
    let (out, n) = run(spec.clone(), cfg);
    assert_eq!(
        (out.max_fitting, out.stop_reason, n),
        (None, StopReason::NothingFits, 1)
    );
}

#[test]
fn max_trials_gives_partial() {
    let spec = SimSpec::affine(0, MIB, 1000 * MIB);
    let cfg = SearchConfig {
        max_trials: Some(3),
        ..Default::default()
    };
    let (out, n) = run(spec, cfg);
    assert_eq!(n, 3);
    assert_eq!(out.stop_reason, StopReason::MaxTrials);
    assert!(!out.stop_reason.is_complete());
    assert_eq!(out.max_fitting, None);
}

#[test]
fn errors_are_never_proof() {
    // The size right above the true max errors: no proof possible, the search says so.
    let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
    spec.fail_at = Some(1001);
    let bisect = exact(SearchConfig {
        strategy: StrategyKind::Bisect,
        ..SearchConfig::default()
    });
    let (out, _) = run(spec.clone(), bisect.clone());
    assert_ne!(out.stop_reason, StopReason::Proven);
    assert!(!out.stop_reason.is_complete());
    assert_eq!(out.max_fitting, Some(1000));
    // With a tolerance, the error at 1001 is still no proof: only an out-of-memory within the
    // tolerance (1002..=1005) closes the bracket, and the plan names that size.
    for strategy in [StrategyKind::Bisect, StrategyKind::Guided] {
        let cfg = SearchConfig {
            strategy,
            ..SearchConfig::default()
        };
        let (out, _) = run(spec.clone(), cfg.clone());
        assert_eq!(out.max_fitting, Some(1000), "{strategy:?}");
        if out.stop_reason.is_complete() {
            let f = out.first_failing.unwrap();
            assert!(f > 1001 && f <= 1005, "{f}");
            check_invariant(&out, &cfg);
        }
    }
    // An error below the true max is a ceiling the search does not cross: the best size below it is
    // reported, marked as unproven.
    spec.fail_at = Some(512);
    let (out, _) = run(spec, bisect);
    assert_eq!(out.stop_reason, StopReason::TrialErrors);
    assert!(!out.stop_reason.is_complete());
    assert_eq!(out.max_fitting, Some(511));
}

#[test]
fn power_strategy_stops_at_first_oom() {
    let spec = SimSpec::affine(0, MIB, 1000 * MIB);
    let cfg = SearchConfig {
        strategy: StrategyKind::Power,
        ..Default::default()
    };
    let cfg = SearchConfig {
        strategy: StrategyKind::Power,
        ..cfg
    };
    let (out, _) = run(spec, cfg);
    assert_eq!(out.max_fitting, Some(512));
    assert_eq!(out.first_failing, Some(1024));
    assert_eq!(out.stop_reason, StopReason::PowerResolution);
}

/// A sim device whose exploration worker carries `overhead` bytes of leftovers (as a long-lived
/// process does), so it runs out of memory slightly earlier than a fresh process.
struct HybridSim {
    spec: SimSpec,
    overhead: u64,
    limit: u64,
    device: crate::device::DeviceInfo,
    trials: u64,
}

impl Backend for HybridSim {
    fn device(&self) -> &crate::device::DeviceInfo {
        &self.device
    }
    fn default_budget(&self) -> u64 {
        self.spec.capacity
    }
    fn set_limit(&mut self, l: u64) {
        self.limit = l;
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        if req.fresh {
            Isolation::Process
        } else {
            Isolation::Worker
        }
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.trials += 1;
        assert!(self.trials <= TRIAL_CAP, "the search does not end");
        let extra = if req.fresh { 0 } else { self.overhead };
        let p = self.spec.peak(req.batch, req.steps) + extra;
        Ok(if p <= self.limit {
            TrialOutcome::Fits {
                peak_bytes: p,
                rss_peak_bytes: None,
                step_seconds: 0.01,
                gpu: None,
            }
        } else {
            TrialOutcome::Oom {
                message: "oom".into(),
                peak_bytes: None,
                rss_peak_bytes: None,
                gpu: None,
            }
        })
    }
}

#[test]
fn hybrid_proof_runs_fresh_and_survives_false_worker_ooms() {
    for overhead in [0, 3 * MIB, 300 * MIB] {
        for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
            let spec = SimSpec::affine(600 * MIB, MIB / 100, 1000 * MIB);
            let truth = spec.true_max(1000 * MIB, 5, 1_000_000);
            let device = crate::device::DeviceInfo {
                kind: crate::device::DeviceKind::Sim,
                name: "hybrid".into(),
                total_bytes: 1000 * MIB,
                free_bytes_at_start: 1000 * MIB,
            };
            let mut be = HybridSim {
                spec,
                overhead,
                limit: 0,
                device,
                trials: 0,
            };
            let cfg = exact(SearchConfig {
                strategy,
                ..Default::default()
            });
            let out = Prober::new(&mut be, cfg, 1000 * MIB).search();
            assert_eq!(
                out.max_fitting,
                Some(truth),
                "overhead {overhead} {strategy:?}"
            );
            assert_eq!(out.stop_reason, StopReason::Proven);
            // The answer and the failure above it were both seen in fresh processes.
            let fresh = |b: u64, fits: bool| {
                out.trials.iter().any(|t| {
                    t.batch == b
                        && t.isolation == Isolation::Process
                        && t.outcome.fits() == fits
                        && (fits || t.outcome.is_oom())
                })
            };
            assert!(
                fresh(truth, true) && fresh(truth + 1, false),
                "{:?}",
                out.trials
            );
            assert!(
                out.trials.len() < 60,
                "overhead {overhead} {strategy:?}: {} trials",
                out.trials.len()
            );
            // With the default tolerance: never above the truth, and the out-of-memory that
            // closes the bracket was seen in a fresh process.
            let mut be = HybridSim {
                spec: be.spec.clone(),
                overhead,
                limit: 0,
                device: be.device.clone(),
                trials: 0,
            };
            let cfg = SearchConfig {
                strategy,
                ..Default::default()
            };
            let out = Prober::new(&mut be, cfg.clone(), 1000 * MIB).search();
            let b = out.max_fitting.unwrap();
            assert!(b <= truth && b + tolerance_gap(b, cfg.tolerance, 1) > truth);
            assert!(out.stop_reason.is_complete());
            let f = out.first_failing.unwrap();
            assert!(fresh_oom(&out, f), "{:?}", out.trials);
            check_invariant(&out, &cfg);
        }
    }
}

/// The trials of `out` as `batch✓/steps` (fits) or `batch✗/steps`, for assertion messages.
fn sequence(out: &SearchOutcome) -> Vec<String> {
    out.trials
        .iter()
        .map(|t| {
            let mark = if t.outcome.fits() { "✓" } else { "✗" };
            format!("{}{mark}/{}", t.batch, t.steps)
        })
        .collect()
}

fn fresh_oom(out: &SearchOutcome, b: u64) -> bool {
    out.trials
        .iter()
        .any(|t| t.batch == b && t.isolation == Isolation::Process && t.outcome.is_oom())
}

/// A near miss of an exact line (seen on CPU: the quickstart's line through 4096 and 6538 put 8280
/// 30 KB under the limit, 8280 ran out of memory at 5 steps, 8277 fit): the next trial is the lowest
/// size whose fit closes the bracket within the tolerance, not a climb back up from far below.
#[test]
fn a_near_miss_of_the_line_is_closed_by_one_fit() {
    // flat to 1500, then 4681046 bytes per sample; 5-step trials hold 0.34 % more per sample, so
    // the candidate (half a gap under the 3-step line) fails and the size a gap below it fits
    let spec =
        SimSpec::parse("base=1GiB,per-sample=4681046,capacity=24GiB,knee=1500,late=16000").unwrap();
    let limit = crate::config::limit(spec.capacity, 0, 0.05);
    let truth = spec.true_max(limit, 5, 1_000_000);
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, SearchConfig::default(), limit).search();
    let seq = sequence(&out);
    let b = out.max_fitting.unwrap();
    assert!(
        b <= truth && b + tolerance_gap(b, 0.005, 1) >= truth,
        "{truth}: {seq:?}"
    );
    assert_eq!(
        out.stop_reason,
        StopReason::ProvenWithinTolerance,
        "{seq:?}"
    );
    assert!(
        out.trials.len() <= 7,
        "{truth}: {} trials: {seq:?}",
        out.trials.len()
    );
    // The near miss: a 5-step failure, then one 5-step fit below it that closes the bracket.
    let n = out.trials.len();
    let (miss, fit) = (&out.trials[n - 2], &out.trials[n - 1]);
    assert!(
        miss.outcome.is_oom() && miss.steps == 5 && fit.outcome.fits() && fit.batch == b,
        "{seq:?}"
    );
}

proptest! {
    /// A prior (a sweep's earlier points; right, a little off or far off, confident or
    /// not) and a `--min-batch` only change where the search looks: the answer is still a size that
    /// fit with the confirmation's steps, never above the truth, proven within the tolerance.
    #[test]
    fn prior_and_min_batch_property(base in 0u64..(4u64<<30), per in 1u64..(64*MIB), cap in (64*MIB)..(100u64<<30),
                          knee in 0u64..200, jump_at in 1u64..100_000, jump in 0u64..(512*MIB),
                          late in 0u64..(64*1024), noise in prop::sample::select(vec![0.0, 0.0, 0.01]),
                          min_batch in prop::sample::select(vec![1u64, 1, 7, 100, 5000]),
                          mult in prop::sample::select(vec![1u64, 1, 8]),
                          tolerance in prop::sample::select(vec![0.0, DEFAULT_TOLERANCE, 0.05]),
                          off_fixed in -0.2f64..0.2, off_per in prop::sample::select(vec![0.0, 0.0004, -0.0004, 0.01, -0.01, 0.3, -0.3]),
                          err in prop::sample::select(vec![0.0005, 0.01, 0.3]),
                          try_first in any::<bool>(),
                          strategy in prop::sample::select(vec![StrategyKind::Bisect, StrategyKind::Guided])) {
        let mut spec = SimSpec::affine(base, per, cap);
        spec.knee = knee;
        spec.jumps = vec![(jump_at, jump)];
        spec.late_per_sample = late;
        spec.noise = noise;
        spec.seed = base ^ per;
        let prior = Prior {
            fixed_bytes: base as f64 * (1.0 + off_fixed),
            per_sample_bytes: per as f64 * (1.0 + off_per),
            fixed_error: err,
            per_sample_error: err,
            try_first,
        };
        let cfg = SearchConfig { min_batch, multiple_of: mult, strategy, tolerance, prior: Some(prior), ..SearchConfig::default() };
        let Some(grid) = Grid::new(cfg.min_batch, cfg.max_batch, mult) else { return Ok(()) };
        let (out, n) = run(spec.clone(), cfg.clone());
        prop_assert!(n <= 80, "{} trials", n);
        let (mut a, mut b, mut truth) = (0u64, grid.last_index + 1, None);
        while a < b {
            let m = a + (b - a) / 2;
            if spec.peak(grid.batch(m), cfg.confirm_steps) <= cap { truth = Some(grid.batch(m)); a = m + 1 } else { b = m }
        }
        match (truth, out.max_fitting) {
            (None, found) => prop_assert_eq!(found, None),
            (Some(t), Some(found)) => {
                prop_assert!(found <= t, "answer {} above the truth {}", found, t);
                let gap = tolerance_gap(found, tolerance, mult);
                prop_assert!(found + gap > t, "answer {} more than a gap ({}) below the truth {}", found, gap, t);
                if let Some(f) = out.first_failing {
                    prop_assert!(within_tolerance(found, f, tolerance, mult), "bracket {}..{} wider than {}", found, f, gap);
                }
                let rec = out.best_record(found).expect("tested");
                prop_assert!(rec.steps >= cfg.confirm_steps);
            }
            (Some(t), None) => prop_assert!(false, "no answer, truth {} ({:?})", t, out.stop_reason),
        }
    }
}

/// A strategy that, once a size fit, asks to measure `measure(st)`, then bisects like [`Misbehaving`].
struct Measuring {
    measure: fn(&SearchState) -> u64,
    done: bool,
}

impl Strategy for Measuring {
    fn propose(&mut self, st: &SearchState) -> Proposal {
        if let (Some(_), false) = (st.lo, self.done) {
            self.done = true;
            return Proposal::measure((self.measure)(st));
        }
        Proposal::explore(match (st.lo, upper_bound(st.hi, st.ceiling)) {
            (Some(l), Some(u)) => l + (u - l) / 2,
            (Some(l), None) => (2 * l + 1).min(st.grid.last_index),
            (None, Some(u)) => u / 2,
            (None, None) => 0,
        })
    }
}

#[test]
fn a_measurement_below_the_largest_fit_runs_once_and_never_moves_the_bracket() {
    // A measurement that does not fit (here an error: `fail-at=3`) must not become an end of the
    // bracket. First: below the first fit (batch 1) there is nothing to measure.
    let spec = SimSpec::parse("base=0,per-sample=1MiB,capacity=1000MiB,fail-at=3").unwrap();
    let truth = spec.true_max(1000 * MIB, 5, 1_000_000);
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, exact(SearchConfig::default()), 1000 * MIB)
        .with_strategy(Box::new(Measuring {
            measure: |st| st.lo.unwrap().saturating_sub(1),
            done: false,
        }))
        .search();
    // The engine refuses it as an internal error rather than re-running a settled size.
    assert_eq!(out.stop_reason, StopReason::TrialErrors);
    assert!(out.fatal.unwrap().contains("asked to measure size 1"));
    // A measurement at an untried size below a later fit runs, and an error there moves nothing.
    struct Later(bool);
    impl Strategy for Later {
        fn propose(&mut self, st: &SearchState) -> Proposal {
            let (l, u) = (st.lo, upper_bound(st.hi, st.ceiling));
            if let (Some(l), false) = (l, self.0) {
                if st.grid.batch(l) >= 8 {
                    self.0 = true;
                    return Proposal::measure(st.grid.index_at_or_below(3));
                }
            }
            Proposal::explore(match (l, u) {
                (Some(l), Some(u)) => l + (u - l) / 2,
                (Some(l), None) => (2 * l + 1).min(st.grid.last_index),
                (None, Some(u)) => u / 2,
                (None, None) => 0,
            })
        }
    }
    let spec = SimSpec::parse("base=0,per-sample=1MiB,capacity=1000MiB,fail-at=3").unwrap();
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, exact(SearchConfig::default()), 1000 * MIB)
        .with_strategy(Box::new(Later(false)))
        .search();
    assert_eq!(out.stop_reason, StopReason::Proven, "{:?}", out.fatal);
    assert_eq!(out.max_fitting, Some(truth));
    let at3: Vec<_> = out.trials.iter().filter(|t| t.batch == 3).collect();
    assert_eq!(at3.len(), 1, "measured once");
    assert!(!at3[0].outcome.fits());
    // A measurement of a size already tried is refused.
    let spec = SimSpec::affine(0, MIB, 1000 * MIB);
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, SearchConfig::default(), 1000 * MIB)
        .with_strategy(Box::new(Measuring {
            measure: |st| st.lo.unwrap(),
            done: false,
        }))
        .search();
    assert_eq!(out.stop_reason, StopReason::TrialErrors);
    assert!(out
        .fatal
        .unwrap()
        .contains("not an untried size below the largest fit"));
}

/// The quickstart's curve on CPU (the default MLP under 1 GiB, measured: flat at 773 MB up to
/// about 1570 samples, then 36.8 KB per sample; 5-step trials hold a little more): the second
/// point of the line is measured at half the first size above the flat part (2048, below the
/// largest fit 4096) instead of a 3-step trial above it (6548), the cost that made the probe 1.8×
/// its floor; the candidate then closes in two trials.
#[test]
fn the_second_point_above_a_flat_part_is_measured_below_the_largest_fit() {
    for capacity in ["1020000000", "1342177280", "2147483648"] {
        let spec = SimSpec::parse(&format!(
            "base=715000000,per-sample=36800,knee=1570,capacity={capacity},late=20"
        ))
        .unwrap();
        let limit = spec.capacity;
        let truth = spec.true_max(limit, 5, 1_000_000);
        let mut be = Capped(SimBackend::new(spec));
        let out = Prober::new(&mut be, SearchConfig::default(), limit).search();
        let seq = sequence(&out);
        let b = out.max_fitting.unwrap();
        assert!(
            b <= truth && b + tolerance_gap(b, 0.005, 1) > truth,
            "{seq:?}"
        );
        // No exploration trial above 4096: the line's second point came from below it.
        assert!(
            out.trials.iter().all(|t| t.steps == 5 || t.batch <= 4096),
            "{seq:?}"
        );
        assert!(out.trials.iter().any(|t| t.batch == 2048), "{seq:?}");
        assert!(out.trials.len() <= 7, "{seq:?}");
    }
}

/// After a confirmed fit, a gallop up that ran out of memory starts over at the tolerance's gap
/// (the line was right there) instead of doubling on: noise-0.002-1000 of the suite took 9 trials,
/// four of them walking down from 1024 to 1003.
#[test]
fn a_gallop_that_ran_out_of_memory_closes_at_the_gap() {
    let spec =
        SimSpec::parse("base=1GiB,per-sample=7083154,capacity=8GiB,noise=0.002,seed=1").unwrap();
    let limit = crate::config::limit(spec.capacity, 0, 0.05);
    let truth = spec.true_max(limit, 5, 1_000_000);
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, SearchConfig::default(), limit).search();
    let b = out.max_fitting.unwrap();
    assert!(b <= truth && b + tolerance_gap(b, 0.005, 1) > truth);
    assert!(
        out.trials.len() <= 7,
        "{:?}",
        out.trials.iter().map(|t| t.batch).collect::<Vec<_>>()
    );
}

/// An exact proof's candidate is the line's own crossing: half a size under it would round one
/// size down, and an affine curve would take 5 trials (1366, 1367, 1368) instead of 4.
#[test]
fn an_exact_proof_runs_the_line_itself() {
    let spec = SimSpec::parse("base=3317815907,per-sample=9512113,capacity=17179869184").unwrap();
    let limit = spec.capacity;
    let truth = spec.true_max(limit, 5, 73_656);
    let cfg = exact(SearchConfig {
        min_batch: 34,
        max_batch: 73_656,
        steps: 4,
        ..SearchConfig::default()
    });
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, cfg, limit).search();
    assert_eq!(out.max_fitting, Some(truth));
    assert!(
        out.trials.len() <= 4,
        "{:?}",
        out.trials.iter().map(|t| t.batch).collect::<Vec<_>>()
    );
}

/// A measured point below the largest fit that lies below a jump makes the slope through it too
/// steep: the flat-part branch gallops (at most 60 trials) rather than walk its middle up one size
/// per trial (569 trials).
#[test]
fn a_steep_line_from_below_a_jump_gallops() {
    let spec = SimSpec::parse(
        "base=5284746499,per-sample=3167660,capacity=17179869184,knee=2599,jump=2096:868528100,jump=622:2789133133",
    )
    .unwrap();
    let limit = spec.capacity;
    let truth = spec.true_max(limit, 5, 1_000_000);
    let cfg = exact(SearchConfig {
        min_batch: 34,
        ..SearchConfig::default()
    });
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, cfg, limit).search();
    assert_eq!(out.max_fitting, Some(truth));
    assert!(out.trials.len() <= 60, "{} trials", out.trials.len());
}

/// A sim device whose failures are over-budget trials, never out-of-memory ones: a process tree
/// measured above the limit that the limit did not stop (RLIMIT_DATA on each process).
struct OverBudgetSim(SimBackend, SimSpec);

impl Backend for OverBudgetSim {
    fn device(&self) -> &crate::device::DeviceInfo {
        self.0.device()
    }
    fn default_budget(&self) -> u64 {
        self.0.default_budget()
    }
    fn set_limit(&mut self, l: u64) {
        self.0.set_limit(l)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        self.0.isolation(req)
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        assert!(self.0.trials_run < TRIAL_CAP, "the search does not end");
        Ok(match self.0.run_trial(req)? {
            TrialOutcome::Oom { .. } => TrialOutcome::OverBudget {
                message: "the tree went above the limit".into(),
                measure: "tree-pss".into(),
                peak_bytes: self.1.peak(req.batch, req.steps),
                limit_bytes: self.1.capacity,
            },
            o => o,
        })
    }
}

/// An over-budget trial bounds the bracket exactly like an out-of-memory: every strategy closes on
/// it and proves the size below (was: an error, retried, then a ceiling that proves nothing).
#[test]
fn an_over_budget_size_closes_the_bracket_like_an_oom() {
    let spec = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
    for strategy in [
        StrategyKind::Guided,
        StrategyKind::Bisect,
        StrategyKind::Power,
    ] {
        for tolerance in [0.0, DEFAULT_TOLERANCE] {
            let cfg = SearchConfig {
                strategy,
                tolerance,
                ..SearchConfig::default()
            };
            let mut be = OverBudgetSim(SimBackend::new(spec.clone()), spec.clone());
            let out = Prober::new(&mut be, cfg.clone(), spec.capacity).search();
            assert!(out.stop_reason.is_complete(), "{strategy:?}: {out:?}");
            assert!(
                be.0.trials_run < 40,
                "{strategy:?}: {} trials",
                be.0.trials_run
            );
            let (b, f) = (out.max_fitting.unwrap(), out.first_failing.unwrap());
            assert!(b <= 900 && f > 900, "{strategy:?}: {b}, {f}");
            if strategy != StrategyKind::Power {
                assert!(
                    within_tolerance(b, f, tolerance, 1),
                    "{strategy:?}: {b}, {f}"
                );
            }
            assert!(out
                .trials
                .iter()
                .all(|t| !t.outcome.fits() || t.batch <= 900));
            assert!(out
                .trials
                .iter()
                .any(|t| t.batch == f && matches!(t.outcome, TrialOutcome::OverBudget { .. })));
            assert!(out.trials.iter().all(|t| t.purpose != Purpose::Retry));
        }
    }
    // nothing fits when the smallest size is over the budget
    let heavy = SimSpec::affine(2000 * MIB, MIB, 1000 * MIB);
    let mut be = OverBudgetSim(SimBackend::new(heavy.clone()), heavy);
    let out = Prober::new(&mut be, SearchConfig::default(), 1000 * MIB).search();
    assert_eq!(out.stop_reason, StopReason::NothingFits);
}

/// A sim device whose `n`-th trial at a size runs out of memory although the size fits, for each
/// `(size, n)` listed: a job whose peak moves from one fresh run to the next.
struct Flaky {
    sim: SimBackend,
    flips: Vec<(u64, usize)>,
    seen: Vec<u64>,
}

impl Backend for Flaky {
    fn device(&self) -> &crate::device::DeviceInfo {
        self.sim.device()
    }
    fn default_budget(&self) -> u64 {
        self.sim.default_budget()
    }
    fn set_limit(&mut self, l: u64) {
        self.sim.set_limit(l)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        self.sim.isolation(req)
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        assert!(self.seen.len() < TRIAL_CAP as usize, "it does not end");
        self.seen.push(req.batch);
        let n = self.seen.iter().filter(|&&b| b == req.batch).count();
        let o = self.sim.run_trial(req)?;
        Ok(if self.flips.contains(&(req.batch, n)) {
            TrialOutcome::Oom {
                message: format!("flaky out of memory at {}", req.batch),
                peak_bytes: None,
                rss_peak_bytes: None,
                gpu: None,
            }
        } else {
            o
        })
    }
}

/// Bisection on a device whose boundary is at 1000, with a measurement 10 below the largest fit
/// once that is at least 512 (the first size that can contradict it), on a device flaky at `flips`.
fn flaky_search(flips: Vec<(u64, usize)>) -> SearchOutcome {
    let mut be = Flaky {
        sim: SimBackend::new(SimSpec::affine(0, MIB, 1000 * MIB)),
        flips,
        seen: vec![],
    };
    let out = Prober::new(&mut be, exact(SearchConfig::default()), 1000 * MIB)
        .with_strategy(Box::new(MeasureBelow {
            from: 512,
            done: false,
        }))
        .search();
    out
}

/// Doubling and bisection, with one measurement 10 below the largest fit once that is at least
/// `from`.
struct MeasureBelow {
    from: u64,
    done: bool,
}

impl Strategy for MeasureBelow {
    fn propose(&mut self, st: &SearchState) -> Proposal {
        if let Some(l) = st
            .lo
            .filter(|&l| !self.done && st.grid.batch(l) >= self.from)
        {
            self.done = true;
            return Proposal::measure(st.grid.index_at_or_below(st.grid.batch(l) - 10));
        }
        bisect::DoublingBisection::default().propose(st)
    }
}

/// How many trials ran after the first one that contradicted an earlier one.
fn trials_after_first_contradiction(trials: &[TrialRecord]) -> Option<usize> {
    (1..=trials.len())
        .find(|&k| !noise::contradictions(&trials[..k]).is_empty())
        .map(|k| trials.len() - k)
}

#[test]
fn a_fit_above_an_out_of_memory_stops_the_bisection_and_answers_one_band_below() {
    // 1, 2, 4, … 512 fit, then the measurement at 502 runs out of memory (the noise): 512 fit above
    // it. The band: 502..512, 10 wide; the answer is 492, fit twice with the confirmation's steps.
    let out = flaky_search(vec![(502, 1)]);
    assert_eq!(
        out.stop_reason,
        StopReason::ProvenBelowNoise,
        "{:?}",
        sequence(&out)
    );
    assert!(out.stop_reason.is_complete());
    assert_eq!((out.max_fitting, out.first_failing), (Some(492), Some(502)));
    let band = out.noisy_boundary.clone().expect("the band is recorded");
    assert_eq!(
        band,
        noise::NoisyBoundary {
            band_low: 492,
            band_high: 512,
            lowest_bound: 502,
            width: 10,
            contradictions: vec![noise::Contradiction {
                fit: 512,
                bound: 502
            }],
            spread_bytes: None,
            ceiling_bytes: None,
        }
    );
    let at: Vec<_> = out.trials.iter().filter(|t| t.batch == 492).collect();
    assert_eq!(at.len(), 2, "run twice");
    assert!(at.iter().all(|t| t.outcome.fits() && t.steps == 5));
    assert_eq!(trials_after_first_contradiction(&out.trials), Some(2));
    assert_eq!(
        band.describe(),
        "outcomes near 502 disagree (fit at 512 above a failure at 502): the answer is at \
         most 492, the low end of the noise band 492–512"
    );
}

/// The noisy boundary's summary line is true of an answer at the band's low end itself (a size that
/// fit twice there): it says the answer is at most that end, never that it lies below the band.
#[test]
fn the_noise_line_says_the_answer_is_at_most_the_band_low_end_which_it_may_be() {
    let out = flaky_search(vec![(502, 1)]);
    let band = out.noisy_boundary.clone().expect("the band is recorded");
    assert_eq!(out.max_fitting, Some(band.band_low), "{:?}", sequence(&out));
    let line = band.describe();
    assert!(
        line.contains(&format!("the answer is at most {}", band.band_low)),
        "{line}"
    );
    assert!(!line.contains("below the noise band"), "{line}");
}

/// A band that reaches below the smallest size says that no size fits reliably, not that the
/// answer is at most 0.
#[test]
fn a_noise_band_below_every_size_says_no_size_fits_reliably() {
    let band = noise::NoisyBoundary {
        band_low: 0,
        band_high: 1,
        lowest_bound: 1,
        width: 1,
        contradictions: vec![noise::Contradiction { fit: 1, bound: 1 }],
        spread_bytes: None,
        ceiling_bytes: None,
    };
    let line = band.describe();
    assert!(line.contains("no size fits reliably"), "{line}");
    assert!(!line.contains("at most 0"), "{line}");
}

/// The noise line names where the outcomes disagreed, and says a failure, not an out-of-memory
/// (an over-budget size fails too), even after the band stepped below a size that only fit above
/// the noise ceiling.
#[test]
fn the_noise_line_names_the_size_whose_outcomes_disagreed() {
    let band = noise::NoisyBoundary {
        band_low: 1128,
        band_high: 2004,
        lowest_bound: 1503,
        width: 375,
        contradictions: vec![noise::Contradiction {
            fit: 2004,
            bound: 2004,
        }],
        spread_bytes: Some(300 << 20),
        ceiling_bytes: Some(1000 << 20),
    };
    let line = band.describe();
    assert!(
        line.starts_with("outcomes near 2004 disagree (2004 both fit and failed)"),
        "{line}"
    );
}

#[test]
fn a_repeat_that_fails_steps_down_one_band() {
    // 492 fits once, then fails: the noise is wider than the band showed; it doubles (20) and the
    // answer steps down below 492 by it.
    let out = flaky_search(vec![(502, 1), (492, 2)]);
    assert_eq!(
        out.stop_reason,
        StopReason::ProvenBelowNoise,
        "{:?}",
        sequence(&out)
    );
    assert_eq!((out.max_fitting, out.first_failing), (Some(472), Some(492)));
    let band = out.noisy_boundary.unwrap();
    assert_eq!(
        (band.band_low, band.lowest_bound, band.width),
        (472, 492, 20)
    );
    assert!(band.contradictions.contains(&noise::Contradiction {
        fit: 492,
        bound: 492
    }));
    assert_eq!(trials_after_first_contradiction(&out.trials), Some(4));
}

#[test]
fn a_noisy_boundary_gives_up_after_its_trials_without_an_answer() {
    let out = flaky_search(vec![(502, 1), (492, 2), (472, 2)]);
    assert_eq!(
        out.stop_reason,
        StopReason::NoisyBoundary,
        "{:?}",
        sequence(&out)
    );
    assert!(!out.stop_reason.is_complete());
    assert_eq!(out.max_fitting, None);
    assert_eq!(
        trials_after_first_contradiction(&out.trials),
        Some(noise::NOISY_TRIALS as usize)
    );
}

#[test]
fn outcomes_that_agree_keep_the_exact_proof() {
    // The same search on a device that is never flaky: no band, the exact answer.
    let out = flaky_search(vec![]);
    assert_eq!(out.stop_reason, StopReason::Proven);
    assert_eq!(out.max_fitting, Some(1000));
    assert_eq!(out.noisy_boundary, None);
}

proptest! {
    /// A device whose footprint moves by up to `noise` samples from one trial to the next: the search
    /// ends within its bound (at most NOISY_TRIALS after the first contradiction), and any answer fit
    /// with the confirmation's steps below every size that failed; after a contradiction, twice in
    /// fresh processes and at least one band below every failure.
    #[test]
    fn a_noisy_boundary_ends_within_its_bound_below_every_failure(
            base in 0u64..(2u64<<30), per in (64*1024u64)..(16*MIB), samples in 64u64..20_000,
            noise in 1u64..60, seed in 0u64..1000,
            tolerance in prop::sample::select(vec![0.0, DEFAULT_TOLERANCE]),
            strategy in prop::sample::select(vec![StrategyKind::Bisect, StrategyKind::Guided]),
            measure in any::<bool>()) {
        let cap = base + per * samples;
        let mut spec = SimSpec::affine(base, per, cap);
        spec.boundary_noise = noise * per;
        spec.seed = seed;
        let cfg = SearchConfig { strategy, tolerance, ..SearchConfig::default() };
        let mut be = Capped(SimBackend::new(spec));
        let prober = Prober::new(&mut be, cfg.clone(), cap);
        let prober = if measure {
            prober.with_strategy(Box::new(MeasureBelow { from: 64, done: false }))
        } else {
            prober
        };
        let mut prober = prober;
        let out = prober.search();
        prop_assert!(out.trials.len() <= 80, "{} trials", out.trials.len());
        let failures: Vec<u64> = out.trials.iter().filter(|t| t.outcome.is_bound()).map(|t| t.batch).collect();
        if let Some(b) = out.max_fitting {
            let rec = out.best_record(b).expect("tested");
            prop_assert!(rec.steps >= cfg.confirm_steps);
            prop_assert!(failures.iter().all(|&f| f > b), "answer {} at or above a failure {:?}", b, failures);
        }
        match &out.noisy_boundary {
            None => prop_assert_eq!(trials_after_first_contradiction(&out.trials), None),
            Some(band) => {
                let after = trials_after_first_contradiction(&out.trials).expect("a contradiction");
                prop_assert!(after <= noise::NOISY_TRIALS as usize, "{} trials after it", after);
                prop_assert!(matches!(out.stop_reason, StopReason::ProvenBelowNoise | StopReason::NoisyBoundary));
                if let Some(b) = out.max_fitting {
                    let fits = out.trials.iter().filter(|t| t.batch == b && t.outcome.fits() && t.steps >= cfg.confirm_steps).count();
                    prop_assert!(fits >= 2, "the answer fit {} times", fits);
                    let lowest = *failures.iter().min().unwrap();
                    prop_assert_eq!(band.lowest_bound, lowest);
                    prop_assert!(b + band.width <= lowest, "answer {} within a band ({}) of {}", b, band.width, lowest);
                }
            }
        }
    }
}

/// A search whose answer runs `repeats` more times, on a device whose footprint moves by up to
/// `noise` from run to run, with the job's limit a `band` above the trials' limit.
fn repeated_search(noise: u64, band: u64, repeats: u32, seed: u64) -> SearchOutcome {
    let limit = 1000 * MIB;
    let mut spec = SimSpec::affine(0, MIB, limit);
    spec.boundary_noise = noise;
    spec.seed = seed;
    let cfg = SearchConfig {
        repeats,
        ..exact(SearchConfig::default())
    };
    let mut be = Capped(SimBackend::new(spec));
    let out = Prober::new(&mut be, cfg, limit)
        .with_job_limit(limit + band)
        .search();
    out
}

/// The fresh fits of `b` with the confirmation's steps, and their largest footprint.
fn answer_fits(out: &SearchOutcome, b: u64) -> (usize, u64) {
    let fits: Vec<u64> = out
        .trials
        .iter()
        .filter(|t| t.batch == b && t.outcome.fits() && t.steps >= 5)
        .filter_map(|t| t.footprint())
        .collect();
    (fits.len(), fits.iter().copied().max().unwrap_or(0))
}

#[test]
fn the_answer_runs_again_fresh_and_a_spread_within_the_guard_band_keeps_it() {
    let out = repeated_search(0, 16 * MIB, 2, 1);
    assert!(out.stop_reason.is_complete(), "{:?}", sequence(&out));
    assert_eq!(out.max_fitting, Some(1000));
    let repeats = out
        .trials
        .iter()
        .filter(|t| t.purpose == Purpose::Repeat)
        .count();
    assert_eq!(repeats, 2, "{:?}", sequence(&out));
    assert_eq!(answer_fits(&out, 1000).0, 3);
    assert_eq!(out.noise_spread_bytes, Some(0));
    assert_eq!(out.noisy_boundary, None);
}

#[test]
fn without_repeats_the_answer_runs_once() {
    let out = repeated_search(0, 16 * MIB, 0, 1);
    assert_eq!(out.max_fitting, Some(1000));
    assert!(out.trials.iter().all(|t| t.purpose != Purpose::Repeat));
    assert_eq!(out.noise_spread_bytes, None);
}

#[test]
fn fresh_runs_that_spread_wider_than_the_guard_band_step_the_answer_below_the_noise() {
    // Footprints move by ±40 MiB from run to run (1 MiB a sample); the guard band is 16 MiB.
    let out = repeated_search(40 * MIB, 16 * MIB, 2, 3);
    assert_eq!(
        out.stop_reason,
        StopReason::ProvenBelowNoise,
        "{:?}",
        sequence(&out)
    );
    let b = out.max_fitting.expect("an answer");
    let spread = out.noise_spread_bytes.expect("measured");
    assert!(spread > 16 * MIB, "spread {spread}");
    let (fits, top) = answer_fits(&out, b);
    assert!(fits >= 3, "the answer fit {fits} times");
    assert!(
        top + spread <= 1016 * MIB,
        "answer {b}: its footprint {top} plus the spread {spread} is above the job's limit"
    );
    let band = out.noisy_boundary.clone().expect("recorded");
    assert!(b + band.width <= band.lowest_bound, "{band:?}");
    assert!(
        out.trials
            .iter()
            .filter(|t| t.outcome.is_bound())
            .all(|t| t.batch > b),
        "{:?}",
        sequence(&out)
    );
}

proptest! {
    /// Whatever the job's noise, a complete answer fit `1 + repeats` times in fresh runs, and its
    /// largest footprint plus the measured spread stays under the job's limit once the spread is
    /// wider than the guard band; the search ends within its bound.
    #[test]
    fn a_repeated_answer_leaves_room_for_the_measured_noise(
            noise_mib in 0u64..80, band_mib in 1u64..32, repeats in 1u32..4, seed in 0u64..1000) {
        let out = repeated_search(noise_mib * MIB, band_mib * MIB, repeats, seed);
        prop_assert!(out.trials.len() <= 60, "{} trials", out.trials.len());
        if let (Some(b), true) = (out.max_fitting, out.stop_reason.is_complete()) {
            let (fits, top) = answer_fits(&out, b);
            prop_assert!(fits > repeats as usize, "the answer fit {} times", fits);
            let spread = out.noise_spread_bytes.unwrap_or(0);
            if spread > band_mib * MIB {
                prop_assert!(top + spread <= (1000 + band_mib) * MIB,
                    "answer {}: footprint {} + spread {} above the job's limit", b, top, spread);
            }
            let failures: Vec<u64> = out.trials.iter().filter(|t| t.outcome.is_bound()).map(|t| t.batch).collect();
            prop_assert!(failures.iter().all(|&f| f > b), "answer {} at or above a failure {:?}", b, failures);
        }
    }
}

/// A job whose footprint moves uniformly by ±`noise` from run to run: three fresh runs of the
/// answer span on average only half that range, so the room left under the job's limit is the
/// whole range those runs imply. Over many draws, a fresh run of the answer lands above the job's
/// limit under 2 % of the time (the bare range of three runs left 3.2 % above it here).
#[test]
fn a_fresh_run_of_the_answer_rarely_lands_above_the_job_limit_under_uniform_noise() {
    let (noise, band) = (40 * MIB, 16 * MIB);
    let job_limit = (1000 * MIB + band) as f64;
    let mut above = vec![];
    for seed in 0..300 {
        let out = repeated_search(noise, band, 2, seed);
        let (Some(b), true) = (out.max_fitting, out.stop_reason.is_complete()) else {
            continue;
        };
        let mean = (b * MIB) as f64;
        let n = noise as f64;
        above.push(((mean + n - job_limit) / (2.0 * n)).clamp(0.0, 1.0));
    }
    assert!(
        above.len() >= 200,
        "only {} of 300 searches complete",
        above.len()
    );
    let rate = above.iter().sum::<f64>() / above.len() as f64;
    assert!(
        rate < 0.02,
        "a fresh run of the answer lands above the job's limit {:.1} % of the time",
        rate * 100.0
    );
}

/// A sim device whose job breaks from `from` up with an error (a shape that stops matching), and
/// otherwise runs as the sim does.
struct FailsFrom(SimBackend, u64);

impl Backend for FailsFrom {
    fn device(&self) -> &crate::device::DeviceInfo {
        self.0.device()
    }
    fn default_budget(&self) -> u64 {
        self.0.default_budget()
    }
    fn set_limit(&mut self, l: u64) {
        self.0.set_limit(l)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        self.0.isolation(req)
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        assert!(self.0.trials_run < TRIAL_CAP, "the search does not end");
        if req.batch < self.1 {
            return self.0.run_trial(req);
        }
        self.0.trials_run += 1;
        Ok(TrialOutcome::Error {
            message: format!("RuntimeError: shape mismatch at batch {}", req.batch),
        })
    }
}

fn fails_from(from: u64, spec: SimSpec, strategy: StrategyKind) -> SearchOutcome {
    let limit = spec.capacity;
    let cfg = SearchConfig {
        strategy,
        max_batch: 2048,
        ..SearchConfig::default()
    };
    let mut be = FailsFrom(SimBackend::new(spec), from);
    let out = Prober::new(&mut be, cfg, limit).search();
    out
}

/// A job that errs from some size up, below its memory limit: once the error repeated at a size, a
/// second size that errs (not retried) ends the search, and the stop names the error of the
/// smallest size that failed (was: a bisection down to the error's first size, two trials each,
/// 23 trials for guided and 27 for bisect ending in "trials failed with errors or timeouts").
#[test]
fn an_error_from_some_size_up_stops_the_search_and_names_it() {
    for strategy in [
        StrategyKind::Guided,
        StrategyKind::Bisect,
        StrategyKind::Power,
    ] {
        let out = fails_from(700, SimSpec::affine(0, MIB, 4000 * MIB), strategy);
        assert_eq!(out.stop_reason, StopReason::TrialErrors, "{strategy:?}");
        let failed: Vec<&TrialRecord> = out.trials.iter().filter(|t| !t.outcome.fits()).collect();
        let smallest = failed.iter().map(|t| t.batch).min().unwrap();
        let detail = out.fatal.clone().unwrap_or_default();
        assert!(
            detail.starts_with(&format!(
                "size {smallest} failed: RuntimeError: shape mismatch at batch {smallest}"
            )) && detail.contains("fix the failure"),
            "{strategy:?}: {detail}"
        );
        // after the first size that failed twice, at most two trials more
        let repeated = out
            .trials
            .iter()
            .position(|t| t.purpose == Purpose::Retry)
            .unwrap();
        assert!(
            out.trials.len() <= repeated + 3,
            "{strategy:?}: {:?}",
            sequence(&out)
        );
        assert!(failed.len() <= 3, "{strategy:?}: {:?}", sequence(&out));
    }
}

/// An error only at sizes above an out-of-memory bounds nothing: the search closes its proof below,
/// also where it met the error first (guided tries the largest size early: 2048 erred twice, then
/// an out-of-memory at a size between lifted it from the bracket).
#[test]
fn an_error_only_above_an_out_of_memory_does_not_stop_the_proof() {
    // a quarter MiB a sample predicts 4000 under 1000 MiB, but 2000 MiB more from 1000 up
    let mut spec = SimSpec::affine(0, MIB / 4, 1000 * MIB);
    spec.jumps = vec![(1000, 2000 * MIB)];
    let truth = spec.true_max(1000 * MIB, 5, 2048);
    for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
        let out = fails_from(1500, spec.clone(), strategy);
        assert!(
            out.stop_reason.is_complete(),
            "{strategy:?}: {:?}",
            sequence(&out)
        );
        // (within the default tolerance: 0.5 %)
        let m = out.max_fitting.unwrap();
        assert!(m <= truth && truth - m <= tolerance_gap(m, DEFAULT_TOLERANCE, 1));
        assert_eq!(out.fatal, None);
    }
    let out = fails_from(1500, spec, StrategyKind::Guided);
    let errors = out
        .trials
        .iter()
        .filter(|t| t.outcome.kind() == "error")
        .count();
    assert!(errors >= 2, "{:?}", sequence(&out));
}

/// A size that erred twice right above the largest fit names its error in the stop's detail too.
#[test]
fn a_single_size_that_errs_is_named_when_it_stops_the_proof() {
    let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
    spec.fail_at = Some(512);
    let cfg = exact(SearchConfig {
        strategy: StrategyKind::Bisect,
        ..SearchConfig::default()
    });
    let (out, _) = run(spec, cfg);
    assert_eq!(out.stop_reason, StopReason::TrialErrors);
    assert_eq!(out.max_fitting, Some(511));
    let detail = out.fatal.unwrap();
    assert!(
        detail.starts_with("size 512 failed (2 trials): simulated failure at batch 512. An error"),
        "{detail}"
    );
}

/// A device whose trials that need not be fresh run warm (started ahead, imports done) on a second
/// curve, as a job whose cold start holds more or less than a warm process.
struct WarmSim {
    warm: SimBackend,
    cold: SimBackend,
    last_warm: bool,
    /// The device's first trial runs cold, as an `--exec` device's does (no warm process yet).
    cold_first: bool,
}

impl WarmSim {
    fn new(warm: &SimSpec, cold: &SimSpec) -> Self {
        WarmSim {
            warm: SimBackend::new(warm.clone()),
            cold: SimBackend::new(cold.clone()),
            last_warm: false,
            cold_first: false,
        }
    }
}

/// A search on `k` devices at once whose exploration runs warm on `warm` and whose fresh trials
/// run on `cold`; the first trial of each device runs cold, as an `--exec` device's does.
fn warm_search(warm: &SimSpec, cold: &SimSpec, cfg: &SearchConfig, k: usize) -> SearchOutcome {
    warm_search_on(warm, cold, cfg, k, false)
}

/// [`warm_search`] on devices that share their cores (`alone`: exploration one size at a time).
fn warm_search_on(
    warm: &SimSpec,
    cold: &SimSpec,
    cfg: &SearchConfig,
    k: usize,
    alone: bool,
) -> SearchOutcome {
    let mut sims: Vec<WarmSim> = (0..k)
        .map(|_| WarmSim {
            cold_first: true,
            ..WarmSim::new(warm, cold)
        })
        .collect();
    let lanes = (sims.iter_mut().enumerate())
        .map(|(i, s)| crate::device::lanes::Lane {
            backend: s as &mut (dyn Backend + Send),
            gpu: Some(i as u32),
        })
        .collect();
    let mut set = crate::device::lanes::Lanes::new(lanes);
    if alone {
        set = set.exploring_alone();
    }
    let out = Prober::new(&mut set, cfg.clone(), cold.capacity).search();
    drop(set);
    out
}

impl Backend for WarmSim {
    fn device(&self) -> &crate::device::DeviceInfo {
        self.cold.device()
    }
    fn default_budget(&self) -> u64 {
        self.cold.default_budget()
    }
    fn set_limit(&mut self, l: u64) {
        self.warm.set_limit(l);
        self.cold.set_limit(l)
    }
    fn isolation(&self, _req: &TrialRequest) -> Isolation {
        Isolation::Process
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        let ran = self.cold.trials_run + self.warm.trials_run;
        assert!(ran < TRIAL_CAP);
        let cold = req.fresh || (self.cold_first && ran == 0);
        self.last_warm = !cold;
        if !self.last_warm {
            self.cold.run_trial(req)
        } else {
            self.warm.run_trial(req)
        }
    }
    fn take_details(&mut self) -> Option<crate::protocol::TrialDetails> {
        Some(crate::protocol::TrialDetails {
            warm: self.last_warm,
            ..Default::default()
        })
    }
}

/// A warm exploration trial is never the answer's confirmation nor a bound, even with the
/// confirmation's steps (`--confirm-steps` ≤ `--steps`) and no repeats: the answer fit cold, and
/// a fresh run of it fits.
#[test]
fn a_warm_fit_with_the_confirmations_steps_does_not_confirm_the_answer() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let warm = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
    for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
        let cfg = SearchConfig {
            strategy,
            steps: 5,
            confirm_steps: 5,
            repeats: 0,
            ..SearchConfig::default()
        };
        let mut be = WarmSim::new(&warm, &cold);
        let out = Prober::new(&mut be, cfg, cold.capacity).search();
        let b = out
            .max_fitting
            .unwrap_or_else(|| panic!("{strategy:?}: {out:#?}"));
        assert!(
            b <= 750,
            "{strategy:?}: {b} does not fit a cold run: {out:?}"
        );
        assert!(
            out.trials
                .iter()
                .any(|t| t.batch == b && t.cold() && t.outcome.fits() && t.steps >= 5),
            "{strategy:?}: {b} never fit cold"
        );
    }
}

/// With warm exploration that measures as cold processes do, the bracket closes on warm trials and
/// only the proof runs cold: the failure above the answer, its confirmation and its repeats.
#[test]
fn warm_exploration_leaves_only_the_proof_to_cold_trials() {
    let mut late = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    // memory that appears after the exploration's steps: 2 KiB a sample a step
    late.late_per_sample = 2048;
    for (spec, strategy) in [
        (
            SimSpec::affine(250 * MIB, MIB, 1000 * MIB),
            StrategyKind::Guided,
        ),
        (
            SimSpec::affine(250 * MIB, MIB, 1000 * MIB),
            StrategyKind::Bisect,
        ),
        (late.clone(), StrategyKind::Guided),
        (late, StrategyKind::Bisect),
    ] {
        let b = spec.true_max(spec.capacity, 5, 1_000_000);
        let cfg = exact(SearchConfig {
            strategy,
            repeats: 2,
            ..SearchConfig::default()
        });
        let mut be = WarmSim::new(&spec, &spec);
        let out = Prober::new(&mut be, cfg, spec.capacity).search();
        let seq = seq(&out);
        assert_eq!(out.max_fitting, Some(b), "{strategy:?}: {seq:?}");
        let cold: Vec<_> = (out.trials.iter())
            .filter(|t| t.cold())
            .map(|t| (t.batch, t.purpose))
            .collect();
        assert_eq!(
            cold,
            [
                (b + 1, Purpose::Proof),
                (b, Purpose::Confirm),
                (b, Purpose::Repeat),
                (b, Purpose::Repeat)
            ],
            "{strategy:?}: {seq:?}"
        );
    }
}

/// Two cold out-of-memories where warm trials fit with as many steps end warm exploration (one is
/// the job's noise, two are warm trials that miss memory of the job's): the rest of the search runs
/// cold, and the search ends within a few trials of it.
#[test]
fn cold_failures_where_warm_trials_fit_turn_exploration_cold() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let warm = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
    let cfg = exact(SearchConfig {
        repeats: 2,
        ..SearchConfig::default()
    });
    let mut be = WarmSim::new(&warm, &cold);
    let out = Prober::new(&mut be, cfg, cold.capacity).search();
    let seq = seq(&out);
    assert_eq!(out.max_fitting, Some(750), "{seq:?}");
    let t = &out.trials;
    let disagrees = |i: usize| {
        t[i].cold()
            && t[i].outcome.is_bound()
            && t[..i].iter().any(|w| {
                w.warm() && w.outcome.fits() && w.batch >= t[i].batch && w.steps >= t[i].steps
            })
    };
    let at: Vec<usize> = (0..t.len()).filter(|&i| disagrees(i)).collect();
    assert!(at.len() >= WARM_DISAGREEMENTS, "{seq:?}");
    let second = at[WARM_DISAGREEMENTS - 1];
    assert!(t[second + 1..].iter().all(|t| t.cold()), "{seq:?}");
    assert!(t.len() <= 30, "{} trials: {seq:?}", t.len());
}

/// Trials of one round are planned against the bracket before it: a warm fit above a warm failure
/// of the same round is no evidence either way, and the search still proves its answer cold.
#[test]
fn a_round_with_a_warm_fit_above_a_warm_failure_is_still_proven_cold() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let mut crossed = 0;
    for seed in 0..40 {
        let mut warm = cold.clone();
        warm.boundary_noise = 8 * MIB;
        warm.seed = seed;
        let cfg = SearchConfig {
            steps: 5,
            confirm_steps: 5,
            repeats: 0,
            ..SearchConfig::default()
        };
        let out = warm_search(&warm, &cold, &cfg, 2);
        let t = &out.trials;
        crossed += usize::from(t.iter().any(|f| {
            f.warm()
                && f.outcome.fits()
                && t.iter().any(|o| {
                    o.warm() && o.round == f.round && o.outcome.is_bound() && o.batch <= f.batch
                })
        }));
        assert!(out.stop_reason.is_complete(), "seed {seed}: {out:#?}");
        let b = out.max_fitting.unwrap();
        assert!(b <= 750 && 750 - b <= tolerance_gap(b, DEFAULT_TOLERANCE, 1));
        assert!(t
            .iter()
            .any(|t| t.batch == b && t.cold() && t.outcome.fits()));
    }
    assert!(crossed >= 3, "only {crossed} searches had a crossed round");
}

/// Power's doubling leaves a bound that does not close the bracket; it is still the plan's first
/// failing size, so it holds cold: a warm failure there (warm trials holding more) is run again.
#[test]
fn powers_bound_holds_cold() {
    let cold = SimSpec::affine(0, MIB, 1100 * MIB);
    let warm = SimSpec::affine(150 * MIB, MIB, 1100 * MIB);
    for k in [1, 2] {
        let cfg = SearchConfig {
            strategy: StrategyKind::Power,
            ..SearchConfig::default()
        };
        let out = warm_search(&warm, &cold, &cfg, k);
        let f = out.first_failing.expect("a bound");
        assert!(
            (out.trials.iter()).any(|t| t.batch == f && t.cold() && t.outcome.is_bound()),
            "k={k}: {f} never failed cold: {out:#?}"
        );
        assert_eq!(out.max_fitting, Some(1024), "k={k}");
    }
}

/// With warm trials that hold a little more than cold ones, a cold fit above a warm failure keeps
/// the warm failures above it as the bracket's end instead of exploring cold again from the fit up:
/// the search runs few cold trials more than the proof's.
#[test]
fn a_cold_fit_above_a_warm_failure_keeps_the_warm_failures_above_it() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let mut warm = cold.clone();
    // 1.5 MiB more at the boundary with the confirmation's steps
    warm.late_per_sample = 2048;
    for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
        let cfg = exact(SearchConfig {
            strategy,
            repeats: 2,
            ..SearchConfig::default()
        });
        let out = warm_search(&warm, &cold, &cfg, 1);
        assert_eq!(out.max_fitting, Some(750));
        let cold_trials = out.trials.iter().filter(|t| t.cold()).count();
        assert!(
            cold_trials <= 9,
            "{strategy:?}: {cold_trials} cold: {:?}",
            seq(&out)
        );
        let above = (out.trials.iter())
            .filter(|t| t.cold() && t.batch > 800)
            .count();
        assert_eq!(
            above,
            0,
            "{strategy:?}: cold trials far above: {:?}",
            seq(&out)
        );
    }
}

/// Each trial as `size{w|c}steps:purpose:outcome`.
fn seq(out: &SearchOutcome) -> Vec<String> {
    (out.trials.iter())
        .map(|t| {
            let how = if t.warm() { "w" } else { "c" };
            let (b, st, p, o) = (t.batch, t.steps, t.purpose, t.outcome.kind());
            format!("{b}{how}{st}:{p:?}:{o}")
        })
        .collect()
}

/// A noisy band is at least the guard band's samples wide, measured by the slope up to the fit
/// nearest the lowest failure when that size itself never fit (the usual case: a fit above it).
#[test]
fn the_guard_band_widens_a_noisy_band_whose_lowest_failure_never_fit() {
    let limit = 1000 * MIB;
    let rec = |batch: u64, fit: bool| {
        TrialRecord::for_test(batch, fit.then_some(250 * MIB + batch * MIB), 5, 1)
    };
    // 1 MiB a sample, a 16 MiB guard band: 16 samples; 745 failed and 746 fit
    let history = vec![
        rec(1, true),
        rec(375, true),
        rec(740, true),
        rec(745, false),
        rec(746, true),
    ];
    let mut be = SimBackend::new(SimSpec::affine(250 * MIB, MIB, limit));
    let p = Prober::new(&mut be, SearchConfig::default(), limit)
        .with_job_limit(limit + 16 * MIB)
        .with_history(history);
    let band = p.noisy_band(&Grid::new(1, 1_000_000, 1).unwrap()).unwrap();
    assert!(band.width >= 16, "{band:?}");
    assert!(band.band_low <= 745 - 16, "{band:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// Whatever warm trials measure (less or more than cold ones, late memory on either side, noise
    /// in warm runs), on one device or several: a complete answer fits cold (1 + repeats cold fits
    /// with the confirmation's steps), is at most the cold truth, and its first failing size failed
    /// cold, above it.
    #[test]
    fn warm_trials_never_prove(
        warm_base in 100u64..400, warm_late in prop::sample::select(vec![0u64, 2048, 200 * 1024]),
        cold_late in prop::sample::select(vec![0u64, 2048]), warm_noise in 0u64..8, seed in 0u64..1000,
        k in 1usize..4, repeats in prop::sample::select(vec![0u32, 2]),
        tolerance in prop::sample::select(vec![0.0, DEFAULT_TOLERANCE]),
        strategy in prop::sample::select(vec![StrategyKind::Guided, StrategyKind::Bisect])) {
        let mut cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
        cold.late_per_sample = cold_late;
        let mut warm = SimSpec::affine(warm_base * MIB, MIB, 1000 * MIB);
        warm.late_per_sample = warm_late;
        warm.boundary_noise = warm_noise * MIB;
        warm.seed = seed;
        let cfg = SearchConfig { strategy, repeats, tolerance, ..SearchConfig::default() };
        let out = warm_search(&warm, &cold, &cfg, k);
        prop_assert!(out.stop_reason.is_complete(), "{:?}: {:?}", out.stop_reason, seq(&out));
        let b = out.max_fitting.unwrap();
        prop_assert!(b <= cold.true_max(cold.capacity, 5, cfg.max_batch), "{:?}", seq(&out));
        let cold_fits = (out.trials.iter())
            .filter(|t| t.batch == b && t.cold() && t.outcome.fits() && t.steps >= 5)
            .count();
        prop_assert!(cold_fits > repeats as usize, "{:?}", seq(&out));
        let f = out.first_failing.unwrap();
        prop_assert!(f > b);
        prop_assert!((out.trials.iter()).any(|t| t.batch == f && t.cold() && t.outcome.is_bound()));
        prop_assert!(out.trials.len() <= 150, "{} trials: {:?}", out.trials.len(), seq(&out));
    }
}

/// A job whose warm processes hold less than its cold start (a library the script sizes before
/// importing it): the answer's confirmation runs out of memory twice where a warm trial of as many
/// steps fit, and the search explores cold from then on instead of climbing back to the warm
/// boundary.
#[test]
fn a_confirmation_failing_twice_where_a_warm_trial_fit_turns_exploration_cold() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let warm = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
    let cfg = SearchConfig {
        steps: 5,
        confirm_steps: 5,
        repeats: 2,
        ..SearchConfig::default()
    };
    let out = warm_search(&warm, &cold, &cfg, 1);
    let t = &out.trials;
    let warm_fit = |b: u64| {
        t.iter()
            .any(|w| w.warm() && w.outcome.fits() && w.batch >= b)
    };
    let disagreeing: Vec<usize> = (0..t.len())
        .filter(|&i| t[i].cold() && t[i].outcome.is_bound() && warm_fit(t[i].batch))
        .collect();
    assert!(disagreeing.len() >= 2, "{:?}", seq(&out));
    let (first, second) = (disagreeing[0], disagreeing[1]);
    assert_eq!(t[first].batch, t[second].batch, "{:?}", seq(&out));
    assert!(t[second..].iter().all(|t| t.cold()), "{:?}", seq(&out));
    let b = out.max_fitting.expect("an answer");
    assert!(b <= 750 && 750 - b <= tolerance_gap(b, DEFAULT_TOLERANCE, 1));
}

#[test]
fn the_noise_of_several_repeated_sizes_is_pooled_not_the_widest_one_scaled() {
    use super::line::{pooled_range, whole_range};
    let (three, two): (&[u64], &[u64]) = (&[100, 130, 160], &[200, 260]);
    assert_eq!(pooled_range([three].into_iter()), Some(whole_range(60, 3)));
    // 60 + 60 over the shares three runs (1/2) and two runs (1/3) span: 144, where the widest
    // scaled alone would be 180
    assert_eq!(pooled_range([three, two].into_iter()), Some(144));
    assert_eq!(pooled_range([&[5u64][..]].into_iter()), None);
}

/// With one repeat the answer runs twice: the search holds it to the noise its own two runs imply,
/// as the split and `verify` do ([`noise::above_noise`]), so no complete plan recommends a size its
/// own rule then refuses.
#[test]
fn with_one_repeat_the_answer_is_held_to_the_noise_of_its_own_runs() {
    for seed in 0..200 {
        let out = repeated_search(40 * MIB, 16 * MIB, 1, seed);
        let (Some(b), true) = (out.max_fitting, out.stop_reason.is_complete()) else {
            continue;
        };
        let fits: Vec<u64> = (out.trials.iter())
            .filter(|t| t.batch == b && t.fresh_fit_at(5, 1))
            .filter_map(|t| t.footprint())
            .collect();
        let over = noise::above_noise(&fits, out.noise_spread_bytes, 1016 * MIB, 1000 * MIB);
        assert_eq!(over, None, "seed {seed}: the answer {b}'s runs {fits:?}");
    }
}

/// Below a noisy boundary the ceiling only falls: a size below one that peaked above it is held
/// to that ceiling even where its own runs, drawn close together, narrow the measured spread. The
/// answer's runs all lie under the ceiling the plan records.
#[test]
fn below_the_noise_the_ceiling_never_rises_for_a_smaller_size() {
    for (repeats, seed) in (1..3).flat_map(|r| (0..150).map(move |s| (r, s))) {
        let out = repeated_search(40 * MIB, 16 * MIB, repeats, seed);
        let (Some(b), true) = (out.max_fitting, out.stop_reason.is_complete()) else {
            continue;
        };
        let Some(ceiling) = out.noisy_boundary.as_ref().and_then(|n| n.ceiling_bytes) else {
            continue;
        };
        let top = answer_fits(&out, b).1;
        assert!(
            top <= ceiling,
            "repeats {repeats}, seed {seed}: the answer {b} peaked at {top}, above the ceiling \
             {ceiling} the plan records"
        );
    }
}

/// `verify`'s rule reads a size's runs by their lowest: a run of verify that draws low widens the
/// measured range of four runs (the probe's three at 1262.7, 1257.9 and 1258.9 MiB and verify's
/// at 1247.4, a Lightning script under a 1264 MiB trial limit and a 1280 MiB job limit) past the
/// guard band, yet every fresh run still reaches at most the lowest plus that range: the plan
/// holds. Held to the highest, as the probe holds its own answer's runs, it failed.
#[test]
fn a_verify_run_drawing_low_does_not_fail_a_plan_whose_noise_fits_the_guard_band() {
    let mib = |x: f64| (x * MIB as f64) as u64;
    let fits = [mib(1262.7), mib(1257.9), mib(1258.9), mib(1247.4)];
    let (job, limit, probe_spread) = (1280 * MIB, 1264 * MIB, Some(mib(9.7)));
    assert_eq!(
        noise::reach_above_limit(&fits, probe_spread, job, limit),
        None
    );
    assert!(noise::above_noise(&fits, probe_spread, job, limit).is_some());
    // a device whose runs all peak 10 MiB higher is held to it
    let higher: Vec<u64> = fits.iter().map(|f| f + 10 * MIB).collect();
    assert!(noise::reach_above_limit(&higher, probe_spread, job, limit).is_some());
}

/// Runs under the job's limit (`verify` on the plan's own device) that all peak above the trials'
/// limit, with no run of the size under it: their spread within the guard band says nothing of a
/// fresh run's room under the job's limit, so the band is the noise they are held to, and the
/// lowest of them plus it lies above the job's limit (397 MiB + 16 MiB > 400 MiB). A fit under the
/// trials' limit with such a spread keeps the promise.
#[test]
fn fits_above_the_trials_limit_are_held_to_the_guard_band_at_least() {
    let (job, limit) = (400 * MIB, 384 * MIB);
    let above = [397 * MIB, 398 * MIB, 399 * MIB];
    for measured in [None, Some(4 * MIB), Some(15 * MIB)] {
        let over = noise::reach_above_limit(&above, measured, job, limit).expect("held");
        assert_eq!(over.top, 397 * MIB);
        assert!(over.top + over.spread > job, "{over:?}");
    }
    let under = [383 * MIB, 386 * MIB, 387 * MIB];
    assert_eq!(
        noise::reach_above_limit(&under, Some(4 * MIB), job, limit),
        None
    );
}

/// Once warm exploration's largest fit ran with the confirmation's steps, every warm trial above it
/// runs so too: a shorter fit above it misses the memory that appears after the exploration's steps,
/// so its peak (below the longer fit's) would aim the line past the boundary the cold proof meets.
#[test]
fn above_a_warm_fit_with_the_confirmations_steps_warm_trials_run_as_many() {
    let mut trials_seen = Vec::new();
    for late in [512, 2048, 8192] {
        for base in [250 * MIB, 600 * MIB] {
            let mut spec = SimSpec::affine(base, 100 * 1024, 1000 * MIB);
            spec.late_per_sample = late;
            let cfg = SearchConfig {
                repeats: 2,
                ..SearchConfig::default()
            };
            let mut be = WarmSim::new(&spec, &spec);
            let out = Prober::new(&mut be, cfg.clone(), spec.capacity).search();
            let seq = seq(&out);
            let truth = spec.true_max(spec.capacity, 5, 1_000_000);
            let b = out.max_fitting.expect("an answer");
            assert!(
                b <= truth && truth - b <= tolerance_gap(b, cfg.tolerance, 1),
                "{seq:?}"
            );
            let mut full_fit: Option<u64> = None;
            for t in out.trials.iter().filter(|t| t.warm()) {
                assert!(
                    full_fit.is_none_or(|f| t.batch <= f) || t.steps >= cfg.confirm_steps,
                    "late {late}: {} ran {} steps above a full-length fit at {full_fit:?}: {seq:?}",
                    t.batch,
                    t.steps
                );
                if t.outcome.fits() && t.steps >= cfg.confirm_steps {
                    full_fit = full_fit.max(Some(t.batch));
                }
            }
            trials_seen.push(out.trials.len());
        }
    }
    eprintln!("trials: {trials_seen:?}");
}

/// Devices that share their cores explore one warm size at a time; once cold trials disagreed with
/// warm ones and exploration runs cold, its trials are the proof's kind and run side by side.
#[test]
fn a_cold_walk_after_warm_exploration_runs_side_by_side_on_devices_sharing_cores() {
    let cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    let warm = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
    let cfg = SearchConfig {
        repeats: 2,
        ..SearchConfig::default()
    };
    let out = warm_search_on(&warm, &cold, &cfg, 2, true);
    let t = &out.trials;
    let in_round = |r: Option<u32>| t.iter().filter(|x| x.round == r).count();
    for w in t.iter().filter(|w| w.warm()) {
        assert_eq!(
            in_round(w.round),
            1,
            "a warm trial beside another: {:?}",
            seq(&out)
        );
    }
    // a round of the walk: several cold trials, none of them a run of the answer
    let walk_round = |r: Option<u32>| {
        let round: Vec<_> = t.iter().filter(|x| x.round == r).collect();
        round.len() > 1
            && (round.iter())
                .all(|x| x.cold() && matches!(x.purpose, Purpose::Explore | Purpose::Proof))
    };
    assert!(
        t.iter().any(|x| walk_round(x.round)),
        "the cold walk ran alone: {:?}",
        seq(&out)
    );
    let b = out.max_fitting.expect("an answer");
    assert!(
        b <= 750 && 750 - b <= tolerance_gap(b, DEFAULT_TOLERANCE, 1),
        "{:?}",
        seq(&out)
    );
    check_invariant(&out, &cfg);
}

/// A cold walk whose confirmation failed where warm trials fit, with no cold fit of the
/// confirmation's length below it (only the first trial's short one): the strategy aims by the warm
/// fits' slope through that cold fit, not at half the failure (449, then a line from there). Warm
/// processes holding 150 MiB less than cold ones (the answer 750 where warm trials fit 898), late
/// memory or none: the walk's first size lies within 2 % of the answer.
#[test]
fn a_cold_walk_aims_by_the_warm_slope_through_its_cold_fit() {
    for late in [0, 2048] {
        let mut cold = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
        cold.late_per_sample = late;
        let mut warm = SimSpec::affine(100 * MIB, MIB, 1000 * MIB);
        warm.late_per_sample = late;
        let cfg = SearchConfig {
            repeats: 2,
            ..SearchConfig::default()
        };
        let out = warm_search_on(&warm, &cold, &cfg, 2, true);
        let truth = cold.true_max(cold.capacity, 5, cfg.max_batch);
        let b = out.max_fitting.expect("an answer");
        assert!(
            b <= truth && truth - b <= tolerance_gap(b, cfg.tolerance, 1),
            "{:?}",
            seq(&out)
        );
        let t = &out.trials;
        let last_failed_confirm = (t.iter())
            .rposition(|x| x.purpose == Purpose::Confirm && x.outcome.is_bound())
            .expect("the confirmation failed cold");
        let walk = &t[last_failed_confirm + 1];
        assert!(
            walk.batch.abs_diff(truth) * 50 <= truth,
            "the walk started at {}: {:?}",
            walk.batch,
            seq(&out)
        );
        check_invariant(&out, &cfg);
    }
}
