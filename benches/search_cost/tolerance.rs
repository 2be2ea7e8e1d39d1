//! Issue #15's three measurements on the same suite: the proof's tolerance (trials and answers at
//! several `--tolerance` values), the capacity model's predictions for larger memories (against each
//! curve's truth there), and the cost of a four-point `--sweep` (each point's search seeded by the
//! points before it, as `probe::sweep` does).
//!
//! Like the rest of the bench it drives batchfit's real search engine on the sim backend and is
//! deterministic; its section of the report is appended after the search-cost tables.

use batchfit::config::SweepParam;
use batchfit::device::sim::{SimBackend, SimSpec};
use batchfit::plan::capacity::{predict, prior_miss, sweep_prior, CapacityModel, Target};
use batchfit::search::{tolerance_gap, Prober, SearchConfig, StopReason, DEFAULT_TOLERANCE};
use std::fmt::Write as _;

use crate::suite::{limit_of, step_cost, Case, MARGIN, START_COST_S};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The tolerances compared (the default among them).
pub const TOLERANCES: [f64; 4] = [0.0, 0.002, DEFAULT_TOLERANCE, 0.01];

/// One guided search at one tolerance on one curve.
pub struct Run {
    pub trials: usize,
    pub seconds: f64,
    pub answer: u64,
    pub first_failing: Option<u64>,
    pub stop: StopReason,
    /// (batch, steps, fits)
    pub sequence: Vec<(u64, u32, bool)>,
}

fn search(
    spec: &SimSpec,
    limit: u64,
    cfg: SearchConfig,
) -> (Run, Vec<batchfit::search::TrialRecord>) {
    let mut be = SimBackend::new(spec.clone());
    let out = Prober::new(&mut be, cfg, limit).search();
    let seconds = out
        .trials
        .iter()
        .map(|t| START_COST_S + t.steps as f64 * step_cost(t.batch))
        .sum();
    (
        Run {
            trials: out.trials.len(),
            seconds,
            answer: out.max_fitting.unwrap_or(0),
            first_failing: out.first_failing,
            stop: out.stop_reason,
            sequence: out
                .trials
                .iter()
                .map(|t| (t.batch, t.steps, t.outcome.fits()))
                .collect(),
        },
        out.trials,
    )
}

/// A capacity-model prediction checked against the curve's truth at a larger memory.
pub struct PredictionCheck {
    pub truth: u64,
    /// The prediction, or why it was refused.
    pub predicted: Result<(u64, u64, u64), String>,
}

/// A sweep point's seeded and independent sequences, and its prior's prediction (size, relative
/// uncertainty).
pub type PointSequences = (String, String, Option<(f64, f64)>);

/// One sweep family: a curve whose per-sample bytes grow with the swept parameter.
pub struct SweepFamily {
    pub name: &'static str,
    /// What it sweeps: its first guess of the power (as `probe::sweep` uses it).
    pub param: SweepParam,
    pub describe: String,
    pub points: Vec<u64>,
    /// Per point: (trials with the seed, trials of an independent probe, answer, truth).
    pub rows: Vec<(u64, usize, usize, u64, u64)>,
    /// Per point: the seeded and the independent probe's trial sequences, and the prior's
    /// prediction with its relative uncertainty (none at the first point).
    pub sequences: Vec<PointSequences>,
}

pub struct Results {
    /// runs[case][tolerance]
    pub runs: Vec<Vec<Run>>,
    pub truths: Vec<u64>,
    pub names: Vec<&'static str>,
    /// checks[case]: at 1.5× and 2× the capacity, from the default probe's trials.
    pub checks: Vec<Vec<PredictionCheck>>,
    pub sweeps: Vec<SweepFamily>,
}

/// Per-sample bytes at `v` of a family: `per0 · (v / v0)^exponent + linear · (v − v0)`.
fn family_spec(base: u64, per0: u64, capacity: u64, v0: u64, v: u64, exponent: f64) -> SimSpec {
    let f = (v as f64 / v0 as f64).powf(exponent);
    SimSpec::affine(base, ((per0 as f64) * f).round() as u64, capacity)
}

