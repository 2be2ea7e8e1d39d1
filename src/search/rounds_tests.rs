use super::super::tests::check_invariant;
use crate::device::lanes::Lane;
use crate::device::lanes::Lanes;
use crate::device::sim::{SimBackend, SimSpec};
use crate::device::{Backend, BackendError, DeviceInfo, RoundTrial};
use crate::protocol::{Isolation, TrialOutcome, TrialRequest};
use crate::search::{
    bisect, rounds, tolerance_gap, Grid, Prober, Proposal, Purpose, SearchConfig, SearchOutcome,
    SearchState, Strategy, StrategyKind, TrialRecord,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// A search over `k` copies of the sim device `spec` (one trial per copy per round), with the
/// number of trials each copy ran.
fn search_on(spec: &SimSpec, cfg: &SearchConfig, k: usize) -> (SearchOutcome, Vec<u64>) {
    search_over(spec, cfg, k, false)
}

/// [`search_on`], the devices sharing their cores when `alone` ([`Lanes::exploring_alone`]).
fn search_over(
    spec: &SimSpec,
    cfg: &SearchConfig,
    k: usize,
    alone: bool,
) -> (SearchOutcome, Vec<u64>) {
    search_lanes(spec, cfg, k, alone, None)
}

/// [`search_over`], with the job's limit `job_limit` above the trials' when given.
fn search_lanes(
    spec: &SimSpec,
    cfg: &SearchConfig,
    k: usize,
    alone: bool,
    job_limit: Option<u64>,
) -> (SearchOutcome, Vec<u64>) {
    let mut sims: Vec<SimBackend> = (0..k).map(|_| SimBackend::new(spec.clone())).collect();
    let lanes = sims
        .iter_mut()
        .enumerate()
        .map(|(i, s)| Lane {
            backend: s as &mut (dyn Backend + Send),
            gpu: Some(i as u32),
        })
        .collect();
    let mut set = Lanes::new(lanes);
    if alone {
        set = set.exploring_alone();
    }
    let out = {
        let mut prober = Prober::new(&mut set, cfg.clone(), spec.capacity);
        if let Some(j) = job_limit {
            prober = prober.with_job_limit(j);
        }
        prober.search()
    };
    drop(set);
    (out, sims.iter().map(|s| s.trials_run).collect())
}

/// The exact proof (no tolerance) with the answer run twice more, as `--exec` runs it.
fn exact_with_repeats(strategy: StrategyKind) -> SearchConfig {
    SearchConfig {
        strategy,
        tolerance: 0.0,
        repeats: 2,
        ..SearchConfig::default()
    }
}

/// Rounds of a search: its trials' distinct round numbers (every trial is its own round when the
/// trials ran one at a time).
fn rounds(out: &SearchOutcome) -> usize {
    let mut r: Vec<u32> = out.trials.iter().filter_map(|t| t.round).collect();
    r.dedup();
    r.len() + out.trials.iter().filter(|t| t.round.is_none()).count()
}

#[test]
fn one_device_runs_no_rounds() {
    let spec = SimSpec::affine(0, MIB, 1000 * MIB);
    let (out, _) = search_on(&spec, &SearchConfig::default(), 1);
    assert!(out.trials.iter().all(|t| t.round.is_none()));
    assert_eq!(
        out.max_fitting,
        Some(spec.true_max(1000 * MIB, 5, 1_000_000))
    );
}

#[test]
fn a_round_runs_one_trial_per_device_and_records_its_number() {
    let spec = SimSpec::parse("base=1GiB,per-sample=3MiB,capacity=16GiB").unwrap();
    let (out, per_lane) = search_on(&spec, &SearchConfig::default(), 4);
    let mut last = 0;
    for t in &out.trials {
        let r = t
            .round
            .expect("every trial of a parallel search has a round");
        assert!(r >= last, "rounds are numbered in order");
        last = r;
        let same: Vec<_> = out.trials.iter().filter(|u| u.round == t.round).collect();
        assert!(same.len() <= 4);
        let mut gpus: Vec<_> = same.iter().map(|u| u.gpu_index).collect();
        gpus.sort();
        gpus.dedup();
        assert_eq!(gpus.len(), same.len(), "one trial per device in round {r}");
    }
    assert!(per_lane.iter().skip(1).all(|&n| n > 0), "{per_lane:?}");
    assert_eq!(per_lane.iter().sum::<u64>(), out.trials.len() as u64);
}

#[test]
fn bisection_spreads_a_round_evenly_over_the_bracket() {
    let grid = Grid::new(1, 1000, 1).unwrap();
    let st = SearchState {
        grid,
        lo: Some(99),
        hi: Some(199),
        ceiling: None,
        trials: &[],
        limit_bytes: 1,
        steps: 2,
        base_steps: 2,
        confirm_steps: 5,
        tolerance: 0.0,
        confirm_ooms: false,
        prior: None,
    };
    let mut s = bisect::DoublingBisection::default();
    let got: Vec<u64> = s.propose_round(&st, 4).iter().map(|p| p.index).collect();
    assert_eq!(got, vec![119, 139, 159, 179]);
    // a bracket with fewer sizes than devices: each size once
    let st = SearchState {
        hi: Some(102),
        ..st
    };
    let got: Vec<u64> = s.propose_round(&st, 8).iter().map(|p| p.index).collect();
    assert_eq!(got, vec![100, 101]);
}

/// A round over a bracket open above, whose sizes that failed all lie below its fit (a noisy
/// boundary, or warm failures that cold fits overturned), is the proposal alone: the boundary is
/// near those failures, and neither a ladder to the largest size nor a gap above the proposal
/// (75424 beside 4714 on a 2-core machine, each slowing the other) is worth a device.
#[test]
fn a_round_open_above_after_failures_below_does_not_climb_the_ladder() {
    let grid = Grid::new(1, 1_048_576, 1).unwrap();
    let trials = [
        TrialRecord::for_test(4672, Some(1 << 30), 5, 1),
        TrialRecord::for_test(4691, None, 5, 1),
        TrialRecord::for_test(4691, Some(1 << 30), 5, 1),
    ];
    let st = SearchState {
        grid,
        lo: Some(grid.index_at_or_below(4691)),
        hi: None,
        ceiling: None,
        trials: &trials,
        limit_bytes: 1 << 31,
        steps: 2,
        base_steps: 2,
        confirm_steps: 5,
        tolerance: 0.005,
        confirm_ooms: false,
        prior: None,
    };
    let first = Proposal::explore(grid.index_at_or_below(4714));
    assert_eq!(rounds::around(&st, first, 2, false), vec![first]);
    // with nothing failed, the ladder still spreads a round upward
    let st = SearchState {
        trials: &trials[..1],
        ..st
    };
    assert_eq!(rounds::around(&st, first, 2, false).len(), 2);
}

/// Rounds and trials for k = 1, 2, 4, 8 devices on one scripted curve, both strategies: more devices,
/// fewer rounds; every answer proven, within the tolerance of the truth (printed with
/// `--nocapture` for the record).
#[test]
fn more_devices_need_fewer_rounds_for_the_same_answer() {
    let spec = SimSpec::parse("base=4GiB,per-sample=300MiB,capacity=141GiB,knee=8").unwrap();
    for strategy in [StrategyKind::Guided, StrategyKind::Bisect] {
        let cfg = SearchConfig {
            strategy,
            ..SearchConfig::default()
        };
        let truth = spec.true_max(spec.capacity, cfg.confirm_steps, cfg.max_batch);
        let mut seen = vec![];
        for k in [1, 2, 4, 8] {
            let (out, _) = search_on(&spec, &cfg, k);
            check_invariant(&out, &cfg);
            let b = out.max_fitting.expect("an answer");
            assert!(b <= truth && b + tolerance_gap(b, cfg.tolerance, 1) >= truth);
            println!(
                "{strategy:?} k={k}: {} rounds, {} trials, answer {:?}",
                rounds(&out),
                out.trials.len(),
                out.max_fitting
            );
            seen.push((rounds(&out), out.max_fitting));
        }
        assert!(seen[3].0 < seen[0].0, "{strategy:?}: {seen:?}");
        assert!(seen.windows(2).all(|w| w[1].0 <= w[0].0), "{seen:?}");
    }
}

#[test]
fn errors_in_a_round_are_retried_and_never_evidence() {
    // every trial at 256 (on the doubling ladder) ends in an error: never a fit, never an
    // out-of-memory; the search on one device says the same
    let spec = SimSpec::parse("base=0,per-sample=1MiB,capacity=1000MiB,fail-at=256").unwrap();
    let cfg = SearchConfig {
        strategy: StrategyKind::Bisect,
        tolerance: 0.0,
        ..SearchConfig::default()
    };
    let (out, _) = search_on(&spec, &cfg, 3);
    let (one, _) = search_on(&spec, &cfg, 1);
    let at: Vec<_> = out.trials.iter().filter(|t| t.batch == 256).collect();
    assert!(
        at.len() >= 2,
        "an error in a round is retried: {:?}",
        out.trials
    );
    assert!(at
        .iter()
        .all(|t| matches!(t.outcome, TrialOutcome::Error { .. })));
    assert!(at[1..].iter().all(|t| t.purpose == Purpose::Retry));
    assert_eq!(out.max_fitting, one.max_fitting);
    assert_eq!(out.stop_reason, one.stop_reason);
    assert_ne!(out.first_failing, Some(256));
}

proptest! {
    /// For random monotone devices, the search on k devices at once answers what the search on one
    /// answers, and the proof holds: the answer fit with the confirmation's steps and the next size
    /// up ran out of memory.
    #[test]
    fn k_way_search_answers_as_the_one_way_search(
        base in 0u64..(4u64<<30), per in 1u64..(64*MIB), cap in (64*MIB)..(100u64<<30),
        knee in 0u64..200, jump_at in 1u64..100_000, jump in 0u64..(512*MIB),
        late in 0u64..(64*1024), mult in prop::sample::select(vec![1u64, 2, 8]),
        k in 2usize..9,
        strategy in prop::sample::select(vec![StrategyKind::Bisect, StrategyKind::Guided])) {
        let mut spec = SimSpec::affine(base, per, cap);
        spec.knee = knee;
        spec.jumps = vec![(jump_at, jump)];
        spec.late_per_sample = late;
        let cfg = SearchConfig { multiple_of: mult, strategy, tolerance: 0.0, ..SearchConfig::default() };
        let (one, _) = search_on(&spec, &cfg, 1);
        let (many, per_lane) = search_on(&spec, &cfg, k);
        prop_assert!(per_lane.iter().sum::<u64>() <= 200, "{:?} trials", per_lane);
        prop_assert_eq!(many.max_fitting, one.max_fitting);
        prop_assert_eq!(many.stop_reason, one.stop_reason);
        check_invariant(&many, &cfg);
    }
}

/// On two devices, the proof's cold trials run side by side: the answer's two repeats share a
/// round, and nothing runs after it.
#[test]
fn the_proofs_trials_run_side_by_side() {
    let spec = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    for strategy in [StrategyKind::Bisect, StrategyKind::Guided] {
        let cfg = exact_with_repeats(strategy);
        let (out, _) = search_on(&spec, &cfg, 2);
        assert_eq!(out.max_fitting, Some(750));
        let repeats: Vec<u32> = (out.trials.iter())
            .filter(|t| t.batch == 750 && t.purpose == Purpose::Repeat)
            .filter_map(|t| t.round)
            .collect();
        assert_eq!(repeats.len(), 2, "{:?}", out.trials);
        assert_eq!(repeats[0], repeats[1], "the repeats share a round");
        let last = out.trials.iter().filter_map(|t| t.round).max().unwrap();
        assert_eq!(last, repeats[0], "nothing runs after the repeats");
        check_invariant(&out, &cfg);
    }
}

/// On two devices, the runs of a candidate below a noisy boundary go side by side too, and the
/// answer keeps the noise rule: it fit at least twice, a band below every failure.
#[test]
fn runs_below_a_noisy_boundary_run_side_by_side() {
    let mut noisy = 0;
    for seed in 0..40 {
        let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
        spec.boundary_noise = 20 * MIB;
        spec.seed = seed;
        let cfg = SearchConfig {
            repeats: 2,
            tolerance: 0.0,
            ..SearchConfig::default()
        };
        let (out, _) = search_on(&spec, &cfg, 2);
        let Some(band) = out.noisy_boundary.clone() else {
            continue;
        };
        let Some(b) = out.max_fitting else { continue };
        noisy += 1;
        let lowest = (out.trials.iter())
            .filter(|t| t.outcome.is_bound())
            .map(|t| t.batch)
            .min()
            .unwrap();
        assert!(b + band.width <= lowest, "seed {seed}: {b}, {band:?}");
        let at_b: Vec<_> = (out.trials.iter())
            .filter(|t| t.batch == b && t.steps >= 5)
            .collect();
        assert!(at_b.iter().filter(|t| t.outcome.fits()).count() >= 2);
        let mut rounds: Vec<u32> = at_b.iter().filter_map(|t| t.round).collect();
        let n = rounds.len();
        rounds.dedup();
        assert!(
            rounds.len() < n,
            "seed {seed}: {b}'s runs each alone: {:?}",
            out.trials
        );
    }
    assert!(noisy >= 5, "only {noisy} noisy searches");
}

/// Devices that share their cores explore one size at a time, and run only the proof's trials side
/// by side: the answer of one device, in fewer rounds than its trials.
#[test]
fn devices_sharing_cores_explore_alone_and_prove_side_by_side() {
    let spec = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    for strategy in [StrategyKind::Bisect, StrategyKind::Guided] {
        let cfg = exact_with_repeats(strategy);
        let (one, _) = search_on(&spec, &cfg, 1);
        let (out, per_lane) = search_over(&spec, &cfg, 3, true);
        assert_eq!(out.max_fitting, one.max_fitting, "{strategy:?}");
        let round = |r: Option<u32>| out.trials.iter().filter(move |t| t.round == r);
        for t in out.trials.iter().filter(|t| t.purpose == Purpose::Explore) {
            assert_eq!(round(t.round).count(), 1, "{strategy:?}: {:?}", out.trials);
        }
        assert!(
            (out.trials.iter()).any(|t| round(t.round).count() > 1),
            "{strategy:?}: no proof trials side by side: {:?}",
            out.trials
        );
        assert!(per_lane[1] > 0, "{per_lane:?}");
        assert!(rounds(&out) < out.trials.len());
        check_invariant(&out, &cfg);
    }
}

/// Two devices whose trials fail when they run beside another (a job that binds a fixed port): the
/// first of a round runs, the others end in an error.
struct Crowded(SimBackend);

impl Backend for Crowded {
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
        self.0.isolation(req)
    }
    fn width(&self) -> usize {
        2
    }
    fn explore_width(&self) -> usize {
        1
    }
    fn run_round(&mut self, reqs: &[TrialRequest]) -> Vec<RoundTrial> {
        let mut out = vec![crate::device::run_one(&mut self.0, reqs[0], None)];
        for _ in &reqs[1..] {
            out.push(RoundTrial {
                outcome: Ok(TrialOutcome::Error {
                    message: "address already in use".into(),
                }),
                isolation: Isolation::Process,
                details: None,
                seconds: 0.0,
                gpu: None,
            });
        }
        out
    }
}

