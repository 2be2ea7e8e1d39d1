//! One writer per place: an exclusive advisory lock (`flock`) on a lock file beside what a probe
//! writes, held until the process exits, so that a second batchfit process that would write the
//! same files is refused before it runs anything. Used for a probe's `--logs` directory
//! (`DIR/.batchfit-logs.lock`: trial logs are named by the trial's number) and its `--out` plan
//! (`.NAME.batchfit-lock` beside it: the plan and its partial sibling).
//!
//! * The lock file is opened with [`open_regular`] without following links: a symbolic link, a
//!   directory, a FIFO or a device at its name is refused, never written through or replaced.
//! * It holds the holder's pid (one line), so that a refusal can say who holds it.
//! * A lock file this process created is removed by [`release_all`] when the process exits (the
//!   `batchfit` binary calls it after every command, whatever its end: success, an error, an
//!   interruption that wrote a partial plan), while its name is still the file this process
//!   locked; a lock file that was there before is left as it was.
//! * A process killed outright (SIGKILL, the OOM killer) removes nothing, but the kernel lets its
//!   `flock` go with it: the file it leaves, its dead pid inside, refuses no one (only a live holder
//!   does), and the next process that takes the lock removes it at exit as its own.
//! * A holder removes its lock file just before it lets the lock go, so another process may lock a
//!   file that no longer has a name: after `flock` the name is checked to still be the locked file,
//!   and the open is tried again otherwise.
//!
//! Within one process a lock nests: holding the same lock file again succeeds (every backend of a
//! probe, the GPUs of a multi-GPU probe, the points of a sweep). The descriptor is not inherited by
//! trials (`O_CLOEXEC`), so a trial's leftover process never keeps a lock.

use super::files::{open_regular, OpenError};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Why a lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it (`pid`: what the lock file says, when it says it).
    Held { lock: PathBuf, pid: Option<u32> },
    /// Something other than a regular file is at the lock file's name (a link, a directory, …).
    NotRegular { lock: PathBuf, what: &'static str },
    /// The lock file cannot be made, opened or locked.
    Io {
        lock: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { lock, pid } => match pid {
                Some(pid) => write!(f, "process {pid} holds {}", lock.display()),
                None => write!(f, "another process holds {}", lock.display()),
            },
            LockError::NotRegular { lock, what } => write!(
                f,
                "its lock file {} is {what}, not a regular file; batchfit neither follows nor \
                 replaces it: remove it",
                lock.display()
            ),
            LockError::Io { lock, error } => {
                write!(f, "cannot use its lock file {}: {error}", lock.display())
            }
        }
    }
}

struct Held {
    path: PathBuf,
    file: File,
    /// This process created the lock file (and so removes it).
    made: bool,
}

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    static HELD: OnceLock<Mutex<Vec<Held>>> = OnceLock::new();
    HELD.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether `path` names the file `file` is open on.
fn names(path: &Path, file: &File) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// How many times a lock file that its holder removed meanwhile is opened again.
const ATTEMPTS: usize = 16;

/// Takes the exclusive lock on the lock file `lock` (made when missing) for the rest of this
/// process, or says why not. The caller gives a path whose directory is canonical, so that two
/// names of one directory are one lock.
pub fn hold(lock: &Path) -> Result<(), LockError> {
    let mut held = held();
    if held.iter().any(|h| h.path == lock) {
        return Ok(());
    }
    let io = |error| LockError::Io {
        lock: lock.to_path_buf(),
        error,
    };
    let refused = |e: OpenError| match e {
        OpenError::Missing(e) | OpenError::Io(e) => io(e),
        OpenError::Link(_) => LockError::NotRegular {
            lock: lock.to_path_buf(),
            what: "a symbolic link",
        },
        OpenError::Directory => LockError::NotRegular {
            lock: lock.to_path_buf(),
            what: "a directory",
        },
        OpenError::NotRegular(what) => LockError::NotRegular {
            lock: lock.to_path_buf(),
            what,
        },
    };
    for _ in 0..ATTEMPTS {
        let mut create = std::fs::OpenOptions::new();
        create.read(true).write(true).create_new(true).mode(0o644);
        let (mut file, made) = match open_regular(lock, &mut create, false) {
            Ok(f) => (f, true),
            // (O_EXCL: also a symbolic link at the name, which the open below refuses)
            Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match open_regular(
                    lock,
                    std::fs::OpenOptions::new().read(true).write(true),
                    false,
                ) {
                    Ok(f) => (f, false),
                    // its holder removed it between the two opens
                    Err(OpenError::Missing(_)) => continue,
                    Err(e) => return Err(refused(e)),
                }
            }
            Err(e) => return Err(refused(e)),
        };
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(e));
            }
            let mut text = String::new();
            let _ = (&file).take(64).read_to_string(&mut text);
            return Err(LockError::Held {
                lock: lock.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        if !names(lock, &file) {
            // locked a file its holder removed (or replaced) on its way out: not the lock any more
            continue;
        }
        if file.metadata().map_err(io)?.nlink() > 1 {
            // another name of the same file: writing the pid would change that file too
            return Err(LockError::NotRegular {
                lock: lock.to_path_buf(),
                what: "a hard link to another file",
            });
        }
        let made = made || left_by_a_killed_holder(&file);
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .map_err(io)?;
        held.push(Held {
            path: lock.to_path_buf(),
            file,
            made,
        });
        return Ok(());
    }
    Err(io(std::io::Error::other(
        "it was removed or replaced each time it was locked",
    )))
}

