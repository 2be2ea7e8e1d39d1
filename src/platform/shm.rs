//! Shared memory that a trial's processes left in `/dev/shm`.
//!
//! PyTorch moves a DataLoader worker's batch to the main process through POSIX shared memory
//! (`shm_open("/torch_<pid>_<random>_<n>")` in the sending process), and unlinks the name once the
//! receiver holds it. A process killed in between (the kernel's OOM killer, batchfit ending a trial
//! over its budget) leaves the file behind, a whole batch of RAM on tmpfs that nothing frees: one
//! such file per killed trial of a 256 KiB-per-sample script, 355 MiB resident each. The trial's
//! per-trial `TMPDIR` does not hold these (`shm_open` always uses `/dev/shm`), so once every process
//! of a trial has ended, the files named for its PIDs are removed. A file named for another
//! process, or not a regular file, or not this user's, is never touched.

use std::path::Path;

/// Where `shm_open` puts its files on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// Removes the shared-memory files in [`SHM_DIR`] that the processes `pids` created and left;
/// returns their names.
pub fn remove_left(pids: &[u32]) -> Vec<String> {
    remove_left_in(Path::new(SHM_DIR), pids)
}

/// [`remove_left`] in `dir`.
pub fn remove_left_in(dir: &Path, pids: &[u32]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    if pids.is_empty() {
        return vec![];
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut removed = vec![];
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !creator(&name).is_some_and(|p| pids.contains(&p)) {
            continue;
        }
        let ours = entry
            .metadata()
            .is_ok_and(|m| m.file_type().is_file() && m.uid() == uid);
        if ours && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// The PID in a name PyTorch gives its shared memory (`torch_<pid>_<random>_<n>`).
fn creator(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("torch_")?;
    let (pid, tail) = rest.split_once('_')?;
    (!tail.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        .then(|| pid.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_files_named_for_the_trials_processes_are_removed() {
        let d = tempfile::tempdir().unwrap();
        for name in [
            "torch_123_3226630336_4",
            "torch_1234_1_1",
            "torch_77_9_0",
            "psm_123",
            "torch_x_1",
        ] {
            std::fs::write(d.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join("torch_123_dir_1")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.path().join("torch_123_link_2")).unwrap();
        let mut removed = remove_left_in(d.path(), &[123, 77]);
        removed.sort();
        assert_eq!(removed, ["torch_123_3226630336_4", "torch_77_9_0"]);
        for kept in ["torch_1234_1_1", "psm_123", "torch_x_1", "torch_123_dir_1"] {
            assert!(d.path().join(kept).exists(), "{kept}");
        }
        assert!(d.path().join("torch_123_link_2").symlink_metadata().is_ok());
        assert!(remove_left_in(d.path(), &[]).is_empty());
    }
}
