//! The report: the Markdown tables and findings the bench prints and writes between the search-cost
//! markers of `docs/benchmarks.md`.
//!
//! Its own module because it only formats: it computes nothing that the suite did not measure, so a change
//! of wording cannot change a number, and the numbers can be checked without reading the prose.

use batchfit::search::DEFAULT_TOLERANCE;
use std::fmt::Write as _;
use std::path::Path;

use crate::peers::{
    ReplayReport, ReplayStatus, ACCELERATE_START, LIGHTNING_INIT_VAL, LIGHTNING_MARGIN,
    LIGHTNING_MAX_TRIALS, LIGHTNING_MAX_VAL_DEFAULT, LIGHTNING_MAX_VAL_RAISED,
};
use crate::suite::{
    describe, step_cost, SearchRun, Suite, GUIDED_IDX, LBIN_RAISED_IDX, MARGIN, PEER_STEPS,
    START_COST_S, STEPS, STEP_BASE_S, STEP_PER_SAMPLE_S,
};

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
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

fn fmt_s(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// `trials:answer` plus a mark: `=` exact, `<` below the truth, `>` ABOVE the truth, `*` untested answer.
fn cell(r: &SearchRun, truth: u64) -> String {
    let a = r.answer.map_or("err".to_string(), |a| a.to_string());
    let mark = if r.answer.is_none() {
        ""
    } else if r.above(truth) {
        " **>**"
    } else if r.exact(truth) {
        " ="
    } else {
        " <"
    };
    let untested = if r.answer.is_some() && !r.tested() {
        "*"
    } else {
        ""
    };
    format!("{} · {a}{mark}{untested}", r.n())
}

/// How a replay's status reads, in the report and on stderr.
pub fn replay_status(status: ReplayStatus) -> &'static str {
    match status {
        ReplayStatus::Match => "match",
        ReplayStatus::Mismatch => "**MISMATCH**",
        ReplayStatus::Skipped => "**SKIPPED** (check not run)",
        ReplayStatus::Failed => "**FAILED** (recording unusable)",
    }
}

/// The search-cost section: `self_check` is what `suite::self_check_replay` returned (sequences checked,
/// flipped sequences rejected), `replays` the replays of the recordings of the real tools.
pub fn render(s: &Suite, self_check: (usize, usize), replays: &[ReplayReport]) -> String {
    let mut md = String::new();
    let w = &mut md;
    intro(w, s);
    let (guided_median_trials, guided_above) = summary(w, s);
    hybrid(w, s);
    per_curve(w, s);
    targets(w, s, guided_median_trials, guided_above);
    why_missed(w, s);
    peer_notes(w, s);
    replay_section(w, self_check, replays);
    md
}

