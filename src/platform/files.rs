//! Writing result files (plans, partial plans, cache entries, plots) safely, from job scripts that
//! often run as root.
//!
//! One writer for every file batchfit writes, [`write_atomic`]:
//! * **atomic**: the bytes go to a temporary file in the target's directory, are synced, and replace
//!   the target with one `rename`, so a reader sees the old file or the new one, never half of one;
//! * **only regular files are replaced**: a device node (`/dev/null`), a FIFO, a socket or a directory
//!   at the path is refused (renaming over `/dev/null` as root would break it for the whole machine);
//! * **symlinks are followed**: the link's target is written and the link stays a link (a dangling
//!   link is refused, since its target's directory may not be what the user meant);
//! * **modes are kept**: an existing file keeps its permission bits (and, when batchfit runs as root,
//!   its owner); a new file gets `0666` less the process umask, as `File::create` would. A file whose
//!   permission bits allow nobody to write it is refused rather than replaced.
//!
//! [`check_target`] runs the same checks before any trial, so a bad `--out` costs nothing.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The permission bits of a new file before the umask (as `open(2)` with `File::create`).
pub const NEW_FILE_MODE: u32 = 0o666;

#[derive(Debug, Error)]
pub enum FileError {
    #[error("{path} is a directory; give the path of a file")]
    Directory { path: PathBuf },
    #[error(
        "{path} is not a regular file ({kind}); batchfit only replaces regular files, so give another path"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path} is a symbolic link to {target}, which does not exist; give the target path itself"
    )]
    DanglingLink { path: PathBuf, target: PathBuf },
    #[error("{path} is read-only (mode {mode:o}); make it writable or give another path")]
    ReadOnly { path: PathBuf, mode: u32 },
    #[error("the directory of {path} does not exist; create it first")]
    NoDirectory { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why [`open_regular`] did not open a path.
#[derive(Debug)]
pub enum OpenError {
    /// Nothing at the path.
    Missing(std::io::Error),
    /// A symbolic link at the name, and links are not followed there.
    Link(std::io::Error),
    /// A directory at the path.
    Directory,
    /// Something other than a regular file (the words of [`kind_of`]).
    NotRegular(&'static str),
    /// Any other failure of the open (a FIFO without a reader opened for writing: `ENXIO`).
    Io(std::io::Error),
}

/// Opens `path` with `opts` as a **regular file only**: opening never waits on a FIFO
/// (`O_NONBLOCK`), a device, FIFO, socket or directory at the path is refused before a byte is read
/// or written, the descriptor is not inherited by trials (`O_CLOEXEC`), and with `follow == false`
/// a symbolic link at the name is refused rather than followed (`O_NOFOLLOW`: names a command or
/// another user controls, where root must not write or read through a link). Every reader or writer
/// of such a path calls this (plans, model and fingerprint files, trial reports and logs, the
/// `--logs` lock); each turns the [`OpenError`] into its own message.
pub fn open_regular(
    path: &Path,
    opts: &mut std::fs::OpenOptions,
    follow: bool,
) -> Result<std::fs::File, OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let f = opts
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | nofollow)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            _ if e.kind() == std::io::ErrorKind::NotFound => OpenError::Missing(e),
            Some(libc::ELOOP) if !follow => OpenError::Link(e),
            _ => OpenError::Io(e),
        })?;
    let ft = f.metadata().map_err(OpenError::Io)?.file_type();
    if ft.is_dir() {
        return Err(OpenError::Directory);
    }
    if !ft.is_file() {
        return Err(OpenError::NotRegular(kind_of(&ft)));
    }
    Ok(f)
}

/// What a non-regular file is, in words (for errors).
pub fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// What is at a path we are about to write.
struct Target {
    /// The path to write (a symlink's final target).
    path: PathBuf,
    /// The existing file's mode and owner, if there is one.
    existing: Option<(u32, u32, u32)>,
}

fn resolve(path: &Path) -> Result<Target, FileError> {
    let io = |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(e)),
    };
    let real = match &link {
        Some(m) if m.file_type().is_symlink() => match std::fs::canonicalize(path) {
            Ok(t) => t,
            Err(_) => {
                let target = std::fs::read_link(path).map_err(io)?;
                return Err(FileError::DanglingLink {
                    path: path.to_path_buf(),
                    target,
                });
            }
        },
        _ => path.to_path_buf(),
    };
    let meta = match &link {
        Some(m) if !m.file_type().is_symlink() => Some(m.clone()),
        Some(_) => Some(std::fs::metadata(&real).map_err(io)?),
        None => None,
    };
    let existing = match meta {
        None => None,
        Some(m) if m.is_dir() => {
            return Err(FileError::Directory {
                path: path.to_path_buf(),
            })
        }
        Some(m) if !m.is_file() => {
            return Err(FileError::NotRegular {
                path: path.to_path_buf(),
                kind: kind_of(&m.file_type()),
            })
        }
        Some(m) => {
            let mode = m.permissions().mode() & 0o7777;
            if mode & 0o222 == 0 {
                return Err(FileError::ReadOnly {
                    path: path.to_path_buf(),
                    mode,
                });
            }
            Some((mode, m.uid(), m.gid()))
        }
    };
    let dir = match real.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(FileError::NoDirectory {
            path: path.to_path_buf(),
        });
    }
    Ok(Target {
        path: real,
        existing,
    })
}