/// A job that fails beside another runs the rest of its proof alone, below a noisy boundary too:
/// after the first round side by side, every trial is alone in its round; nothing that failed is
/// evidence.
#[test]
fn a_trial_that_fails_beside_another_turns_the_proof_one_at_a_time() {
    let mut noisy = 0;
    for seed in 0..40 {
        let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
        spec.boundary_noise = 20 * MIB;
        spec.seed = seed;
        let cfg = SearchConfig {
            tolerance: 0.0,
            repeats: 2,
            ..SearchConfig::default()
        };
        let mut crowded = Crowded(SimBackend::new(spec.clone()));
        let out = Prober::new(&mut crowded, cfg.clone(), spec.capacity).search();
        noisy += usize::from(out.noisy_boundary.is_some());
        let beside = |r: Option<u32>| out.trials.iter().filter(|t| t.round == r).count();
        let shared: Vec<_> = (out.trials.iter())
            .filter(|t| beside(t.round) > 1)
            .map(|t| t.round)
            .collect();
        assert!(
            shared.iter().all(|&r| r == shared[0]),
            "seed {seed}: one round side by side, then alone: {:?}",
            out.trials
        );
        if let Some(b) = out.max_fitting {
            let fits = (out.trials.iter())
                .filter(|t| t.batch == b && t.steps >= 5 && t.outcome.fits())
                .count();
            assert!(fits >= 3, "seed {seed}: {b} fit {fits} times");
        }
    }
    assert!(noisy >= 5, "only {noisy} noisy searches");
}

