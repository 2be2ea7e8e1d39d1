//! The peers' batch-size searches, re-implemented so the suite can run them on simulated curves:
//! Lightning 2.6.6's `scale_batch_size` (`power`, `binsearch`) and Accelerate 1.16's
//! `find_executable_batch_size`, flaws included (see the crate doc in `main.rs`), and the replay that
//! checks them against trial sequences recorded from the real tools (`benches/data/*_real_sequence.json`).
//!
//! Its own module because it knows nothing of batchfit: it is what must match the real tools, and what a
//! reader checks against their source.

use serde_json::Value;
use std::path::Path;

/// Lightning's `_adjust_batch_size` caps at its own `max_val` argument, whose default is 8192.
pub const LIGHTNING_ADJUST_DEFAULT_MAX_VAL: u64 = 8192;
pub const LIGHTNING_INIT_VAL: u64 = 2;
pub const LIGHTNING_MAX_TRIALS: u32 = 25;
pub const LIGHTNING_MARGIN: f64 = 0.05;
pub const LIGHTNING_MAX_VAL_DEFAULT: u64 = 8192;
pub const LIGHTNING_MAX_VAL_RAISED: u64 = 1_048_576;
pub const ACCELERATE_START: u64 = 128;

// ---------------------------------------------------------------------------------------------------
// Peer re-implementations. Each takes an oracle: `oracle(b)` runs a trial at b and says whether it fit
// (`Some(true)`), ran out of memory (`Some(false)`), or that the run must stop (`None`: used by replay
// when the proposal diverges from the recording).
// ---------------------------------------------------------------------------------------------------

/// What a peer did.
#[derive(Debug, Clone, Default)]
pub struct PeerRun {
    /// (batch, fits), in order.
    pub trials: Vec<(u64, bool)>,
    /// The size the tool returns; `None` when it raises an error instead.
    pub answer: Option<u64>,
    /// Why there is no answer, or how the answer came about when notable.
    pub note: Option<String>,
    /// Stopped by the oracle (replay divergence).
    pub aborted: bool,
}

impl PeerRun {
    fn run(&mut self, oracle: &mut dyn FnMut(u64) -> Option<bool>, b: u64) -> Option<bool> {
        let r = oracle(b);
        match r {
            Some(f) => self.trials.push((b, f)),
            None => self.aborted = true,
        }
        r
    }
}

/// Python's `int(n * factor)` for a non-negative int and a float factor.
fn py_int_mul(n: u64, factor: f64) -> u64 {
    (n as f64 * factor) as u64
}

/// Lightning's `_adjust_batch_size` size computation (the dataset is assumed larger than any size, i.e.
/// its length check never triggers): `value` overrides `factor`; the result is capped at `max_val`.
fn lightning_adjust(current: u64, factor: f64, value: Option<u64>, max_val: u64) -> (u64, bool) {
    let new = value
        .unwrap_or_else(|| py_int_mul(current, factor))
        .min(max_val);
    (new, new != current)
}

/// Lightning 2.6.6 `scale_batch_size(mode="power")`.
pub fn lightning_power(
    init_val: u64,
    max_trials: u32,
    max_val: u64,
    oracle: &mut dyn FnMut(u64) -> Option<bool>,
) -> PeerRun {
    let mut run = PeerRun::default();
    // The initial `_adjust_batch_size(value=init_val)` (default max_val).
    let (mut size, _) = lightning_adjust(0, 1.0, Some(init_val), LIGHTNING_ADJUST_DEFAULT_MAX_VAL);
    let mut any_success = false;
    for i in 0..max_trials {
        if size >= max_val {
            run.note = Some(format!("reached max_val {max_val}: returned untested"));
            break;
        }
        if size == 0 {
            // The dataloader is rebuilt with batch_size=0 right after the halving: ValueError.
            run.answer = None;
            run.note = Some("batch size reached 0: Lightning raises".into());
            return run;
        }
        match run.run(oracle, size) {
            None => return run,
            Some(true) => {
                let last_successful = size;
                if i + 1 >= max_trials {
                    size = last_successful;
                    break;
                }
                // Power mode does not pass max_val: the default 8192 applies.
                let (new, changed) =
                    lightning_adjust(size, 2.0, None, LIGHTNING_ADJUST_DEFAULT_MAX_VAL);
                size = new;
                if !changed {
                    break;
                }
                any_success = true;
            }
            Some(false) => {
                let (new, _) = lightning_adjust(size, 0.5, None, LIGHTNING_ADJUST_DEFAULT_MAX_VAL);
                size = new;
                if size == 0 {
                    run.answer = None;
                    run.note = Some("batch size reached 0: Lightning raises".into());
                    return run;
                }
                if any_success {
                    break;
                }
            }
        }
    }
    run.answer = Some(size);
    run
}

