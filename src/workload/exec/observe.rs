//! The DataLoader watcher (`--observe on`, the default): whether a job's torch DataLoader really
//! yielded the batch batchfit gave it.
//!
//! A trial that exits 0 under its limit fits, and a job whose `DataLoader(ds, batch_size=B)` draws
//! from a dataset shorter than B (or whose script clamps B, `min(B, len(ds))`, or whose sampler
//! yields less) trains the same few samples at every size: each trial "fits" with flat memory and
//! the plan would recommend a batch the job never trained. The optional helper's report catches
//! that (`samples`), but only in scripts that use it; this catches it in any PyTorch job without a
//! line of it changed.
//!
//! A small Python file ([`SITECUSTOMIZE`]), written into a batchfit-owned folder put first on the
//! trial's `PYTHONPATH`, is imported by every Python process of the trial at start-up as
//! `sitecustomize` (the user's own, further on the path, still runs, once). Only when the job
//! imports torch's DataLoader does it wrap `_BaseDataLoaderIter.__next__`, which the main process
//! (each torchrun rank) runs for every batch, never a worker; each process writes the largest batch
//! it saw to `$BATCHFIT_OBSERVED/<pid>.json` ([`OBSERVED`]). After a trial that exited 0, batchfit
//! reads those files ([`read`]): when some process iterated a DataLoader, every batch's size was
//! read, and the largest over all processes is below the size asked for, the trial is an error
//! ([`short`]): never a fit, never an out-of-memory. `{batch}` is the per-rank micro-batch and each
//! rank's loader yields it, so the largest over the processes is the figure to compare.
//!
//! The same start-up file imports batchfit's helper (as `_batchfit_reads`, from its folder) in every
//! process of a trial that writes a report, so that the files a job reads before it imports the
//! helper itself (a config opened at the top of the script) are in the report's `read_files`, the
//! plan's cache key. It is installed with `--observe off` too; `off` leaves out only the watcher
//! (no `BATCHFIT_OBSERVED`).
//!
//! The helper's report, where the job writes one, is the job's own word and wins. A trial with no
//! file (no DataLoader, a job that is not Python, `python -S`/`-I`, `--observe off`) is judged as
//! before, as is one where some batch's size could not be read (no tensor in it): nothing is
//! refused on evidence the watcher did not have.

use std::path::{Path, PathBuf};

/// The watcher, imported by every Python process of a trial as `sitecustomize`.
pub const SITECUSTOMIZE: &str = include_str!("observe_sitecustomize.py");

/// The environment variable naming the folder the trial's processes write their observations to.
pub const OBSERVED: &str = "BATCHFIT_OBSERVED";

/// At most this many files of one trial are read (a process each).
const MAX_FILES: usize = 4096;

/// A process's file is a few dozen bytes; anything larger is not one.
const MAX_FILE_BYTES: u64 = 4096;

/// What the processes of one trial saw of their DataLoaders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    /// The largest batch (first dimension of its first tensor) of any process.
    pub largest: u64,
    /// Batches yielded, over all processes.
    pub batches: u64,
    /// Batches whose size could not be read (no tensor found, or reading failed).
    pub unknown: u64,
    /// Processes that iterated a DataLoader.
    pub processes: u32,
    /// The largest batch size a DataLoader that batches its samples itself was built with (0: none
    /// seen).
    pub configured: u64,
}

#[derive(serde::Deserialize)]
struct ProcessFile {
    largest: u64,
    batches: u64,
    #[serde(default)]
    unknown: u64,
    #[serde(default)]
    configured: u64,
}

/// The name the watcher imports batchfit's helper under, from its own folder, to record what each
/// process reads from its start (the plan's cache key).
pub const READS_MODULE: &str = "_batchfit_reads.py";