/// Side by side, a noisy boundary costs no more trials after its first disagreement than one trial
/// at a time may (the noise rule's cap): a round whose repeats ran out of memory where the
/// confirmation fit goes to the noise rule at once, without one more run of its size.
#[test]
fn side_by_side_the_noise_rule_keeps_its_cap_of_trials() {
    let cap = crate::search::noise::noisy_trials(2) as usize;
    // trials in the rounds after the first disagreement's (its round's other trials ran with it)
    let after_first = |out: &SearchOutcome| {
        let first = (0..out.trials.len())
            .find(|&i| !crate::search::noise::contradictions(&out.trials[..=i]).is_empty())?;
        let round = out.trials[first].round;
        let after = out.trials[first + 1..].iter().filter(|t| t.round > round);
        Some(after.filter(|t| t.purpose != Purpose::Retry).count())
    };
    for seed in 0..300 {
        let mut spec = SimSpec::affine(0, MIB, 1000 * MIB);
        spec.boundary_noise = 20 * MIB;
        spec.seed = seed;
        let cfg = SearchConfig {
            repeats: 2,
            tolerance: 0.0,
            ..SearchConfig::default()
        };
        for k in [2, 4] {
            let (out, _) = search_over(&spec, &cfg, k, true);
            let n = after_first(&out).unwrap_or(0);
            assert!(
                n <= cap,
                "seed {seed}, {k} lanes: {n} trials after the first disagreement (cap {cap}): {:?}",
                out.trials
            );
        }
    }
}

