//! A memory cgroup per trial: the whole process tree of a user's command limited together, as Slurm,
//! Kubernetes and systemd limit a job, and measured by the kernel (`memory.peak`).
//!
//! `RLIMIT_DATA` limits each process of a tree on its own and counts address space a process reserved
//! but never touched, so for a job of several processes (torchrun's ranks, DataLoader workers) and for
//! an unchanged Python script (whose allocator reserves far more than it touches) it is a different
//! bound than the one the job will meet. Where this process may create a child cgroup with the memory
//! controller — cgroup v2 (`memory.max`, `memory.peak`, `memory.events`) or v1 (`memory.limit_in_bytes`,
//! `memory.max_usage_in_bytes`, `memory.oom_control`) — each trial runs in its own group: swap off
//! for the group, every process of the tree charged to it, a kernel OOM kill counted as the group's,
//! and the group removed (its processes killed) after the trial.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Version {
    V1,
    V2,
}

/// Where trial groups can be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub version: Version,
    pub dir: PathBuf,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::write(p, v)
}

/// The cgroup this process is in, for the memory controller: `Err` says why trials cannot have one.
pub fn parent() -> Result<Parent, String> {
    let own = read(Path::new("/proc/self/cgroup")).ok_or("cannot read /proc/self/cgroup")?;
    // v1 memory controller: "N:memory:/path" (also "N:cpu,memory:/path")
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next(), parts.next(), parts.next());
        if let (Some(ctrls), Some(path)) = (ctrls, path) {
            if ctrls.split(',').any(|c| c == "memory") {
                let dir = PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
                if dir.join("memory.limit_in_bytes").exists() {
                    return Ok(Parent {
                        version: Version::V1,
                        dir,
                    });
                }
            }
        }
    }
    // v2: "0::/path"
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no cgroup v2 entry and no v1 memory controller in /proc/self/cgroup")?;
    let base = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|b| b.join("cgroup.controllers").exists())
        .ok_or("no cgroup v2 hierarchy mounted")?;
    let dir = base.join(path.trim_start_matches('/'));
    let controllers = read(&dir.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(format!(
            "the memory controller is not available to this process's cgroup ({})",
            dir.display()
        ));
    }
    let subtree = read(&dir.join("cgroup.subtree_control")).unwrap_or_default();
    if !subtree.split_whitespace().any(|c| c == "memory") {
        // Enabling it fails when this cgroup holds processes itself (cgroup v2's "no internal
        // processes" rule), e.g. batchfit started directly in a job's cgroup.
        write(&dir.join("cgroup.subtree_control"), "+memory").map_err(|e| {
            format!(
                "cannot enable the memory controller for child groups of {} ({e}); run batchfit in \
                 a delegated cgroup (e.g. systemd-run --user --scope -p Delegate=yes) or use \
                 --cpu-limit rlimit",
                dir.display()
            )
        })?;
    }
    Ok(Parent {
        version: Version::V2,
        dir,
    })
}

/// A memory cgroup of one trial; killed and removed when dropped.
#[derive(Debug)]
pub struct Group {
    version: Version,
    dir: PathBuf,
    /// `cgroup.procs` as a C string, for the child to join between fork and exec.
    procs: CString,
}

impl Group {
    /// A new group under `parent` named `name`, limited to `limit` bytes without swap.
    pub fn create(parent: &Parent, name: &str, limit: u64) -> Result<Group, String> {
        let dir = parent.dir.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot create the memory cgroup {}: {e}", dir.display()))?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
            .map_err(|e| e.to_string())?;
        let g = Group {
            version: parent.version,
            dir,
            procs,
        };
        let set = |file: &str, v: String| {
            write(&g.dir.join(file), &v)
                .map_err(|e| format!("cannot set {} of {}: {e}", file, g.dir.display()))
        };
        match g.version {
            Version::V2 => {
                set("memory.max", limit.to_string())?;
                if g.dir.join("memory.swap.max").exists() {
                    set("memory.swap.max", "0".into())?;
                }
                if !g.dir.join("memory.peak").exists() {
                    return Err(format!(
                        "{} has no memory.peak (Linux ≥ 5.19 needed to measure a trial's peak); use \
                         --cpu-limit rlimit",
                        g.dir.display()
                    ));
                }
            }
            Version::V1 => {
                set("memory.limit_in_bytes", limit.to_string())?;
                if g.dir.join("memory.memsw.limit_in_bytes").exists() {
                    set("memory.memsw.limit_in_bytes", limit.to_string())?;
                } else {
                    set("memory.swappiness", "0".into())?;
                }
            }
        }
        Ok(g)
    }

    /// The path of `cgroup.procs` (the child writes its PID there before exec).
    pub fn procs_path(&self) -> &CString {
        &self.procs
    }

    pub fn version(&self) -> Version {
        self.version
    }

    fn value(&self, file: &str) -> Option<u64> {
        read(&self.dir.join(file))?.trim().parse().ok()
    }

