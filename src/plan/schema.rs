//! The v1 plan's types: everything `batchfit probe` writes and everything downstream reads.
//!
//! Types defined here: [`Plan`] and its sections. Types the plan embeds from the layers below it (so
//! that the engine and the plan share one definition):
//! * [`crate::search`]: [`TrialRecord`], [`StopReason`], [`StrategyKind`], [`Purpose`];
//! * [`crate::protocol`]: [`TrialOutcome`] and its measurements, [`Isolation`], [`GpuProcess`];
//! * [`crate::device`]: [`DeviceInfo`], [`DeviceKind`], [`IsolationMode`], [`SimSpec`];
//! * [`super::model`]: [`ModelSpec`] (the model's `config`) with its architecture, input and loss specs;
//! * [`super::capacity`]: [`CapacityModel`] (the measured memory line, `capacity_model`).
//!
//! `tests/data/plan-v1.json` is parsed and re-serialised unchanged by a test: renaming any of these
//! types' fields changes the contract and fails it.

pub use super::capacity::{AccumulationOffset, CapacityModel, CapacityPoint};
pub use super::model::ModelSpec;
pub use crate::device::{sim::SimSpec, DeviceInfo, DeviceKind, IsolationMode, LimitMechanism};
pub use crate::protocol::{
    AllocatorReport, FileStat, FootprintMethod, GpuMeasure, GpuProcess, Isolation,
    PythonEnvironment, ReportedCuda, StepTime, TrialDetails, TrialOutcome, TrialReport,
};
pub use crate::search::{Purpose, StopReason, StrategyKind, TrialRecord};

use crate::accumulate::Split;
use crate::search::SearchConfig;
use serde::{Deserialize, Serialize};

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

impl Status {
    /// The name a plan (and `--format env`) uses: `complete`, `partial`, `nothing-fits`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Complete => "complete",
            Status::Partial => "partial",
            Status::NothingFits => "nothing-fits",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    /// The PyTorch version batchfit's own model trials ran on (the user's torch, found by the torch
    /// runner); absent where no libtorch ran (`--exec`, which runs the user's own, and sim plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libtorch_version: Option<String>,
}

impl Tool {
    /// This batchfit, with no libtorch (see [`Tool::on_torch`]).
    pub fn current() -> Self {
        Tool {
            name: "batchfit".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libtorch_version: None,
        }
    }

    /// This batchfit, running model trials on the torch of `version`.
    pub fn on_torch(version: &str) -> Self {
        Tool {
            libtorch_version: Some(version.into()),
            ..Tool::current()
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

/// What a plan's trials ran (the JSON `model` section): batchfit's own tch model ([`ModelInfo`]), or
/// the user's command ([`ExecInfo`], marked `"kind": "exec"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum WorkloadInfo {
    Model(ModelInfo),
    Exec(ExecInfo),
}

impl<'de> Deserialize<'de> for WorkloadInfo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        if v.get("kind").and_then(|k| k.as_str()) == Some("exec") {
            serde_json::from_value(v)
                .map(WorkloadInfo::Exec)
                .map_err(D::Error::custom)
        } else {
            serde_json::from_value(v)
                .map(WorkloadInfo::Model)
                .map_err(D::Error::custom)
        }
    }
}