/// Lightning 2.6.6 `scale_batch_size(mode="binsearch")`, margin included.
pub fn lightning_binsearch(
    init_val: u64,
    max_trials: u32,
    margin: f64,
    max_val: u64,
    oracle: &mut dyn FnMut(u64) -> Option<bool>,
) -> PeerRun {
    let mut run = PeerRun::default();
    let (mut size, _) = lightning_adjust(0, 1.0, Some(init_val), LIGHTNING_ADJUST_DEFAULT_MAX_VAL);
    let mut low: u64 = 1;
    let mut high: Option<u64> = None;
    let mut count: u32 = 0; // successful trials only
    let mut capped_after_oom = 0u32;
    loop {
        if size >= max_val {
            run.note = Some(format!("reached max_val {max_val}: returned untested"));
            break;
        }
        match run.run(oracle, size) {
            None => return run,
            Some(true) => {
                let last_successful = size;
                count += 1;
                if count >= max_trials {
                    size = last_successful;
                    run.note = Some(format!("{max_trials} successful trials: stopped"));
                    break;
                }
                low = size;
                let (new, changed) = match high {
                    Some(h) => {
                        if h - low <= 1 {
                            break;
                        }
                        lightning_adjust(size, 1.0, Some((h + low) / 2), max_val)
                    }
                    None => lightning_adjust(size, 2.0, None, max_val),
                };
                size = new;
                if !changed {
                    break;
                }
            }
            Some(false) => {
                let h = size;
                high = Some(h);
                // The OOM branch does not pass max_val: the default 8192 applies.
                let (new, _) = lightning_adjust(
                    size,
                    1.0,
                    Some((h + low) / 2),
                    LIGHTNING_ADJUST_DEFAULT_MAX_VAL,
                );
                if new < (h + low) / 2 {
                    capped_after_oom += 1;
                }
                size = new;
                if h - low <= 1 {
                    break;
                }
            }
        }
    }
    if capped_after_oom > 0 {
        let n = format!(
            "{capped_after_oom} post-OOM proposal(s) capped to {LIGHTNING_ADJUST_DEFAULT_MAX_VAL} (re-running a size already known to fit)"
        );
        run.note = Some(match run.note.take() {
            Some(o) => format!("{o}; {n}"),
            None => n,
        });
    }
    if margin > 0.0 {
        size = py_int_mul(size, 1.0 - margin).max(1);
    }
    run.answer = Some(size);
    run
}