/// The split's fresh runs go side by side too: its confirmation and repeats at the accumulation the
/// job will run share a round; a split size that runs out of memory at that accumulation is said
/// so, as one run at a time would.
#[test]
fn the_splits_runs_go_side_by_side() {
    let mut spec = SimSpec::affine(250 * MIB, MIB, 1000 * MIB);
    spec.accumulation_extra = 40 * MIB;
    let cfg = SearchConfig {
        repeats: 2,
        ..SearchConfig::default()
    };
    let mut sims: Vec<SimBackend> = (0..3).map(|_| SimBackend::new(spec.clone())).collect();
    let lanes = (sims.iter_mut())
        .map(|s| Lane {
            backend: s as &mut (dyn Backend + Send),
            gpu: None,
        })
        .collect();
    let mut set = Lanes::new(lanes).exploring_alone();
    let mut prober = Prober::new(&mut set, cfg, spec.capacity);
    // 700 + 40 MiB of accumulation fits in 1000 MiB; 740 + 40 does not
    let fits = prober.confirm_split_held(450, 2, Purpose::Confirm).unwrap();
    assert_eq!(fits, crate::search::Confirmation::Fits);
    let over = prober.confirm_split_held(740, 2, Purpose::Confirm).unwrap();
    assert_eq!(over, crate::search::Confirmation::OutOfMemory);
    let trials = prober.trials().to_vec();
    let at = |b: u64| trials.iter().filter(move |t| t.batch == b);
    assert_eq!(at(450).count(), 3, "{trials:?}");
    assert!(at(450).all(|t| t.accumulation == 2 && t.round == trials[0].round));
    assert!(at(740).all(|t| t.round != trials[0].round));
}

