//! One device: the search, then (when it completes) the confirmed accumulation split, into a plan.
//! Like hyperfine's exporters, the partial plan is rewritten after every trial, so a crash or an
//! interruption keeps what was measured.

use super::report::{self, Ending, ProbeError, Progress};
use super::split::{self, SplitOutcome};
use crate::config::{AccumulationProof, ProbeConfig};
use crate::device::Backend;
use crate::plan::{CapacityModel, Plan, Recommendation, Status};
use crate::search::{Prober, Purpose, SearchOutcome, Stop, StopReason, TrialRecord};

/// A search on one device, with the prober kept for the split's confirmations.
pub struct Searched<'b> {
    pub prober: Prober<'b>,
    pub outcome: SearchOutcome,
}

/// Runs the search on `backend` under `skeleton`'s limit (a fresh run of the answer, noise included,
/// must fit under its job's limit), calling `on_trial` after every trial (progress, and the partial
/// plan rewritten); `gpu` is recorded in every trial of a multi-GPU probe.
pub fn search<'b>(
    cfg: &ProbeConfig,
    backend: &'b mut dyn Backend,
    skeleton: &Plan,
    gpu: Option<u32>,
    on_trial: impl FnMut(&TrialRecord, &[TrialRecord]) + 'b,
) -> Searched<'b> {
    search_announced(cfg, backend, skeleton, gpu, |_, _| {}, on_trial)
}

/// [`search`], calling `on_start(n, request)` before trial `n` runs.
pub fn search_announced<'b>(
    cfg: &ProbeConfig,
    backend: &'b mut dyn Backend,
    skeleton: &Plan,
    gpu: Option<u32>,
    on_start: impl FnMut(usize, &crate::protocol::TrialRequest) + 'b,
    on_trial: impl FnMut(&TrialRecord, &[TrialRecord]) + 'b,
) -> Searched<'b> {
    let mut prober = Prober::new(backend, cfg.search.clone(), skeleton.limit_bytes)
        .with_job_limit(skeleton.job_limit_bytes())
        .on_trial(on_trial)
        .on_start(on_start);
    if let Some(g) = gpu {
        prober = prober.on_gpu(g);
    }
    if cfg.workload.may_not_train_the_size() {
        let limit = skeleton.limit_bytes;
        prober = prober.refuse_when(move |trials| settled_at_the_limit(trials, limit));
    }
    let outcome = prober.search();
    Searched { prober, outcome }
}

/// The single-device probe: search, split, plan (not yet written to `--out`).
pub fn run(
    cfg: &ProbeConfig,
    backend: &mut dyn Backend,
    skeleton: &Plan,
    limit: u64,
    progress: &mut dyn Progress,
) -> Result<(Plan, Ending), ProbeError> {
    let mut write_error = None;
    let (outcome, split) = {
        let partial_out = cfg.out.as_deref();
        let write_error = &mut write_error;
        let progress = std::cell::RefCell::new(&mut *progress);
        let progress = &progress;
        let Searched {
            mut prober,
            outcome,
        } = search_announced(
            cfg,
            backend,
            skeleton,
            None,
            move |n, req| {
                progress
                    .borrow_mut()
                    .starting(n, req.batch, req.accumulation)
            },
            move |t, all| {
                progress.borrow_mut().trial(all.len(), t, limit);
                let mut snap = skeleton.clone();
                snap.trials = all.to_vec();
                if let Err(e) = report::write(partial_out, &snap) {
                    *write_error = Some(e);
                }
            },
        );
        if let (true, Some(max), StopReason::MaxBatch) = (
            cfg.workload.may_not_train_the_size(),
            outcome.max_fitting,
            outcome.stop_reason,
        ) {
            measure_the_slope_below(cfg, &mut prober, max);
        }
        let split = match (outcome.max_fitting, outcome.stop_reason.is_complete()) {
            (Some(max), true) => {
                let (g, w) = cfg.global.unwrap_or((max * cfg.world_size, cfg.world_size));
                Some(split::confirmed(
                    g,
                    w,
                    max,
                    cfg.allow_uneven,
                    crate::accumulate::Sizes::new(cfg.search.multiple_of, cfg.search.min_batch),
                    &mut |b, acc, retest| {
                        let purpose = if retest {
                            Purpose::Retry
                        } else {
                            Purpose::Split
                        };
                        prober.confirm_split_held(b, acc, purpose)
                    },
                ))
            }
            _ => None,
        };
        let outcome = SearchOutcome {
            trials: prober.trials().to_vec(),
            noise_spread_bytes: prober.noise_spread(),
            ..outcome
        };
        (outcome, split)
    };
    if let Some(e) = write_error {
        return Err(e);
    }
    Ok(assemble(cfg, skeleton, &outcome, split))
}

/// The recommendation of a confirmed split: its sizes and bracket, the fastest size within the
/// throughput tolerance, and whether the accumulation is known to reach the job (a warning in
/// `warnings` when only accumulation 1 was proven).
fn recommendation(
    cfg: &ProbeConfig,
    outcome: &SearchOutcome,
    s: &crate::accumulate::Split,
    warnings: &mut Vec<String>,
) -> Recommendation {
    let max = outcome.max_fitting.expect("split only with a fit");
    let rec = best_fit(&outcome.trials, s.micro_batch).expect("split size confirmed");
    let mut r = Recommendation::from_split(s, max, outcome.first_failing, rec);
    if let Some(a) = crate::plan::throughput::advise(
        &outcome.trials,
        cfg.search.steps,
        cfg.search.confirm_steps,
        cfg.throughput_tolerance,
        r.micro_batch,
    ) {
        r.fastest_micro_batch = Some(a.fastest.batch);
        r.fastest_samples_per_second = Some(a.fastest.samples_per_second);
    }
    let by_construction = AccumulationProof::ByConstruction;
    if cfg.workload.accumulation_proof() != by_construction && r.accumulation > 1 {
        r.accumulation_proven = Some(true);
    }
    if let Some(w) = unproven_accumulation(cfg, &outcome.trials, &r) {
        warnings.push(w);
        r.accumulation_proven = Some(false);
    }
    r
}

