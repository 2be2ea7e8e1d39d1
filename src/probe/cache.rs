//! The plan cache: a completed plan is stored under `${XDG_CACHE_HOME:-~/.cache}/batchfit/plans/`
//! (or `$BATCHFIT_CACHE_DIR`), keyed by a hash over everything that changes the answer, so a repeated
//! `batchfit probe` under the same conditions answers at once.
//!
//! Only that `plans` folder is ever touched: the libtorch folder next to it
//! (`batchfit/libtorch-2.11.0`) is never read, listed or removed by any cache command.

use crate::config::{BackendChoice, ProbeConfig};
use crate::device::sim::SimSpec;
use crate::plan::schema::PythonEnvironment;
use crate::plan::{Plan, PlanError, SearchSettings, Status, Tool};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Overrides the cache directory (the `plans` folder itself).
pub const DIR_ENV: &str = "BATCHFIT_CACHE_DIR";

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("cannot find a cache directory: set BATCHFIT_CACHE_DIR, XDG_CACHE_HOME or HOME")]
    NoDir,
    #[error(
        "cache entry {path} is {what}, not a file batchfit wrote: not written through (remove it \
         to cache again)"
    )]
    NotAFile { path: PathBuf, what: &'static str },
    // not `source`: `{e:#}` at the binary's edge would print the OS error twice
    #[error("cache directory {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// How `batchfit probe` uses the cache.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// Return a cached plan when the key matches (off with `--refresh` and `--no-cache`).
    pub read: bool,
    /// Store a completed plan (off with `--no-cache`).
    pub write: bool,
}

/// `$BATCHFIT_CACHE_DIR`, else `${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/plans`.
pub fn default_dir() -> Result<PathBuf, CacheError> {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = non_empty(DIR_ENV) {
        return Ok(PathBuf::from(d));
    }
    let base = match non_empty("XDG_CACHE_HOME") {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(non_empty("HOME").ok_or(CacheError::NoDir)?).join(".cache"),
    };
    Ok(base.join("batchfit").join("plans"))
}

/// Everything that changes the answer of a probe. Hashed (SHA-256 of its compact JSON) into the key.
#[derive(Serialize)]
struct KeyInput<'a> {
    key_version: u32,
    tool: &'a Tool,
    device_kind: crate::device::DeviceKind,
    device_name: &'a str,
    device_total_bytes: u64,
    /// Free bytes at start, rounded down to 1/16 of the total; only when the budget follows from it
    /// (no `--memory-budget`), else it would only cause misses.
    #[serde(skip_serializing_if = "Option::is_none")]
    free_bucket: Option<u64>,
    sim_spec: Option<&'a SimSpec>,
    model_fingerprint: &'a str,
    budget_bytes: u64,
    reserve_bytes: u64,
    margin: f64,
    search: &'a SearchSettings,
    threads: u32,
    seed: i64,
    global: Option<(u64, u64)>,
    world_size: u64,
    allow_uneven: bool,
    throughput_tolerance: f64,
    /// cuda: the card's identity and the allocator settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_uuid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_driver: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    alloc_conf: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    compare_alloc_conf: bool,
    /// The trial processes' stack limit and memory-relevant environment (threads' stacks are data).
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<&'a crate::plan::ProcessSetup>,
    /// How the trials' memory is limited (RLIMIT_DATA or a cgroup).
    #[serde(skip_serializing_if = "Option::is_none")]
    limit_mechanism: Option<crate::device::LimitMechanism>,
    /// `--exec`: what the command's trials depend on beyond its argv and `--fingerprint-file`s.
    #[serde(skip_serializing_if = "Option::is_none")]
    exec: Option<ExecKey<'a>>,
}

pub use crate::plan::schema::{environment_sha256, IGNORED_ENVIRONMENT};

/// What an `--exec` probe's answer depends on beyond the command's fingerprint.
#[derive(Serialize)]
struct ExecKey<'a> {
    /// The working directory the command runs in.
    cwd: String,
    /// [`environment_sha256`] of the probe.
    environment_sha256: &'a str,
    /// The auto-fingerprinted files' records (the command's script, its configs).
    files: &'a [crate::plan::schema::FileRecord],
    oom_patterns: &'a [String],
    /// `--observe off`: its trials above a short DataLoader fit, where the watcher's are errors
    /// (absent when on, so the keys of plans made before the watcher stay the same).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    observe_off: bool,
}

