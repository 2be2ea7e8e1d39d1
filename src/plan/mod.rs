//! The plan: batchfit's contract with everything downstream (`batchfit-train`, job scripts, DeepSpeed
//! configs, `merge`/`verify`, the cache). Versioned (`schema_version`), documented in `docs/plan.md`,
//! its types in [`schema`] (the model's description in [`model`]), checked on every read, written
//! atomically by the one writer ([`crate::platform::files`]), and `partial` until the proof is complete.
//!
//! Also here, because they are functions of plans alone: [`merge`] (one plan from several machines'
//! plans) and [`throughput`] (samples/s advice from the recorded trials).

pub mod capacity;
pub mod check;
pub mod input;
pub mod merge;
pub mod model;
pub mod schema;
pub mod throughput;

pub use schema::*;

use crate::platform::files::{self, FileError};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlanError {
    #[error("plan file {0} does not exist; run `batchfit probe --out {0}` first")]
    Missing(PathBuf),
    // not `source`: `{e:#}` at the binaries' edge would print the OS error twice
    #[error("cannot read plan file {path}: {error}")]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("plan file {path} is {what}, not a regular file; give the path of a plan")]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("plan file {path} is not valid JSON ({detail}); it may be truncated: re-run `batchfit probe`")]
    NotJson { path: PathBuf, detail: String },
    #[error("plan file {path} has schema_version {found}, newer than this build understands ({SCHEMA_VERSION}); upgrade batchfit")]
    Newer { path: PathBuf, found: u64 },
    #[error("plan file {path} is not a batchfit plan: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error(
        "plan file {path} contradicts itself: {detail}; it was edited or damaged, so nothing in it \
         can be trusted: re-run `batchfit probe`"
    )]
    Inconsistent { path: PathBuf, detail: String },
    #[error(transparent)]
    Write(#[from] FileError),
}

/// The fit whose measurements a recommendation carries (`peak_bytes`, samples/s): of the fresh fits
/// (cold, [`TrialRecord::cold`]) of exactly `batch` × `accumulation` with at least `steps` steps,
/// the one with the largest peak.
/// A fresh run of the recommendation may peak as high as any of them, so the plan records the
/// highest, never merely the last. The one choice of the probe, `merge` and `verify`.
pub fn recommended_fit<'a>(
    trials: impl IntoIterator<Item = &'a TrialRecord>,
    batch: u64,
    accumulation: u32,
    steps: u32,
) -> Option<&'a TrialRecord> {
    trials
        .into_iter()
        .filter(|t| t.batch == batch && t.fresh_fit_at(steps, accumulation))
        .max_by_key(|t| t.outcome.peak_bytes())
}

impl Plan {
    /// The limit the job gets: the trials' `limit_bytes` plus the guard band in bytes (the band is
    /// headroom for the job, which is not the trial process; `batchfit-train --memory-limit plan`).
    pub fn job_limit_bytes(&self) -> u64 {
        self.limit_bytes
            .saturating_add(self.guard_band_bytes.unwrap_or(0))
    }

    /// The optimizer steps its recommendation was confirmed with: for each size of
    /// `micro_batches`, the most steps of a recorded trial of that size that fit with (at least)
    /// the plan's accumulation; the fewest over the sizes. `None` without a recommendation, or when
    /// a size has no such trial (a merged plan before `batchfit verify`).
    pub fn proven_steps(&self) -> Option<u32> {
        let r = self.recommendation.as_ref()?;
        let acc = u32::try_from(r.accumulation).unwrap_or(u32::MAX);
        r.micro_batches
            .iter()
            .map(|&b| check::fitting_steps(self, b, acc))
            .try_fold(u32::MAX, |fewest, s| s.map(|s| fewest.min(s)))
    }

    /// The confirmation steps: the most steps the search runs a size with.
    pub fn confirmation_steps(&self) -> u32 {
        self.search.confirm_steps.max(self.search.steps)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serialises")
    }