/// The plan of a finished search and its split: the trials, how the search stopped, the
/// recommendation when the split was proven.
pub fn assemble(
    cfg: &ProbeConfig,
    skeleton: &Plan,
    outcome: &SearchOutcome,
    split: Option<SplitOutcome>,
) -> (Plan, Ending) {
    let mut plan = skeleton.clone();
    plan.trials = outcome.trials.clone();
    plan.search.noisy_boundary = outcome.noisy_boundary.clone();
    plan.search.noise_spread_bytes = outcome.noise_spread_bytes;
    plan.stop_reason = outcome.stop_reason;
    plan.stop_detail = outcome
        .fatal
        .clone()
        .unwrap_or_else(|| outcome.stop_reason.describe().to_string());
    let mut ending = Ending::of(outcome.stop_reason, outcome.interrupted_by);
    let unshown = (cfg.workload.may_not_train_the_size())
        .then(|| batch_not_shown(&outcome.trials))
        .flatten();
    match split {
        Some(SplitOutcome { split, warnings }) => {
            plan.warnings.extend(warnings);
            match split {
                Ok(_) if unshown.is_some() => {
                    plan.stop_reason = StopReason::BatchNotShown;
                    plan.stop_detail = unshown.unwrap_or_default();
                    plan.status = Status::Partial;
                    ending = Ending::TrialErrors;
                }
                Ok(s) => {
                    let r = recommendation(cfg, outcome, &s, &mut plan.warnings);
                    plan.recommendation = Some(r);
                    if let Some(w) = &s.warning {
                        plan.warnings.push(w.clone());
                    }
                    plan.status = Status::Complete;
                    if outcome.stop_reason == StopReason::Proven {
                        plan.stop_detail.push_str(LOCAL_PROOF);
                    }
                }
                Err(stop) => {
                    ending = stopped(&mut plan, stop);
                    plan.status = Status::Partial;
                }
            }
        }
        None if outcome.stop_reason == StopReason::BatchNotShown => {
            plan.stop_detail = unshown.unwrap_or_default();
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
    // Disagreeing outcomes near a noisy boundary are said by its own line, not as non-monotone memory.
    if plan.search.noisy_boundary.is_none() {
        plan.warnings.extend(non_monotone(&plan.trials));
    }
    plan.warnings.extend(failed_beside_another(&plan.trials));
    plan.warnings.extend(fewer_steps_than_the_job(&plan));
    plan.warnings
        .extend(bounded_by_reserved_address_space(&plan));
    // a command's first trial, at the smallest size, already over the limit: what it needs
    let first =
        (plan.trials.first()).filter(|_| cfg.workload.explains_a_first_trial_over_the_limit());
    let too_small = first.and_then(|t| super::first_trial::over_the_limit(&plan, t));
    plan.warnings.extend(too_small);
    if reads_batch(&plan.trials) {
        plan.warnings
            .retain(|w| w != crate::config::NO_BATCH_WARNING);
    }
    plan.capacity_model = CapacityModel::fit(&plan.trials, plan.limit_bytes);
    if let (Some(g), Some(r)) = (plan.gpu.as_mut(), plan.recommendation.as_ref()) {
        g.footprint_method = plan
            .trials
            .iter()
            .filter(|t| t.batch == r.micro_batch && t.outcome.fits())
            .find_map(|t| t.outcome.gpu().map(|m| m.method));
    }
    (plan, ending)
}

/// What a proof is: about the size and the next one up (docs/soundness.md).
pub const LOCAL_PROOF: &str = " (a local proof: it assumes memory does not shrink as the batch \
     grows; sizes above the failing one were not all tried, and trials that contradict the \
     assumption are listed in the warnings)";

/// Trials that contradict memory growing with the batch size: a size that fit above one that ran
/// out of memory (with at least as many steps and as much accumulation, both in cold processes: a
/// warm trial's fit says what a process that imported ahead holds, not the job). The proof is local;
/// the plan says where it does not hold.
pub fn non_monotone(trials: &[TrialRecord]) -> Option<String> {
    let mut worst: Option<(&TrialRecord, &TrialRecord)> = None;
    for f in trials.iter().filter(|t| t.outcome.fits() && t.cold()) {
        for o in trials.iter().filter(|t| {
            t.outcome.is_oom()
                && t.cold()
                && t.batch < f.batch
                && t.steps <= f.steps
                && t.accumulation <= f.accumulation
        }) {
            if worst.is_none_or(|(wf, wo)| f.batch - o.batch > wf.batch - wo.batch) {
                worst = Some((f, o));
            }
        }
    }
    worst.map(|(f, o)| {
        format!(
            "non-monotone memory: micro-batch {} fit although {} ran out of memory; memory does not \
             grow with the batch size everywhere here, so the answer is only proven locally (the \
             size and the next one up) and larger sizes may fit",
            f.batch, o.batch
        )
    })
}

/// A trial that ended in an error or a timeout while another ran beside it (the proof's trials
/// side by side): the job may not bear two runs at once (a fixed port, a fixed file), and the rest
/// of the proof ran one trial at a time ([`crate::search::Prober`]'s proof width).
pub fn failed_beside_another(trials: &[TrialRecord]) -> Option<String> {
    let failed = crate::search::rounds::failed_beside_another(trials)?;
    let what = if failed.outcome.kind() == "error" {
        "an error"
    } else {
        "a timeout"
    };
    Some(format!(
        "micro-batch {} ended in {what} while another trial ran beside it ({}); the rest of the \
         proof ran one trial at a time. If the job cannot run twice at once (a fixed port, a fixed \
         file), give --parallel 1",
        failed.batch,
        failed.outcome.message().unwrap_or("no message")
    ))
}

/// A user's command that fit at the `--max-batch` cap never ran out of memory, which a job that
/// lowers its own batch after an out-of-memory, or clamps it, never does either. Its memory must
/// then be seen to keep growing up to the cap ([`batch_not_shown`]), which needs a fit between a
/// quarter and half the cap (the slope) and one with the confirmation's steps between three
/// quarters and fifteen sixteenths of it (the top): where the search jumped to the cap, the cap's
/// half and seven eighths are measured, one trial each. Their outcomes are evidence for that check
/// only: an error leaves it without the point.
fn measure_the_slope_below(cfg: &ProbeConfig, prober: &mut Prober<'_>, max: u64) {
    let confirm = cfg.search.confirm_steps.max(cfg.search.steps);
    measure_within(cfg, prober, (max / 4, max / 2), max / 2, cfg.search.steps);
    measure_within(
        cfg,
        prober,
        (max * 3 / 4, max * 15 / 16),
        max * 7 / 8,
        confirm,
    );
}

/// Runs one trial of `size` (on the grid, at or below it) with `steps` unless a fit with at least
/// those steps lies in `(window.0, window.1]`, or the size is not above the smallest size tried.
fn measure_within(
    cfg: &ProbeConfig,
    prober: &mut Prober<'_>,
    window: (u64, u64),
    size: u64,
    steps: u32,
) {
    let step = cfg.search.multiple_of.max(1);
    let size = size / step * step;
    let measured = prober
        .trials()
        .iter()
        .any(|t| t.outcome.fits() && t.steps >= steps && t.batch > window.0 && t.batch <= window.1);
    let first = prober
        .trials()
        .iter()
        .map(|t| t.batch)
        .min()
        .unwrap_or(size);
    if measured || size <= first || size < cfg.search.min_batch {
        return;
    }
    let _ = prober.trial(size, steps, Purpose::Explore);
}

/// Why the trials of a user's command do not show that the batch size reaches it, if they do not.
/// Two rules, from the largest fitting size at most half the largest fit `lo` (else the smallest
/// fit) to the largest fit `hi`:
///
/// - **Memory keeps growing.** Where the peak rose measurably from the smallest fit to `lo`, it
///   must rise from `lo` to `hi`, and between sizes above `lo` that fit with the most steps
///   ([`stalled_above`]), by at least half what that slope predicts (less the noise; the slope
///   taken at its least, the rise below less one noise). A job
///   that lowers its own batch after an out-of-memory (a batch-size finder, a retry) trains a size
///   it chose above its real limit, and its peak stops growing there. No report excuses this: a
///   job that read its size through the helper may still have halved it. A size above every fit
///   that ran out of memory does (such a job fits wherever it is given a size): where the peak is
///   the data segment under RLIMIT_DATA, it grows by arenas and can stall for thousands of samples
///   below a real out-of-memory. (A knee, memory flat
///   below and growing above, only makes the slope below smaller, never the rule stricter.)
/// - **The peak moves at all.** The peak must rise by more than the measurement noise (the spread
///   of repeated trials of one size, at least [`crate::search::guided::MIN_RISE`] of the top
///   peak), unless a report of `hi` shows the job ran that size: its `batch_size()` read it from
///   batchfit, or it counted that many samples in a micro-batch (`Trial.step(samples=n)`, the
///   framework callbacks). A report that only repeats the size the job was given
///   (`Trial(batch=args.batch)`) is no evidence: a job whose loader ignores the flag reports it
///   all the same. Or the DataLoader watcher saw the job's loader yield batches of `hi`
///   (`dataloader_batch`). Or a size above `hi` ran out of memory or over the budget (the
///   outcome changes with the size, so it reaches the job even where a small model's peak barely
///   moves). A job that ignores `{batch}` fits at every size with the same peak.
///
/// Fewer than two fitting sizes: nothing to compare. Trials with accumulation are left out (their
/// peaks hold the accumulated gradients too).
pub fn batch_not_shown(trials: &[TrialRecord]) -> Option<String> {
    // a micro-batch run with accumulation holds its gradients beside it: only single micro-batches
    // are compared
    let single: Vec<TrialRecord> = (trials.iter())
        .filter(|t| t.accumulation <= 1)
        .cloned()
        .collect();
    let trials = &single[..];
    let fits: Vec<(u64, u64)> = trials
        .iter()
        .filter(|t| t.outcome.fits())
        .filter_map(|t| Some((t.batch, t.outcome.peak_bytes()?)))
        .collect();
    let hi = fits.iter().map(|f| f.0).max()?;
    let first = fits.iter().map(|f| f.0).min()?;
    // the top: a job that retries smaller grows up to its real limit and is flat above it
    let lo = (fits.iter().map(|f| f.0).filter(|&b| b <= hi / 2).max()).unwrap_or(first);
    if lo == hi {
        return None;
    }
    let peaks = |b: u64| fits.iter().filter(move |f| f.0 == b).map(|f| f.1);
    let spread = fits
        .iter()
        .map(|&(b, _)| peaks(b).max().unwrap_or(0) - peaks(b).min().unwrap_or(0))
        .max()
        .unwrap_or(0);
    let (low, high) = (peaks(lo).max()?, peaks(hi).min()?);
    let noise = (spread as f64).max(crate::search::guided::MIN_RISE * high as f64);
    let rise = high.saturating_sub(low) as f64;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    // a size above every fit ran out of memory: the size reaches the job (a job that lowers its own
    // batch fits wherever it is given one)
    let bounded_above = trials.iter().any(|t| t.batch > hi && t.outcome.is_bound());
    let below = (first < lo && !bounded_above).then(|| peaks(first).min());
    if let Some(below) = below.flatten() {
        let rise_below = low.saturating_sub(below) as f64;
        // the slope's least: a rise of a few noises is known only to within one noise (a data
        // segment that grows in arenas at small sizes rises by a chunk, not by the line)
        let slope = (rise_below - noise) / (lo - first) as f64;
        let stalled = (rise_below > noise)
            .then(|| stalled_above(trials, lo, hi, slope, noise))
            .flatten();
        if let Some((a, c, rise, predicted)) = stalled {
            return Some(format!(
                "refused: the batch size is not shown to reach the job: its peak rose {:.0} MiB \
                 from micro-batch {first} to {lo}, and then only {:.0} MiB from {a} to {c} where \
                 that slope predicts {:.0} MiB: memory stopped growing with the size given. {}",
                mib(rise_below),
                mib(rise),
                mib(predicted),
                unshown_causes(trials)
            ));
        }
    }
    let read = trials
        .iter()
        .filter(|t| t.batch == hi && t.outcome.fits())
        .filter_map(|t| t.details.as_ref())
        .any(|d| {
            d.dataloader_batch.is_some_and(|n| n >= hi)
                || d.report.as_ref().is_some_and(|r| {
                    r.batch == hi && (r.reads_batch || r.samples.is_some_and(|n| n >= hi))
                })
        });
    if read || bounded_above || rise > noise {
        return None;
    }
    Some(format!(
        "refused: the batch size is not shown to reach the job: sizes {lo} and {hi} both fit \
         with about the same peak ({:.0} MiB at {lo}, {:.0} MiB at {hi}; a rise of {:.1} MiB, within \
         the {:.1} MiB noise), and no report says the job ran the size it was given. {}",
        mib(low as f64),
        mib(high as f64),
        mib(rise),
        mib(noise),
        unshown_causes(trials)
    ))
}

/// Fits this close to the limit are where a job that lowers its own batch settles.
const NEAR_THE_LIMIT: f64 = 0.9;

/// Whether the trials already refuse an answer, before the search's end: at least three fits peak
/// within 10 % of the limit, the largest of them at least twice the smallest, and
/// [`batch_not_shown`] refuses them. A job that catches its own out-of-memory and trains a smaller
/// size (Accelerate's `find_executable_batch_size`, a retry) fits at every size above its real
/// limit at about the same peak: the search would double up to `--max-batch` and refuse at the end
/// (32 trials, 7 minutes, on one such script). A job whose memory grows with the batch cannot fit
/// twice the size at the same peak near the limit, so this never stops one that could be answered.
pub fn settled_at_the_limit(trials: &[TrialRecord], limit: u64) -> bool {
    let near: Vec<u64> = trials
        .iter()
        .filter(|t| t.accumulation <= 1 && t.outcome.fits())
        .filter(|t| {
            t.footprint()
                .is_some_and(|f| f as f64 >= NEAR_THE_LIMIT * limit as f64)
        })
        .map(|t| t.batch)
        .collect();
    let (Some(&lo), Some(&hi)) = (near.iter().min(), near.iter().max()) else {
        return false;
    };
    near.len() >= 3 && hi >= 2 * lo && batch_not_shown(trials).is_some()
}

/// Where the peak stopped growing above `lo`, by the slope below it: from `lo` to `hi`, or between
/// two sizes in that range that fit with the most steps any fit ran (a job that clamps its size
/// near the top, a finder that settles on the size it found), the rise is less than half what the
/// slope predicts, less the noise; a pair only where the prediction is more than twice the noise
/// and twice the scatter of those fits about their line.
/// The pair, its rise and the prediction.
fn stalled_above(
    trials: &[TrialRecord],
    lo: u64,
    hi: u64,
    slope: f64,
    noise: f64,
) -> Option<(u64, u64, f64, f64)> {
    let steps = trials
        .iter()
        .filter(|t| t.outcome.fits())
        .map(|t| t.steps)
        .max()?;
    let at = |b: u64, all_steps: bool| {
        trials
            .iter()
            .filter(move |t| t.batch == b && t.outcome.fits() && (all_steps || t.steps == steps))
            .filter_map(|t| t.outcome.peak_bytes())
    };
    let stalled = |a: u64, c: u64, all_steps: bool, needs: f64| {
        let (low, high) = (at(a, all_steps).max()?, at(c, all_steps).min()?);
        let rise = high.saturating_sub(low) as f64;
        let predicted = slope * (c - a) as f64;
        (predicted > needs && rise + noise < predicted / 2.0).then_some((a, c, rise, predicted))
    };
    let mut by_size: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for t in trials
        .iter()
        .filter(|t| t.steps == steps && (lo..=hi).contains(&t.batch))
    {
        if let (true, Some(p)) = (t.outcome.fits(), t.outcome.peak_bytes()) {
            by_size.entry(t.batch).or_default().push(p);
        }
    }
    // a job whose peak moves from run to run scatters its fits about their line by that much: a
    // pair is read only beyond it
    let scatter = crate::search::line::residual_range(&by_size).unwrap_or(0) as f64;
    let needs = 2.0 * noise.max(scatter);
    let sizes: Vec<u64> = by_size.keys().copied().collect();
    let pairs = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &a)| sizes[i + 1..].iter().map(move |&c| (a, c)));
    stalled(lo, hi, true, 0.0).or_else(|| {
        pairs
            .into_iter()
            .find_map(|(a, c)| stalled(a, c, false, needs))
    })
}