fn exec_key(info: &crate::plan::schema::ExecInfo, observe_off: bool) -> ExecKey<'_> {
    ExecKey {
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        environment_sha256: &info.environment_sha256,
        files: &info.auto_fingerprint_files,
        oom_patterns: &info.oom_patterns,
        observe_off,
    }
}

/// The files the trials' reports say the command read, with their hashes now (a large file: its
/// stat, [`crate::plan::schema::FileRecord::of`]; a file that cannot be read, and batchfit's own
/// files in its temporary directories, are left out); `None`
/// when no trial's report says (the job does not use the helper).
pub fn read_files(
    trials: &[crate::search::TrialRecord],
) -> Option<Vec<crate::plan::schema::FileRecord>> {
    let mut paths: Option<std::collections::BTreeSet<&str>> = None;
    for t in trials {
        let Some(d) = t.details.as_ref() else {
            continue;
        };
        for r in d.report.iter().chain(&d.rank_reports) {
            if let Some(files) = &r.read_files {
                paths
                    .get_or_insert_with(Default::default)
                    .extend(files.iter().map(String::as_str));
            }
        }
    }
    Some(
        paths?
            .into_iter()
            .filter(|p| !crate::platform::scratch::is_batchfits(std::path::Path::new(p)))
            .filter_map(|p| crate::plan::schema::FileRecord::of(p).ok())
            .collect(),
    )
}

/// The installed packages the trials' reports say the command ran with (their site dirs,
/// distributions and imported files, merged over the trials); `None` when no report says.
pub fn python_environment(
    trials: &[crate::search::TrialRecord],
) -> Option<crate::plan::schema::PythonEnvironment> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut site_dirs: Vec<String> = vec![];
    let mut distributions = BTreeSet::new();
    let mut files = BTreeMap::new();
    let mut any = false;
    let reports = trials
        .iter()
        .filter_map(|t| t.details.as_ref())
        .flat_map(|d| d.report.iter().chain(&d.rank_reports));
    for env in reports.filter_map(|r| r.python_environment.as_ref()) {
        any = true;
        for d in &env.site_dirs {
            if !site_dirs.contains(d) {
                site_dirs.push(d.clone());
            }
        }
        distributions.extend(env.distributions.iter().cloned());
        for f in &env.files {
            files.entry(f.path.clone()).or_insert_with(|| f.clone());
        }
    }
    any.then(|| crate::plan::schema::PythonEnvironment {
        site_dirs,
        distributions: distributions.into_iter().collect(),
        files: files.into_values().collect(),
    })
}

/// The `*.dist-info` / `*.egg-info` entries of `site_dirs` now (absolute, sorted); a folder that
/// cannot be listed has none.
fn distributions_now(site_dirs: &[String]) -> Vec<String> {
    let mut v: Vec<String> = site_dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".dist-info") || p.ends_with(".egg-info"))
        .collect();
    v.sort();
    v
}

/// Why the installed packages a cached plan was made with are not those of now, if they are not: a
/// distribution installed, removed or upgraded in one of its site dirs, or a file the job imported
/// from them changed (size or modification time) or gone.
fn stale_environment(env: &crate::plan::schema::PythonEnvironment) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let now = distributions_now(&env.site_dirs);
    if now != env.distributions {
        let added = now.iter().find(|d| !env.distributions.contains(d));
        let removed = env.distributions.iter().find(|d| !now.contains(d));
        let what = match (added, removed) {
            (Some(a), _) => format!("{a} is new"),
            (None, Some(r)) => format!("{r} is gone"),
            (None, None) => "their order".to_string(),
        };
        return Some(format!(
            "the installed packages changed since the plan was made ({what})"
        ));
    }
    env.files.iter().find_map(|f| {
        let why = match std::fs::metadata(&f.path) {
            Ok(m) => {
                let mtime_ns = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
                if m.len() == f.size && mtime_ns == f.mtime_ns {
                    return None;
                }
                "changed since the plan was made".to_string()
            }
            Err(e) => format!("cannot be read now ({e})"),
        };
        Some(format!(
            "{} {why} (an installed package the command imports)",
            f.path
        ))
    })
}

