//! TorchScript model files: checked before any trial (exists, readable, really TorchScript), hashed for
//! the fingerprint, and re-checked by `batchfit-train` so a plan is never used with a changed file.

use crate::protocol::classify::first_line;
use crate::workload::runner::Runner;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum ScriptError {
    #[error("model file {0} does not exist; give the path of a TorchScript file (export one with scripts/export_torchscript.py)")]
    Missing(String),
    #[error("model file {0} is a directory, not a TorchScript file")]
    Directory(String),
    #[error("cannot read model file {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{path} is not a TorchScript model that libtorch can load ({reason}); export it with scripts/export_torchscript.py (torch.jit.script or trace, then save)")]
    NotTorchscript { path: String, reason: String },
    #[error("{0}")]
    NoRunner(String),
    #[error("model file {path} changed since the probe (its SHA-256 is {now}, the plan's is {planned}); re-probe with this file")]
    Changed {
        path: String,
        now: String,
        planned: String,
    },
}

/// What validation learns about a TorchScript file.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptFile {
    /// Absolute path (trial children and the trainer may run elsewhere).
    pub path: String,
    pub sha256: String,
    pub parameters: u64,
}

/// SHA-256 (hex) of a file's content.
pub fn sha256_file(path: &Path) -> Result<String, ScriptError> {
    let shown = path.display().to_string();
    // a regular file only: a FIFO hung the probe, a link to /dev/zero was hashed without end
    use crate::platform::files::{open_regular, OpenError};
    let mut f = match open_regular(path, std::fs::OpenOptions::new().read(true), true) {
        Ok(f) => f,
        Err(OpenError::Missing(e) | OpenError::Link(e) | OpenError::Io(e)) => {
            return Err(open_error(path, e))
        }
        Err(OpenError::Directory) => return Err(ScriptError::Directory(shown)),
        Err(OpenError::NotRegular(kind)) => {
            return Err(ScriptError::Unreadable {
                path: shown,
                reason: format!("it is {kind}, not a regular file"),
            })
        }
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| ScriptError::Unreadable {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn open_error(path: &Path, e: std::io::Error) -> ScriptError {
    let shown = path.display().to_string();
    match e.kind() {
        std::io::ErrorKind::NotFound => ScriptError::Missing(shown),
        _ if path.is_dir() => ScriptError::Directory(shown),
        _ => ScriptError::Unreadable {
            path: shown,
            reason: e.to_string(),
        },
    }
}

/// Checks and hashes a TorchScript file and counts its parameters (loaded on the CPU, once, by the
/// torch runner).
pub fn inspect(path: &Path) -> Result<ScriptFile, ScriptError> {
    if path.is_dir() {
        return Err(ScriptError::Directory(path.display().to_string()));
    }
    let sha256 = sha256_file(path)?;
    let abs = std::fs::canonicalize(path).map_err(|e| open_error(path, e))?;
    let parameters = count_parameters(path, &abs)?;
    Ok(ScriptFile {
        path: abs.to_string_lossy().into_owned(),
        sha256,
        parameters,
    })
}

/// Loads the file with libtorch (the torch runner's `inspect`) and counts its parameters.
fn count_parameters(path: &Path, abs: &Path) -> Result<u64, ScriptError> {
    let runner = Runner::locate().map_err(|e| ScriptError::NoRunner(e.to_string()))?;
    let out = runner
        .command()
        .arg("inspect")
        .arg(abs)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            ScriptError::NoRunner(format!("cannot start {}: {e}", runner.exe.display()))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.trim().parse() {
        Ok(n) if out.status.success() => Ok(n),
        _ => Err(ScriptError::NotTorchscript {
            path: path.display().to_string(),
            reason: first_line(&String::from_utf8_lossy(&out.stderr)),
        }),
    }
}

/// The file at `path` still has the content the plan was made with.
pub fn verify(path: &Path, planned_sha256: &str) -> Result<(), ScriptError> {
    let now = sha256_file(path)?;
    if now != planned_sha256 {
        return Err(ScriptError::Changed {
            path: path.display().to_string(),
            now,
            planned: planned_sha256.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--model x.pt` where x.pt is a FIFO hung the probe (hashing waited for a writer); a
    /// link to /dev/zero was hashed without end. Both are refused at once.
    #[test]
    fn a_model_file_that_is_not_a_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("z.pt");
        std::os::unix::fs::symlink("/dev/null", &zero).unwrap();
        let fifo = dir.path().join("m.pt");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // /dev/null first: without the check it hashes to the empty file's digest at once
        for (p, what) in [(&zero, "a character device"), (&fifo, "a FIFO")] {
            let e = sha256_file(p).unwrap_err().to_string();
            assert!(
                e.contains(&format!("it is {what}, not a regular file")),
                "{e}"
            );
            let e = inspect(p).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pt");
        assert!(matches!(inspect(&missing), Err(ScriptError::Missing(_))));
        assert!(matches!(
            inspect(dir.path()),
            Err(ScriptError::Directory(_))
        ));
        let garbled = dir.path().join("garbled.pt");
        std::fs::write(&garbled, b"PK\x03\x04 not really a zip").unwrap();
        // libtorch judges the content: the runner cargo built next to target/release/deps/
        let runner = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .with_file_name(crate::workload::runner::RUNNER_NAME);
        assert!(
            runner.exists(),
            "{} is not built (cargo build --workspace)",
            runner.display()
        );
        std::env::set_var("BATCHFIT_TORCH_RUNNER", &runner);
        let e = inspect(&garbled).unwrap_err();
        assert!(matches!(e, ScriptError::NotTorchscript { .. }), "{e}");
        assert!(e.to_string().contains("export_torchscript.py"), "{e}");
        let empty = dir.path().join("empty.pt");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(
            inspect(&empty),
            Err(ScriptError::NotTorchscript { .. })
        ));
        // a changed file is refused
        let sha = sha256_file(&garbled).unwrap();
        verify(&garbled, &sha).unwrap();
        std::fs::write(&garbled, b"other").unwrap();
        assert!(matches!(
            verify(&garbled, &sha),
            Err(ScriptError::Changed { .. })
        ));
    }
}