/// Writes the start-up hook (with the watcher) and the helper it imports into `folder` (created):
/// the folder to put first on `PYTHONPATH`.
pub fn install(folder: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(folder)?;
    std::fs::write(folder.join("sitecustomize.py"), SITECUSTOMIZE)?;
    std::fs::write(folder.join(READS_MODULE), super::PYTHON_HELPER)?;
    Ok(folder.to_path_buf())
}

/// `PYTHONPATH` for a trial: the watcher's folder, then the user's own `PYTHONPATH` (if any).
pub fn python_path(site: &Path, users: Option<std::ffi::OsString>) -> std::ffi::OsString {
    let mut p = site.as_os_str().to_owned();
    if let Some(u) = users.filter(|u| !u.is_empty()) {
        p.push(":");
        p.push(u);
    }
    p
}

/// The observations in `dir` (one `<pid>.json` per process that iterated a DataLoader); `None` when
/// no process yielded a batch. Files the job may have put there that are not the watcher's (links,
/// other names, other content) are passed over.
pub fn read(dir: &Path) -> Option<Observed> {
    use crate::platform::files::open_regular;
    use std::io::Read;
    let mut seen = Observed::default();
    for entry in std::fs::read_dir(dir).ok()?.flatten().take(MAX_FILES) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(file) = open_regular(&entry.path(), std::fs::OpenOptions::new().read(true), false)
        else {
            continue;
        };
        let mut text = String::new();
        if file.take(MAX_FILE_BYTES).read_to_string(&mut text).is_err() {
            continue;
        }
        let Ok(p) = serde_json::from_str::<ProcessFile>(&text) else {
            continue;
        };
        if p.batches == 0 {
            continue;
        }
        seen.largest = seen.largest.max(p.largest);
        seen.batches = seen.batches.saturating_add(p.batches);
        seen.unknown = seen.unknown.saturating_add(p.unknown);
        seen.configured = seen.configured.max(p.configured);
        seen.processes += 1;
    }
    (seen.batches > 0).then_some(seen)
}

/// The largest batch the DataLoaders yielded, for the trial's record: `None` when none was read.
pub fn largest(seen: Option<&Observed>) -> Option<u64> {
    seen.filter(|o| o.batches > o.unknown).map(|o| o.largest)
}

/// Why the trial of `batch` did not train it, if the DataLoaders show so: every batch's size read,
/// and the largest below `batch`.
pub fn short(seen: Option<&Observed>, batch: u64) -> Option<String> {
    let o = seen?;
    if o.unknown > 0 || o.batches == 0 || o.largest >= batch {
        return None;
    }
    Some(format!(
        "the job's DataLoader yielded at most {} samples per batch while {batch} was asked ({} \
         batch(es) in {} process(es)): the job did not train {batch}. Likely causes: a dataset \
         shorter than the batch (with drop_last, a dataset that small yields none), a script that \
         clamps its batch size (min(batch, len(dataset))), or a sampler that yields fewer; if the \
         job deliberately trains another size through its DataLoader, probe with --observe off",
        o.largest, o.batches, o.processes
    ))
}