/// Why a cached `--exec` plan does not hold for the command as it is now, if it does not: a file
/// named by `--fingerprint-file` or a file the command read changed or is gone (both are checked:
/// naming some files never stops the check of the others), its installed packages changed (their
/// record is `environment`, [`environment_record`], for a plan that keeps only their summary), or it
/// reported nothing of what it reads (or, by the helper, nothing of its installed packages) and no
/// `--fingerprint-file` was given.
fn stale_exec(
    plan: &Plan,
    environment: impl FnOnce() -> Result<PythonEnvironment, String>,
) -> Option<String> {
    use crate::plan::schema::PlanEnvironment;
    let info = plan.model.exec()?;
    if info.read_files.is_none() && info.fingerprint_files.is_empty() {
        return Some(NO_HELPER_DATA.to_string());
    }
    let why = match &info.python_environment {
        Some(PlanEnvironment::Listed(env)) => stale_environment(env),
        Some(PlanEnvironment::Summary(_)) => match environment() {
            Ok(env) => stale_environment(&env),
            Err(why) => Some(why),
        },
        None if info.read_files.is_some() => Some(NO_ENVIRONMENT_DATA.to_string()),
        None => None,
    };
    if why.is_some() {
        return why;
    }
    let verdict = |path: &str, unchanged: std::io::Result<bool>, why: &str| match unchanged {
        Ok(true) => None,
        Ok(false) => Some(format!("{path} changed since the plan was made ({why})")),
        Err(e) => Some(format!("{path} ({why}) cannot be read now ({e})")),
    };
    let named = info
        .fingerprint_files
        .iter()
        .find_map(|f| verdict(&f.path, f.unchanged(), "--fingerprint-file"));
    named.or_else(|| {
        info.read_files
            .iter()
            .flatten()
            .find_map(|f| verdict(f.path(), f.unchanged(), "the command reads it"))
    })
}

/// The record of the installed packages stored beside the cache entry `key` (see
/// [`crate::plan::schema::PlanEnvironment`]), when it is there and is the one `plan` summed up.
fn environment_record(plan: &Plan, dir: &Path, key: &str) -> Result<PythonEnvironment, String> {
    use crate::plan::schema::PlanEnvironment;
    let path = environment_path(dir, key);
    let Some(Some(PlanEnvironment::Summary(summary))) =
        plan.model.exec().map(|e| &e.python_environment)
    else {
        return Err("it has no summary of its installed packages".to_string());
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        format!(
            "the record of its installed packages, {}, cannot be read ({e})",
            path.display()
        )
    })?;
    summary.read_record(&bytes).ok_or_else(|| {
        format!(
            "the record of its installed packages, {}, is not the one the plan was made with \
             (edited, or written by another probe)",
            path.display()
        )
    })
}

/// Why an `--exec` plan of a job without the helper's report is never answered from the cache.
pub const NO_HELPER_DATA: &str = "cache not used: the command reports no helper data, so batchfit \
     cannot see which files it reads; add --fingerprint-file FILE... or use the helper";

/// Why an `--exec` plan whose helper reported the files the job read but not its installed
/// packages (a copy of the helper older than this batchfit) is never answered from the cache.
pub const NO_ENVIRONMENT_DATA: &str = "cache not used: the command's helper reports no installed \
     packages (an older batchfit_trial.py?), so batchfit cannot see whether they changed; update it \
     with `batchfit python-helper > batchfit_trial.py`";

