//! Search-cost benchmark: how many trials, and how much modeled time, each search strategy needs to find
//! the largest micro-batch that fits, over a suite of simulated memory curves — batchfit's strategies
//! against faithful re-implementations of PyTorch Lightning 2.6.6's `scale_batch_size` (modes `power`
//! and `binsearch`) and Accelerate 1.16's `find_executable_batch_size`.
//!
//! Run: `LIBTORCH=$(scripts/setup-libtorch.sh) cargo bench --bench search_cost`.
//! Prints the tables and rewrites the `search-cost` marked section of `docs/benchmarks.md` (nothing else
//! in that file). Deterministic: no wall-clock measurement enters the results.
//!
//! The peers are re-implemented from reading their source (not copied), flaws included:
//! * Lightning `power`: doubles from `init_val` until an OOM, then halves once and returns. A size that
//!   reaches `max_val` is returned **untested**. Its doubling goes through `_adjust_batch_size`, whose own
//!   `max_val` defaults to 8192 and is not passed by power mode, so raising `max_val` does not let power
//!   mode go above 8192.
//! * Lightning `binsearch`: doubles, then bisects `(high + low) // 2` with `low` starting at 1. Only
//!   successful trials count toward `max_trials`. A size that reaches `max_val` is returned untested. After
//!   an OOM the next size goes through `_adjust_batch_size` without `max_val`, so it is capped at 8192 even
//!   when `max_val` was raised. If a first trial at 2 runs out of memory, 1 is returned untested. Finally
//!   the result is cut by `margin` (`max(1, int(n × (1 − margin)))`), so the answer is usually untested.
//! * Accelerate: starts at 128 and multiplies by 0.9 (truncated) on every OOM until a size runs; it
//!   never goes above the start.
//!
//! The peers' functions are also replayed against recorded trial sequences of the real tools
//! (`benches/data/*_real_sequence.json`) when those files exist.
//!
//! Layout: `suite.rs` holds the curves, the cost model and the runs of every tool (the only module that
//! uses batchfit's library); `peers.rs` the re-implementations and their replay; `report.rs` turns the
//! results into the Markdown section; `tolerance.rs` measures and reports the proof's tolerance, the
//! capacity model's predictions and the cost of a sweep; this file wires them: run, replay, render,
//! print, write.

mod peers;
mod report;
mod suite;
mod tolerance;

use std::path::PathBuf;

fn main() {
    assert_eq!(
        suite::STEPS,
        batchfit::search::SearchConfig::default().steps,
        "the bench's exploration steps are batchfit's default"
    );
    let s = suite::run();
    // The replay machinery checked on the suite itself, then the recordings of the real tools.
    let self_check = suite::self_check_replay(&s.cases, &s.tools);
    // BATCHFIT_REPLAY_DIR overrides where the recordings are read from (to test the replay itself).
    let data = std::env::var_os("BATCHFIT_REPLAY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/data"));
    let mut replays = vec![];
    for f in [
        "lightning_real_sequence.json",
        "accelerate_real_sequence.json",
    ] {
        for rep in peers::replay_file(&data.join(f)) {
            eprintln!(
                "replay {}: {}: {}",
                rep.tool,
                report::replay_status(rep.status),
                rep.detail
            );
            replays.push(rep);
        }
    }
    let mut md = report::render(&s, self_check, &replays);
    // Issue #15: tolerance, capacity model, sweep (its own section after the tables above).
    md += &tolerance::render(&tolerance::run(&s.cases));

    print!("{md}");
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md");
    match report::write_section(&doc, &md) {
        Ok(()) => {
            eprintln!("updated the search-cost section of {}", doc.display());
            // batchfit must never report a size above the true max: that is its proof invariant.
            let mut bad = vec![];
            for (ci, c) in s.cases.iter().enumerate() {
                for (ti, t) in s.tools.iter().enumerate() {
                    if !t.in_process() && s.results[ci][ti].above(s.truths[ci]) {
                        bad.push(format!(
                            "{} on {}: {:?} > {}",
                            t.label(),
                            c.name,
                            s.results[ci][ti].answer,
                            s.truths[ci]
                        ));
                    }
                }
            }
            if !bad.is_empty() {
                eprintln!(
                    "FAIL: batchfit answered above the true max:\n  {}",
                    bad.join("\n  ")
                );
                std::process::exit(2);
            }
        }
        Err(e) => {
            eprintln!("could not update {}: {e}", doc.display());
            std::process::exit(1);
        }
    }
}