/// What a refusal for the batch size says to do.
const UNSHOWN_CAUSES: &str = "Likely causes: the script does not use the {batch} placeholder (nor \
     BATCHFIT_BATCH), or the job adjusts its own batch size (a batch-size finder, or an \
     out-of-memory retry inside the job); pass the size through and let an out-of-memory end the \
     job (or report it with the helper's batch_size())";

/// The same, for a job whose helper says it read the size: it read it and trained less.
const READ_BUT_NOT_TRAINED: &str = "The job read the size (the helper's batch_size()), so it \
     trains less than it reads: the job adjusts its own batch size (it clamps it to its dataset's \
     length, min(batch, …), or lowers it after an out-of-memory: a batch-size finder, a retry); \
     give it a dataset at least as long as --max-batch and let an out-of-memory end the job";

/// The same, for a job whose DataLoader the watcher saw yield the size asked.
const YIELDED_BUT_FLAT: &str = "The job's DataLoader yielded the size asked (batchfit's watcher \
     saw it), yet memory stopped growing: a dataset not much longer than the batch (its workers \
     prefetch most of it at every size), or the job adjusts its own batch size after an \
     out-of-memory (a batch-size finder, a retry: its loader yields the first size, then less); \
     give the job a \
     dataset several times longer than --max-batch, and let an out-of-memory end the job";