/// The title, how to run the bench, and the model's set-up and constants.
fn intro(w: &mut String, s: &Suite) {
    let (confirm_steps, cap) = (s.confirm_steps, s.cap);
    let n = s.cases.len();
    let _ = writeln!(w, "## Search cost\n");
    let _ = writeln!(
        w,
        "How many trials, and how much modeled time, each strategy needs to find the largest micro-batch that fits, \
         over {n} simulated memory curves (`benches/search_cost/`; deterministic, runs in about a second):\n"
    );
    let _ = writeln!(
        w,
        "```sh\nLIBTORCH=$(scripts/setup-libtorch.sh) cargo bench --bench search_cost\n```\n"
    );
    let _ = writeln!(
        w,
        "It prints these tables and rewrites only this section of `docs/benchmarks.md`.\n"
    );
    let _ = writeln!(w, "### Setup and constants\n");
    let _ = writeln!(
        w,
        "* **Limit** = capacity × (1 − {MARGIN}) (batchfit's default margin), the same for every tool. A trial fits \
         when the curve's true peak is ≤ the limit; curves with `noise` only perturb the *reported* peak.\n\
         * **Truth** = `SimSpec::true_max(limit, {confirm_steps}, {cap})`: the largest size whose peak after \
         {confirm_steps} steps (batchfit's confirmation length, which catches late memory) fits, up to batchfit's \
         default `--max-batch`.\n\
         * **batchfit**: `Prober` with `SearchConfig {{ strategy, ..Default::default() }}` ({STEPS} steps per trial, \
         {confirm_steps} for the confirmation; trials counted including the confirmation; the default `--tolerance` \
         {DEFAULT_TOLERANCE}: an answer b is proven by an out-of-memory at most max(1, ⌊{DEFAULT_TOLERANCE}·b⌋) above it, \
         so it can be that much below the truth — *exact answers* counts the answers equal to it, and the \
         tolerance section below the tables has the exact search too).\n\
         * **Lightning 2.6.6** `scale_batch_size`: `init_val` {LIGHTNING_INIT_VAL}, `max_trials` {LIGHTNING_MAX_TRIALS}, \
         `steps_per_trial` {PEER_STEPS}, `margin` {LIGHTNING_MARGIN} (binsearch), `max_val` {LIGHTNING_MAX_VAL_DEFAULT} (default) \
         or {LIGHTNING_MAX_VAL_RAISED} (raised); re-implemented with its flaws: a size that reaches `max_val` is \
         returned untested; power mode's doubling and binsearch's post-OOM step are capped at 8192 by \
         `_adjust_batch_size`'s default `max_val` even when `max_val` is raised; binsearch counts only successful \
         trials toward `max_trials` and cuts its result by the margin. The dataset is assumed larger than any size.\n\
         * **Accelerate 1.16** `find_executable_batch_size`: starts at {ACCELERATE_START}, multiplies by 0.9 on each OOM, \
         never goes up.\n\
         * **Modeled time** of a search = starts × {START_COST_S} s + Σ over trials of steps × step_cost(b), with \
         step_cost(b) = {STEP_BASE_S} s + {STEP_PER_SAMPLE_S} s × b. Lightning and Accelerate search inside the \
         training process and pay the {START_COST_S} s start (process + libtorch) once. batchfit is modeled two ways: \
         **process-per-trial** (`--isolation process`): every trial is a fresh process and pays the start; **hybrid** \
         (`--isolation hybrid`): exploration trials run in one long-lived worker that pays the start once, \
         and every proof trial (the confirmation, and a fresh re-run of the failure above the answer when the worker \
         found it) is a fresh process that pays it again. The sim backend has no processes, so the hybrid figures come \
         from re-running each search with the sim backend reporting worker isolation for exploration: the engine then \
         schedules the fresh re-run exactly as on the CPU backend, so hybrid searches have one trial more (the \
         main tables count process-per-trial trials). The model ignores what the worker can get wrong (memory left \
         over from earlier trials could make it fail early, which the fresh re-run catches at the cost of more \
         trials). Every trial is charged its full step count (an OOM trial usually dies in \
         its first step, so this slightly overcharges every tool alike); Lightning's checkpoint save/restore and \
         validation batches are not charged.\n"
    );
}

/// The per-strategy summary table; returns guided's median trials and answers above the truth (targets).
fn summary(w: &mut String, s: &Suite) -> (f64, usize) {
    let (tools, truths, results) = (&s.tools, &s.truths, &s.results);
    let (guided_idx, lbin_raised_idx) = (GUIDED_IDX, LBIN_RAISED_IDX);
    let n = s.cases.len();
    // Per-strategy summary.
    let _ = writeln!(w, "### Summary over {n} curves\n");
    let _ = writeln!(
        w,
        "| strategy | median trials | max trials | median modeled time (s) | total modeled time (s) | exact answers | \
         answers above truth | untested answers | median answer / truth | time ÷ L-bin-1M: Σ suite | time ÷ L-bin-1M: \
         median per curve |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let lbin_secs: Vec<f64> = results
        .iter()
        .map(|r| r[lbin_raised_idx].seconds())
        .collect();
    let mut guided_median_trials = 0.0;
    let mut guided_above = 0;
    for (ti, t) in tools.iter().enumerate() {
        let col: Vec<&SearchRun> = results.iter().map(|r| &r[ti]).collect();
        let trials: Vec<f64> = col.iter().map(|r| r.n() as f64).collect();
        let secs: Vec<f64> = col.iter().map(|r| r.seconds()).collect();
        let exact = col.iter().zip(truths).filter(|(r, &t)| r.exact(t)).count();
        let above = col.iter().zip(truths).filter(|(r, &t)| r.above(t)).count();
        let untested = col
            .iter()
            .filter(|r| r.answer.is_some() && !r.tested())
            .count();
        let ratio: Vec<f64> = col
            .iter()
            .zip(truths)
            .filter(|(_, &t)| t > 0)
            .map(|(r, &t)| r.answer.unwrap_or(0) as f64 / t as f64)
            .collect();
        if ti == guided_idx {
            guided_median_trials = median(&trials);
            guided_above = above;
        }
        let per_curve: Vec<f64> = secs.iter().zip(&lbin_secs).map(|(a, b)| a / b).collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {exact}/{n} | {above} | {untested} | {:.3} | {:.2} | {:.2} |",
            t.label(),
            median(&trials),
            trials.iter().cloned().fold(0.0, f64::max),
            fmt_s(median(&secs)),
            fmt_s(secs.iter().sum()),
            median(&ratio),
            secs.iter().sum::<f64>() / lbin_secs.iter().sum::<f64>(),
            median(&per_curve)
        );
    }
    let _ = writeln!(w);
    (guided_median_trials, guided_above)
}