/// Accelerate 1.16 `find_executable_batch_size(starting_batch_size=start)` with the default reduction.
pub fn accelerate_find_executable(
    start: u64,
    oracle: &mut dyn FnMut(u64) -> Option<bool>,
) -> PeerRun {
    let mut run = PeerRun::default();
    let mut size = start;
    loop {
        if size == 0 {
            run.note = Some("reached zero: Accelerate raises".into());
            return run;
        }
        match run.run(oracle, size) {
            None => return run,
            Some(true) => {
                run.answer = Some(size);
                return run;
            }
            Some(false) => size = py_int_mul(size, 0.9),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Replay against recorded real sequences
// ---------------------------------------------------------------------------------------------------

/// The outcome of replaying a recorded sequence through a re-implementation.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub tool: String,
    pub status: ReplayStatus,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStatus {
    /// Same proposals, same answer.
    Match,
    /// The re-implementation diverges from the recording.
    Mismatch,
    /// No recording: nothing was checked.
    Skipped,
    /// A recording exists but cannot be used.
    Failed,
}

impl ReplayReport {
    pub fn matched(&self) -> bool {
        self.status == ReplayStatus::Match
    }
}

/// Runs the re-implementation of `tool` with its answers taken from `recorded` (batch, fits) and checks
/// that it proposes exactly the recorded batch sequence (and, when given, returns `recorded_answer`).
/// `params` may carry `max_val`, `init_val`, `max_trials`, `margin`, `starting_batch_size`.
pub fn replay(
    tool: &str,
    params: &Value,
    recorded: &[(u64, bool)],
    recorded_answer: Option<u64>,
) -> ReplayReport {
    let u = |k: &str, d: u64| params.get(k).and_then(Value::as_u64).unwrap_or(d);
    let max_val = u("max_val", LIGHTNING_MAX_VAL_DEFAULT);
    let init_val = u("init_val", LIGHTNING_INIT_VAL);
    let max_trials = u("max_trials", LIGHTNING_MAX_TRIALS as u64) as u32;
    let margin = params
        .get("margin")
        .and_then(Value::as_f64)
        .unwrap_or(LIGHTNING_MARGIN);
    let start = u("starting_batch_size", ACCELERATE_START);

    let mut idx = 0usize;
    let mut divergence: Option<String> = None;
    let mut oracle = |b: u64| -> Option<bool> {
        match recorded.get(idx) {
            Some(&(rb, f)) if rb == b => {
                idx += 1;
                Some(f)
            }
            Some(&(rb, _)) => {
                divergence = Some(format!(
                    "trial {}: re-implementation proposes {b}, the tool ran {rb}",
                    idx + 1
                ));
                None
            }
            None => {
                divergence = Some(format!(
                    "trial {}: re-implementation proposes {b}, the recording has only {} trials",
                    idx + 1,
                    recorded.len()
                ));
                None
            }
        }
    };
    let run = match tool {
        "lightning-binsearch" => {
            lightning_binsearch(init_val, max_trials, margin, max_val, &mut oracle)
        }
        "lightning-power" => lightning_power(init_val, max_trials, max_val, &mut oracle),
        "accelerate" | "accelerate-find-executable-batch-size" => {
            accelerate_find_executable(start, &mut oracle)
        }
        other => {
            return ReplayReport {
                tool: other.to_string(),
                status: ReplayStatus::Failed,
                detail: format!("unknown tool {other:?}: no re-implementation to replay"),
            }
        }
    };
    let seq = |v: &[(u64, bool)]| {
        v.iter()
            .map(|(b, f)| format!("{b}{}", if *f { "✓" } else { "✗" }))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut problems = vec![];
    if let Some(d) = divergence {
        problems.push(d);
    } else if idx < recorded.len() {
        problems.push(format!(
            "re-implementation stopped after {idx} trials, the tool ran {}",
            recorded.len()
        ));
    }
    if problems.is_empty() {
        if let Some(a) = recorded_answer {
            if run.answer != Some(a) {
                problems.push(format!("answer {:?} vs the tool's {a}", run.answer));
            }
        }
    }
    let matched = problems.is_empty();
    let detail = if matched {
        format!(
            "same {} trials ({}), same answer {}",
            recorded.len(),
            seq(recorded),
            recorded_answer.map_or("(none recorded)".to_string(), |a| a.to_string())
        )
    } else {
        format!("{}; recorded: {}", problems.join("; "), seq(recorded))
    };
    let status = if matched {
        ReplayStatus::Match
    } else {
        ReplayStatus::Mismatch
    };
    ReplayReport {
        tool: tool.to_string(),
        status,
        detail,
    }
}

/// Replays every record of a `*_real_sequence.json` file (an object, or an array of them).
pub fn replay_file(path: &Path) -> Vec<ReplayReport> {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) => {
            return vec![ReplayReport {
                tool: name.clone(),
                status: ReplayStatus::Skipped,
                detail: format!(
                "`{}` is absent, so the re-implementation was not checked against the real tool",
                path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(path)
                    .display()
            ),
            }]
        }
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return vec![ReplayReport {
                tool: name,
                status: ReplayStatus::Failed,
                detail: format!("unreadable JSON: {e}"),
            }]
        }
    };
    let records: Vec<Value> = match v {
        Value::Array(a) => a,
        o => vec![o],
    };
    records
        .iter()
        .map(|r| {
            let tool = r
                .get("tool")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            let trials: Option<Vec<(u64, bool)>> =
                r.get("trials").and_then(Value::as_array).map(|a| {
                    a.iter()
                        .filter_map(|t| {
                            Some((t.get("batch")?.as_u64()?, t.get("fits")?.as_bool()?))
                        })
                        .collect()
                });
            let n_raw = r
                .get("trials")
                .and_then(Value::as_array)
                .map_or(0, |a| a.len());
            match trials {
                Some(t) if t.len() == n_raw && !t.is_empty() => {
                    let mut rep = replay(&tool, r, &t, r.get("answer").and_then(Value::as_u64));
                    rep.detail = format!("{name}: {}", rep.detail);
                    rep
                }
                _ => ReplayReport {
                    tool,
                    status: ReplayStatus::Failed,
                    detail: format!("{name}: no usable `trials` list of {{batch, fits}}"),
                },
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// The suite