/// A job whose fresh runs move by ±40 MiB, five times the 16 MiB guard band, with a large fixed
/// footprint (1000 MiB of a 1264 MiB limit), searched with the proof's trials two at a time: most
/// searches end with an answer the job's noise leaves room for.
#[test]
fn side_by_side_a_job_much_noisier_than_the_guard_band_still_gets_an_answer() {
    let cfg = exact_with_repeats(StrategyKind::Guided);
    let (mut complete, seeds) = (0, 100);
    for seed in 0..seeds {
        let mut spec = SimSpec::affine(1000 * MIB, MIB, 1264 * MIB);
        spec.boundary_noise = 40 * MIB;
        spec.seed = seed;
        let out = noisy_search_on(&spec, &cfg, 2, 1280 * MIB);
        let Some(b) = out.max_fitting.filter(|_| out.stop_reason.is_complete()) else {
            continue;
        };
        complete += 1;
        let fits: Vec<u64> = (out.trials.iter())
            .filter(|t| t.batch == b && t.fresh_fit_at(5, 1))
            .filter_map(|t| t.footprint())
            .collect();
        let spread = out.noise_spread_bytes.expect("measured");
        assert!(
            fits.len() >= 3,
            "seed {seed}: the answer {b} fit {} times",
            fits.len()
        );
        assert!(
            fits.iter().max().unwrap() + spread <= 1280 * MIB,
            "seed {seed}: the answer {b} leaves less room than the spread {spread}"
        );
    }
    assert!(complete >= 90, "{complete} of {seeds} searches answered");
}

/// [`search_over`] with the devices sharing their cores, and the job's limit `job_limit`.
fn noisy_search_on(spec: &SimSpec, cfg: &SearchConfig, k: usize, job_limit: u64) -> SearchOutcome {
    search_lanes(spec, cfg, k, true, Some(job_limit)).0
}
