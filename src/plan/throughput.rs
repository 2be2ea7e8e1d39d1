//! Throughput advice: samples/s of the sizes that were tested and fit, and whether a smaller one is
//! about as fast as the best.
//!
//! Only measured sizes count: a trial that fit with the exploration steps (`--steps`) or the
//! confirmation steps (`--confirm-steps`) and reported a positive `step_seconds`. A size is never
//! advised unless a trial ran it and it fit, so the advice keeps the plan's guarantee that every size it
//! names was tested.
//!
//! **Advice only beyond the noise** ([`advise`]): a size's samples/s must rest on repeated
//! measurements — the steps a command's report timed (`details.step_time: report`, one value per
//! step after the first), several trials of the size, or a trial that times its own steps and keeps
//! their median (batchfit's own models, the sim) — and their spread must be within the tolerance, at
//! the advised size and at the best one. A command's trial without a report has one sample, its wall
//! time over its steps (`wall-clock`: the interpreter's start included, several seconds of noise):
//! from one such sample per size nothing is advised.

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

/// The samples/s measurements of one tested size, from all its fitting trials (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Repeated {
    pub batch: u64,
    /// One value per measurement.
    pub samples: Vec<f64>,
    /// A trial of the size timed its own steps and reported their median (one value, measured
    /// repeatedly).
    pub medians: bool,
}

impl Repeated {
    /// The median of the measurements.
    pub fn median(&self) -> f64 {
        let mut v = self.samples.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }
    /// Whether the value rests on repeated measurements.
    pub fn repeated(&self) -> bool {
        self.medians || self.samples.len() >= 2
    }
    /// The measurements' spread relative to their median: (max − min) / median.
    pub fn spread(&self) -> f64 {
        let max = self.samples.iter().copied().fold(f64::MIN, f64::max);
        let min = self.samples.iter().copied().fold(f64::MAX, f64::min);
        (max - min) / self.median()
    }
}

/// Every measurement of samples/s per tested fitting size (the exploration or confirmation steps),
/// sorted by batch: a command's report gives one per timed step after the first, its wall clock one
/// for the trial; a self-timed trial (no details) its median.
pub fn repeated(trials: &[TrialRecord], steps: u32, confirm_steps: u32) -> Vec<Repeated> {
    use crate::protocol::StepTime;
    let mut out: Vec<Repeated> = vec![];
    for t in trials {
        if !t.outcome.fits() || (t.steps != steps && t.steps != confirm_steps) || t.batch == 0 {
            continue;
        }
        let Some(step) = t
            .outcome
            .step_seconds()
            .filter(|s| s.is_finite() && *s > 0.0)
        else {
            continue;
        };
        let per_step = |s: f64| s / f64::from(t.accumulation.max(1));
        let (values, medians): (Vec<f64>, bool) = match t.details.as_ref() {
            None => (vec![step], true),
            Some(d) => match (d.step_time, d.report.as_ref()) {
                (Some(StepTime::Report), Some(r)) => {
                    let timed = if r.step_seconds.len() >= 2 {
                        &r.step_seconds[1..]
                    } else {
                        &r.step_seconds[..]
                    };
                    (timed.iter().map(|&s| per_step(s)).collect(), false)
                }
                _ => (vec![step], false),
            },
        };
        let values: Vec<f64> = values
            .into_iter()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| t.batch as f64 / s)
            .collect();
        if values.is_empty() {
            continue;
        }
        match out.iter_mut().find(|x| x.batch == t.batch) {
            Some(x) => {
                x.samples.extend(values);
                x.medians |= medians;
            }
            None => out.push(Repeated {
                batch: t.batch,
                samples: values,
                medians,
            }),
        }
    }
    out.sort_by_key(|m| m.batch);
    out
}

