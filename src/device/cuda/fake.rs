//! Scripted GPUs for tests of the real binaries (`BATCHFIT_FAKE_GPUS=FILE`): NVML answers from the
//! file and CUDA trials follow a simulated memory curve per GPU. A test hook, like the hidden fault
//! injection of trials; the plan of such a run says `"fake": true` in its `gpu` section.
//!
//! ```json
//! {"driver": "580.95",
//!  "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-…", "total_bytes": …, "free_bytes": …,
//!            "used_bytes": …, "processes": [{"pid": 4242, "used_bytes": …}]}],
//!  "sim": ["base=2GiB,per-sample=40MiB,capacity=141GiB"]}
//! ```
//! `sim[i]` is GPU i's curve (`--sim` syntax); a missing entry reuses the last. A GPU may also give
//! `reserved_bytes` (the driver's reserve, as NVML's v2 memory query reports it).

use crate::device::sim::SimSpec;
use crate::gpu::{GpuError, GpuInfo, GpuQuery};
use serde::Deserialize;

pub const ENV: &str = "BATCHFIT_FAKE_GPUS";

#[derive(Debug, Deserialize)]
struct File {
    driver: String,
    gpus: Vec<GpuInfo>,
    #[serde(default)]
    sim: Vec<String>,
}

/// The fake set-up named by `BATCHFIT_FAKE_GPUS`, if set.
pub struct Fake {
    pub gpus: FakeGpus,
    pub sims: Vec<SimSpec>,
}

impl Fake {
    pub fn from_env() -> Option<Result<Fake, GpuError>> {
        let path = std::env::var_os(ENV)?;
        Some(Self::load(std::path::Path::new(&path)))
    }

    fn load(path: &std::path::Path) -> Result<Fake, GpuError> {
        let bad = |m: String| GpuError::Query(format!("{ENV}={}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let f: File = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let sims = f
            .sim
            .iter()
            .map(|s| SimSpec::parse(s).map_err(|e| bad(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Fake {
            gpus: FakeGpus {
                driver: f.driver,
                gpus: f.gpus,
                fail: None,
            },
            sims,
        })
    }

    /// GPU `index`'s curve.
    pub fn sim(&self, index: u32) -> Option<SimSpec> {
        self.sims.get(index as usize).or(self.sims.last()).cloned()
    }
}

/// A scripted set of GPUs answering NVML's questions.
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

/// One H200 with `processes` on it (unit tests).
#[cfg(test)]
pub(crate) fn fake_h200(processes: Vec<crate::protocol::GpuProcess>) -> FakeGpus {
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