/// batchfit's strategies under hybrid isolation.
fn hybrid(w: &mut String, s: &Suite) {
    let (tools, results) = (&s.tools, &s.results);
    let lbin_raised_idx = LBIN_RAISED_IDX;
    let n = s.cases.len();
    let lbin_secs: Vec<f64> = results
        .iter()
        .map(|r| r[lbin_raised_idx].seconds())
        .collect();
    // The same for batchfit under hybrid isolation.
    let _ = writeln!(w, "### batchfit under hybrid isolation\n");
    let _ = writeln!(
        w,
        "Trials include the fresh re-run of the failure above the answer; time = one worker start + a start per proof \
         trial + the steps.\n"
    );
    let _ = writeln!(
        w,
        "| strategy | median trials | max trials | median modeled time (s) | total modeled time (s) | time ÷ L-bin-1M: Σ suite \
         | time ÷ L-bin-1M: median per curve |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|");
    for (ti, t) in tools.iter().enumerate() {
        let hy: Vec<(usize, f64)> = results.iter().filter_map(|r| r[ti].hybrid()).collect();
        if hy.len() != n {
            continue;
        }
        let trials: Vec<f64> = hy.iter().map(|h| h.0 as f64).collect();
        let secs: Vec<f64> = hy.iter().map(|h| h.1).collect();
        let per_curve: Vec<f64> = secs.iter().zip(&lbin_secs).map(|(a, b)| a / b).collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} |",
            t.label(),
            median(&trials),
            trials.iter().cloned().fold(0.0, f64::max),
            fmt_s(median(&secs)),
            fmt_s(secs.iter().sum()),
            secs.iter().sum::<f64>() / lbin_secs.iter().sum::<f64>(),
            median(&per_curve)
        );
    }
    let _ = writeln!(w);
}