/// The smallest tested fitting size below `below` whose samples/s is within `tolerance` of the
/// best, where repeated measurements show it (see the module doc): the best size (by median) and
/// the advised one rest on repeated measurements whose spread is within the tolerance, and the
/// advised one's median is at least the best's × (1 − tolerance). `None` otherwise.
pub fn advise(
    trials: &[TrialRecord],
    steps: u32,
    confirm_steps: u32,
    tolerance: f64,
    below: u64,
) -> Option<Advice> {
    let all = repeated(trials, steps, confirm_steps);
    let shown = |r: &Repeated| r.repeated() && r.spread() <= tolerance;
    let best = all.iter().fold(None::<&Repeated>, |acc, r| match acc {
        Some(b) if b.median() >= r.median() => Some(b),
        _ => Some(r),
    })?;
    if !shown(best) {
        return None;
    }
    let threshold = best.median() * (1.0 - tolerance);
    let as_measured = |r: &Repeated| Measured {
        batch: r.batch,
        samples_per_second: r.median(),
        steps: trials
            .iter()
            .filter(|t| t.batch == r.batch && t.outcome.fits())
            .map(|t| t.steps)
            .max()
            .unwrap_or(steps),
    };
    all.iter()
        .find(|r| r.batch < below && r.median() >= threshold && shown(r))
        .map(|r| Advice {
            fastest: as_measured(r),
            best: as_measured(best),
        })
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
    use crate::protocol::TrialOutcome;

    fn t(batch: u64, steps: u32, step_seconds: Option<f64>) -> TrialRecord {
        let mut t = TrialRecord::for_test(batch, step_seconds.map(|_| 1), steps, 1);
        if let (
            TrialOutcome::Fits {
                step_seconds: s, ..
            },
            Some(secs),
        ) = (&mut t.outcome, step_seconds)
        {
            *s = secs;
        }
        t.seconds = 0.1;
        t
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

    /// A command's trial: its wall clock (one sample) or its report's step times.
    fn exec(batch: u64, steps: u32, step_seconds: &[f64]) -> TrialRecord {
        use crate::protocol::{StepTime, TrialDetails, TrialReport, REPORT_SCHEMA};
        let mut t = t(batch, steps, Some(step_seconds[0]));
        let wall = step_seconds.len() == 1;
        t.details = Some(TrialDetails {
            step_time: Some(if wall {
                StepTime::WallClock
            } else {
                StepTime::Report
            }),
            report: (!wall).then(|| TrialReport {
                schema: REPORT_SCHEMA.into(),
                batch,
                steps: u64::from(steps),
                accumulation: 1,
                reads_accumulation: false,
                step_seconds: step_seconds.to_vec(),
                rank: 0,
                world_size: 1,
                cuda: None,
                python: None,
                torch: None,
                samples: None,
                reads_batch: false,
                job_steps: None,
                read_files: None,
                modules: None,
                python_environment: None,
            }),
            ..Default::default()
        });
        t
    }

    /// One wall-clock sample per size (a command without a report: the interpreter's start in
    /// every number) is no evidence that a smaller size is about as fast: no advice (was: 128 at
    /// 98 % of 256's samples/s, from one noisy sample each). Repeated measurements within the
    /// tolerance show it; a spread wider than the tolerance does not.
    #[test]
    fn advice_only_from_repeated_measurements_within_the_tolerance() {
        // samples/s from one wall-clock sample each: 128 → 980, 256 → 1000
        let single = vec![
            exec(128, 3, &[128.0 / 980.0]),
            exec(256, 5, &[256.0 / 1000.0]),
        ];
        assert_eq!(advise(&single, 3, 5, 0.03, 256), None);
        // the report's step times (the first step, which allocates, left out): steady, within 3 %
        let steady = vec![
            exec(128, 3, &[9.0, 128.0 / 980.0, 128.0 / 985.0, 128.0 / 975.0]),
            exec(
                256,
                5,
                &[9.0, 256.0 / 1000.0, 256.0 / 1005.0, 256.0 / 995.0],
            ),
        ];
        let a = advise(&steady, 3, 5, 0.03, 256).expect("shown by repeated step times");
        assert_eq!(a.fastest.batch, 128);
        assert!((a.fastest.samples_per_second - 980.0).abs() < 1e-6);
        assert_eq!(a.best.batch, 256);
        // the same medians, but the steps of 128 spread by 20 %: not shown within 3 %
        let noisy = vec![
            exec(128, 3, &[9.0, 128.0 / 880.0, 128.0 / 980.0, 128.0 / 1060.0]),
            exec(
                256,
                5,
                &[9.0, 256.0 / 1000.0, 256.0 / 1005.0, 256.0 / 995.0],
            ),
        ];
        assert_eq!(advise(&noisy, 3, 5, 0.03, 256), None);
        // two wall-clock trials of each size that agree are repeated measurements too
        let twice = vec![
            exec(128, 3, &[128.0 / 980.0]),
            exec(128, 5, &[128.0 / 982.0]),
            exec(256, 3, &[256.0 / 1000.0]),
            exec(256, 5, &[256.0 / 1001.0]),
        ];
        assert_eq!(advise(&twice, 3, 5, 0.03, 256).unwrap().fastest.batch, 128);
        // a best measured once: nothing is shown against it
        let best_once = vec![
            exec(128, 3, &[9.0, 128.0 / 980.0, 128.0 / 985.0]),
            exec(256, 5, &[256.0 / 1000.0]),
        ];
        assert_eq!(advise(&best_once, 3, 5, 0.03, 256), None);
    }
}