/// Why the trial of `batch` did not train it though the job says it did (its report): a DataLoader
/// built with a batch size of at least `batch` never yielded a batch that large, in any process —
/// its dataset (or the process's shard of it) is shorter than the batch. The report's word is the
/// configured size; the activations the trial measured are those of the shorter batches.
pub fn shorter_than_its_own_batch(seen: Option<&Observed>, batch: u64) -> Option<String> {
    let o = seen?;
    if o.unknown > 0 || o.batches == 0 || o.configured < batch || o.largest >= batch {
        return None;
    }
    Some(format!(
        "the job's DataLoader was built with batch_size {} but yielded at most {} samples per \
         batch ({} batch(es) in {} process(es)): its dataset, or this process's shard of it, is \
         shorter than the batch, so the job never trained {batch} (its memory at {batch} was not \
         measured); give it a dataset at least as long as --max-batch, or probe with --max-batch \
         {}",
        o.configured, o.largest, o.batches, o.processes, o.largest
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// The largest batch over every process decides; a file of another name, a temporary file, a
    /// link and garbage are passed over.
    #[test]
    fn the_largest_batch_over_the_processes_is_judged_against_the_size_asked() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "101.json", r#"{"largest": 48, "batches": 3}"#);
        write(
            d.path(),
            "102.json",
            r#"{"largest": 64, "batches": 5, "unknown": 0}"#,
        );
        write(
            d.path(),
            "103.json.tmp",
            r#"{"largest": 999, "batches": 1}"#,
        );
        write(d.path(), "x.json", r#"{"largest": 999, "batches": 1}"#);
        write(d.path(), "104.json", "not json");
        write(d.path(), "other", r#"{"largest": 4096, "batches": 1}"#);
        std::os::unix::fs::symlink(d.path().join("other"), d.path().join("105.json")).unwrap();
        let seen = read(d.path()).unwrap();
        assert_eq!(
            seen,
            Observed {
                largest: 64,
                batches: 8,
                unknown: 0,
                processes: 2,
                configured: 0
            }
        );
        assert_eq!(largest(Some(&seen)), Some(64));
        let why = short(Some(&seen), 256).unwrap();
        assert!(
            why.contains("at most 64 samples per batch while 256 was asked"),
            "{why}"
        );
        assert!(why.contains("--observe off"), "{why}");
        assert_eq!(short(Some(&seen), 64), None);
        assert_eq!(short(Some(&seen), 32), None);
    }

    /// A loader built with the size asked that yields fewer is short of its own batch; one built
    /// smaller (ready-made batches, or another loader), or one that yielded the size, is not.
    #[test]
    fn a_loader_built_with_the_batch_that_yields_less_is_shorter_than_its_batch() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "9.json",
            r#"{"largest": 300, "batches": 3, "configured": 925}"#,
        );
        let seen = read(d.path()).unwrap();
        assert_eq!(seen.configured, 925);
        let why = shorter_than_its_own_batch(Some(&seen), 925).unwrap();
        assert!(
            why.contains("built with batch_size 925 but yielded at most 300 samples per batch"),
            "{why}"
        );
        assert!(why.contains("--max-batch 300"), "{why}");
        assert_eq!(shorter_than_its_own_batch(Some(&seen), 300), None);
        assert_eq!(shorter_than_its_own_batch(Some(&seen), 1000), None);
        write(d.path(), "9.json", r#"{"largest": 300, "batches": 3}"#);
        assert_eq!(
            shorter_than_its_own_batch(read(d.path()).as_ref(), 925),
            None
        );
    }

    /// No file, files of processes that yielded nothing, or a batch whose size could not be read:
    /// nothing is judged.
    #[test]
    fn without_every_batchs_size_nothing_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path()), None);
        assert_eq!(read(&d.path().join("missing")), None);
        write(d.path(), "7.json", r#"{"largest": 0, "batches": 0}"#);
        assert_eq!(read(d.path()), None);
        write(
            d.path(),
            "8.json",
            r#"{"largest": 16, "batches": 4, "unknown": 1}"#,
        );
        let seen = read(d.path()).unwrap();
        assert_eq!(short(Some(&seen), 256), None);
        assert_eq!(short(None, 256), None);
        write(
            d.path(),
            "8.json",
            r#"{"largest": 0, "batches": 4, "unknown": 4}"#,
        );
        assert_eq!(largest(read(d.path()).as_ref()), None);
    }

    /// The watcher's folder goes first; the user's PYTHONPATH stays after it.
    #[test]
    fn the_watcher_goes_before_the_users_python_path() {
        let site = Path::new("/b/site");
        assert_eq!(python_path(site, None), "/b/site");
        assert_eq!(python_path(site, Some("".into())), "/b/site");
        assert_eq!(
            python_path(site, Some("/u/a:/u/b".into())),
            "/b/site:/u/a:/u/b"
        );
    }
}
