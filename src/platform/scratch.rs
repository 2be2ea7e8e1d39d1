//! Scratch directories in the system's temporary directory that outlive no batchfit process for long.
//!
//! A probe of a user's command keeps its trials' reports and their `TMPDIR`s in directories of its
//! own (`batchfit-reports-*`, `batchfit-tmp-*`). They are removed when the probe ends, whatever its
//! end, except when the probe is killed outright (SIGKILL, the OOM killer, a job scheduler's time
//! limit): then nothing of batchfit runs to remove them. So each scratch directory holds an owner
//! file (`.owner`) that its process keeps locked (`flock`, not inherited by trials) for as long as
//! the directory is in use. The kernel lets the lock go with the process, so the next batchfit
//! process that makes a scratch directory ([`make`]) removes every directory of that prefix whose
//! owner file it can lock: directories of a process that is gone. It removes only directories (never
//! what a link points to) owned by its own user and holding an owner file; anything else of that name
//! is left alone.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The file a scratch directory's process keeps locked.
const OWNER: &str = ".owner";

/// A scratch directory, removed when dropped, locked as in use while it lives.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    _owner: File,
}

impl Scratch {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the scratch directories of `prefix` left by processes that are gone, then makes a new
/// one, owned and locked by this process. It is made under another name and renamed to its own
/// once its owner file is locked, so that another process's sweep never finds it unlocked.
pub fn make(prefix: &str) -> std::io::Result<Scratch> {
    let parent = std::env::temp_dir();
    sweep(&parent, prefix);
    let new = tempfile::Builder::new()
        .prefix(".batchfit-new-")
        .tempdir_in(&parent)?;
    let owner = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(new.path().join(OWNER))?;
    if !try_lock(&owner) {
        return Err(std::io::Error::last_os_error());
    }
    let named = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&parent)?;
    let path = named.keep();
    // rename over the empty directory just made for the name (atomic: the name never lacks one)
    std::fs::rename(new.path(), &path).inspect_err(|_| {
        let _ = std::fs::remove_dir(&path);
    })?;
    let _ = new.keep();
    Ok(Scratch {
        path,
        _owner: owner,
    })
}

/// Whether `path` lies in one of batchfit's own directories in the system's temporary directory
/// (a probe's reports, its trials' `TMPDIR`s, the DataLoader watcher): files a job touches there
/// are batchfit's, gone when the probe ends, never what the job depends on.
pub fn is_batchfits(path: &Path) -> bool {
    let temp = std::env::temp_dir();
    path.strip_prefix(&temp).is_ok_and(|rest| {
        rest.components()
            .next()
            .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("batchfit-"))
    })
}

/// Removes the directories named `prefix*` in `parent` whose owner file no process holds, and
/// returns them.
pub fn sweep(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return vec![];
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .filter(|p| abandoned(p, uid))
        .filter(|p| std::fs::remove_dir_all(p).is_ok())
        .collect()
}

/// Whether `dir` is a directory (not a link) of user `uid` whose owner file is a regular file that
/// this process can lock: its process is gone.
fn abandoned(dir: &Path, uid: u32) -> bool {
    let is_own_dir =
        std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_dir() && m.uid() == uid);
    if !is_own_dir {
        return false;
    }
    let owner = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(dir.join(OWNER));
    owner.is_ok_and(|f| f.metadata().is_ok_and(|m| m.is_file()) && try_lock(&f))
}

/// Takes `file`'s exclusive lock without waiting (it goes with the descriptor).
fn try_lock(file: &File) -> bool {
    // SAFETY: flock on a descriptor the caller owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory whose process is gone (its owner file unlocked) is removed by the next
    /// one's sweep; one still in use, a directory without an owner file and a link are left.
    #[test]
    fn a_killed_processs_scratch_directory_is_removed_by_the_next() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        let gone = p.join("batchfit-x-gone");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join(OWNER), "").unwrap();
        std::fs::write(gone.join("trial-1.json"), "{}").unwrap();
        let live = p.join("batchfit-x-live");
        std::fs::create_dir(&live).unwrap();
        let held = File::create(live.join(OWNER)).unwrap();
        // a lock held by another open file description, as another process's would be
        assert!(try_lock(&held));
        let bare = p.join("batchfit-x-bare");
        std::fs::create_dir(&bare).unwrap();
        let link = p.join("batchfit-x-link");
        std::os::unix::fs::symlink(&gone, &link).unwrap();
        let removed = sweep(p, "batchfit-x-");
        assert_eq!(removed, vec![gone.clone()]);
        assert!(!gone.exists() && live.exists() && bare.exists());
        assert!(std::fs::symlink_metadata(&link).is_ok(), "the link is left");
        drop(held);
        assert_eq!(sweep(p, "batchfit-x-"), vec![live]);
    }

    /// A scratch directory in use is never swept (its owner file is locked from before it has its
    /// name), and goes when dropped.
    #[test]
    fn a_scratch_directory_in_use_is_not_swept_and_goes_when_dropped() {
        let s = make("batchfit-scratch-test-").unwrap();
        assert!(s.path().join(OWNER).is_file());
        let swept = sweep(&std::env::temp_dir(), "batchfit-scratch-test-");
        assert!(!swept.contains(&s.path().to_path_buf()), "{swept:?}");
        let path = s.path().to_path_buf();
        drop(s);
        assert!(!path.exists());
    }
}