    /// Reads and validates a plan file (JSON, schema version, [`check::check`]: its invariants and
    /// the trials behind its recommendation).
    pub fn read(path: &Path) -> Result<Plan, PlanError> {
        use crate::platform::files::{open_regular, OpenError};
        use std::io::Read;
        let p = path.to_path_buf();
        // only a regular file is read: a FIFO must not hang the reader, and a device (`/dev/zero`)
        // must not be read until memory runs out
        let mut file = match open_regular(path, std::fs::OpenOptions::new().read(true), true) {
            Ok(f) => f,
            Err(OpenError::Missing(_)) => return Err(PlanError::Missing(p)),
            Err(OpenError::Link(error) | OpenError::Io(error)) => {
                return Err(PlanError::Unreadable { path: p, error })
            }
            Err(OpenError::Directory) => {
                return Err(PlanError::NotAFile {
                    path: p,
                    what: "a directory",
                })
            }
            Err(OpenError::NotRegular(what)) => return Err(PlanError::NotAFile { path: p, what }),
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|error| PlanError::Unreadable { path: p, error })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Plan, PlanError> {
        let p = path.to_path_buf();
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| PlanError::NotJson {
            path: p.clone(),
            detail: e.to_string(),
        })?;
        let ver = v
            .get("schema_version")
            .and_then(|s| s.as_u64())
            .ok_or_else(|| PlanError::Invalid {
                path: p.clone(),
                detail: "no schema_version".into(),
            })?;
        if ver > SCHEMA_VERSION as u64 {
            return Err(PlanError::Newer {
                path: p,
                found: ver,
            });
        }
        let plan: Plan = serde_json::from_value(v).map_err(|e| PlanError::Invalid {
            path: p.clone(),
            detail: e.to_string(),
        })?;
        check::check(&plan).map_err(|detail| PlanError::Inconsistent { path: p, detail })?;
        Ok(plan)
    }

    /// Writes the plan with the one writer of result files (atomic; see [`crate::platform::files`]).
    pub fn write_atomic(&self, path: &Path) -> Result<(), PlanError> {
        let mut text = self.to_json();
        text.push('\n');
        files::write_atomic(path, text.as_bytes())?;
        Ok(())
    }
}

