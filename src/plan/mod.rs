//! The plan: batchfit's contract with everything downstream (`batchfit-train`, job scripts, DeepSpeed
//! configs, `merge`/`verify`, the cache). Versioned (`schema_version`), documented in `docs/plan.md`,
//! its types in [`schema`] (the model's description in [`model`]), checked on every read, written
//! atomically by the one writer ([`crate::platform::files`]), and `partial` until the proof is complete.
//!
//! Also here, because they are functions of plans alone: [`merge`] (one plan from several machines'
//! plans) and [`throughput`] (samples/s advice from the recorded trials).

pub mod capacity;
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
    #[error("cannot read plan file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plan file {path} is not valid JSON ({detail}); it may be truncated: re-run `batchfit probe`")]
    NotJson { path: PathBuf, detail: String },
    #[error("plan file {path} has schema_version {found}, newer than this build understands ({SCHEMA_VERSION}); upgrade batchfit")]
    Newer { path: PathBuf, found: u64 },
    #[error("plan file {path} is not a batchfit plan: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error(transparent)]
    Write(#[from] FileError),
}

impl Plan {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serialises")
    }

    /// Reads and validates a plan file.
    pub fn read(path: &Path) -> Result<Plan, PlanError> {
        let p = path.to_path_buf();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PlanError::Missing(p))
            }
            Err(e) => return Err(PlanError::Unreadable { path: p, source: e }),
        };
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
    fn sample_plan() -> Plan {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "batchfit",
            "probe",
            "--backend",
            "sim",
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=16GiB",
            "--global-batch",
            "1018",
            "--allow-uneven",
        ])
        .unwrap();
        let crate::cli::Command::Probe(args) = cli.command else {
            panic!()
        };
        let cfg = crate::config::validate(&args).unwrap();
        crate::probe::run(&cfg, Path::new("unused"), &mut |_| {})
            .unwrap()
            .plan
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

    proptest! {
        /// Truncated or corrupted plan files give an error (never a panic, never a silently
        /// different plan from a truncated file).
        #[test]
        fn corrupted_plans_never_panic(cut in 0.0f64..1.0, pos in 0.0f64..1.0, byte in 0u8..128) {
            let text = sample_plan().to_json();
            let n = (text.len() as f64 * cut) as usize;
            prop_assert!(Plan::parse(&text[..n], Path::new("p")).is_err());
            let mut bytes = text.clone().into_bytes();
            let i = ((bytes.len() - 1) as f64 * pos) as usize;
            bytes[i] = byte;
            if let Ok(t) = String::from_utf8(bytes) {
                let _ = Plan::parse(&t, Path::new("p"));
            }
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