fn umask() -> u32 {
    // SAFETY: umask only reads and sets the process's file mode mask; it is set back at once.
    // (Trials and progress threads create no files while this runs.)
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    }
}

/// Whether two paths name the same file (the same path, or links to one target; for a file that
/// does not exist yet, the same directory and name).
pub fn same_target(a: &Path, b: &Path) -> bool {
    let real = |p: &Path| -> PathBuf {
        if let Ok(c) = std::fs::canonicalize(p) {
            return c;
        }
        // not there yet: its directory's real path and its name
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        match p.file_name() {
            Some(n) => dir.join(n),
            None => dir,
        }
    };
    real(a) == real(b)
}

/// Whether two paths are one file: the same device and inode when both exist, else the same real
/// path ([`same_target`]).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => same_target(a, b),
    }
}

/// Checks that `path` can be written by [`write_atomic`] (see the module doc), creating nothing but a
/// short-lived probe file in its directory.
pub fn check_target(path: &Path) -> Result<(), FileError> {
    let t = resolve(path)?;
    let dir = t.path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    tempfile::Builder::new()
        .prefix(".batchfit-check-")
        .tempfile_in(&dir)
        .map(drop)
        .map_err(|source| FileError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Writes `bytes` to `path` atomically, replacing only a regular file, following a symlink, keeping
/// an existing file's mode and owner (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let t = resolve(path)?;
    let err = |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match t.path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".batchfit-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    let mode = match t.existing {
        Some((mode, uid, gid)) => {
            // SAFETY: fchown on a descriptor we own. Only root can give a file away; for others it
            // fails harmlessly when the owner is already us.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::fchown(tmp.as_file().as_raw_fd(), uid, gid);
            }
            mode
        }
        None => NEW_FILE_MODE & !umask(),
    };
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(&t.path).map_err(|e| err(e.error))?;
    Ok(())
}

/// SHA-256 of a file's content, in hex.
pub fn sha256(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    // a FIFO must not make the open wait for a writer (it hung); only a regular file is read
    let mut f = match open_regular(path, std::fs::OpenOptions::new().read(true), true) {
        Ok(f) => f,
        Err(OpenError::Missing(e) | OpenError::Link(e) | OpenError::Io(e)) => return Err(e),
        Err(OpenError::Directory) => {
            return Err(std::io::Error::other("a directory, not a regular file"))
        }
        Err(OpenError::NotRegular(kind)) => {
            return Err(std::io::Error::other(format!("{kind}, not a regular file")))
        }
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn replaces_regular_files_keeping_their_mode() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("p.json");
        write_atomic(&f, b"one").unwrap();
        let new_mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(new_mode, NEW_FILE_MODE & !umask());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // nothing left beside it
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn same_target_sees_through_links_and_relative_paths() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("p.json");
        assert!(same_target(&f, &d.path().join(".").join("p.json")));
        assert!(!same_target(&f, &d.path().join("q.json")));
        std::fs::write(&f, "x").unwrap();
        let link = d.path().join("l.svg");
        symlink(&f, &link).unwrap();
        assert!(same_target(&f, &link));
    }

    #[test]
    fn follows_symlinks_and_refuses_what_is_not_a_file() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("real.json");
        std::fs::write(&target, "old").unwrap();
        let link = d.path().join("link.json");
        symlink(&target, &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");

        let dangling = d.path().join("dangling.json");
        symlink(d.path().join("nowhere/x.json"), &dangling).unwrap();
        assert!(matches!(
            write_atomic(&dangling, b"x"),
            Err(FileError::DanglingLink { .. })
        ));
        assert!(matches!(
            write_atomic(Path::new("/dev/null"), b"x"),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            check_target(Path::new("/dev/null")),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            write_atomic(d.path(), b"x"),
            Err(FileError::Directory { .. })
        ));
        let ro = d.path().join("ro.json");
        std::fs::write(&ro, "keep").unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert!(matches!(
            write_atomic(&ro, b"x"),
            Err(FileError::ReadOnly { .. })
        ));
        assert_eq!(std::fs::read(&ro).unwrap(), b"keep");
        assert!(matches!(
            check_target(&d.path().join("no/such/dir/p.json")),
            Err(FileError::NoDirectory { .. })
        ));
        // /dev/null is still a character device
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }
}