#[allow(clippy::too_many_arguments)]
fn sweep_family(
    name: &'static str,
    param: SweepParam,
    base: u64,
    per0: u64,
    capacity: u64,
    points: Vec<u64>,
    exponent: f64,
    tweak: impl Fn(&mut SimSpec, u64),
) -> SweepFamily {
    let limit = limit_of(capacity);
    let mut models: Vec<(u64, CapacityModel)> = vec![];
    let mut last_miss = None;
    let mut rows = vec![];
    let mut sequences = vec![];
    for &v in &points {
        let mut spec = family_spec(base, per0, capacity, points[0], v, exponent);
        tweak(&mut spec, v);
        let before: Vec<(u64, &CapacityModel)> = models.iter().map(|(v, m)| (*v, m)).collect();
        // the parameter's first guess of the power (seq-len 1, image-size 2), as `probe::sweep`
        // passes it; most families differ from it on purpose
        let prior = sweep_prior(&before, v, param.exponent(), last_miss);
        let cfg = SearchConfig {
            prior: prior.clone(),
            ..SearchConfig::default()
        };
        let (run, trials) = search(&spec, limit, cfg);
        let (plain, _) = search(&spec, limit, SearchConfig::default());
        let truth = spec.true_max(limit, 5, 1_000_000);
        assert!(
            run.answer <= truth,
            "{name} at {v}: {} > {truth}",
            run.answer
        );
        last_miss = prior
            .as_ref()
            .and_then(|p| prior_miss(p, &trials, run.answer));
        if let Some(m) = CapacityModel::fit(&trials, limit) {
            models.push((v, m));
        }
        rows.push((v, run.trials, plain.trials, run.answer, truth));
        sequences.push((
            seq(&run),
            seq(&plain),
            prior.as_ref().and_then(|p| p.predict(limit)),
        ));
    }
    let describe = format!(
        "base={}GiB, {}MiB per sample at {} × (point / {})^{exponent}, capacity {}GiB",
        base / GIB,
        per0 / MIB,
        points[0],
        points[0],
        capacity / GIB
    );
    SweepFamily {
        name,
        param,
        describe,
        points,
        rows,
        sequences,
    }
}

pub fn run(cases: &[Case]) -> Results {
    let mut runs = vec![];
    let mut truths = vec![];
    let mut names = vec![];
    let mut checks = vec![];
    for c in cases {
        let limit = limit_of(c.spec.capacity);
        let truth = c.spec.true_max(limit, 5, 1_000_000);
        let mut row = vec![];
        let mut default_trials = vec![];
        for &tolerance in &TOLERANCES {
            let cfg = SearchConfig {
                tolerance,
                ..SearchConfig::default()
            };
            let (r, t) = search(&c.spec, limit, cfg);
            assert!(
                r.answer <= truth,
                "{} at {tolerance}: above the truth",
                c.name
            );
            if tolerance == DEFAULT_TOLERANCE {
                default_trials = t;
            }
            row.push(r);
        }
        // The capacity model of the default probe, predicting 1.5× and 2× the capacity.
        let model = CapacityModel::fit(&default_trials, limit);
        let mut cc = vec![];
        for factor in [1.5, 2.0] {
            let cap = (c.spec.capacity as f64 * factor) as u64;
            let t = c.spec.true_max(limit_of(cap), 5, 1_000_000);
            let predicted = match &model {
                None => Err("no model".into()),
                Some(m) => {
                    let p = predict(m, cap, 0, MARGIN, Target::default());
                    match (p.refused, p.max_micro_batch) {
                        (Some(why), _) => Err(why),
                        (None, Some(e)) => Ok((e.micro_batch, e.low, e.high)),
                        (None, None) => Err("no prediction".into()),
                    }
                }
            };
            cc.push(PredictionCheck {
                truth: t,
                predicted,
            });
        }
        runs.push(row);
        truths.push(truth);
        names.push(c.name);
        checks.push(cc);
    }
    let seq = vec![256, 512, 1024, 2048];
    let sweeps = vec![
        sweep_family(
            "tokens, linear",
            SweepParam::SeqLen,
            2 * GIB,
            3 * MIB,
            80 * GIB,
            seq.clone(),
            1.0,
            |_, _| {},
        ),
        sweep_family(
            "attention, ^1.3",
            SweepParam::SeqLen,
            2 * GIB,
            3 * MIB,
            80 * GIB,
            seq.clone(),
            1.3,
            |_, _| {},
        ),
        sweep_family(
            "image side, ^2",
            SweepParam::ImageSize,
            6 * GIB,
            MIB,
            40 * GIB,
            vec![128, 256, 384, 512],
            2.0,
            |_, _| {},
        ),
        sweep_family(
            "large fixed part, ^1.5",
            SweepParam::SeqLen,
            30 * GIB,
            20 * MIB,
            80 * GIB,
            vec![512, 1024, 2048, 4096],
            1.5,
            |_, _| {},
        ),
        sweep_family(
            "noisy 0.5 %, ^1.2",
            SweepParam::SeqLen,
            2 * GIB,
            3 * MIB,
            80 * GIB,
            seq.clone(),
            1.2,
            |s, v| {
                s.noise = 0.005;
                s.seed = v;
            },
        ),
        sweep_family(
            "knee at 8, linear",
            SweepParam::SeqLen,
            4 * GIB,
            2 * MIB,
            24 * GIB,
            seq,
            1.0,
            |s, _| s.knee = 8,
        ),
    ];
    Results {
        runs,
        truths,
        names,
        checks,
        sweeps,
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**missed**"
    }
}

