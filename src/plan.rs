//! The plan: batchfit's contract with everything downstream (`batchfit-train`, job scripts, DeepSpeed
//! configs). Versioned (`schema_version`), documented in `docs/plan.md`, validated on read, written
//! atomically (temp file in the same directory + rename), and `partial` until the proof is complete.

use crate::accumulate::Split;
use crate::backend::DeviceInfo;
use crate::models::ModelSpec;
use crate::search::{SearchConfig, StopReason, TrialRecord};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The proof is complete (or a stated cap was reached): the recommendation can be used.
    Complete,
    /// The search stopped early (interrupted, out of trials or time, errors): not a result.
    Partial,
    /// Even the smallest size ran out of memory.
    NothingFits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    pub libtorch_version: String,
}

impl Tool {
    pub fn current() -> Self {
        Tool {
            name: "batchfit".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libtorch_version: option_env!("BATCHFIT_LIBTORCH_VERSION")
                .unwrap_or("unknown-at-build")
                .into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub parameter_count: u64,
    pub input_spec: String,
    pub dtype: String,
    pub optimizer: String,
    /// Everything the trainer needs to rebuild the model.
    pub config: ModelSpec,
    /// SHA-256 of the canonical JSON of `config`.
    pub fingerprint: String,
}

impl ModelInfo {
    pub fn of(spec: &ModelSpec) -> Self {
        ModelInfo {
            name: spec.name(),
            parameter_count: spec.parameter_count(),
            input_spec: spec.input_spec(),
            dtype: spec.precision.dtype().into(),
            optimizer: spec.optimizer.as_str().into(),
            config: spec.clone(),
            fingerprint: spec.fingerprint(),
        }
    }
}

/// Process set-up the trainer must reproduce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Runtime {
    pub threads: u32,
    pub seed: i64,
    pub malloc_mmap_threshold: i32,
    pub malloc_arena_max: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    pub micro_batch: u64,
    pub accumulation: u64,
    pub global_batch: u64,
    pub world_size: u64,
    /// The largest size proven to fit.
    pub max_fitting_batch: u64,
    /// The smallest size proven not to fit (absent when a cap was reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failing_batch: Option<u64>,
    /// Measured footprint of the recommended micro-batch (the quantity the limit acts on).
    pub peak_bytes: u64,
    pub samples_per_second: f64,
    #[serde(default)]
    pub uneven: bool,
    pub micro_batches: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub better_global_batches: Vec<u64>,
    /// The smallest tested size, below `micro_batch`, whose measured samples/s is within
    /// `--throughput-tolerance` of the best measured (see [`crate::throughput`]); absent otherwise
    /// and in plans written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_micro_batch: Option<u64>,
    /// Measured samples/s of `fastest_micro_batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_samples_per_second: Option<f64>,
}

impl Recommendation {
    pub fn from_split(
        s: &Split,
        max_fitting: u64,
        first_failing: Option<u64>,
        rec: &TrialRecord,
    ) -> Self {
        let step = rec.outcome.step_seconds().unwrap_or(0.0);
        Recommendation {
            micro_batch: s.micro_batch,
            accumulation: s.accumulation,
            global_batch: s.global_batch,
            world_size: s.world_size,
            max_fitting_batch: max_fitting,
            first_failing_batch: first_failing,
            peak_bytes: rec.outcome.peak_bytes().unwrap_or(0),
            samples_per_second: if step > 0.0 {
                rec.batch as f64 / step
            } else {
                0.0
            },
            uneven: s.uneven,
            micro_batches: s.micro_batches.clone(),
            warning: s.warning.clone(),
            better_global_batches: s.better_global_batches.clone(),
            fastest_micro_batch: None,
            fastest_samples_per_second: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub schema_version: u32,
    pub status: Status,
    /// Seconds since the Unix epoch.
    pub created_unix: u64,
    pub tool: Tool,
    pub device: DeviceInfo,
    pub model: ModelInfo,
    pub runtime: Runtime,
    pub budget_bytes: u64,
    pub reserve_bytes: u64,
    pub margin: f64,
    pub limit_bytes: u64,
    pub search: SearchSettings,
    pub recommendation: Option<Recommendation>,
    pub stop_reason: StopReason,
    pub stop_detail: String,
    pub trials: Vec<TrialRecord>,
    #[serde(default)]
    pub warnings: Vec<String>,
    /// `false` for a plan merged from other machines' plans (`batchfit merge`) until `batchfit verify`
    /// confirms it here; `true` once verified; absent in probe plans (proven where they were made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// The plans a merged plan was made from (`batchfit merge`); absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<PlanSource>,
    /// The simulated device's curve (sim backend only), so `batchfit verify` can rebuild it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_spec: Option<crate::backend::sim::SimSpec>,
    /// The GPU(s) as NVML saw them at the start, and how the footprint was measured (cuda only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSection>,
    /// Why `reserve_bytes` is what it is when batchfit chose it (DDP's gradient buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_note: Option<String>,
}

/// The cuda backend's view of the card(s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSection {
    /// NVML index of the GPU the plan's numbers are from (the one with the smallest answer when
    /// several were probed).
    pub index: u32,
    pub uuid: String,
    pub driver: String,
    /// Other processes on the card at the start, and what they held: not available to this job.
    pub other_processes: Vec<crate::gpu::GpuProcess>,
    pub other_processes_bytes: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF` of the trials as the user set it (batchfit adds
    /// `per_process_memory_fraction` = limit / CUDA's total to each trial's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// How the recommended size's footprint was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footprint_method: Option<crate::backend::FootprintMethod>,
    /// One entry per probed GPU (`--gpus`), each with its own largest fitting size and its check of
    /// the plan's micro-batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_gpu: Vec<PerGpu>,
    /// `--compare-alloc-conf`: the same probe with `expandable_segments:True`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf_comparison: Option<AllocConfComparison>,
    /// Scripted GPUs (`BATCHFIT_FAKE_GPUS`, tests only): not a measurement.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fake: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerGpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub free_bytes_at_start: u64,
    pub max_fitting_batch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failing_batch: Option<u64>,
    pub trials: usize,
    /// The plan's micro-batch(es) with its accumulation ran on this GPU and fit.
    pub confirmed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocConfComparison {
    pub alloc_conf: String,
    pub max_fitting_batch: Option<u64>,
    pub peak_bytes: Option<u64>,
    pub trials: usize,
    /// Largest fitting size with the comparison setting minus the plan's (positive: it fits more).
    pub difference: Option<i64>,
}

/// One input of `batchfit merge`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanSource {
    /// The plan file as given on the command line.
    pub path: String,
    pub device_kind: String,
    pub device_name: String,
    pub max_fitting_batch: u64,
}

/// The search flags as recorded (a copy of [`SearchConfig`] with the time limit in seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSettings {
    pub strategy: crate::search::StrategyKind,
    pub steps: u32,
    pub confirm_steps: u32,
    pub min_batch: u64,
    pub max_batch: u64,
    pub multiple_of: u64,
    pub max_trials: Option<u32>,
    pub time_limit_seconds: Option<f64>,
    pub trial_timeout_seconds: f64,
    /// `process` or `hybrid` (cpu); absent for sim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::backend::cpu::IsolationMode>,
    /// `--allow-retries`: trials that needed allocator retries counted as fits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_retries: bool,
}

impl SearchSettings {
    pub fn of(
        c: &SearchConfig,
        trial_timeout_seconds: f64,
        isolation: Option<crate::backend::cpu::IsolationMode>,
    ) -> Self {
        SearchSettings {
            strategy: c.strategy,
            steps: c.steps,
            confirm_steps: c.confirm_steps,
            min_batch: c.min_batch,
            max_batch: c.max_batch,
            multiple_of: c.multiple_of,
            max_trials: c.max_trials,
            time_limit_seconds: c.time_limit.map(|d| d.as_secs_f64()),
            trial_timeout_seconds,
            isolation,
            allow_retries: c.allow_retries,
        }
    }
}

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
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
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

    /// Writes the plan atomically: a temporary file in the same directory, then a rename.
    pub fn write_atomic(&self, path: &Path) -> Result<(), PlanError> {
        write_atomic(path, self.to_json().as_bytes())
    }
}

/// Writes `bytes` to `path` atomically (temp file in the same directory + rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PlanError> {
    let err = |source| PlanError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".batchfit-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    tmp.write_all(b"\n").map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
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

/// Checks, before any trial runs, that `out` can be written: not a directory, and its directory exists
/// and accepts a new file.
pub fn check_writable(out: &Path) -> Result<(), String> {
    if out.is_dir() {
        return Err(format!(
            "--out {} is a directory; give a file path such as {}/plan.json",
            out.display(),
            out.display()
        ));
    }
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "the directory of --out {} does not exist; create it first",
            out.display()
        ));
    }
    tempfile::Builder::new()
        .prefix(".batchfit-check-")
        .tempfile_in(&dir)
        .map(drop)
        .map_err(|e| format!("cannot write in {} for --out: {e}", dir.display()))
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