/// The cache key of a probe: `skeleton` is the plan before any trial (device, model, budget, search
/// flags, runtime), `cfg` adds the split and advice settings.
pub fn key(skeleton: &Plan, cfg: &ProbeConfig) -> String {
    let d = &skeleton.device;
    let sim = match &cfg.backend {
        BackendChoice::Sim(s) => Some(s),
        _ => None,
    };
    let input = KeyInput {
        key_version: 2,
        tool: &skeleton.tool,
        device_kind: d.kind,
        device_name: &d.name,
        device_total_bytes: d.total_bytes,
        free_bucket: cfg
            .budget
            .is_none()
            .then(|| d.free_bytes_at_start / (d.total_bytes / 16).max(1)),
        sim_spec: sim,
        model_fingerprint: skeleton.model.fingerprint(),
        budget_bytes: skeleton.budget_bytes,
        reserve_bytes: skeleton.reserve_bytes,
        margin: skeleton.margin,
        // (how many trials ran at once says nothing of the answer)
        search: &skeleton.search.flags(),
        threads: skeleton.runtime.threads,
        seed: skeleton.runtime.seed,
        global: cfg.global,
        world_size: cfg.world_size,
        allow_uneven: cfg.allow_uneven,
        throughput_tolerance: cfg.throughput_tolerance,
        gpu_uuid: skeleton.gpu.as_ref().map(|g| g.uuid.as_str()),
        gpu_driver: skeleton.gpu.as_ref().map(|g| g.driver.as_str()),
        alloc_conf: skeleton.gpu.as_ref().and_then(|g| g.alloc_conf.as_deref()),
        compare_alloc_conf: cfg.compare_alloc_conf,
        process: skeleton.runtime.process.as_ref(),
        limit_mechanism: skeleton.limit_mechanism,
        exec: cfg
            .workload
            .command_info()
            .map(|e| exec_key(e, !cfg.workload.observes_its_dataloaders())),
    };
    let json = serde_json::to_string(&input).expect("key serialises");
    let digest = Sha256::digest(json.as_bytes());
    digest[..10].iter().map(|b| format!("{b:02x}")).collect()
}

/// One key for a probe of several GPUs, from each GPU's key (in `--gpus` order).
pub fn combine(keys: &[String]) -> String {
    let digest = Sha256::digest(keys.join(",").as_bytes());
    digest[..10].iter().map(|b| format!("{b:02x}")).collect()
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.json"))
}

/// The name ending of the file beside a cache entry that holds its job's installed packages.
const ENVIRONMENT_SUFFIX: &str = ".environment.json";

/// Where the record of the installed packages of the entry `key` is stored.
fn environment_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}{ENVIRONMENT_SUFFIX}"))
}

/// What the cache holds for a key.
#[derive(Debug)]
pub enum Lookup {
    Hit(Box<Plan>),
    /// No entry.
    Miss,
    /// An entry that is not used, and why (unreadable, contradicting itself, its trials not backing
    /// its recommendation, or made under other conditions than `skeleton`'s): a miss, to be said.
    Rejected(String),
}

/// The cached complete plan for `key`, if any. An entry is used only if it reads as a plan (the
/// check of every reader, [`crate::plan::check::check`]: its invariants and trials behind its
/// recommendation), its trials back it with the confirmation's steps and its bracket matches its
/// stop reason ([`crate::plan::check::evidence`]), and, given the `skeleton` of this probe, it was made on the
/// same device with the same model, limit, search flags and runtime; anything else is
/// [`Lookup::Rejected`] (the probe runs, and overwrites the entry).
pub fn lookup(dir: &Path, key: &str, skeleton: Option<&Plan>) -> Lookup {
    let path = entry_path(dir, key);
    let plan = match Plan::read(&path) {
        Ok(p) => p,
        Err(PlanError::Missing(_)) => return Lookup::Miss,
        Err(e) => return Lookup::Rejected(e.to_string()),
    };
    let why = if plan.status != Status::Complete {
        Some(format!(
            "it is not a complete plan (status {})",
            plan.status
        ))
    } else if let Err(e) = crate::plan::check::evidence(&plan) {
        Some(format!("its trials do not back its recommendation: {e}"))
    } else if let Some(why) = stale_exec(&plan, || environment_record(&plan, dir, key)) {
        Some(why)
    } else {
        skeleton.and_then(|s| other_conditions(&plan, s))
    };
    match why {
        None => Lookup::Hit(Box::new(plan)),
        Some(why) => Lookup::Rejected(format!("{}: {why}", path.display())),
    }
}