impl WorkloadInfo {
    /// A short name for people (`mlp`, `gpt2-small`, `exec: python train.py`).
    pub fn name(&self) -> String {
        match self {
            WorkloadInfo::Model(m) => m.name.clone(),
            WorkloadInfo::Exec(e) => e.name(),
        }
    }
    /// What a plan is for: another fingerprint is another job.
    pub fn fingerprint(&self) -> &str {
        match self {
            WorkloadInfo::Model(m) => &m.fingerprint,
            WorkloadInfo::Exec(e) => &e.fingerprint,
        }
    }
    /// Whether the fingerprint is that of the rest of the section (an edited plan's is not).
    pub fn fingerprint_matches(&self) -> bool {
        match self {
            WorkloadInfo::Model(m) => m.config.fingerprint() == m.fingerprint,
            WorkloadInfo::Exec(e) => {
                exec_fingerprint(&e.argv, &e.fingerprint_files) == e.fingerprint
            }
        }
    }
    /// The tch model, when the trials ran one.
    pub fn model(&self) -> Option<&ModelInfo> {
        match self {
            WorkloadInfo::Model(m) => Some(m),
            WorkloadInfo::Exec(_) => None,
        }
    }
    /// The user's command, when the trials ran one.
    pub fn exec(&self) -> Option<&ExecInfo> {
        match self {
            WorkloadInfo::Exec(e) => Some(e),
            WorkloadInfo::Model(_) => None,
        }
    }
    /// Parameters, where batchfit knows them (its own models).
    pub fn parameter_count(&self) -> Option<u64> {
        self.model().map(|m| m.parameter_count)
    }
}

/// `"kind": "exec"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecKind {
    Exec,
}

/// A file whose content is part of a command's fingerprint (`--fingerprint-file`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    /// As given on the command line.
    pub path: String,
    pub sha256: String,
}

impl FileHash {
    /// Whether the file's content is still the one hashed (an error when it cannot be read).
    pub fn unchanged(&self) -> std::io::Result<bool> {
        Ok(crate::platform::files::sha256(std::path::Path::new(&self.path))? == self.sha256)
    }
}

/// From this size up a file a cached plan depends on (one the command reads, or an argument) is
/// recorded by its [`FileIdentity`] instead of its content's hash: hashing a dataset of gigabytes on
/// every probe and every cache lookup would cost a full read of it each time, while a rewrite,
/// replacement or truncation of such a file still moves its size, modification time or inode.
pub const STAT_ONLY_BYTES: u64 = 64 << 20;

/// A large file known by its size, modification time, inode and device (see [`STAT_ONLY_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub inode: u64,
    pub device: u64,
}

impl FileIdentity {
    fn of(path: &str, m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            path: path.to_string(),
            size: m.len(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
            inode: m.ino(),
            device: m.dev(),
        }
    }
}

/// A file a cached `--exec` plan depends on: by its content's hash below [`STAT_ONLY_BYTES`]
/// (`{"path", "sha256"}`), by its [`FileIdentity`] from there up (`{"path", "size", "mtime_ns",
/// "inode", "device"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileRecord {
    Hash(FileHash),
    Identity(FileIdentity),
}

impl FileRecord {
    /// The record of the regular file at `path` now.
    pub fn of(path: &str) -> std::io::Result<Self> {
        let p = std::path::Path::new(path);
        let m = std::fs::metadata(p)?;
        if m.is_file() && m.len() >= STAT_ONLY_BYTES {
            return Ok(FileRecord::Identity(FileIdentity::of(path, &m)));
        }
        let sha256 = if m.is_dir() {
            listing_sha256(p)?
        } else {
            crate::platform::files::sha256(p)?
        };
        Ok(FileRecord::Hash(FileHash {
            path: path.to_string(),
            sha256,
        }))
    }

    pub fn path(&self) -> &str {
        match self {
            FileRecord::Hash(h) => &h.path,
            FileRecord::Identity(i) => &i.path,
        }
    }

    /// Whether the file is still the one recorded (an error when it cannot be read). A large file
    /// is never read: its stat decides; a file hashed when it was small is changed once it is large.
    pub fn unchanged(&self) -> std::io::Result<bool> {
        let m = std::fs::metadata(self.path())?;
        match self {
            FileRecord::Hash(h) if m.is_dir() => {
                Ok(listing_sha256(std::path::Path::new(&h.path))? == h.sha256)
            }
            FileRecord::Identity(i) => Ok(FileIdentity::of(&i.path, &m) == *i),
            FileRecord::Hash(_) if m.len() >= STAT_ONLY_BYTES => Ok(false),
            FileRecord::Hash(h) => h.unchanged(),
        }
    }
}

