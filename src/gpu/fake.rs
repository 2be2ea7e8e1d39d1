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

use super::{FakeGpus, GpuError, GpuInfo, GpuQuery};
use crate::backend::sim::SimSpec;
use serde::Deserialize;
use std::sync::Arc;

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

/// NVML as this process should see it: the fake GPUs when `BATCHFIT_FAKE_GPUS` is set, else the
/// real NVML (or its error).
pub fn query() -> Result<Arc<dyn GpuQuery + Send + Sync>, GpuError> {
    match Fake::from_env() {
        Some(f) => Ok(Arc::new(f?.gpus)),
        None => Ok(Arc::new(super::nvml::RealNvml::get()?)),
    }
}
