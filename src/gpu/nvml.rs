//! The real NVML, through `nvml-wrapper`. Initialised once per process; the result (or the error, as a
//! value) is kept. The library is `libnvidia-ml.so.1` (what the driver package installs) found by the
//! dynamic loader; where the loader does not know the driver's folder, the places drivers are mounted
//! or installed (containers' `/usr/local/nvidia/lib64`, distributions' lib folders, WSL) are tried,
//! and `BATCHFIT_NVML_LIB=PATH` names the library outright. A library that loads but whose
//! `nvmlInit` fails (driver not loaded, no permission) is the answer: no other copy is tried.

use super::{GpuError, GpuInfo, GpuProcess, GpuQuery};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::sync::OnceLock;

static NVML: OnceLock<Result<Nvml, InitFailure>> = OnceLock::new();

/// Why NVML is not there: the message, and whether no library was found at any place searched (a
/// machine without an NVIDIA driver, as opposed to a driver that is there and refuses).
struct InitFailure {
    message: String,
    no_library: bool,
}

/// Names the NVML library to load, instead of searching for it.
pub const LIB_ENV: &str = "BATCHFIT_NVML_LIB";

/// Where `libnvidia-ml.so.1` is looked for, in order, after the loader's own search.
/// The unversioned name comes last: it is often the CUDA toolkit's link-time stub, whose `nvmlInit`
/// refuses, which would end the search before the real driver's library.
const FALLBACK_PATHS: &[&str] = &[
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    "libnvidia-ml.so",
];

/// Loads and initialises NVML from the first of `candidates` that loads.
fn init_from(candidates: &[String]) -> Result<Nvml, InitFailure> {
    let mut missing = Vec::new();
    for lib in candidates {
        match Nvml::builder().lib_path(std::ffi::OsStr::new(lib)).init() {
            Ok(nvml) => return Ok(nvml),
            // not there: try the next place
            // (libloading's message names the file)
            Err(NvmlError::LibloadingError(e)) => missing.push(e.to_string()),
            // the library is there and says no (or lacks what batchfit needs): that is the answer
            Err(e) => {
                return Err(InitFailure {
                    message: format!("{lib}: {e}"),
                    no_library: false,
                })
            }
        }
    }
    let message = match missing.len() {
        0 => "no NVML library to try".into(),
        1 => missing.remove(0),
        n => format!(
            "{}; also tried {} other place(s): {}",
            missing[0],
            n - 1,
            candidates[1..].join(", ")
        ),
    };
    Err(InitFailure {
        message,
        no_library: true,
    })
}

/// The process-wide NVML handle, or why there is none.
pub struct RealNvml {
    nvml: &'static Nvml,
}

impl RealNvml {
    pub fn get() -> Result<RealNvml, GpuError> {
        let r = NVML.get_or_init(|| match std::env::var(LIB_ENV) {
            Ok(path) if !path.is_empty() => {
                // a library the user named: never a machine without a driver
                init_from(&[path]).map_err(|e| InitFailure {
                    message: format!("{} (from {LIB_ENV})", e.message),
                    no_library: false,
                })
            }
            _ => init_from(
                &std::iter::once("libnvidia-ml.so.1")
                    .chain(FALLBACK_PATHS.iter().copied())
                    .map(String::from)
                    .collect::<Vec<_>>(),
            ),
        });
        match r {
            Ok(nvml) => Ok(RealNvml { nvml }),
            Err(e) => Err(GpuError::NoDriver(e.message.clone())),
        }
    }

    /// Whether NVML failed because no library was found at any place searched (no NVIDIA driver on
    /// this machine), not because one was found and refused or was named by `BATCHFIT_NVML_LIB`.
    pub fn no_library() -> bool {
        Self::get().is_err()
            && NVML
                .get()
                .is_some_and(|r| r.as_ref().is_err_and(|e| e.no_library))
    }
}

fn q<E: std::fmt::Display>(e: E) -> GpuError {
    GpuError::Query(e.to_string())
}

impl GpuQuery for RealNvml {
    fn driver_version(&self) -> Result<String, GpuError> {
        self.nvml.sys_driver_version().map_err(q)
    }
    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(q)
    }
    fn device(&self, index: u32) -> Result<GpuInfo, GpuError> {
        let count = self.device_count()?;
        if index >= count {
            return Err(GpuError::NoSuchDevice { index, count });
        }
        let d = self.nvml.device_by_index(index).map_err(q)?;
        let mem = d.memory_info().map_err(q)?;
        // The process list is optional: some sandboxes do not implement it, and the memory figures
        // are still good.
        let (processes, processes_unavailable) = match d.running_compute_processes() {
            Ok(ps) => (
                ps.into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_bytes: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    })
                    .collect(),
                false,
            ),
            Err(_) => (vec![], true),
        };
        Ok(GpuInfo {
            index,
            name: d.name().map_err(q)?,
            uuid: d.uuid().map_err(q)?,
            total_bytes: mem.total,
            free_bytes: mem.free,
            used_bytes: mem.used,
            reserved_bytes: mem.reserved,
            processes,
            processes_unavailable,
        })
    }
    fn used_bytes(&self, index: u32) -> Result<u64, GpuError> {
        let d = self.nvml.device_by_index(index).map_err(q)?;
        Ok(d.memory_info().map_err(q)?.used)
    }
    fn process_used(&self, index: u32, pid: u32) -> Result<Option<u64>, GpuError> {
        self.processes_used(index, &[pid])
    }
    fn processes_used(&self, index: u32, pids: &[u32]) -> Result<Option<u64>, GpuError> {
        let d = self.nvml.device_by_index(index).map_err(q)?;
        let mut sum = None;
        for p in d.running_compute_processes().map_err(q)? {
            if pids.contains(&p.pid) {
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    sum = Some(sum.unwrap_or(0) + b);
                }
            }
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On machines without a driver (CI), NVML must fail with a clear error, never report zeros.
    /// On a GPU machine it must report a real card.
    #[test]
    fn real_nvml_reports_a_card_or_a_clear_error() {
        match RealNvml::get() {
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("--backend cpu") && m.contains("--backend sim"),
                    "{m}"
                );
                crate::note!("no NVIDIA driver here (expected on CPU machines): {m}");
            }
            Ok(n) => {
                for g in n.devices().unwrap() {
                    assert!(g.total_bytes > 0 && !g.name.is_empty(), "{g:?}");
                }
            }
        }
    }
}