/// Per curve: every tool's trials and answer, then its modeled time.
fn per_curve(w: &mut String, s: &Suite) {
    let (cases, tools, truths, results) = (&s.cases, &s.tools, &s.truths, &s.results);
    // Per-curve tables.
    let _ = writeln!(w, "### Per curve: trials · answer\n");
    let _ = writeln!(
        w,
        "The spec column is the curve in `--sim` syntax (`batchfit probe --backend sim --sim '<spec>'`); the limit \
         is 95 % of `capacity`.\n"
    );
    let _ =
        writeln!(
        w,
        "`=` exact, `<` below the truth, **`>`** above the truth (would run out of memory in training), `*` answer \
         never tested as a fit. Columns: {}.\n",
        tools.iter().map(|t| format!("`{}` = {}", t.short(), t.label())).collect::<Vec<_>>().join("; ")
    );
    let header = |w: &mut String, extra: &str| {
        let _ = write!(w, "| curve |{extra} truth |");
        for t in tools {
            let _ = write!(w, " {} |", t.short());
        }
        let _ = writeln!(w);
        let _ = write!(
            w,
            "|---|{}---:|",
            if extra.is_empty() { "" } else { "---|" }
        );
        for _ in tools {
            let _ = write!(w, "---:|");
        }
        let _ = writeln!(w);
    };
    header(w, " spec |");
    for (ci, c) in cases.iter().enumerate() {
        let _ = write!(
            w,
            "| {} | `{}` | {} |",
            c.name,
            describe(&c.spec),
            truths[ci]
        );
        for r in &results[ci] {
            let _ = write!(w, " {} |", cell(r, truths[ci]));
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "### Per curve: modeled time (s)\n");
    header(w, "");
    for (ci, c) in cases.iter().enumerate() {
        let _ = write!(w, "| {} | {} |", c.name, truths[ci]);
        for r in &results[ci] {
            let _ = write!(w, " {} |", fmt_s(r.seconds()));
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);
}

/// Modeled seconds per curve of guided and of Lightning binsearch (max_val raised), and their ratios.
fn guided_vs_lightning(s: &Suite) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let results = &s.results;
    let (guided_idx, lbin_raised_idx) = (GUIDED_IDX, LBIN_RAISED_IDX);
    let g_secs: Vec<f64> = results.iter().map(|r| r[guided_idx].seconds()).collect();
    let l_secs: Vec<f64> = results
        .iter()
        .map(|r| r[lbin_raised_idx].seconds())
        .collect();
    let per_curve_ratio: Vec<f64> = g_secs.iter().zip(&l_secs).map(|(g, l)| g / l).collect();
    (g_secs, l_secs, per_curve_ratio)
}

/// The targets (guided against Lightning binsearch with max_val raised).
fn targets(w: &mut String, s: &Suite, guided_median_trials: f64, guided_above: usize) {
    let results = &s.results;
    let guided_idx = GUIDED_IDX;
    let n = s.cases.len();
    let (g_secs, l_secs, per_curve_ratio) = guided_vs_lightning(s);
    let ratio_median_curve = median(&per_curve_ratio);
    let ratio_total = g_secs.iter().sum::<f64>() / l_secs.iter().sum::<f64>();
    let ratio_of_medians = median(&g_secs) / median(&l_secs);
    let curves_within = per_curve_ratio.iter().filter(|&&r| r <= 1.0 / 3.0).count();
    let gh_secs: Vec<f64> = results
        .iter()
        .map(|r| r[guided_idx].hybrid().expect("batchfit").1)
        .collect();
    let gh_trials: Vec<f64> = results
        .iter()
        .map(|r| r[guided_idx].hybrid().expect("batchfit").0 as f64)
        .collect();
    let h_per_curve: Vec<f64> = gh_secs.iter().zip(&l_secs).map(|(g, l)| g / l).collect();
    let h_ratio_total = gh_secs.iter().sum::<f64>() / l_secs.iter().sum::<f64>();
    let h_ratio_median_curve = median(&h_per_curve);
    let h_within = h_per_curve.iter().filter(|&&r| r <= 1.0 / 3.0).count();
    let verdict = |ok: bool| if ok { "**met**" } else { "**missed**" };
    let _ = writeln!(w, "### Against the targets\n");
    let _ = writeln!(w, "| target | measured | verdict |");
    let _ = writeln!(w, "|---|---|---|");
    let _ = writeln!(
        w,
        "| default (guided) strategy: median trials ≤ 6 | {guided_median_trials} | {} |",
        verdict(guided_median_trials <= 6.0)
    );
    let _ = writeln!(
        w,
        "| default (guided) strategy: zero answers above the true max | {guided_above} | {} |",
        verdict(guided_above == 0)
    );
    let _ = writeln!(
        w,
        "| modeled time ≤ 1/3 of Lightning binsearch (max_val raised), whole suite (Σ guided / Σ Lightning) | {:.3} | {} |",
        ratio_total,
        verdict(ratio_total <= 1.0 / 3.0)
    );
    let _ = writeln!(
        w,
        "| same, median of the per-curve ratios | {:.3} ({curves_within}/{n} curves ≤ 1/3) | {} |",
        ratio_median_curve,
        verdict(ratio_median_curve <= 1.0 / 3.0)
    );
    let _ = writeln!(
        w,
        "| same, ratio of the median times ({} s / {} s) | {:.3} | {} |",
        fmt_s(median(&g_secs)),
        fmt_s(median(&l_secs)),
        ratio_of_medians,
        verdict(ratio_of_medians <= 1.0 / 3.0)
    );
    let _ = writeln!(
        w,
        "| hybrid isolation: median trials ≤ 6 (fresh re-run of the failure included) | {} | {} |",
        median(&gh_trials),
        verdict(median(&gh_trials) <= 6.0)
    );
    let _ = writeln!(
        w,
        "| hybrid isolation: modeled time ≤ 1/3 of Lightning binsearch (max_val raised), Σ suite | {:.3} | {} |",
        h_ratio_total,
        verdict(h_ratio_total <= 1.0 / 3.0)
    );
    let _ = writeln!(
        w,
        "| hybrid isolation: same, median of the per-curve ratios | {:.3} ({h_within}/{n} curves ≤ 1/3) | {} |",
        h_ratio_median_curve,
        verdict(h_ratio_median_curve <= 1.0 / 3.0)
    );
    let _ = writeln!(w);
}

/// Why the time target is missed, how good the baseline's answers are, and guided's costly curves.
fn why_missed(w: &mut String, s: &Suite) {
    let (cases, truths, results) = (&s.cases, &s.truths, &s.results);
    let (guided_idx, lbin_raised_idx) = (GUIDED_IDX, LBIN_RAISED_IDX);
    let confirm_steps = s.confirm_steps;
    let n = cases.len();
    let (g_secs, l_secs, per_curve_ratio) = guided_vs_lightning(s);
    let _ = writeln!(
        w,
        "Why the time target is out of reach for any strategy that proves its answer, under either model: a proven \
         answer needs at least a trial at the answer ({STEPS} steps), a confirmation there ({confirm_steps} steps, a fresh \
         process) and a failing trial one size up, so at least {} steps at the answer's size, while Lightning binsearch \
         stops at an untested or margin-cut size (on affine-all-fit it returns 1048576 without running it; guided must \
         run 1000000 for {} steps, {} s alone). On small answers the process starts dominate instead: at least three \
         (a fit, a failure and the confirmation; under hybrid, the worker, the fresh re-run of the failure and the \
         confirmation), {} s, against Lightning's single one.\n",
        2 * STEPS + confirm_steps,
        STEPS + confirm_steps,
        fmt_s((STEPS + confirm_steps) as f64 * step_cost(1_000_000)),
        fmt_s(3.0 * START_COST_S)
    );
    let lb_exact = (0..n)
        .filter(|&ci| results[ci][lbin_raised_idx].exact(truths[ci]))
        .count();
    let lb_low: Vec<String> = (0..n)
        .filter(|&ci| results[ci][lbin_raised_idx].answer.unwrap_or(0) < truths[ci])
        .map(|ci| {
            format!(
                "{} for {}",
                results[ci][lbin_raised_idx].answer.unwrap_or(0),
                truths[ci]
            )
        })
        .collect();
    let _ = writeln!(
        w,
        "Caveat on the baseline: Lightning binsearch (max_val raised) is exact on {lb_exact}/{n} curves; its answer is \
         below the truth on {} (e.g. {}), partly because of its margin and partly because it stops after \
         {LIGHTNING_MAX_TRIALS} successful trials, several of them re-runs of 8192 forced by the post-OOM cap. Its modeled \
         time is therefore the time to a wrong answer, cheaper than a correct search would be.\n",
        lb_low.len(),
        lb_low.iter().take(4).cloned().collect::<Vec<_>>().join(", ")
    );
    let mut losing: Vec<(usize, f64)> = per_curve_ratio
        .iter()
        .cloned()
        .enumerate()
        .filter(|&(_, r)| r > 1.0 / 3.0)
        .collect();
    losing.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    if !losing.is_empty() {
        let _ = writeln!(
            w,
            "Curves where guided's modeled time is above 1/3 of Lightning binsearch's (on small batches guided's \
             {START_COST_S} s process start per trial dominates; on large ones, its extra trials at large sizes): {}.\n",
            losing
                .iter()
                .map(|&(ci, r)| format!(
                    "{} ({} s vs {} s, ratio {:.2})",
                    cases[ci].name,
                    fmt_s(g_secs[ci]),
                    fmt_s(l_secs[ci]),
                    r
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let worst_guided: Vec<String> = cases
        .iter()
        .enumerate()
        .filter(|&(ci, _)| {
            results[ci][guided_idx].n() > 6 || !results[ci][guided_idx].exact(truths[ci])
        })
        .map(|(ci, c)| {
            let r = &results[ci][guided_idx];
            let seq = r
                .trials
                .iter()
                .map(|&(b, s, f)| {
                    format!(
                        "{b}{}{}",
                        if s != STEPS {
                            format!("/{s}st")
                        } else {
                            String::new()
                        },
                        if f { "✓" } else { "✗" }
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            format!("{}: {} trials ({}; stop: {})", c.name, r.n(), seq, r.note)
        })
        .collect();
    if !worst_guided.is_empty() {
        let _ = writeln!(
            w,
            "Curves where guided needs more than 6 trials or misses the exact answer:\n"
        );
        for s in &worst_guided {
            let _ = writeln!(w, "* {s}");
        }
        let _ = writeln!(w);
    }
}

/// How the peers' notable answers came about (untested answers, errors, capped proposals).
fn peer_notes(w: &mut String, s: &Suite) {
    let (cases, tools, results) = (&s.cases, &s.tools, &s.results);
    // Notes on peers' untested or error answers.
    let mut notes = vec![];
    for (ci, c) in cases.iter().enumerate() {
        for (ti, t) in tools.iter().enumerate() {
            let r = &results[ci][ti];
            if t.in_process() && !r.note.is_empty() {
                notes.push(format!("{} on {}: {}", t.short(), c.name, r.note));
            }
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(
            w,
            "<details><summary>How the peers' answers came about (notable cases)</summary>\n"
        );
        for s in &notes {
            let _ = writeln!(w, "* {s}");
        }
        let _ = writeln!(w, "\n</details>\n");
    }
}

/// The replays: the self-check on the suite, then each recording of a real tool.
fn replay_section(w: &mut String, self_check: (usize, usize), replays: &[ReplayReport]) {
    // Replays against the real tools.
    let _ = writeln!(
        w,
        "### Re-implementations replayed against the real tools\n"
    );
    let _ = writeln!(
        w,
        "Each recorded sequence of (batch, fits) from a real run is fed to the re-implementation, which must \
         propose the same sizes in the same order and return the same answer.\n"
    );
    let (checked, flipped) = self_check;
    let _ = writeln!(
        w,
        "Self-check of the replay: the re-implementations' own {checked} sequences on this suite replay as a match, \
         and all {flipped} of them with the first outcome flipped are reported as a mismatch.\n"
    );
    for rep in replays {
        let _ = writeln!(
            w,
            "* `{}` — {}: {}",
            rep.tool,
            replay_status(rep.status),
            rep.detail
        );
    }
    let _ = writeln!(w);
}

const BEGIN: &str = "<!-- search-cost:begin -->";
const END: &str = "<!-- search-cost:end -->";

/// Replaces only the text between the search-cost markers (creating the file or the markers if absent).
pub fn write_section(path: &Path, body: &str) -> std::io::Result<()> {
    let existing = match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let section = format!("{BEGIN}\n{body}{END}");
    let new = match existing {
        None => format!("# Benchmarks\n\n{section}\n"),
        Some(s) => match (s.find(BEGIN), s.find(END)) {
            (Some(b), Some(e)) if e > b => format!("{}{section}{}", &s[..b], &s[e + END.len()..]),
            (None, None) => {
                let sep = if s.ends_with("\n\n") {
                    ""
                } else if s.ends_with('\n') {
                    "\n"
                } else {
                    "\n\n"
                };
                format!("{s}{sep}{section}\n")
            }
            _ => {
                return Err(std::io::Error::other(format!(
                    "the markers {BEGIN} / {END} are malformed in {}; not touching it",
                    path.display()
                )))
            }
        },
    };
    let tmp = path.with_extension("md.tmp-search-cost");
    std::fs::write(&tmp, new)?;
    std::fs::rename(&tmp, path)
}