/// SHA-256 of a directory's listing (its entries' names, sorted, one per line): what a job that
/// lists a folder (`os.listdir`, `glob.glob`: the shards of a dataset) depends on; a file added,
/// removed or renamed there changes it.
fn listing_sha256(dir: &std::path::Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut names: Vec<Vec<u8>> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().into_encoded_bytes()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    let mut h = Sha256::new();
    h.update(b"listing\n");
    for n in names {
        h.update(&n);
        h.update(b"\n");
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The user's training command (`batchfit probe --exec -- CMD ARG…`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecInfo {
    pub kind: ExecKind,
    /// The command as given, placeholders (`{batch}`, `{steps}`, `{accumulation}`) included.
    pub argv: Vec<String>,
    /// SHA-256 of the argv and of each fingerprint file's path and content.
    pub fingerprint: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprint_files: Vec<FileHash>,
    /// The environment variables batchfit sets in every trial (nothing else of the user's
    /// environment is changed); the memory limit is in `limit_mechanism`.
    pub environment: Vec<String>,
    /// `--oom-pattern`: extra out-of-memory signatures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_patterns: Vec<String>,
    /// `--threads`: `OMP_NUM_THREADS` of every trial (absent: the user's environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Files of the command recorded without being asked (part of the cache key, not of
    /// `fingerprint`): every argument that is a regular file (the program, its script, a config
    /// file in any folder and of any extension), as given; hashed, or from [`STAT_ONLY_BYTES`] up
    /// known by their stat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auto_fingerprint_files: Vec<FileRecord>,
    /// A point of `--sweep` (`{seq}` or `{image-size}`, already substituted in `argv`): the
    /// environment variable every trial also gets it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_point: Option<ExecSweepPoint>,
    /// SHA-256 of the probe's environment less the variables that do not change a job
    /// ([`IGNORED_ENVIRONMENT`]): part of the cache key. The values are not
    /// stored (they may hold secrets).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub environment_sha256: String,
    /// The files the command read, by its trials' reports (the helper's `read_files`), with their
    /// hashes (from [`STAT_ONLY_BYTES`] up: their stat) when the plan was made: a cached plan is
    /// used only while every one is unchanged.
    /// Absent when no trial wrote a report that says (the job does not use the helper): then the
    /// cache is not used for it unless `--fingerprint-file` names what it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_files: Option<Vec<FileRecord>>,
    /// The installed packages the command ran with, by its trials' reports (the helper's
    /// `python_environment`), summed up ([`PlanEnvironment`]): a cached plan is used only while
    /// they are the same. Absent when no trial's report says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_environment: Option<PlanEnvironment>,
}

/// `model.python_environment` of an `--exec` plan. The per-file stats of a job's installed
/// packages run to well over a thousand entries for `import torch` (most of the plan's bytes), so a
/// plan keeps only their [`EnvironmentSummary`] and the cache keeps the list itself beside the
/// cached plan; plans written before that keep the list inline, and are read as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum PlanEnvironment {
    Summary(EnvironmentSummary),
    Listed(PythonEnvironment),
}

// by hand: serde's untagged enums cannot read the list's `i128` modification times
impl<'de> Deserialize<'de> for PlanEnvironment {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let read = if v.get("record_sha256").is_some() {
            serde_json::from_value(v).map(PlanEnvironment::Summary)
        } else {
            serde_json::from_value(v).map(PlanEnvironment::Listed)
        };
        read.map_err(serde::de::Error::custom)
    }
}

/// What a plan says of its job's installed packages: their site dirs, how many distributions and
/// imported files, and the digest of the full record (the helper's [`PythonEnvironment`], stored
/// as compact JSON beside the cached plan) that a cache lookup checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentSummary {
    pub site_dirs: Vec<String>,
    pub distribution_count: u64,
    pub file_count: u64,
    /// SHA-256 (hex) of the record's compact JSON, [`EnvironmentSummary::record`].
    pub record_sha256: String,
}