    /// The group's peak memory use (`memory.peak` / `memory.max_usage_in_bytes`).
    pub fn peak(&self) -> Option<u64> {
        match self.version {
            Version::V2 => self.value("memory.peak"),
            Version::V1 => self.value("memory.max_usage_in_bytes"),
        }
    }

    /// The group's limit (`memory.max` / `memory.limit_in_bytes`).
    pub fn limit(&self) -> Option<u64> {
        match self.version {
            Version::V2 => self.value("memory.max"),
            Version::V1 => self.value("memory.limit_in_bytes"),
        }
    }

    /// The anonymous and shared memory charged to the group now (`memory.stat`: v2 `anon` +
    /// `shmem`, v1 `total_rss` + `total_shmem`): what cannot be reclaimed without swap. The kernel's
    /// peak also counts page cache (read files, the libraries' text), which is reclaimed at the limit,
    /// so every trial near the limit reads about 100% there.
    pub fn anon(&self) -> Option<u64> {
        let t = read(&self.dir.join("memory.stat"))?;
        let keys: [&str; 2] = match self.version {
            Version::V2 => ["anon ", "shmem "],
            Version::V1 => ["total_rss ", "total_shmem "],
        };
        let get = |k: &str| {
            t.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(get(keys[0])? + get(keys[1]).unwrap_or(0))
    }

    /// OOM kills the kernel counted in this group.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        read(&self.dir.join(file))
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<u32> {
        read(&self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in the group (`cgroup.kill` where the kernel has it).
    pub fn kill_all(&self) {
        if self.version == Version::V2 && write(&self.dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for pid in self.pids() {
            // SAFETY: sending a signal to a process of the trial's own group.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The processes must be gone before the directory can be removed.
        for _ in 0..200 {
            self.kill_all();
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// The PID in a trial group's name (`batchfit-PID-N`, as the cpu device names them).
fn owner_of(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix("batchfit-")?.split_once('-')?;
    // a trial's group, or a warm process's (`warmN`) waiting for its trial
    n.strip_prefix("warm").unwrap_or(n).parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Removes the trial groups under `parent` left by batchfit processes that are gone (killed with
/// SIGKILL, or by a machine's OOM killer, before they could remove their own): their processes are
/// killed, their directories removed. Groups of a live batchfit are left alone. Returns how many
/// were removed.
pub fn remove_stale(parent: &Parent) -> usize {
    let Ok(dir) = std::fs::read_dir(&parent.dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_of(&name) else { continue };
        let alive =
            read(Path::new(&format!("/proc/{pid}/comm"))).is_some_and(|c| c.trim() == "batchfit");
        if alive || !e.path().is_dir() {
            continue;
        }
        let g = Group {
            version: parent.version,
            dir: e.path(),
            procs: CString::new(e.path().join("cgroup.procs").as_os_str().as_encoded_bytes())
                .unwrap_or_default(),
        };
        // dropping it kills what is left in it and removes the directory
        drop(g);
        if !e.path().exists() {
            removed += 1;
        }
    }
    removed
}

/// Moves the calling process into the group whose `cgroup.procs` is `procs`. Async-signal-safe: for
/// use between fork and exec.
pub fn join(procs: &CString) -> std::io::Result<()> {
    // SAFETY: open/write/close with valid pointers; "0" means the writing process itself.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        libc::close(fd);
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the machine allows it (root, a memory controller), a group limits a child's tree and
    /// counts its OOM kill; elsewhere the reason is a sentence.
    #[test]
    fn trial_group_names_tell_their_owner() {
        assert_eq!(owner_of("batchfit-123-4"), Some(123));
        assert_eq!(owner_of("batchfit-123-warm4"), Some(123));
        assert_eq!(owner_of("batchfit-test-123"), None);
        assert_eq!(owner_of("batchfit-123"), None);
        assert_eq!(owner_of("other-123-4"), None);
    }

    #[test]
    fn a_group_limits_and_counts_an_oom_kill() {
        let parent = match parent() {
            Ok(p) => p,
            Err(why) => {
                assert!(!why.is_empty());
                crate::note!("no memory cgroup here: {why}");
                return;
            }
        };
        let g = match Group::create(
            &parent,
            &format!("batchfit-test-{}", std::process::id()),
            64 << 20,
        ) {
            Ok(g) => g,
            Err(why) => {
                crate::note!("cannot create a memory cgroup here: {why}");
                return;
            }
        };
        let procs = g.procs_path().clone();
        let mut cmd = std::process::Command::new("python3");
        // touches 256 MiB under a 64 MiB limit: the kernel kills it
        cmd.args([
            "-c",
            "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1",
        ]);
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
        unsafe {
            cmd.pre_exec(move || join(&procs));
        }
        let status = cmd.status().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(g.oom_kills() >= 1);
        assert!(g.peak().unwrap() > 32 << 20);
        let dir = g.dir.clone();
        drop(g);
        assert!(!dir.exists());
    }
}