/// Whether a lock file this process found and could lock is one a batchfit process left when it
/// was killed: it holds a pid (its holder's, now gone, since the lock was free). This process then
/// removes it at exit as its own.
fn left_by_a_killed_holder(file: &File) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 64];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n]).is_ok_and(|t| t.trim().parse::<u32>().is_ok())
}

/// Lets every lock of this process go, removing first each lock file this process made (while its
/// name is still the file it locked). Called once at exit; a later [`hold`] takes a lock again.
pub fn release_all() {
    release_where(|_| true);
}

/// [`release_all`] of the lock files whose path `which` accepts.
fn release_where(which: impl Fn(&Path) -> bool) {
    let mut held = held();
    let (go, keep): (Vec<Held>, Vec<Held>) = held.drain(..).partition(|h| which(&h.path));
    *held = keep;
    for h in go {
        if h.made && names(&h.path, &h.file) {
            let _ = std::fs::remove_file(&h.path);
        }
        drop(h.file);
    }
}

/// The lock file of writing `out` (a plan): `.NAME.batchfit-lock` beside the file a write to `out`
/// lands in (a symbolic link's target: the plan writer follows links), in its canonical directory.
pub fn beside(out: &Path) -> std::io::Result<PathBuf> {
    let target = match std::fs::canonicalize(out) {
        Ok(t) => t,
        Err(_) => {
            let dir = out.parent().filter(|d| !d.as_os_str().is_empty());
            let name = out.file_name().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the path has no file name",
                )
            })?;
            std::fs::canonicalize(dir.unwrap_or(Path::new(".")))?.join(name)
        }
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(target.with_file_name(format!(".{name}.batchfit-lock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symbolic link or a FIFO at a lock file's name is refused, never followed or replaced; a
    /// lock file this process made goes at release, one that was there stays.
    #[test]
    fn lock_files_are_regular_files_and_only_made_ones_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = d.path().join("link.lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(hold(&link), Err(LockError::NotRegular { .. })));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let fifo = d.path().join("fifo.lock");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(matches!(hold(&fifo), Err(LockError::NotRegular { .. })));
        let made = d.path().join("made.lock");
        let there = d.path().join("there.lock");
        std::fs::write(&there, "").unwrap();
        hold(&made).unwrap();
        hold(&made).unwrap();
        hold(&there).unwrap();
        assert_eq!(
            std::fs::read_to_string(&made).unwrap().trim(),
            std::process::id().to_string()
        );
        release_where(|p| p.starts_with(d.path()));
        assert!(!made.exists());
        assert!(there.exists());
        assert!(link.is_symlink() && fifo.exists());
    }

    /// The lock file of a batchfit process that was killed (its pid inside, its lock gone with it)
    /// is taken by the next process and removed at that one's exit; a file of that name without a
    /// pid stays.
    #[test]
    fn a_killed_holders_lock_file_is_removed_by_the_next_holder() {
        let d = tempfile::tempdir().unwrap();
        let left = d.path().join(".batchfit-logs.lock");
        std::fs::write(&left, "4194303\n").unwrap();
        hold(&left).unwrap();
        assert_eq!(
            std::fs::read_to_string(&left).unwrap(),
            format!("{}\n", std::process::id()),
            "the pid replaces the old one, from the start of the file"
        );
        let foreign = d.path().join("foreign.lock");
        std::fs::write(&foreign, "notes\n").unwrap();
        hold(&foreign).unwrap();
        release_where(|p| p.starts_with(d.path()));
        assert!(!left.exists());
        assert!(foreign.exists());
    }

    /// A hard link at a lock file's name is another name of some other file: refused, and that
    /// file is left as it was.
    #[test]
    fn a_hard_link_at_the_lock_files_name_is_refused_and_its_file_kept() {
        let d = tempfile::tempdir().unwrap();
        let notes = d.path().join("notes.txt");
        std::fs::write(&notes, "my notes, do not lose\n").unwrap();
        let lock = d.path().join(".p.json.batchfit-lock");
        std::fs::hard_link(&notes, &lock).unwrap();
        assert!(matches!(hold(&lock), Err(LockError::NotRegular { .. })));
        assert_eq!(
            std::fs::read_to_string(&notes).unwrap(),
            "my notes, do not lose\n"
        );
    }
}