/// The likely causes of a refusal, by what the trials' reports and the watcher say.
fn unshown_causes(trials: &[TrialRecord]) -> &'static str {
    let details = || {
        trials
            .iter()
            .filter_map(|t| Some((t.batch, t.details.as_ref()?)))
    };
    let read = details().any(|(_, d)| d.report.as_ref().is_some_and(|r| r.reads_batch));
    // (said only when every size the watcher saw was yielded whole)
    let seen: Vec<(u64, u64)> = (details().filter(|(b, _)| *b > 1))
        .filter_map(|(b, d)| Some((b, d.dataloader_batch?)))
        .collect();
    let yielded = !seen.is_empty() && seen.iter().all(|&(b, n)| n >= b);
    match (read, yielded) {
        (true, _) => READ_BUT_NOT_TRAINED,
        (false, true) => YIELDED_BUT_FLAT,
        (false, false) => UNSHOWN_CAUSES,
    }
}

/// Records in `plan` why a stage after the search stopped; returns the ending.
pub fn stopped(plan: &mut Plan, stop: Stop) -> Ending {
    match stop {
        Stop::Interrupted(sig) => {
            plan.stop_reason = StopReason::Interrupted;
            plan.stop_detail = StopReason::Interrupted.describe().into();
            Ending::Interrupted(sig)
        }
        Stop::Reason(r) => {
            plan.stop_reason = r;
            plan.stop_detail = r.describe().into();
            Ending::of(r, None)
        }
        Stop::Fatal(m) => {
            plan.stop_reason = StopReason::TrialErrors;
            plan.stop_detail = m;
            Ending::TrialErrors
        }
    }
}

