//! GPU memory truth from NVML, behind a trait so every consumer (the cuda backend, `batchfit doctor`)
//! is testable with [`FakeGpus`] on machines without a GPU.
//!
//! NVML reports what the card actually gives up (CUDA contexts, caching-allocator reserves, other
//! processes), which is what decides a "CUDA out of memory" — not what `torch.cuda.memory_allocated`
//! says. NVML is loaded at run time, so binaries build and run anywhere; without a driver the error is
//! kept as a value and reported clearly, never as zeros.

pub mod allocator;
pub mod doctor;
pub mod fake;
pub mod nvml;

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
    #[error("NVML query failed: {0}")]
    Query(String),
}

/// A process using a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where NVML reports per-process memory as unavailable.
    pub used_bytes: Option<u64>,
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

/// A scripted set of GPUs for tests.
#[derive(Debug, Clone, Default)]
pub struct FakeGpus {
    pub driver: String,
    pub gpus: Vec<GpuInfo>,
    /// When set, every query fails with this error (e.g. no driver).
    pub fail: Option<GpuError>,
}

impl GpuQuery for FakeGpus {
    fn driver_version(&self) -> Result<String, GpuError> {
        match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(self.driver.clone()),
        }
    }
    fn device_count(&self) -> Result<u32, GpuError> {
        match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(self.gpus.len() as u32),
        }
    }
    fn device(&self, index: u32) -> Result<GpuInfo, GpuError> {
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        self.gpus
            .get(index as usize)
            .cloned()
            .ok_or(GpuError::NoSuchDevice {
                index,
                count: self.gpus.len() as u32,
            })
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
        let index: u32 = part.trim().parse().map_err(|_| {
            GpuError::Query(format!(
                "--gpus {spec:?}: {part:?} is not a GPU index (use `all` or e.g. 0,2)"
            ))
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
pub(crate) fn fake_h200(processes: Vec<GpuProcess>) -> FakeGpus {
    let gib = 1u64 << 30;
    let used: u64 = processes.iter().filter_map(|p| p.used_bytes).sum::<u64>() + gib / 2;
    FakeGpus {
        driver: "580.95".into(),
        gpus: vec![GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-00000000-1111-2222-3333-444444444444".into(),
            total_bytes: 141 * gib,
            free_bytes: 141 * gib - used - (600 << 20),
            used_bytes: used,
            processes,
            processes_unavailable: false,
            reserved_bytes: 600 << 20,
        }],
        fail: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
