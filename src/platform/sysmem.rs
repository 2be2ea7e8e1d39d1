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

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1), if one is set.
pub fn cgroup_limit() -> Option<u64> {
    let cg = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cg.lines() {
        // v2: "0::/path"
        if let Some(path) = line.strip_prefix("0::") {
            let f = format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'));
            if let Ok(v) =
                fs::read_to_string(&f).or_else(|_| fs::read_to_string("/sys/fs/cgroup/memory.max"))
            {
                return v.trim().parse().ok();
            }
        }
    }
    fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v < (1u64 << 60))
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
    fn reads_own_status() {
        let s = proc_status().unwrap();
        assert!(s.vm_rss > 0 && s.vm_data > 0 && s.vm_hwm >= s.vm_rss);
        let (t, a) = meminfo().unwrap();
        assert!(t > 0 && a > 0 && a <= t);
        assert!(!cpu_name().is_empty());
    }
}