/// The fresh fit at `batch` that proves the most, the largest accumulation, then the most steps, and
/// of those the highest peak ([`crate::plan::recommended_fit`]).
pub fn best_fit(trials: &[TrialRecord], batch: u64) -> Option<&TrialRecord> {
    // the split confirms its sizes at its accumulation with the confirmation's steps: the most of
    // either that a fresh fit of `batch` ran with
    let (accumulation, steps) = trials
        .iter()
        .filter(|t| t.batch == batch && t.outcome.fits())
        .filter(|t| t.cold())
        .map(|t| (t.accumulation, t.steps))
        .max()?;
    crate::plan::recommended_fit(trials, batch, accumulation, steps)
}

/// A user's command proves a split only when it ran the accumulation it was given: the warning for
/// a recommended accumulation > 1 whose trials say (by their report) the command did not read it, or
/// cannot say (no report, no `{accumulation}` in its arguments).
/// Whether the trials' reports show that the command read its size from `BATCHFIT_BATCH`: a report
/// that says so (the helper's `batch_size()` read it), or reports of two different sizes each saying
/// the size it was given.
fn reads_batch(trials: &[TrialRecord]) -> bool {
    let reports: Vec<(u64, &crate::protocol::TrialReport)> = trials
        .iter()
        .filter_map(|t| Some((t.batch, t.details.as_ref()?.report.as_ref()?)))
        .filter(|(b, r)| r.batch == *b)
        .collect();
    reports.iter().any(|(_, r)| r.reads_batch)
        || reports
            .iter()
            .any(|(b, _)| reports.iter().any(|(c, _)| c != b))
}

