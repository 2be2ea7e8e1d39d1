//! Process and machine memory facts on Linux, and the process set-up shared by trials and the trainer.
//!
//! * `RLIMIT_DATA` turns a RAM budget into a real allocation failure inside libtorch
//!   ("DefaultCPUAllocator: can't allocate memory"); `RLIMIT_AS` would count the ~2.6 GiB of mapped CUDA
//!   libraries and is a poor proxy.
//! * glibc's dynamic mmap threshold keeps freed blocks in the heap, which makes peaks depend on history;
//!   a fixed threshold (64 KiB) makes large tensors their own mappings, so peaks are clean and monotonic.
//!   A fixed number of malloc arenas keeps the reserved-but-untouched arena space (which `RLIMIT_DATA`
//!   counts) the same on a 2-core and a 64-core machine.

use std::fs;
use std::path::{Path, PathBuf};

/// The mmap threshold trials and the trainer use.
pub const MMAP_THRESHOLD: i32 = 64 * 1024;
/// The malloc arena count trials and the trainer use.
pub const ARENA_MAX: i32 = 2;

/// Malloc set-up; call first thing in `main` of every binary that runs training steps.
pub fn configure_malloc() {
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}

/// Environment variables that change how much memory a training process takes besides the model:
/// thread pools and their threads' stacks (thread stacks are data under `RLIMIT_DATA`), malloc
/// tunables, a preloaded allocator. A trial process inherits them from the probe; the plan records
/// them so `batchfit-train --memory-limit plan` starts the same way.
pub const MEMORY_ENV: &[&str] = &[
    "OMP_NUM_THREADS",
    "OMP_STACKSIZE",
    "GOMP_STACKSIZE",
    "KMP_STACKSIZE",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "RUST_MIN_STACK",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
];

/// The variables of [`MEMORY_ENV`] that are set in this process, with their values.
pub fn memory_env() -> std::collections::BTreeMap<String, String> {
    MEMORY_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// This process's `RLIMIT_STACK` (soft), `None` when unlimited: the default stack size of the
/// threads glibc starts (OpenMP's among them, unless `OMP_STACKSIZE` says otherwise).
pub fn stack_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    Some(lim.rlim_cur as u64)
}

/// Values (bytes) of the `Vm*` fields of `/proc/self/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStatus {
    pub vm_data: u64,
    pub vm_rss: u64,
    pub vm_hwm: u64,
}

fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l[key.len()..].split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

pub fn proc_status() -> std::io::Result<ProcStatus> {
    let t = fs::read_to_string("/proc/self/status")?;
    let get = |k| {
        kb_field(&t, k).ok_or_else(|| std::io::Error::other(format!("/proc/self/status lacks {k}")))
    };
    Ok(ProcStatus {
        vm_data: get("VmData:")?,
        vm_rss: get("VmRSS:")?,
        vm_hwm: get("VmHWM:")?,
    })
}

/// This process's `VmData` in bytes, read without allocating (a stack buffer): the data-segment
/// sampler runs every millisecond right up to the memory limit, where a heap allocation of its own
/// could fail and abort the process (Rust's allocation-failure handler aborts).
pub fn vm_data_no_alloc() -> Option<u64> {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    let mut f = fs::File::open("/proc/self/status").ok()?;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    kb_field(text, "VmData:")
}