impl EnvironmentSummary {
    /// The summary of `env`, and the record (its compact JSON) whose digest it holds.
    pub fn of(env: &PythonEnvironment) -> (Self, Vec<u8>) {
        let record = Self::record(env);
        let summary = EnvironmentSummary {
            site_dirs: env.site_dirs.clone(),
            distribution_count: env.distributions.len() as u64,
            file_count: env.files.len() as u64,
            record_sha256: sha256_hex(&record),
        };
        (summary, record)
    }

    /// The record of `env` as the cache stores it: its compact JSON.
    pub fn record(env: &PythonEnvironment) -> Vec<u8> {
        serde_json::to_vec(env).expect("serialises")
    }

    /// `bytes` as the record this summary was made from: `None` unless their digest is this one and
    /// they read as a [`PythonEnvironment`].
    pub fn read_record(&self, bytes: &[u8]) -> Option<PythonEnvironment> {
        (sha256_hex(bytes) == self.record_sha256)
            .then(|| serde_json::from_slice(bytes).ok())
            .flatten()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The point of a `--sweep` an exec plan was probed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSweepPoint {
    /// `BATCHFIT_SEQ` or `BATCHFIT_IMAGE_SIZE`.
    pub variable: String,
    pub value: u64,
}

/// The files of `argv` that go into the cache key (see [`ExecInfo::auto_fingerprint_files`]), by
/// [`FileRecord::of`]; files that cannot be read are skipped.
pub fn auto_fingerprint(argv: &[String]) -> Vec<FileRecord> {
    let mut v: Vec<FileRecord> = vec![];
    for a in argv {
        let p = std::path::Path::new(a);
        if !std::fs::metadata(p).is_ok_and(|m| m.is_file()) || v.iter().any(|f| f.path() == a) {
            continue;
        }
        if let Ok(record) = FileRecord::of(a) {
            v.push(record);
        }
    }
    v
}

impl ExecInfo {
    pub fn name(&self) -> String {
        let base = |a: &String| {
            std::path::Path::new(a)
                .file_name()
                .map_or(a.clone(), |n| n.to_string_lossy().into_owned())
        };
        let words: Vec<String> = self.argv.iter().take(2).map(base).collect();
        let more = if self.argv.len() > 2 { " …" } else { "" };
        format!("exec: {}{more}", words.join(" "))
    }
}

/// The environment variables that do not change what a command does, left out of the cache key:
/// the shell's and terminal's state, the login session, per-job ids of a scheduler, and where the
/// cache is. Every other variable of the probe's environment is in the key (by a hash: values may be
/// secrets), so `WIDTH_MULT=3` read by the job is another probe. A name ending in `*` is a prefix.
pub const IGNORED_ENVIRONMENT: [&str; 32] = [
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "TERM",
    "TERMCAP",
    "TERM_PROGRAM*",
    "COLORTERM",
    "COLUMNS",
    "LINES",
    "DISPLAY",
    "WINDOWID",
    "SSH_*",
    "XDG_SESSION_*",
    "XDG_VTNR",
    "TMUX*",
    "STY",
    "PS1",
    "PS2",
    "PROMPT_COMMAND",
    "LS_COLORS",
    "MAIL",
    "HISTFILE",
    "HISTSIZE",
    "LESSOPEN",
    "LESSCLOSE",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_TASK_PID",
    "PBS_JOBID",
    "LSB_JOBID",
    "BATCHFIT_CACHE_DIR",
];

/// Whether `name` is one of [`IGNORED_ENVIRONMENT`].
fn ignored_variable(name: &str) -> bool {
    IGNORED_ENVIRONMENT
        .iter()
        .any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *p,
        })
}