/// The warning for a recommendation confirmed with fewer optimizer steps than the job itself runs,
/// when the job said how many it runs (a report's `job_steps`, the helper's `steps(default=N)`):
/// memory that appears later in a run is not covered by the proof.
fn fewer_steps_than_the_job(plan: &Plan) -> Option<String> {
    let r = plan.recommendation.as_ref()?;
    let proven = plan.proven_steps()?;
    let job = plan
        .trials
        .iter()
        .filter(|t| r.micro_batches.contains(&t.batch) && t.outcome.fits())
        .filter_map(|t| t.details.as_ref()?.report.as_ref()?.job_steps)
        .max()?;
    (job > u64::from(proven)).then(|| {
        format!(
            "the job runs {job} optimizer steps (its steps() default), and micro-batch {} was \
             confirmed with {proven}: memory that grows later in a run (caches, fragmentation, \
             longer inputs) is not covered by the proof; --confirm-steps N confirms with more",
            r.micro_batch
        )
    })
}

/// Why an answer under `RLIMIT_DATA` is below what a memory cgroup would give, when it is: the size
/// that bounds it ran out of memory with its largest process's data segment at the limit while the
/// whole process tree used far less (`Pss_Anon + Pss_Shmem` at most 85 % of the limit). The data
/// segment counts address space reserved and never touched (glibc's per-thread malloc arenas, thread
/// stacks, allocator pools); a cgroup charges the memory in use.
fn bounded_by_reserved_address_space(plan: &Plan) -> Option<String> {
    use crate::device::LimitMechanism;
    use crate::platform::units::format_size;
    let f = plan.recommendation.as_ref()?.first_failing_batch?;
    if plan.limit_mechanism != Some(LimitMechanism::RlimitData) {
        return None;
    }
    let limit = plan.limit_bytes;
    let (data, tree) = plan
        .trials
        .iter()
        .filter(|t| t.batch == f && t.outcome.is_oom())
        .filter_map(|t| {
            Some((
                t.outcome.peak_bytes()?,
                t.details.as_ref()?.tree_pss_peak_bytes?,
            ))
        })
        .find(|&(data, tree)| {
            data as f64 >= 0.95 * limit as f64 && tree as f64 <= 0.85 * limit as f64
        })?;
    Some(format!(
        "micro-batch {f} ran out of RLIMIT_DATA with its largest process's data segment at {} of \
         the {} limit while the whole process tree used {} ({:.0}% of the limit, Pss_Anon + \
         Pss_Shmem): RLIMIT_DATA counts address space a process reserved and never touched \
         (malloc arenas, thread stacks, allocator pools), so the answer is below what the job uses; \
         a memory cgroup (--cpu-limit cgroup, as Slurm and Kubernetes limit a job) charges the \
         memory in use and may allow a larger size",
        format_size(data),
        format_size(limit),
        format_size(tree),
        100.0 * tree as f64 / limit.max(1) as f64
    ))
}