/// What differs between a cached plan and this probe's skeleton, if anything the answer depends on.
fn other_conditions(plan: &Plan, skeleton: &Plan) -> Option<String> {
    let checks = [
        (
            plan.device.kind == skeleton.device.kind
                && plan.device.name == skeleton.device.name
                && plan.device.total_bytes == skeleton.device.total_bytes,
            "device",
        ),
        (
            plan.model.fingerprint() == skeleton.model.fingerprint()
                && plan.model.fingerprint_matches(),
            "model",
        ),
        (
            plan.budget_bytes == skeleton.budget_bytes
                && plan.reserve_bytes == skeleton.reserve_bytes
                && plan.limit_bytes == skeleton.limit_bytes,
            "budget, reserve or limit",
        ),
        (
            plan.search.flags() == skeleton.search.flags(),
            "search settings",
        ),
        (plan.runtime == skeleton.runtime, "runtime"),
        (plan.sim_spec == skeleton.sim_spec, "simulated device"),
        (
            plan.tool.libtorch_version == skeleton.tool.libtorch_version,
            "PyTorch version",
        ),
    ];
    checks
        .iter()
        .find(|(same, _)| !same)
        .map(|(_, what)| format!("its {what} differs from this probe's (edited?)"))
}

/// Stores a complete plan under `key` (atomically), after `environment`, the record of its job's
/// installed packages ([`crate::plan::schema::EnvironmentSummary::record`]), when it has one.
/// Other plans are not stored.
pub fn store(
    dir: &Path,
    key: &str,
    plan: &Plan,
    environment: Option<&[u8]>,
) -> Result<(), CacheError> {
    if plan.status != Status::Complete {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|error| CacheError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    if let Some(record) = environment {
        let path = environment_path(dir, key);
        regular_or_absent(&path)?;
        crate::platform::files::write_atomic(&path, record).map_err(PlanError::from)?;
    }
    let entry = entry_path(dir, key);
    regular_or_absent(&entry)?;
    plan.write_atomic(&entry)?;
    Ok(())
}

/// An entry is batchfit's own regular file: anything else at its name (a symbolic link planted
/// in a shared cache, pointing at a file of root's) is not written through.
fn regular_or_absent(path: &Path) -> Result<(), CacheError> {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if m.file_type().is_file() {
        return Ok(());
    }
    Err(CacheError::NotAFile {
        path: path.to_path_buf(),
        what: if m.file_type().is_symlink() {
            "a symbolic link"
        } else if m.is_dir() {
            "a directory"
        } else {
            crate::platform::files::kind_of(&m.file_type())
        },
    })
}

/// One cached plan, for `batchfit cache list`.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub key: String,
    pub model: String,
    pub device: String,
    pub micro_batch: u64,
    pub created_unix: u64,
}

/// The cache entries (`KEY.json` files of the cache folder), oldest first. A missing folder is empty.
pub fn list(dir: &Path) -> Result<Vec<Entry>, CacheError> {
    let mut v = vec![];
    for path in entry_files(dir)?.into_iter().filter(|p| !is_record(p)) {
        let Ok(plan) = Plan::read(&path) else {
            continue;
        };
        let key = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        v.push(Entry {
            key,
            model: match plan.model.parameter_count() {
                Some(n) => format!("{} ({n} params)", plan.model.name()),
                None => plan.model.name(),
            },
            device: format!("{} {}", plan.device.kind, plan.device.name),
            micro_batch: plan.recommendation.as_ref().map_or(0, |r| r.micro_batch),
            created_unix: plan.created_unix,
        });
    }
    v.sort_by(|a, b| (a.created_unix, &a.key).cmp(&(b.created_unix, &b.key)));
    Ok(v)
}

/// Removes the cache entries (with the records of installed packages beside them, and leftover
/// temporary files) from the cache folder only; returns how many entries were removed (a record
/// is not counted). Nothing outside `dir` is touched, and no folder is removed.
pub fn clear(dir: &Path) -> Result<usize, CacheError> {
    let mut n = 0;
    for path in entry_files(dir)? {
        std::fs::remove_file(&path).map_err(|error| CacheError::Io {
            path: path.clone(),
            error,
        })?;
        n += usize::from(!is_record(&path));
    }
    Ok(n)
}

/// Removes the entries that hold `plan` (the same probe: created at the same time, for the same
/// model, with the same micro-batches), with their records; returns how many. A plan that failed
/// its verification is no answer for the next probe of the same job.
pub fn forget(dir: &Path, plan: &Plan) -> Result<usize, CacheError> {
    let same = |p: &Plan| {
        p.created_unix == plan.created_unix
            && p.model.fingerprint() == plan.model.fingerprint()
            && p.recommendation.as_ref().map(|r| &r.micro_batches)
                == plan.recommendation.as_ref().map(|r| &r.micro_batches)
    };
    let mut n = 0;
    for path in entry_files(dir)?.into_iter().filter(|p| !is_record(p)) {
        if !Plan::read(&path).is_ok_and(|p| same(&p)) {
            continue;
        }
        let key = path.file_stem().unwrap_or_default().to_string_lossy();
        let record = environment_path(dir, &key);
        for f in [&path, &record] {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(CacheError::Io {
                        path: f.to_path_buf(),
                        error: e,
                    })
                }
                _ => {}
            }
        }
        n += 1;
    }
    Ok(n)
}