/// SHA-256 of this process's environment (each variable's name and value, sorted) less
/// [`IGNORED_ENVIRONMENT`]: what an `--exec` probe's trials inherit and may read.
pub fn environment_sha256() -> String {
    let env: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = std::env::vars_os()
        .filter(|(k, _)| !ignored_variable(&k.to_string_lossy()))
        .map(|(k, v)| {
            use std::os::unix::ffi::OsStrExt;
            (k.as_bytes().to_vec(), v.as_bytes().to_vec())
        })
        .collect();
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (k, v) in &env {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k);
        h.update((v.len() as u64).to_le_bytes());
        h.update(v);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The fingerprint of a command: SHA-256 of the canonical JSON of its argv and its files' hashes.
pub fn exec_fingerprint(argv: &[String], files: &[FileHash]) -> String {
    let json = serde_json::to_string(&(argv, files)).expect("serialises");
    sha256_hex(json.as_bytes())
}

/// Process set-up the trainer must reproduce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Runtime {
    pub threads: u32,
    pub seed: i64,
    pub malloc_mmap_threshold: i32,
    pub malloc_arena_max: i32,
    /// The rest of the trial processes' set-up that changes their memory (absent in plans written
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSetup>,
}

/// How the trial processes were started, beyond threads and malloc: what `batchfit-train
/// --memory-limit plan` applies (by starting itself again this way) so that the bound the plan
/// proves is about the same kind of process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSetup {
    /// `RLIMIT_STACK` (soft) of the trial processes, the default stack of every thread they start
    /// (thread stacks count as data under `RLIMIT_DATA`); null when unlimited.
    pub stack_limit_bytes: Option<u64>,
    /// The variables of the memory-relevant environment (OpenMP and BLAS threads and stack sizes,
    /// malloc tunables, `LD_PRELOAD`, …) that the trials had, with their values; one not listed was
    /// unset.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
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
    /// `--throughput-tolerance` of the best measured (see [`super::throughput`]); absent otherwise
    /// and in plans written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_micro_batch: Option<u64>,
    /// Measured samples/s of `fastest_micro_batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_samples_per_second: Option<f64>,
    /// For a command (`--exec`) with accumulation > 1: whether anything shows the job ran that
    /// accumulation (`{accumulation}` in its arguments, or its report). `false`: the split was proven
    /// at accumulation 1 only (a plan warning says so; `--format env` exports
    /// `BATCHFIT_ACCUMULATION_PROVEN=0`). Absent: accumulation 1, batchfit's own model, older plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation_proven: Option<bool>,
}