fn unproven_accumulation(
    cfg: &ProbeConfig,
    trials: &[TrialRecord],
    r: &Recommendation,
) -> Option<String> {
    if r.accumulation <= 1 || cfg.workload.accumulation_proof() != AccumulationProof::ByReport {
        return None;
    }
    let reads = trials
        .iter()
        .filter(|t| t.batch == r.micro_batch && u64::from(t.accumulation) == r.accumulation)
        .filter_map(|t| t.details.as_ref()?.report.as_ref())
        .map(|rep| rep.reads_accumulation && rep.accumulation == r.accumulation)
        .next();
    match reads {
        Some(true) => None,
        Some(false) => Some(format!(
            "the command's report says it did not read the accumulation (BATCHFIT_ACCUMULATION, \
             {{accumulation}}): the split {} × {} was proven at accumulation 1 only",
            r.micro_batch, r.accumulation
        )),
        None => Some(format!(
            "the command takes no {{accumulation}} and wrote no report, so nothing shows it ran {} \
             micro-batches per step: the split {} × {} may be proven at accumulation 1 only",
            r.accumulation, r.micro_batch, r.accumulation
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Isolation, TrialOutcome};

    fn t(batch: u64, fits: bool, steps: u32, isolation: Isolation) -> TrialRecord {
        TrialRecord {
            batch,
            steps,
            purpose: Purpose::Explore,
            isolation,
            accumulation: 1,
            outcome: if fits {
                TrialOutcome::Fits {
                    peak_bytes: 1,
                    rss_peak_bytes: None,
                    step_seconds: 0.1,
                    gpu: None,
                }
            } else {
                TrialOutcome::Oom {
                    message: "oom".into(),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                    gpu: None,
                }
            },
            seconds: 0.1,
            gpu_index: None,
            details: None,
            round: None,
        }
    }

    /// While the search runs, only the partial plan is written, and it says `partial`: a probe
    /// killed mid-search must not leave a plan that claims to be complete, nor touch `--out`.
    #[test]
    fn plans_written_during_the_search_say_partial() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("plan.json");
        let cfg = super::super::config_of(&[
            "--backend",
            "sim",
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=16GiB",
            "--global-batch",
            "8192",
            "--out",
            out.to_str().unwrap(),
        ]);
        let partial = crate::plan::partial_path(&out);
        let mut seen = 0;
        let report = {
            let mut check = |line: &str| {
                if !line.starts_with("trial") {
                    return;
                }
                assert!(!out.exists(), "--out written during the search: {line}");
                if let Ok(text) = std::fs::read_to_string(&partial) {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(v["status"], "partial", "{line}");
                    assert!(v["recommendation"].is_null(), "{line}");
                    seen += 1;
                }
            };
            crate::probe::run(&cfg, &mut check).unwrap()
        };
        assert!(seen >= 3, "the partial plan was seen {seen} times");
        assert_eq!(report.plan.status, crate::plan::Status::Complete);
        assert!(out.exists() && !partial.exists());
    }

    fn fit_at(batch: u64, peak_bytes: u64) -> TrialRecord {
        let mut r = t(batch, true, 2, Isolation::Process);
        if let TrialOutcome::Fits { peak_bytes: p, .. } = &mut r.outcome {
            *p = peak_bytes;
        }
        r
    }

    /// A real job's data segment under RLIMIT_DATA (a script with persistent DataLoader workers)
    /// rose by an arena from 32 to 64 samples and by the line above: the slope below is known only
    /// to within the noise, and the job is not refused for growing slower than the arena's slope.
    #[test]
    fn a_data_segment_that_grows_by_a_chunk_at_small_sizes_is_not_a_stalled_batch() {
        let measured = [
            (32, 848_265_216),
            (64, 894_861_312),
            (128, 916_865_024),
            (192, 969_007_104),
            (224, 993_660_928),
            (224, 993_648_640),
            (224, 993_656_832),
        ];
        let trials: Vec<_> = measured.iter().map(|&(b, p)| fit_at(b, p)).collect();
        assert_eq!(batch_not_shown(&trials), None);
        // a job that stops growing at 128 (a clamp) is still refused on the same measurements
        let clamped: Vec<_> = measured
            .iter()
            .map(|&(b, p)| fit_at(b, if b > 128 { 916_865_024 } else { p }))
            .collect();
        let why = batch_not_shown(&clamped).expect("a clamp above 128 is refused");
        assert!(why.contains("memory stopped growing"), "{why}");
    }

    /// A split's confirmation (accumulation 4 at 1024) holds its gradients beside the micro-batch:
    /// its peak is not read as the single micro-batch's, so a job that keeps growing is not refused
    /// for the gap between them.
    #[test]
    fn a_trial_with_accumulation_is_not_compared_with_single_micro_batches() {
        let mib = 1u64 << 20;
        let mut trials: Vec<_> = [(1, 800), (512, 832), (2048, 928)]
            .iter()
            .map(|&(b, p)| fit_at(b, p * mib))
            .collect();
        assert_eq!(batch_not_shown(&trials), None);
        let mut split = fit_at(1024, 924 * mib);
        split.accumulation = 4;
        trials.push(split);
        assert_eq!(batch_not_shown(&trials), None);
    }

    /// A job whose data segment stalls between two fits (arenas reserved ahead) and that ran out of
    /// memory above them is not refused: the out-of-memory shows the size reaches it. Without one,
    /// the same peaks are a job that stopped growing (a clamp, a retry) and are refused.
    #[test]
    fn a_stalled_peak_below_an_out_of_memory_is_not_refused() {
        let mib = 1u64 << 20;
        let fits: Vec<_> = [(1, 868), (1896, 994), (4244, 996)]
            .iter()
            .map(|&(b, p)| fit_at(b, p * mib))
            .collect();
        let why = batch_not_shown(&fits).expect("no out-of-memory above: refused");
        assert!(why.contains("memory stopped growing"), "{why}");
        let mut trials = fits;
        trials.push(t(7635, false, 2, Isolation::Process));
        assert_eq!(batch_not_shown(&trials), None);
    }

    /// A job that reads its size through the helper and then trains less (it clamps to its
    /// dataset's length) is refused with that cause, not told to call `batch_size()`, which it does;
    /// one whose DataLoader yielded each size asked is told what flattens a loader's memory, not
    /// that it ignores `{batch}`.
    #[test]
    fn a_refused_job_that_read_or_loaded_its_size_is_told_why_memory_stopped_growing() {
        let mib = 1u64 << 20;
        let mut trials: Vec<_> = [(1, 868), (1896, 994), (4244, 996)]
            .iter()
            .map(|&(b, p)| fit_at(b, p * mib))
            .collect();
        let why = batch_not_shown(&trials).unwrap();
        assert!(
            why.contains("batch_size()") && why.contains("placeholder"),
            "{why}"
        );
        let report: crate::protocol::TrialReport = serde_json::from_value(serde_json::json!({
            "schema": "batchfit-trial-report/1", "batch": 4244, "steps": 2, "accumulation": 1,
            "reads_accumulation": false, "reads_batch": true, "step_seconds": [0.1, 0.1]
        }))
        .unwrap();
        trials[2].details = Some(crate::protocol::TrialDetails {
            report: Some(report),
            ..Default::default()
        });
        let why = batch_not_shown(&trials).expect("stalled: refused though it read the size");
        assert!(why.contains("clamps it"), "{why}");
        assert!(!why.contains("placeholder"), "{why}");
        // no report, but the watcher saw the job's DataLoader yield each size asked
        for t in trials.iter_mut() {
            t.details = Some(crate::protocol::TrialDetails {
                dataloader_batch: Some(t.batch),
                ..Default::default()
            });
        }
        let why = batch_not_shown(&trials).expect("stalled: refused though its loader yielded it");
        assert!(why.contains("DataLoader yielded the size asked"), "{why}");
        assert!(!why.contains("placeholder"), "{why}");
        // a loader that yielded the small size whole but less at the large ones did not yield the
        // size asked: the causes say nothing of it
        trials[2].details.as_mut().unwrap().dataloader_batch = Some(300);
        let why = batch_not_shown(&trials).expect("stalled");
        assert!(!why.contains("DataLoader yielded the size asked"), "{why}");
    }

    /// A small model whose peak barely moves between two fits, with nothing above them out of
    /// memory: refused without a report and with a report that only repeats the size given
    /// (`Trial(batch=args.batch)`: a loader that ignores the flag reports it all the same);
    /// accepted when the report shows the job ran that size: it counted that many samples, or its
    /// `batch_size()` read the size from batchfit.
    #[test]
    fn a_report_that_counted_the_samples_or_a_watched_loader_shows_the_batch_reaches_the_job() {
        let mib = 1u64 << 20;
        let trials: Vec<_> = [(64, 800), (512, 801)]
            .iter()
            .map(|&(b, p)| fit_at(b, p * mib))
            .collect();
        let why = batch_not_shown(&trials).expect("a flat peak and no report: refused");
        assert!(why.contains("no report says"), "{why}");
        let report: crate::protocol::TrialReport = serde_json::from_value(serde_json::json!({
            "schema": "batchfit-trial-report/1", "batch": 512, "steps": 2, "accumulation": 1,
            "reads_accumulation": false, "step_seconds": [0.1, 0.1]
        }))
        .unwrap();
        let with = |report: &crate::protocol::TrialReport| {
            let mut t = trials.clone();
            t[1].details = Some(crate::protocol::TrialDetails {
                report: Some(report.clone()),
                ..Default::default()
            });
            batch_not_shown(&t)
        };
        assert!(with(&report).is_some(), "a report of the size given alone");
        let counted = crate::protocol::TrialReport {
            samples: Some(512),
            ..report.clone()
        };
        assert_eq!(with(&counted), None);
        let read = crate::protocol::TrialReport {
            reads_batch: true,
            ..report
        };
        assert_eq!(with(&read), None);
        // the DataLoader watcher saw the job's loader yield batches of 512
        let mut watched = trials.clone();
        watched[1].details = Some(crate::protocol::TrialDetails {
            dataloader_batch: Some(512),
            ..Default::default()
        });
        assert_eq!(batch_not_shown(&watched), None);
        watched[1].details.as_mut().unwrap().dataloader_batch = Some(64);
        assert!(batch_not_shown(&watched).is_some());
    }

    /// A job that lowers its own batch fits at twice its real limit and more at the same peak near
    /// the limit: the trials refuse an answer as soon as three such fits show it. A job whose memory
    /// grows near the limit, and a job that ignores its size far below the limit (refused at the
    /// search's end, as before), do not stop the search.
    #[test]
    fn fits_settled_at_the_limit_refuse_before_the_search_ends() {
        let mib = 1u64 << 20;
        let limit = 1000 * mib;
        let grown: Vec<_> = [(1, 500), (64, 680), (128, 860)]
            .iter()
            .map(|&(b, p)| fit_at(b, p * mib))
            .collect();
        let settled = |sizes: &[(u64, u64)]| {
            let mut trials = grown.clone();
            trials.extend(sizes.iter().map(|&(b, p)| fit_at(b, p * mib)));
            settled_at_the_limit(&trials, limit)
        };
        assert!(!settled(&[(256, 985)]), "two fits near the limit");
        assert!(
            !settled(&[(256, 985), (512, 990)]),
            "two fits near the limit"
        );
        assert!(settled(&[(256, 985), (512, 990), (1024, 986)]));
        // memory that grows near the limit: no two-fold span at the same peak
        assert!(!settled(&[(132, 930), (136, 960), (140, 990)]));
        // a job that ignores its size, far below the limit
        let flat: Vec<_> = [1, 2, 4, 8, 16, 32]
            .iter()
            .map(|&b| fit_at(b, 300 * mib))
            .collect();
        assert!(!settled_at_the_limit(&flat, limit));
    }

    #[test]
    fn a_trial_that_failed_beside_another_is_named() {
        use Isolation::Process as P;
        let mut alone = t(300, true, 5, P);
        alone.round = Some(1);
        let mut beside = t(310, false, 5, P);
        beside.round = Some(2);
        beside.outcome = TrialOutcome::Error {
            message: "OSError: [Errno 98] Address already in use".into(),
        };
        let mut partner = t(300, true, 5, P);
        partner.round = Some(2);
        let mut failed_alone = beside.clone();
        failed_alone.round = Some(3);
        assert_eq!(failed_beside_another(&[alone.clone(), failed_alone]), None);
        let w = failed_beside_another(&[alone, beside, partner]).unwrap();
        assert!(w.contains("micro-batch 310 ended in an error") && w.contains("Errno 98"));
        assert!(w.contains("--parallel 1"), "{w}");
    }

    #[test]
    fn contradicting_trials_are_named() {
        use Isolation::Process as P;
        let ok = [t(100, true, 3, P), t(168, false, 3, P), t(167, true, 5, P)];
        assert_eq!(non_monotone(&ok), None);
        let bad = [t(168, false, 3, P), t(320, true, 3, P), t(400, false, 3, P)];
        let w = non_monotone(&bad).unwrap();
        assert!(
            w.contains("micro-batch 320 fit although 168 ran out of memory"),
            "{w}"
        );
        // a failure with more steps (late memory) or in the worker is no contradiction
        assert_eq!(
            non_monotone(&[t(168, false, 5, P), t(320, true, 3, P)]),
            None
        );
        assert_eq!(
            non_monotone(&[t(168, false, 3, Isolation::Worker), t(320, true, 3, P)]),
            None
        );
        // nor a warm fit above a cold failure (a warm process that held less than the job)
        let mut warm = t(320, true, 3, P);
        warm.details = Some(crate::protocol::TrialDetails {
            warm: true,
            ..Default::default()
        });
        assert_eq!(non_monotone(&[t(168, false, 3, P), warm]), None);
    }
}