fn seq(r: &Run) -> String {
    r.sequence
        .iter()
        .map(|&(b, s, f)| {
            format!(
                "{b}{}{}",
                if f { "✓" } else { "✗" },
                if s > 3 { "/5" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn render(r: &Results) -> String {
    let mut md = String::new();
    let w = &mut md;
    let n = r.names.len();
    let _ = writeln!(w, "## Tolerance, capacity model and sweep (issue #15)\n");
    let _ = writeln!(
        w,
        "The guided strategy on the same {n} curves at several `--tolerance` values (the default is \
         {DEFAULT_TOLERANCE}); the capacity model of each default probe predicting 1.5× and 2× the capacity; \
         four-point sweeps. Modeled time as above (process per trial). A trial with the confirmation's \
         steps (`/5`) is charged five steps, an out-of-memory one too.\n"
    );
    // --- tolerance ---
    let _ = writeln!(w, "### Tolerance\n");
    let _ = writeln!(
        w,
        "| tolerance | median trials | max trials | median modeled time (s) | total modeled time (s) | exact answers | answers above truth | min answer / exact | median answer / exact |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut default_stats = (0.0, 0.0, 0usize, 1.0);
    for (ti, &tol) in TOLERANCES.iter().enumerate() {
        let trials: Vec<f64> = r.runs.iter().map(|x| x[ti].trials as f64).collect();
        let secs: Vec<f64> = r.runs.iter().map(|x| x[ti].seconds).collect();
        let exact = r
            .runs
            .iter()
            .zip(&r.truths)
            .filter(|(x, &t)| x[ti].answer == t)
            .count();
        let above = r
            .runs
            .iter()
            .zip(&r.truths)
            .filter(|(x, &t)| x[ti].answer > t)
            .count();
        let ratios: Vec<f64> = r
            .runs
            .iter()
            .zip(&r.truths)
            .filter(|(_, &t)| t > 0)
            .map(|(x, &t)| x[ti].answer as f64 / t as f64)
            .collect();
        let min_ratio = ratios.iter().cloned().fold(1.0, f64::min);
        let max_trials = trials.iter().cloned().fold(0.0, f64::max);
        if tol == DEFAULT_TOLERANCE {
            default_stats = (median(&trials), max_trials, above, min_ratio);
        }
        let _ = writeln!(
            w,
            "| {}{} | {} | {} | {:.1} | {:.0} | {exact}/{n} | {above} | {:.4} | {:.4} |",
            tol,
            if tol == DEFAULT_TOLERANCE {
                " (default)"
            } else if tol == 0.0 {
                " (exact)"
            } else {
                ""
            },
            median(&trials),
            max_trials,
            median(&secs),
            secs.iter().sum::<f64>(),
            min_ratio,
            median(&ratios)
        );
    }
    let _ = writeln!(w);
    let (med, max, above, min_ratio) = default_stats;
    let _ = writeln!(w, "| target (default tolerance) | measured | verdict |");
    let _ = writeln!(w, "|---|---|---|");
    let _ = writeln!(w, "| median trials ≤ 6 | {med} | {} |", verdict(med <= 6.0));
    let _ = writeln!(w, "| max trials ≤ 15 | {max} | {} |", verdict(max <= 15.0));
    let _ = writeln!(
        w,
        "| never above the truth | {above} above | {} |",
        verdict(above == 0)
    );
    let _ = writeln!(
        w,
        "| answer ≥ 0.99 × the exact answer | min {min_ratio:.4} | {} |",
        verdict(min_ratio >= 0.99)
    );
    let _ = writeln!(w);
    let di = TOLERANCES
        .iter()
        .position(|&t| t == DEFAULT_TOLERANCE)
        .unwrap();
    let _ = writeln!(
        w,
        "Per curve, exact (`--tolerance 0`) and default: trials · answer, and the default's bracket (fit at b, \
         out of memory at b'; the gap allowed is max(1, ⌊{DEFAULT_TOLERANCE}·b⌋)) and trial sequence \
         (✓ fits, ✗ out of memory, /5 with the confirmation's steps).\n"
    );
    let _ = writeln!(
        w,
        "| curve | truth | exact | default | bracket | allowed gap | default sequence |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---|---:|---|");
    for (ci, name) in r.names.iter().enumerate() {
        let (e, d) = (&r.runs[ci][0], &r.runs[ci][di]);
        let bracket = match d.first_failing {
            Some(f) => format!("{} / {f}", d.answer),
            None => format!("{} / cap", d.answer),
        };
        let _ = writeln!(
            w,
            "| {name} | {} | {} · {} | {} · {} | {bracket} | {} | {} |",
            r.truths[ci],
            e.trials,
            e.answer,
            d.trials,
            d.answer,
            tolerance_gap(d.answer, DEFAULT_TOLERANCE, 1),
            seq(d)
        );
    }
    let _ = writeln!(w);
    let stops: Vec<String> = {
        let mut v: Vec<(String, usize)> = vec![];
        for x in &r.runs {
            let s = format!("{:?}", x[di].stop);
            match v.iter_mut().find(|p| p.0 == s) {
                Some(p) => p.1 += 1,
                None => v.push((s, 1)),
            }
        }
        v.into_iter().map(|(s, c)| format!("{s} {c}")).collect()
    };
    let _ = writeln!(w, "Default stop reasons: {}.\n", stops.join(", "));

    // --- capacity model ---
    let _ = writeln!(
        w,
        "### Capacity model: predicted against the truth at larger memories\n"
    );
    let _ = writeln!(
        w,
        "Each curve's default probe (at its capacity) → `capacity_model` → `predict` at 1.5× and 2× the \
         capacity (same 5 % margin) → compared with `SimSpec::true_max` there. Error = (predicted − truth) / \
         truth. *Affine* curves are those whose memory is a line in the batch above the measured range \
         (`affine-*`, `noise-*` without a knee, `late-*`); the others have a knee, a jump, or both.\n"
    );
    let _ = writeln!(w, "| curve | 1.5×: predicted (range) · truth · error | 2×: predicted (range) · truth · error |");
    let _ = writeln!(w, "|---|---|---|");
    let mut affine_errors = vec![];
    let mut all_errors = vec![];
    let mut refused = 0;
    let mut wrong_side = 0;
    for (ci, name) in r.names.iter().enumerate() {
        let affine = name.starts_with("affine")
            || name.starts_with("late-25")
            || name.starts_with("late-5")
            || (name.starts_with("noise") && !name.contains("knee"));
        let cells: Vec<String> = r.checks[ci]
            .iter()
            .map(|c| match &c.predicted {
                Err(why) => {
                    refused += 1;
                    let short: String = why.chars().take(70).collect();
                    format!("refused ({short}…) · {}", c.truth)
                }
                Ok((b, lo, hi)) => {
                    let err = if c.truth > 0 {
                        (*b as f64 - c.truth as f64) / c.truth as f64
                    } else {
                        0.0
                    };
                    if c.truth > 0 {
                        all_errors.push(err.abs());
                        if affine {
                            affine_errors.push(err.abs());
                        }
                    }
                    if c.truth < *lo || c.truth > *hi {
                        wrong_side += 1;
                    }
                    format!("{b} ({lo}–{hi}) · {} · {:+.2} %", c.truth, 100.0 * err)
                }
            })
            .collect();
        let _ = writeln!(w, "| {name} | {} | {} |", cells[0], cells[1]);
    }
    let _ = writeln!(w);
    let max_affine = affine_errors.iter().cloned().fold(0.0, f64::max);
    let _ = writeln!(
        w,
        "| | measured | verdict |\n|---|---|---|\n| affine curves: largest \\|error\\| ≤ 3 % | {:.2} % over {} predictions (median {:.2} %) | {} |\n| all predictions made: largest \\|error\\| | {:.2} % over {} (median {:.2} %) | |\n| refused | {refused} of {} | |\n| truth outside the error bar | {wrong_side} | |\n",
        100.0 * max_affine,
        affine_errors.len(),
        100.0 * median(&affine_errors),
        verdict(max_affine <= 0.03),
        100.0 * all_errors.iter().cloned().fold(0.0, f64::max),
        all_errors.len(),
        100.0 * median(&all_errors),
        2 * n
    );

    // --- sweep ---
    let _ = writeln!(w, "### Sweep cost\n");
    let _ = writeln!(
        w,
        "Four-point sweeps on curves whose per-sample bytes grow with the swept parameter. Each point is \
         searched with the prior `sweep_prior` makes from the points before it (the fixed part of the nearest \
         point, the per-sample part as a power through the two nearest, confident once the same prediction held \
         at the previous point), as `probe::sweep` does; *alone* is the same point probed without a prior. \
         The second point has one point before it: the parameter's usual power (seq-len 1, image-size 2) is \
         tried first (a fit at the largest size it says fits, less half the gap, then the out-of-memory above: the whole proof when \
         it holds), and when it runs out of memory the search starts below by the power's band (up to twice \
         the usual power). Most families differ from the usual power on purpose. \
         Target: a sweep costs ≤ 2.5 × one probe's trials — measured against the first point's probe (the \
         probe the sweep replaces plus three more) and against the mean of the four points probed alone. \
         A seeded point costs at least 2 trials (a confirmation-length fit and the out-of-memory that closes \
         the bracket), so a family whose first probe takes 4 trials meets the target only when every seeded \
         point is hit at once.\n"
    );
    let _ = writeln!(
        w,
        "| family | trials per point, seeded (alone) | sweep total | ÷ first point's probe | ÷ mean probe alone | answers ≤ truth |"
    );
    let _ = writeln!(w, "|---|---|---:|---:|---:|---|");
    let mut ratios_first = vec![];
    let mut ratios_mean = vec![];
    for f in &r.sweeps {
        let total: usize = f.rows.iter().map(|x| x.1).sum();
        let alone: usize = f.rows.iter().map(|x| x.2).sum();
        let first = f.rows[0].1 as f64;
        let mean_alone = alone as f64 / f.rows.len() as f64;
        let rf = total as f64 / first;
        let rm = total as f64 / mean_alone;
        ratios_first.push(rf);
        ratios_mean.push(rm);
        let per: Vec<String> = f
            .rows
            .iter()
            .map(|x| format!("{}: {} ({})", x.0, x.1, x.2))
            .collect();
        let ok = f.rows.iter().all(|x| x.3 <= x.4);
        let _ = writeln!(
            w,
            "| {} — `{}`, {} | {} | {total} | {rf:.2} | {rm:.2} | {} |",
            f.name,
            f.param.as_str(),
            f.describe,
            per.join(", "),
            if ok { "yes" } else { "**no**" }
        );
        let _ = f.points.len();
    }
    let _ = writeln!(
        w,
        "\nPer point: the prior's prediction (± its relative uncertainty), the seeded sequence and the \
         sequence alone (✓ fits, ✗ out of memory, /5 with the confirmation's steps).\n"
    );
    let _ = writeln!(w, "| family | point | truth | prior | seeded | alone |");
    let _ = writeln!(w, "|---|---:|---:|---|---|---|");
    for f in &r.sweeps {
        for (row, (seeded, alone, prior)) in f.rows.iter().zip(&f.sequences) {
            let prior = prior
                .map(|(b, rel)| format!("{b:.0} ± {:.1} %", 100.0 * rel))
                .unwrap_or_else(|| "none".into());
            let _ = writeln!(
                w,
                "| {} | {} | {} | {prior} | {seeded} | {alone} |",
                f.name, row.0, row.4
            );
        }
    }
    let worst_first = ratios_first.iter().cloned().fold(0.0, f64::max);
    let costlier: Vec<String> = r
        .sweeps
        .iter()
        .flat_map(|f| {
            f.rows
                .iter()
                .filter(|x| x.1 > x.2)
                .map(move |x| format!("{} at {}: {} > {}", f.name, x.0, x.1, x.2))
        })
        .collect();
    let met: Vec<String> = r
        .sweeps
        .iter()
        .zip(ratios_first.iter().zip(&ratios_mean))
        .filter(|(_, (a, b))| **a <= 2.5 && **b <= 2.5)
        .map(|(f, _)| format!("*{}*", f.name))
        .collect();
    let worst_mean = ratios_mean.iter().cloned().fold(0.0, f64::max);
    let _ = writeln!(
        w,
        "\n| target | measured | verdict |\n|---|---|---|\n| sweep ≤ 2.5 × the mean probe alone, every family | worst {worst_mean:.2}, median {:.2} | {} |\n| sweep ≤ 2.5 × the first point's probe, every family | worst {worst_first:.2}, median {:.2} | {} |",
        median(&ratios_mean),
        verdict(worst_mean <= 2.5),
        median(&ratios_first),
        verdict(worst_first <= 2.5)
    );
    let _ = writeln!(
        w,
        "| a seeded point never costs more than the same point alone | {} | {} |\n\nBoth sweep targets met on {} of {} families: {}.\n",
        if costlier.is_empty() {
            "0 costlier".to_string()
        } else {
            costlier.join("; ")
        },
        verdict(costlier.is_empty()),
        met.len(),
        r.sweeps.len(),
        if met.is_empty() {
            "none".to_string()
        } else {
            met.join(", ")
        }
    );
    md
}
