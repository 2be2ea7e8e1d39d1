//! GPU memory truth from NVML, behind a trait ([`GpuQuery`]) so every consumer (the cuda device,
//! `batchfit doctor`, `batchfit-train`) is testable on machines without a GPU (with the scripted GPUs
//! of [`crate::device::cuda::fake`]); and which GPUs a job may use ([`visible_indices`], [`select`]).
//! (The caching allocator's own figures come from the trial itself: the torch runner's C++ shim,
//! or a user's command's report.)
//!
//! NVML reports what the card actually gives up (CUDA contexts, caching-allocator reserves, other
//! processes), which is what decides a "CUDA out of memory" — not what `torch.cuda.memory_allocated`
//! says. NVML is loaded at run time, so binaries build and run anywhere; without a driver the error is
//! kept as a value and reported clearly, never as zeros.

pub mod nvml;

pub use crate::protocol::GpuProcess;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GpuError {
    #[error(
        "no NVIDIA driver could be loaded ({0}); GPU probing needs one. Without a GPU, use --backend cpu \
         (real training steps under a RAM limit) or --backend sim (a simulated memory curve)"
    )]
    NoDriver(String),
    #[error(
        "GPU index {index} does not exist: this machine has {count} GPU(s) (indices 0..{count})"
    )]
    NoSuchDevice { index: u32, count: u32 },
    /// `--gpus` names no GPU index (user input, not the driver).
    #[error("--gpus {spec:?}: {part:?} is not a GPU index (use `all` or e.g. 0,2)")]
    BadSelection { spec: String, part: String },
    #[error("NVML query failed: {0}")]
    Query(String),
}

/// One GPU as NVML sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    /// Memory the driver and firmware set aside (NVML's v2 memory query). `total_bytes` counts it,
    /// CUDA's total (what `per_process_memory_fraction` is a fraction of) does not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_bytes: u64,
    pub processes: Vec<GpuProcess>,
    /// NVML could not list the compute processes (e.g. under a sandbox): `processes` is empty for
    /// that reason, not because there are none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub processes_unavailable: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl GpuError {
    /// Whether the error is the user's input (`--gpus`), not the machine's.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            GpuError::BadSelection { .. } | GpuError::NoSuchDevice { .. }
        )
    }
}

impl GpuInfo {
    /// The device memory CUDA reports as total (`cudaMemGetInfo`): NVML's total less the driver's
    /// reserve (NVML's total where the reserve is not a part of it, which no driver reports).
    pub fn cuda_total_bytes(&self) -> u64 {
        if self.reserved_bytes < self.total_bytes {
            self.total_bytes - self.reserved_bytes
        } else {
            self.total_bytes
        }
    }
}

/// What batchfit asks of NVML.
pub trait GpuQuery {
    fn driver_version(&self) -> Result<String, GpuError>;
    fn device_count(&self) -> Result<u32, GpuError>;
    fn device(&self, index: u32) -> Result<GpuInfo, GpuError>;
    fn devices(&self) -> Result<Vec<GpuInfo>, GpuError> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }
    /// Used memory of GPU `index` (the light query the trial sampler calls every few ms).
    fn used_bytes(&self, index: u32) -> Result<u64, GpuError> {
        Ok(self.device(index)?.used_bytes)
    }
    /// Memory NVML attributes to the processes `pids` on `index`, summed (`None`: NVML attributes
    /// nothing to any of them, e.g. another PID namespace). One query for a whole process tree.
    fn processes_used(&self, index: u32, pids: &[u32]) -> Result<Option<u64>, GpuError> {
        let mut sum = None;
        for &pid in pids {
            if let Some(b) = self.process_used(index, pid)? {
                sum = Some(sum.unwrap_or(0) + b);
            }
        }
        Ok(sum)
    }
    /// Memory NVML attributes to `pid` on `index` (`None`: unavailable, e.g. another PID namespace).
    fn process_used(&self, index: u32, pid: u32) -> Result<Option<u64>, GpuError> {
        Ok(self
            .device(index)?
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.used_bytes))
    }
}

/// The NVML indices `CUDA_VISIBLE_DEVICES` (`visible`) lets this job use: entries are GPU UUIDs (or
/// their prefixes, as CUDA accepts) or indices; `None` when it is unset (all GPUs).
pub fn visible_indices(
    visible: Option<&str>,
    q: &dyn GpuQuery,
) -> Result<Option<Vec<u32>>, GpuError> {
    let Some(v) = visible.map(str::trim) else {
        return Ok(None);
    };
    let gpus = q.devices()?;
    let mut out = vec![];
    for e in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if let Ok(i) = e.parse::<u32>() {
            // CUDA's own order is fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML's is PCI.
            out.push(i);
        } else if let Some(g) = gpus.iter().find(|g| g.uuid.starts_with(e)) {
            out.push(g.index);
        } else {
            // CUDA stops at the first entry it cannot resolve
            break;
        }
    }
    Ok(Some(out))
}

/// Parses `--gpus all|0,2,…` against the GPUs present: sorted, deduplicated indices, each checked.
pub fn select(spec: &str, q: &dyn GpuQuery) -> Result<Vec<u32>, GpuError> {
    let count = q.device_count()?;
    if spec.trim() == "all" {
        if count == 0 {
            return Err(GpuError::Query("NVML sees no GPU".into()));
        }
        return Ok((0..count).collect());
    }
    let mut v = vec![];
    for part in spec.split(',') {
        let index: u32 = part.trim().parse().map_err(|_| GpuError::BadSelection {
            spec: spec.to_string(),
            part: part.to_string(),
        })?;
        if index >= count {
            return Err(GpuError::NoSuchDevice { index, count });
        }
        v.push(index);
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::fake::{fake_h200, FakeGpus};

    #[test]
    fn selection() {
        let mut f = fake_h200(vec![]);
        f.gpus.push(GpuInfo {
            index: 1,
            ..f.gpus[0].clone()
        });
        assert_eq!(select("all", &f).unwrap(), vec![0, 1]);
        assert_eq!(select("1,0,1", &f).unwrap(), vec![0, 1]);
        assert_eq!(
            select("2", &f),
            Err(GpuError::NoSuchDevice { index: 2, count: 2 })
        );
        assert!(select("x", &f).is_err());
        let none = FakeGpus {
            fail: Some(GpuError::NoDriver("libnvidia-ml.so.1: cannot open".into())),
            ..Default::default()
        };
        let e = select("all", &none).unwrap_err().to_string();
        assert!(
            e.contains("--backend cpu") && e.contains("--backend sim"),
            "{e}"
        );
    }

    #[test]
    fn per_process_memory() {
        let f = fake_h200(vec![
            GpuProcess {
                pid: 42,
                used_bytes: Some(3 << 30),
            },
            GpuProcess {
                pid: 7,
                used_bytes: None,
            },
        ]);
        assert_eq!(f.process_used(0, 42).unwrap(), Some(3 << 30));
        assert_eq!(f.process_used(0, 7).unwrap(), None);
        assert_eq!(f.process_used(0, 9).unwrap(), None);
    }
}