/// Whether `path` is the record of installed packages beside an entry, not an entry.
fn is_record(path: &Path) -> bool {
    path.to_string_lossy().ends_with(ENVIRONMENT_SUFFIX)
}

/// Plain files named `*.json` (entries and the records beside them) or `.batchfit-*.tmp`
/// (interrupted writes) directly in `dir`.
fn entry_files(dir: &Path) -> Result<Vec<PathBuf>, CacheError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(error) => {
            return Err(CacheError::Io {
                path: dir.to_path_buf(),
                error,
            })
        }
    };
    let mut v = vec![];
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_file = e.file_type().map(|t| t.is_file()).unwrap_or(false);
        if is_file
            && (name.ends_with(".json")
                || (name.starts_with(".batchfit-") && name.ends_with(".tmp")))
        {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

/// `YYYY-MM-DD HH:MM` (UTC) of a Unix time.
pub fn format_date(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // civil_from_days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        (secs % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &[&str]) -> ProbeConfig {
        let mut args = vec!["--backend", "cpu"];
        args.extend(extra);
        crate::probe::config_of(&args)
    }

    /// With an explicit --memory-budget the free memory at start does not change the answer, so it
    /// is not in the key (it caused misses); without one the budget follows from it, so it is.
    #[test]
    fn free_memory_is_in_the_key_only_without_a_budget() {
        let plan =
            Plan::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan-v1-cpu.json"))
                .unwrap();
        let mut less_free = plan.clone();
        less_free.device.free_bytes_at_start /= 2;
        let explicit = cfg(&["--memory-budget", "2GiB"]);
        assert_eq!(key(&plan, &explicit), key(&less_free, &explicit));
        let default = cfg(&[]);
        assert_ne!(key(&plan, &default), key(&less_free, &default));
    }

    /// How many trials ran at once (the cores and the memory free decide it under `--parallel
    /// auto`) does not change the answer, so it is not in the key: a plan probed side by side
    /// answers a probe run one trial at a time, and the other way round.
    #[test]
    fn trials_at_once_are_not_in_the_key() {
        let plan =
            Plan::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan-v1-cpu.json"))
                .unwrap();
        let mut two = plan.clone();
        two.search.parallel = Some(2);
        let c = cfg(&["--memory-budget", "2GiB"]);
        assert_eq!(key(&plan, &c), key(&two, &c));
    }

    /// A plan probed with `--observe off` (whose trials above a short DataLoader fit) is not the
    /// answer of a probe that watches the DataLoaders, and the watcher's default leaves the key as
    /// it was.
    #[test]
    fn observe_off_is_another_cache_key() {
        let plan =
            Plan::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan-v1-cpu.json"))
                .unwrap();
        let exec = |more: &[&str]| {
            let mut v = vec!["--memory-budget", "2GiB"];
            v.extend(more);
            v.extend(["--exec", "--", "/bin/sh", "-c", "true", "{batch}"]);
            key(&plan, &cfg(&v))
        };
        assert_eq!(exec(&[]), exec(&["--observe", "on"]));
        assert_ne!(exec(&[]), exec(&["--observe", "off"]));
        let input = |c: &ProbeConfig| {
            serde_json::to_string(&exec_key(c.workload.command_info().unwrap(), false)).unwrap()
        };
        let on = cfg(&["--exec", "--", "/bin/sh", "-c", "true", "{batch}"]);
        assert!(!input(&on).contains("observe_off"), "{}", input(&on));
    }

    /// A cached `--exec` plan is stale when a file named by `--fingerprint-file` changed, though
    /// every file the job read is unchanged, and when a file the job read changed, though every named
    /// file is unchanged: naming files adds to the check of the files read, never replaces it.
    #[test]
    fn named_and_read_files_are_both_checked_in_a_cached_exec_plan() {
        use crate::plan::schema::{FileHash, FileRecord, PlanEnvironment};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let hashed = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            FileHash {
                path: p.display().to_string(),
                sha256: crate::platform::files::sha256(&p).unwrap(),
            }
        };
        let mut plan = exec_plan(PlanEnvironment::Listed(Default::default()));
        let crate::plan::WorkloadInfo::Exec(exec) = &mut plan.model else {
            unreachable!("exec_plan makes an exec plan")
        };
        exec.fingerprint_files = vec![hashed("notes.txt", "v1")];
        exec.read_files = Some(vec![FileRecord::Hash(hashed("model.py", "WIDTH = 1"))]);
        let stale = |plan: &Plan| stale_exec(plan, || Err("no record".to_string()));
        assert_eq!(stale(&plan), None);
        std::fs::write(dir.join("model.py"), "WIDTH = 2").unwrap();
        let why = stale(&plan).expect("a read file changed");
        assert!(
            why.contains("model.py changed since the plan was made"),
            "{why}"
        );
        std::fs::write(dir.join("model.py"), "WIDTH = 1").unwrap();
        std::fs::write(dir.join("notes.txt"), "v2").unwrap();
        let why = stale(&plan).expect("a named file changed");
        assert!(
            why.contains("notes.txt changed since the plan was made"),
            "{why}"
        );
    }

    /// The installed packages of a cached plan are checked by their site dirs' distributions and
    /// the stat of the files the job imported: a distribution installed (or upgraded: a new
    /// version's folder) and a file rewritten are each noticed, the same stat is not.
    #[test]
    fn a_changed_distribution_or_imported_package_file_makes_the_environment_stale() {
        use crate::plan::schema::{FileStat, PythonEnvironment};
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site-packages");
        std::fs::create_dir_all(site.join("pkg-1.0.dist-info")).unwrap();
        let file = site.join("pkg.py");
        std::fs::write(&file, "WIDTH = 1").unwrap();
        let stat = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            FileStat {
                path: p.display().to_string(),
                size: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            }
        };
        let env = PythonEnvironment {
            site_dirs: vec![site.display().to_string()],
            distributions: vec![site.join("pkg-1.0.dist-info").display().to_string()],
            files: vec![stat(&file)],
        };
        assert_eq!(stale_environment(&env), None);
        std::fs::create_dir(site.join("other-2.0.dist-info")).unwrap();
        let why = stale_environment(&env).expect("a distribution was installed");
        assert!(why.contains("other-2.0.dist-info is new"), "{why}");
        std::fs::remove_dir(site.join("other-2.0.dist-info")).unwrap();
        let mut older = env.clone();
        older.files[0].mtime_ns -= 1;
        let why = stale_environment(&older).expect("the file's modification time moved");
        assert!(
            why.contains("pkg.py changed since the plan was made"),
            "{why}"
        );
        std::fs::remove_file(&file).unwrap();
        let why = stale_environment(&env).expect("the file is gone");
        assert!(why.contains("pkg.py cannot be read now"), "{why}");
    }

    /// The cpu plan of `tests/data` as an `--exec` plan whose job read nothing and ran with
    /// `environment`.
    fn exec_plan(environment: crate::plan::schema::PlanEnvironment) -> Plan {
        use crate::plan::schema::{ExecInfo, ExecKind};
        let mut plan =
            Plan::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan-v1-cpu.json"))
                .unwrap();
        plan.model = crate::plan::WorkloadInfo::Exec(ExecInfo {
            kind: ExecKind::Exec,
            argv: vec!["python".into(), "job.py".into()],
            fingerprint: String::new(),
            fingerprint_files: vec![],
            environment: vec![],
            oom_patterns: vec![],
            threads: None,
            auto_fingerprint_files: vec![],
            sweep_point: None,
            environment_sha256: String::new(),
            read_files: Some(vec![]),
            python_environment: Some(environment),
        });
        plan
    }

    /// A site dir in `dir` with one distribution and one imported file, and its environment.
    fn site_with_one_file(dir: &Path) -> PythonEnvironment {
        use crate::plan::schema::FileStat;
        use std::os::unix::fs::MetadataExt;
        let site = dir.join("site-packages");
        std::fs::create_dir_all(site.join("pkg-1.0.dist-info")).unwrap();
        let file = site.join("pkg.py");
        std::fs::write(&file, "WIDTH = 1").unwrap();
        let m = std::fs::metadata(&file).unwrap();
        PythonEnvironment {
            site_dirs: vec![site.display().to_string()],
            distributions: vec![site.join("pkg-1.0.dist-info").display().to_string()],
            files: vec![FileStat {
                path: file.display().to_string(),
                size: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            }],
        }
    }

    /// A cached plan that keeps only the summary of its installed packages is checked against the
    /// list stored beside it: unchanged, it is answered; the list altered or gone, it is not; an
    /// imported file changed, the message names that file as before.
    #[test]
    fn a_summarised_environment_is_checked_against_the_record_beside_the_entry() {
        use crate::plan::schema::{EnvironmentSummary, PlanEnvironment};
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("plans");
        let env = site_with_one_file(tmp.path());
        let (summary, record) = EnvironmentSummary::of(&env);
        assert_eq!((summary.distribution_count, summary.file_count), (1, 1));
        let plan = exec_plan(PlanEnvironment::Summary(summary));
        assert!(!plan.to_json().contains("pkg.py"), "{}", plan.to_json());
        store(&cache, "k", &plan, Some(&record)).unwrap();
        assert!(matches!(lookup(&cache, "k", None), Lookup::Hit(_)));
        let path = environment_path(&cache, "k");
        let mut other = env.clone();
        other.files[0].size += 1;
        std::fs::write(&path, EnvironmentSummary::record(&other)).unwrap();
        let Lookup::Rejected(why) = lookup(&cache, "k", None) else {
            panic!("an altered record was used")
        };
        assert!(
            why.contains("is not the one the plan was made with"),
            "{why}"
        );
        std::fs::remove_file(&path).unwrap();
        let Lookup::Rejected(why) = lookup(&cache, "k", None) else {
            panic!("a missing record was not noticed")
        };
        assert!(why.contains("cannot be read"), "{why}");
        std::fs::write(&path, &record).unwrap();
        std::fs::write(&env.files[0].path, "WIDTH = 22").unwrap();
        let Lookup::Rejected(why) = lookup(&cache, "k", None) else {
            panic!("a changed package file was not noticed")
        };
        assert!(
            why.contains("pkg.py changed since the plan was made"),
            "{why}"
        );
        assert_eq!(list(&cache).unwrap().len(), 1);
        assert_eq!(clear(&cache).unwrap(), 1);
        assert!(!path.exists());
    }

    /// A plan written while the installed packages were listed inline still reads, round-trips
    /// unchanged and is checked by that list.
    #[test]
    fn an_environment_listed_inline_in_an_older_plan_is_still_read_and_checked() {
        use crate::plan::schema::PlanEnvironment;
        let tmp = tempfile::tempdir().unwrap();
        let env = site_with_one_file(tmp.path());
        let json = plan_json_with(&env);
        let plan = Plan::parse(&json, Path::new("old.json")).unwrap();
        let exec = plan.model.exec().unwrap();
        assert_eq!(
            exec.python_environment,
            Some(PlanEnvironment::Listed(env.clone()))
        );
        let again: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
        assert_eq!(
            again,
            serde_json::from_str::<serde_json::Value>(&json).unwrap()
        );
        let no_record = || Err("no record".to_string());
        assert_eq!(stale_exec(&plan, no_record), None);
        std::fs::write(&env.files[0].path, "WIDTH = 22").unwrap();
        let why = stale_exec(&plan, no_record).expect("a changed package file");
        assert!(
            why.contains("pkg.py changed since the plan was made"),
            "{why}"
        );
    }

    /// The JSON of [`exec_plan`] with `env` listed inline, as plans kept it before the summary.
    fn plan_json_with(env: &PythonEnvironment) -> String {
        use crate::plan::schema::PlanEnvironment;
        let plan = exec_plan(PlanEnvironment::Listed(Default::default()));
        let mut v: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
        v["model"]["python_environment"] = serde_json::to_value(env).unwrap();
        serde_json::to_string_pretty(&v).unwrap()
    }

    #[test]
    fn dates() {
        assert_eq!(format_date(0), "1970-01-01 00:00");
        assert_eq!(format_date(68_214_840), "1972-02-29 12:34");
    }
}