/// Resets the peak RSS mark (`VmHWM`) of this process.
pub fn reset_peak_rss() -> std::io::Result<()> {
    fs::write("/proc/self/clear_refs", "5")
}

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`.
pub fn meminfo() -> std::io::Result<(u64, u64)> {
    let t = fs::read_to_string("/proc/meminfo")?;
    let total = kb_field(&t, "MemTotal:").ok_or_else(|| std::io::Error::other("no MemTotal"))?;
    let avail =
        kb_field(&t, "MemAvailable:").ok_or_else(|| std::io::Error::other("no MemAvailable"))?;
    Ok((total, avail))
}

/// A cgroup's memory: its limit, and what it holds now less the page cache it can drop (the kernel
/// reclaims inactive file pages before it kills anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    pub limit: u64,
    pub used: u64,
}

impl CgroupMemory {
    /// What the cgroup can still take before its limit.
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// This process's memory cgroup, when it has a limit (v2 `memory.max`/`memory.current`, or v1
/// `memory.limit_in_bytes`/`memory.usage_in_bytes`; `inactive_file` of `memory.stat` counted as free).
pub fn cgroup_memory() -> Option<CgroupMemory> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_in(Path::new("/sys/fs/cgroup"), &own)
}

fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn stat_field(dir: &Path, keys: &[&str]) -> u64 {
    let Ok(t) = fs::read_to_string(dir.join("memory.stat")) else {
        return 0;
    };
    keys.iter()
        .find_map(|k| {
            t.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// [`cgroup_memory`] under `root` (the cgroup mount) for a process whose `/proc/self/cgroup` is
/// `own`: the process's own cgroup, else the mount's root (inside a container, its own cgroup).
fn cgroup_memory_in(root: &Path, own: &str) -> Option<CgroupMemory> {
    let dirs = |base: PathBuf, path: &str| {
        let mut v = vec![];
        let rel = path.trim().trim_start_matches('/');
        if !rel.is_empty() {
            v.push(base.join(rel));
        }
        v.push(base);
        v
    };
    // v2: "0::/path"
    if let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) {
        for dir in dirs(root.to_path_buf(), path) {
            let Ok(max) = fs::read_to_string(dir.join("memory.max")) else {
                continue;
            };
            let Ok(limit) = max.trim().parse::<u64>() else {
                return None; // "max": no limit
            };
            let current = read_u64(&dir.join("memory.current")).unwrap_or(0);
            let used = current.saturating_sub(stat_field(&dir, &["inactive_file"]));
            return Some(CgroupMemory { limit, used });
        }
    }
    // v1: "N:memory:/path" (or a list of controllers with memory in it)
    let v1 = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrl.split(',').any(|c| c == "memory").then_some(path)
    });
    for dir in dirs(root.join("memory"), v1.unwrap_or("")) {
        let Some(limit) = read_u64(&dir.join("memory.limit_in_bytes")) else {
            continue;
        };
        if limit >= 1 << 60 {
            return None; // unlimited
        }
        let usage = read_u64(&dir.join("memory.usage_in_bytes")).unwrap_or(0);
        let used =
            usage.saturating_sub(stat_field(&dir, &["total_inactive_file", "inactive_file"]));
        return Some(CgroupMemory { limit, used });
    }
    None
}

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1), if one is set.
pub fn cgroup_limit() -> Option<u64> {
    cgroup_memory().map(|c| c.limit)
}

/// Memory a new process can take now: `MemAvailable`, capped by what this process's cgroup can
/// still take (its limit less what it already holds: in a half-full container, half).
pub fn available_bytes() -> std::io::Result<u64> {
    let (_, avail) = meminfo()?;
    Ok(cgroup_memory().map_or(avail, |c| c.headroom().min(avail)))
}

/// The CPU model name, for the plan's device identity.
pub fn cpu_name() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// This process's `RLIMIT_DATA` (soft), `None` when unlimited.
pub fn data_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
    Some(lim.rlim_cur as u64)
}

/// Sets this process's `RLIMIT_DATA` (soft and hard).
pub fn set_data_limit(bytes: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_headroom_counts_what_the_cgroup_already_holds() {
        let d = tempfile::tempdir().unwrap();
        let gib = 1u64 << 30;
        // v2, the process's own cgroup: 8 GiB limit, 5 GiB charged of which 1 GiB is dropable cache
        let own = d.path().join("job/step");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join("memory.max"), format!("{}\n", 8 * gib)).unwrap();
        std::fs::write(own.join("memory.current"), format!("{}\n", 5 * gib)).unwrap();
        std::fs::write(
            own.join("memory.stat"),
            format!("anon 1\nactive_file 7\ninactive_file {gib}\n"),
        )
        .unwrap();
        let c = cgroup_memory_in(d.path(), "0::/job/step\n").unwrap();
        assert_eq!(c.limit, 8 * gib);
        assert_eq!(c.headroom(), 4 * gib, "{c:?}");
        // no limit
        std::fs::write(own.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_memory_in(d.path(), "0::/job/step\n"), None);
        // v1, inside a container (the mount's root is its cgroup)
        let v1 = tempfile::tempdir().unwrap();
        let m = v1.path().join("memory");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("memory.limit_in_bytes"), format!("{}", 16 * gib)).unwrap();
        std::fs::write(m.join("memory.usage_in_bytes"), format!("{}", 10 * gib)).unwrap();
        std::fs::write(
            m.join("memory.stat"),
            format!("total_inactive_file {}\n", 2 * gib),
        )
        .unwrap();
        let c = cgroup_memory_in(v1.path(), "4:memory:/docker/abc\n0::/\n").unwrap();
        assert_eq!((c.limit, c.headroom()), (16 * gib, 8 * gib));
        std::fs::write(m.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        assert_eq!(cgroup_memory_in(v1.path(), "4:memory:/x\n"), None);
    }

    #[test]
    fn reads_own_status() {
        let s = proc_status().unwrap();
        assert!(s.vm_rss > 0 && s.vm_data > 0 && s.vm_hwm >= s.vm_rss);
        let d = vm_data_no_alloc().unwrap();
        assert!(
            d > 0 && d.abs_diff(s.vm_data) < 64 << 20,
            "{d} vs {}",
            s.vm_data
        );
        let (t, a) = meminfo().unwrap();
        assert!(t > 0 && a > 0 && a <= t);
        assert!(!cpu_name().is_empty());
    }
}