/// `plan.json` → `plan.partial.json` (the partial plan is written beside the requested output).
pub fn partial_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plan".into());
    let name = match out.extension() {
        Some(ext) => format!("{stem}.partial.{}", ext.to_string_lossy()),
        None => format!("{stem}.partial"),
    };
    out.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A real plan from a sim probe (no files written).
    /// Seen in CI: `batchfit-train --memory-limit plan` ran under the trials' own limit and ran
    /// out of memory 160 KB above the trial's peak; the job's limit is the band above it.
    #[test]
    fn the_job_limit_is_the_trials_limit_plus_the_band() {
        let mut p = sample_plan();
        p.guard_band_bytes = None;
        assert_eq!(p.job_limit_bytes(), p.limit_bytes);
        p.guard_band_bytes = Some(1 << 20);
        assert_eq!(p.job_limit_bytes(), p.limit_bytes + (1 << 20));
    }

    fn sample_plan() -> Plan {
        crate::probe::sim_plan(&[
            "--backend",
            "sim",
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=16GiB",
            "--global-batch",
            "1018",
            "--allow-uneven",
        ])
    }

    #[test]
    fn round_trip() {
        let plan = sample_plan();
        assert_eq!(plan.status, Status::Complete);
        let text = plan.to_json();
        let back = Plan::parse(&text, Path::new("p.json")).unwrap();
        assert_eq!(back, plan);
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("plan.json");
        plan.write_atomic(&f).unwrap();
        assert_eq!(Plan::read(&f).unwrap(), plan);
        // no temporary files left beside it
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// The cache trusts a plan whose trials back it: not a bracket wider than its stop reason claims
    /// (an edited `first_failing_batch` on an out-of-memory far above).
    #[test]
    fn the_evidence_holds_the_bracket_to_its_stop_reason() {
        let plan = sample_plan();
        check::evidence(&plan).unwrap();
        let r = plan.recommendation.as_ref().unwrap();
        // an out-of-memory far above the answer (as a search's first candidate often is)
        let far = 2 * r.max_fitting_batch;
        let mut edited = plan.clone();
        let mut oom = plan
            .trials
            .iter()
            .find(|t| t.outcome.is_bound() && t.accumulation <= 1)
            .unwrap()
            .clone();
        oom.batch = far;
        edited.trials.push(oom);
        check::evidence(&edited).unwrap();
        edited.recommendation.as_mut().unwrap().first_failing_batch = Some(far);
        check::invariants(&edited).unwrap();
        let e = check::evidence(&edited).unwrap_err();
        assert!(e.contains("does not match its bracket"), "{e}");
    }

    /// The cache trusts a plan whose search repeats its answer only when the answer fit that often:
    /// a plan that says `repeats: 2` with one fit of its answer is not evidence.
    #[test]
    fn the_evidence_holds_the_answer_to_its_repeats() {
        let mut plan = sample_plan();
        check::evidence(&plan).unwrap();
        plan.search.repeats = 2;
        let e = check::evidence(&plan).unwrap_err();
        assert!(
            e.contains("where its search repeats the answer to 3"),
            "{e}"
        );
        let b = plan.recommendation.as_ref().unwrap().max_fitting_batch;
        let steps = plan.search.confirm_steps.max(plan.search.steps);
        let fit = plan
            .trials
            .iter()
            .find(|t| t.batch == b && t.outcome.fits() && t.steps >= steps)
            .unwrap()
            .clone();
        plan.trials.extend([fit.clone(), fit]);
        check::evidence(&plan).unwrap();
    }

    proptest! {
        /// Truncated or corrupted plan files give an error (never a panic, never a silently
        /// different plan from a truncated file).
        #[test]
        fn corrupted_plans_never_panic(cut in 0.0f64..1.0, pos in 0.0f64..1.0, byte in 0u8..128) {
            let text = sample_plan().to_json();
            // cut at a character boundary (a plan holds non-ASCII text: ⌊tolerance × size⌋)
            let mut n = (text.len() as f64 * cut) as usize;
            while !text.is_char_boundary(n) {
                n -= 1;
            }
            prop_assert!(Plan::parse(&text[..n], Path::new("p")).is_err());
            let mut bytes = text.clone().into_bytes();
            let i = ((bytes.len() - 1) as f64 * pos) as usize;
            bytes[i] = byte;
            if let Ok(t) = String::from_utf8(bytes) {
                let _ = Plan::parse(&t, Path::new("p"));
            }
        }
    }

    /// A plan is never written in place: a reader holding the old file (here a hard link to it)
    /// keeps the old bytes, and the new file appears whole, under a new inode, with the old mode.
    #[test]
    fn plans_replace_files_atomically_never_in_place() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("plan.json");
        let mut plan = even_plan();
        plan.write_atomic(&f).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let old = std::fs::read_to_string(&f).unwrap();
        let reader = d.path().join("held-open.json");
        std::fs::hard_link(&f, &reader).unwrap();
        let ino = std::fs::metadata(&f).unwrap().ino();
        plan.warnings.push("second write".into());
        plan.write_atomic(&f).unwrap();
        assert_eq!(
            std::fs::read_to_string(&reader).unwrap(),
            old,
            "written in place"
        );
        assert_ne!(std::fs::metadata(&f).unwrap().ino(), ino);
        assert_eq!(Plan::read(&f).unwrap(), plan);
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // nothing but the two names left in the directory
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    /// One way to make a valid plan contradict itself (`d` ≥ 1 so the change is real).
    fn corrupt(plan: &mut Plan, which: u8, d: u64) {
        let r = plan.recommendation.as_mut().expect("complete plan");
        match which {
            0 => r.micro_batch += d,
            1 => r.micro_batch = r.micro_batch.saturating_sub(d),
            2 => r.accumulation += d,
            3 => r.global_batch += d,
            4 => r.world_size += d,
            5 => r.micro_batches[0] += d,
            6 => {
                let m = r.micro_batch;
                r.micro_batches.push(m)
            }
            7 => {
                r.micro_batches.pop();
            }
            8 => r.max_fitting_batch = r.micro_batch - 1,
            9 => r.first_failing_batch = Some(r.max_fitting_batch - (d % r.max_fitting_batch)),
            10 => plan.recommendation = None,
            11 => plan.status = Status::Partial,
            12 => plan.schema_version = 0,
            13 => r.micro_batch = 0,
            14 => plan.limit_bytes = plan.budget_bytes + d,
            15 => r.fastest_micro_batch = Some(r.micro_batch + d),
            _ => plan.trials[0].steps = 0,
        }
    }

    proptest! {
        /// A plan edited into contradicting itself is refused by every reader (they all go through
        /// `Plan::parse`), saying it contradicts itself; never trusted, never a panic.
        #[test]
        fn contradicting_plans_are_refused(which in 0u8..17, d in 1u64..100_000) {
            for plan in [uneven_plan(), even_plan()] {
                let mut bad = plan.clone();
                corrupt(&mut bad, which, d);
                let e = Plan::parse(&bad.to_json(), Path::new("p.json")).unwrap_err();
                prop_assert!(
                    matches!(e, PlanError::Inconsistent { .. }),
                    "corruption {} by {}: {}", which, d, e
                );
                prop_assert!(e.to_string().contains("contradicts itself"));
            }
        }
    }

    /// A complete sim plan for `global` (8192 = 2 × 4096 exactly; 10007 --allow-uneven = 3336 × 2
    /// + 3335), probed once per test binary.
    fn sim_plan(global: &str) -> Plan {
        let mut argv = vec![
            "batchfit",
            "probe",
            "--backend",
            "sim",
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=16GiB",
            "--global-batch",
            global,
        ];
        if global == "10007" {
            argv.push("--allow-uneven");
        }
        crate::probe::sim_plan(&argv[2..])
    }

    fn even_plan() -> Plan {
        static P: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
        P.get_or_init(|| sim_plan("8192")).clone()
    }

    fn uneven_plan() -> Plan {
        static P: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
        P.get_or_init(|| sim_plan("10007")).clone()
    }

    #[test]
    fn valid_plans_pass_the_checks() {
        for plan in [sample_plan(), even_plan(), uneven_plan()] {
            check::invariants(&plan).unwrap();
            check::evidence(&plan).unwrap();
        }
        // the evidence check needs the trials: a plan whose split size never ran is not backed
        let mut p = even_plan();
        p.trials.retain(|t| t.batch != 4096);
        assert!(check::evidence(&p).unwrap_err().contains("4096"));
        let u = uneven_plan();
        assert_eq!(
            u.recommendation.as_ref().unwrap().micro_batches,
            vec![3336, 3336, 3335]
        );
    }

    /// A plan whose first failing size is its largest fitting size claims that one size both fit
    /// and ran out of memory: refused (the proptest's corruption reaches this edge only by chance).
    #[test]
    fn a_first_failing_size_equal_to_the_largest_fit_is_refused() {
        for plan in [even_plan(), uneven_plan()] {
            let mut bad = plan.clone();
            let r = bad.recommendation.as_mut().unwrap();
            r.first_failing_batch = Some(r.max_fitting_batch);
            let e = Plan::parse(&bad.to_json(), Path::new("p.json")).unwrap_err();
            assert!(matches!(e, PlanError::Inconsistent { .. }), "{e}");
            assert!(
                e.to_string()
                    .contains("is not above its largest fitting size"),
                "{e}"
            );
        }
    }

    #[test]
    fn partial_names() {
        assert_eq!(
            partial_path(Path::new("plan.json")),
            PathBuf::from("plan.partial.json")
        );
        assert_eq!(
            partial_path(Path::new("/a/b/p")),
            PathBuf::from("/a/b/p.partial")
        );
    }
}