/// `n` and the noun, singular or plural: `1 trial`, `3 trials`.
pub fn count(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// The micro-batches of one step as a product or a sum of products, grouped by size:
/// `4096 × 2`, or for an uneven split `1430 × 4 + 1429 × 3`.
pub fn describe_micro_batches(micro_batches: &[u64]) -> String {
    let mut groups: Vec<(u64, usize)> = vec![];
    for &m in micro_batches {
        match groups.iter_mut().find(|(size, _)| *size == m) {
            Some(g) => g.1 += 1,
            None => groups.push((m, 1)),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.0));
    groups
        .iter()
        .map(|(m, n)| format!("{m} × {n}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

impl Recommendation {
    /// `micro-batch 4096 × accumulation 2 × world size 1 = global batch 8192`, or for an uneven
    /// split `micro-batches 1430 × 4 + 1429 × 3 (uneven) per rank × world size 1 = global batch 10007`:
    /// a line that is true as written.
    pub fn describe(&self) -> String {
        if self.uneven || self.micro_batches.iter().any(|&m| m != self.micro_batch) {
            format!(
                "micro-batches {} (uneven: {} per step) per rank × world size {} = global batch {}",
                describe_micro_batches(&self.micro_batches),
                count(self.micro_batches.len(), "micro-batch", "micro-batches"),
                self.world_size,
                self.global_batch
            )
        } else {
            format!(
                "micro-batch {} × accumulation {} × world size {} = global batch {}",
                self.micro_batch, self.accumulation, self.world_size, self.global_batch
            )
        }
    }

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
            accumulation_proven: None,
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
    pub model: WorkloadInfo,
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
    /// Why the last `batchfit verify` of this plan did not confirm it (a size that did not fit here,
    /// or the verification was interrupted); absent otherwise. With it `--format env` exports
    /// `BATCHFIT_STATUS=failed-verification`, so a job script's status check refuses the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_failure: Option<String>,
    /// The plans a merged plan was made from (`batchfit merge`); absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<PlanSource>,
    /// The trials that ran on another device than `device`, as index ranges `[from, to)` of
    /// `trials`: a `batchfit verify` that verified the plan elsewhere than its earlier trials ran
    /// makes those the one range; one that failed elsewhere adds its own. Empty: every trial ran on
    /// `device`. ([`Plan::device_trials`].)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials_elsewhere: Vec<(usize, usize)>,
    /// The simulated device's curve (sim backend only), so `batchfit verify` can rebuild it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_spec: Option<SimSpec>,
    /// The GPU(s) as NVML saw them at the start, and how the footprint was measured (cuda only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSection>,
    /// Why `reserve_bytes` is what it is when batchfit chose it (DDP's gradient buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_note: Option<String>,
    /// How each trial's memory was limited: `rlimit-data` (per process), `cgroup-v1`/`cgroup-v2`
    /// (the whole process tree), `cuda-fraction`, `simulated`. Absent in plans made before it was
    /// recorded (those used `rlimit-data` on cpu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mechanism: Option<LimitMechanism>,
    /// The share by which the trials' limit (`limit_bytes`) was set below the budget's limit
    /// (`budget_bytes` less `reserve_bytes` and the margin) because the limit mechanism's boundary is
    /// noisy: a memory cgroup charges page cache, so a size near the limit fits some runs and not
    /// others. The recommendation is proven under `limit_bytes`, which leaves this share of the
    /// budget's limit as headroom. Absent: none (`rlimit-data`, cuda, sim; plans made before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_band: Option<f64>,
    /// The guard band in bytes, where it is a measured byte count (the boundary's noise: glibc's
    /// dynamic mmap threshold moves a command's peak in steps of 4–13 MB): `batchfit predict`
    /// takes these bytes (at most a quarter of each limit) off every limit it predicts for, not
    /// `guard_band`'s share of it. Absent in plans whose band was a share (made before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_band_bytes: Option<u64>,
    /// The memory curve the trials measured, as a line (`batchfit predict`); absent in plans written
    /// before it existed and when no trial fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_model: Option<CapacityModel>,
    /// `--sweep`: the largest micro-batch proven at each point (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
}

impl Plan {
    /// Whether this plan's sizes are proven on the machine it is used on: a probe plan (no
    /// `sources`) is proven where it was made unless a `batchfit verify` of it failed; a merged plan
    /// only once `batchfit verify` marked it `verified: true` (absent reads as not verified, so a
    /// plan edited by hand or by another tool cannot pass as proven).
    pub fn is_verified(&self) -> bool {
        match self.verified {
            Some(v) => v,
            None => self.sources.is_empty(),
        }
    }
    /// The trials that ran on the device the plan describes (`device`), outside `trials_elsewhere`:
    /// after a `batchfit verify` on another device, only verify's own. What the plan says of this
    /// device rests on these.
    pub fn device_trials(&self) -> Vec<&TrialRecord> {
        let elsewhere = |i: usize| self.trials_elsewhere.iter().any(|&(a, b)| a <= i && i < b);
        (self.trials.iter().enumerate())
            .filter(|&(i, _)| !elsewhere(i))
            .map(|(_, t)| t)
            .collect()
    }
    /// Whether a `batchfit verify` of this plan failed: it says why, or it is a probe plan (no
    /// `sources`, proven where it was made) marked `verified: false`, which only a failed verify does.
    /// An interruption is no verdict: a plan that recorded one as its failure
    /// ([`INTERRUPTED_VERIFICATION`]) is not failed.
    pub fn failed_verification(&self) -> bool {
        match self.verification_failure.as_deref() {
            Some(INTERRUPTED_VERIFICATION) => false,
            Some(_) => true,
            None => self.verified == Some(false) && self.sources.is_empty(),
        }
    }
}

/// The `verification_failure` that marks an interrupted verify in the plans that carry one: no
/// verdict, so not a failed verification (an interrupted verify leaves a plan's state as it was).
pub const INTERRUPTED_VERIFICATION: &str = "the verification was interrupted";

/// `--sweep PARAM=V1,V2,…`: one probe per point, each proven on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// `seq-len` (tokens per sample) or `image-size` (pixels per side).
    pub parameter: String,
    /// The point this plan's model, trials and recommendation are of.
    pub plan_point: u64,
    pub points: Vec<SweepPoint>,
}

/// One point of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The parameter's value.
    pub value: u64,
    pub status: Status,
    pub stop_reason: StopReason,
    /// The largest micro-batch proven to fit at this point (absent unless `status` is complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fitting_batch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failing_batch: Option<u64>,
    /// Tokens of one sample: the sequence length; for `image-size`, the ViT's patches or a CNN's
    /// pixels (height × width).
    pub tokens_per_sample: u64,
    /// `max_fitting_batch × tokens_per_sample`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_micro_batch: Option<u64>,
    /// Measured peak of `max_fitting_batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// How many trials this point took.
    pub trials: usize,
    /// Seconds inside this point's trials.
    pub seconds: f64,
    pub model_fingerprint: String,
    /// What the points before it predicted for this one (the size its search started near); never
    /// evidence: only this point's own trials prove its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_batch: Option<u64>,
    /// This point's memory line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_model: Option<CapacityModel>,
    /// Every trial of this point (the plan's own `trials` are those of `plan_point`).
    pub trial_records: Vec<TrialRecord>,
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
    pub other_processes: Vec<GpuProcess>,
    pub other_processes_bytes: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF` of the trials as the user set it (batchfit adds
    /// `per_process_memory_fraction` = limit / CUDA's total to each trial's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// How the recommended size's footprint was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footprint_method: Option<FootprintMethod>,
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
    pub device_kind: DeviceKind,
    pub device_name: String,
    pub max_fitting_batch: u64,
    /// The smallest micro-batch that ran out of memory *with gradient accumulation* on that source
    /// (its split was recomputed below it): the merged split stays below it. Absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smallest_failing_with_accumulation: Option<u64>,
}

/// The search flags as recorded (a copy of [`SearchConfig`] with the time limit in seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSettings {
    pub strategy: StrategyKind,
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
    pub isolation: Option<IsolationMode>,
    /// `--allow-retries`: trials that needed allocator retries counted as fits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_retries: bool,
    /// `--tolerance`: the proof's relative tolerance (absent in plans written before it existed:
    /// exact). With it, `recommendation.max_fitting_batch` fits and `first_failing_batch` is at most
    /// `max(multiple_of, ⌊tolerance × max_fitting_batch⌋)` above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// Outcomes near the boundary that disagreed (a size fit at or above one that ran out of memory),
    /// and the band the answer stayed below (docs/how-it-works.md, "A noisy boundary"); absent when
    /// the outcomes never disagreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noisy_boundary: Option<crate::search::noise::NoisyBoundary>,
    /// Trials run at once in each round of the search (identical GPUs, `--parallel N`, or the
    /// proof's trials under `--parallel auto` on the cpu, exploration then alone); each
    /// trial's `round` says which round it ran in. Absent: one trial at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
    /// Why several GPUs were not searched together in rounds (they differ), when they were not:
    /// each then ran its own search, as `gpu.per_gpu` shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_fallback: Option<String>,
    /// `--repeats`: fresh re-runs of the answer after its confirmation (it fit `1 + repeats` times);
    /// absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u32,
    /// The job's measured noise: the widest spread of the footprints of fresh runs at one size
    /// (docs/how-it-works.md, "The answer's own noise"); absent when no size ran twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_spread_bytes: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SearchSettings {
    /// The settings alone, without what the search measured (the noisy boundary, the spread): what
    /// two probes must share for one's plan to answer the other.
    pub fn flags(&self) -> SearchSettings {
        SearchSettings {
            noisy_boundary: None,
            noise_spread_bytes: None,
            parallel: None,
            parallel_fallback: None,
            ..self.clone()
        }
    }

    pub fn of(
        c: &SearchConfig,
        trial_timeout_seconds: f64,
        isolation: Option<IsolationMode>,
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
            tolerance: Some(c.tolerance),
            noisy_boundary: None,
            parallel: None,
            parallel_fallback: None,
            repeats: c.repeats,
            noise_spread_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument that is a regular file is hashed into the key, whatever its extension and
    /// folder (`../conf/model.cfg`); a folder, a missing path and a plain word are not files.
    #[test]
    fn every_regular_file_argument_is_fingerprinted_whatever_its_extension_and_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("conf");
        std::fs::create_dir(&conf).unwrap();
        for name in ["model.cfg", "settings", "train.py"] {
            std::fs::write(conf.join(name), name).unwrap();
        }
        let arg = |name: &str| conf.join(name).display().to_string();
        let argv = [
            arg("train.py"),
            "{batch}".to_string(),
            arg("model.cfg"),
            conf.display().to_string(),
            arg("missing.toml"),
            arg("settings"),
            arg("model.cfg"),
        ];
        let paths: Vec<String> = auto_fingerprint(&argv)
            .iter()
            .map(|f| f.path().to_string())
            .collect();
        assert_eq!(
            paths,
            [arg("train.py"), arg("model.cfg"), arg("settings")],
            "{paths:?}"
        );
    }

    /// A file of at least [`STAT_ONLY_BYTES`] is recorded by its stat and checked by it, never
    /// read (a sparse file of that size reads as zeros: its hash would still match after a
    /// rewrite that keeps it sparse, its stat does not); its modification time moved, its size
    /// changed or the file replaced by another of the same size and time, it is changed. A file
    /// hashed while small is changed once it is large, without being read.
    #[test]
    fn a_large_file_is_recorded_and_checked_by_its_stat() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data.bin");
        let name = path.display().to_string();
        let sparse =
            |p: &std::path::Path, len: u64| std::fs::File::create(p).unwrap().set_len(len).unwrap();
        sparse(&path, STAT_ONLY_BYTES);
        let record = FileRecord::of(&name).unwrap();
        let FileRecord::Identity(id) = &record else {
            panic!("hashed: {record:?}")
        };
        assert_eq!(id.size, STAT_ONLY_BYTES);
        assert!(record.unchanged().unwrap());
        let at = |ns: i64| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64);
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(at(id.mtime_ns + 1_000_000)).unwrap();
        assert!(!record.unchanged().unwrap(), "a moved modification time");
        file.set_modified(at(id.mtime_ns)).unwrap();
        assert!(record.unchanged().unwrap());
        let other = tmp.path().join("other.bin");
        sparse(&other, STAT_ONLY_BYTES);
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(at(id.mtime_ns))
            .unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!record.unchanged().unwrap(), "a file replaced by another");
        let small = tmp.path().join("small.bin");
        std::fs::write(&small, b"abc").unwrap();
        let hashed = FileRecord::of(&small.display().to_string()).unwrap();
        assert!(matches!(hashed, FileRecord::Hash(_)), "{hashed:?}");
        assert!(hashed.unchanged().unwrap());
        sparse(&small, STAT_ONLY_BYTES);
        assert!(!hashed.unchanged().unwrap(), "a small file grown large");
        std::fs::remove_file(&path).unwrap();
        assert!(record.unchanged().is_err(), "a file gone");
    }
}
