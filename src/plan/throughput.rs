//! Throughput advice: samples/s of the sizes that were tested and fit, and whether a smaller one is
//! about as fast as the best.
//!
//! Only measured sizes count: a trial that fit with the exploration steps (`--steps`) or the
//! confirmation steps (`--confirm-steps`) and reported a positive `step_seconds`. A size is never
//! advised unless a trial ran it and it fit, so the advice keeps the plan's guarantee that every size it
//! names was tested.

use super::Plan;
use crate::search::TrialRecord;

/// The measured throughput of one tested size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub batch: u64,
    pub samples_per_second: f64,
    /// Steps of the trial the measurement comes from (the one with the most steps at this size).
    pub steps: u32,
}

/// One measurement per tested fitting size, sorted by batch. Of several trials at a size, the one with
/// the most steps (then the latest) is used: the confirmation run is the steadier measurement.
pub fn measured(trials: &[TrialRecord], steps: u32, confirm_steps: u32) -> Vec<Measured> {
    let mut by_batch: Vec<Measured> = vec![];
    for t in trials {
        if !t.outcome.fits() || (t.steps != steps && t.steps != confirm_steps) || t.batch == 0 {
            continue;
        }
        let Some(step) = t.outcome.step_seconds() else {
            continue;
        };
        if !(step.is_finite() && step > 0.0) {
            continue;
        }
        let m = Measured {
            batch: t.batch,
            samples_per_second: t.batch as f64 / step,
            steps: t.steps,
        };
        match by_batch.iter_mut().find(|x| x.batch == t.batch) {
            Some(x) if m.steps >= x.steps => *x = m,
            Some(_) => {}
            None => by_batch.push(m),
        }
    }
    by_batch.sort_by_key(|m| m.batch);
    by_batch
}

/// The best measured samples/s (the first size to reach it on a tie).
pub fn best(measured: &[Measured]) -> Option<Measured> {
    measured.iter().copied().fold(None, |acc, m| match acc {
        Some(b) if b.samples_per_second >= m.samples_per_second => Some(b),
        _ => Some(m),
    })
}

/// Advice: a tested size smaller than `below` whose samples/s is within `tolerance` of the best.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Advice {
    /// The smallest such size.
    pub fastest: Measured,
    /// The best measured size (may be larger than `below`).
    pub best: Measured,
}

/// The smallest tested fitting size below `below` with samples/s ≥ best × (1 − tolerance), if any.
pub fn advise(
    trials: &[TrialRecord],
    steps: u32,
    confirm_steps: u32,
    tolerance: f64,
    below: u64,
) -> Option<Advice> {
    let m = measured(trials, steps, confirm_steps);
    let best = best(&m)?;
    let threshold = best.samples_per_second * (1.0 - tolerance);
    m.iter()
        .find(|x| x.batch < below && x.samples_per_second >= threshold)
        .map(|&fastest| Advice { fastest, best })
}

/// A line for the human summary when the plan carries `fastest_micro_batch`.
pub fn summary_line(plan: &Plan) -> Option<String> {
    let r = plan.recommendation.as_ref()?;
    let fastest = r.fastest_micro_batch?;
    let m = measured(&plan.trials, plan.search.steps, plan.search.confirm_steps);
    let sps = r.fastest_samples_per_second.or_else(|| {
        m.iter()
            .find(|x| x.batch == fastest)
            .map(|x| x.samples_per_second)
    })?;
    let best = best(&m);
    let vs_best = match best {
        Some(b) if b.samples_per_second > 0.0 => format!(
            ", {:.1}% of the best measured ({:.0} samples/s at micro-batch {})",
            100.0 * sps / b.samples_per_second,
            b.samples_per_second,
            b.batch
        ),
        _ => String::new(),
    };
    Some(format!(
        "throughput: micro-batch {fastest} (tested, fits) runs {sps:.0} samples/s{vs_best}: \
         about as fast as micro-batch {} with less memory\n",
        r.micro_batch
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Isolation, TrialOutcome};
    use crate::search::Purpose;

    fn t(batch: u64, steps: u32, step_seconds: Option<f64>) -> TrialRecord {
        TrialRecord {
            batch,
            steps,
            purpose: Purpose::Explore,
            isolation: Isolation::None,
            accumulation: 1,
            outcome: match step_seconds {
                Some(s) => TrialOutcome::Fits {
                    peak_bytes: 1,
                    rss_peak_bytes: None,
                    step_seconds: s,
                    gpu: None,
                },
                None => TrialOutcome::Oom {
                    message: "oom".into(),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                    gpu: None,
                },
            },
            seconds: 0.1,
            gpu_index: None,
            details: None,
        }
    }

    #[test]
    fn smallest_within_tolerance_of_best() {
        // samples/s: 64 → 640, 128 → 1000, 256 → 1010, 512 → 1020, 600 → oom
        let trials = vec![
            t(64, 3, Some(0.1)),
            t(128, 3, Some(0.128)),
            t(256, 3, Some(256.0 / 1010.0)),
            t(512, 5, Some(512.0 / 1020.0)),
            t(600, 3, None),
        ];
        let a = advise(&trials, 3, 5, 0.03, 512).unwrap();
        assert_eq!(a.fastest.batch, 128);
        assert_eq!(a.best.batch, 512);
        assert!(advise(&trials, 3, 5, 0.005, 512).is_none());
        assert_eq!(
            advise(&trials, 3, 5, 0.015, 512).unwrap().fastest.batch,
            256
        );
        // never a size at or above the recommendation
        assert!(advise(&trials, 3, 5, 0.03, 128).is_none());
    }

    #[test]
    fn only_fitting_trials_with_explore_or_confirm_steps() {
        let trials = vec![
            t(100, 1, Some(0.01)), // other step count: ignored
            t(200, 3, Some(0.0)),  // no timing: ignored
            t(300, 3, Some(1.0)),
            t(400, 3, None),
        ];
        let m = measured(&trials, 3, 5);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].batch, 300);
        assert!(advise(&trials, 3, 5, 0.5, 1000).is_some());
        assert_eq!(advise(&trials, 3, 5, 0.5, 1000).unwrap().fastest.batch, 300);
    }

    #[test]
    fn confirm_measurement_wins_at_a_size() {
        let trials = vec![t(100, 3, Some(1.0)), t(100, 5, Some(0.5))];
        let m = measured(&trials, 3, 5);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].samples_per_second, 200.0);
    }
}
