//! The CUDA backend: real training steps on `cuda:i` in a fresh child process per trial, with the
//! footprint measured the two ways that matter (see [`crate::backend::GpuMeasure`]):
//!
//! * **what the card gives up**, from NVML: the trial process's used memory (CUDA context + the caching
//!   allocator's reserve + library workspaces), sampled every few milliseconds by this parent and
//!   reported by the child at its end; where NVML cannot attribute memory to the trial's PID (another
//!   PID namespace), the device's change in used memory since before the trial. This decides the fit.
//! * **what the allocator saw**, through the C++ shim ([`crate::gpu::allocator`]): peak allocated and
//!   reserved bytes, allocation retries, OOMs. A trial that needed retries (the allocator flushed its
//!   cache to satisfy a request) is outcome `retries`, which bounds the search like an OOM.
//!
//! Each trial runs under `PYTORCH_CUDA_ALLOC_CONF` = the user's setting plus
//! `per_process_memory_fraction` = limit / CUDA's total, so the allocator itself raises "CUDA out of memory"
//! at the limit (as `RLIMIT_DATA` does on the cpu backend) and a trial never takes memory other jobs
//! on the card are using. The CUDA context lies outside that fraction; NVML's figure counts it.
//!
//! The backend compiles everywhere. Without a driver, NVML's error (naming the cpu and sim backends)
//! is returned before any trial. For tests, `BATCHFIT_FAKE_GPUS=FILE` (see [`fake`])
//! replaces NVML with scripted GPUs and the trials with simulated curves, the way hyperfine's mock
//! executor lets its integration tests run the real binary.

pub mod fake;

use super::process::{self, Ran};
use super::sim::SimBackend;
use super::{Backend, BackendError, DeviceInfo, DeviceKind, LimitMechanism};
use crate::gpu::{GpuInfo, GpuQuery};
use crate::platform::units::format_size;
use crate::protocol::{
    FootprintMethod, GpuMeasure, Isolation, Placement, TrialDetails, TrialOutcome, TrialRequest,
    Workload,
};
use std::sync::Arc;
use std::time::Duration;

/// How trials run.
pub enum Executor {
    /// Trial processes of a workload on the GPU.
    Real(Arc<dyn Workload>),
    /// A simulated memory curve (tests with fake GPUs, [`fake`]).
    Fake(SimBackend),
}

pub struct CudaBackend {
    gpus: Arc<dyn GpuQuery + Send + Sync>,
    index: u32,
    info: GpuInfo,
    device: DeviceInfo,
    limit: u64,
    exec: Executor,
    alloc_conf: Option<String>,
    timeout: Duration,
    /// The other GPUs a trial runs on (a user's command over several GPUs, [`Self::with_group`]).
    group: Vec<GpuInfo>,
    /// `--logs DIR`: each trial's whole output.
    logs: Option<std::path::PathBuf>,
    trials: u32,
    details: Option<TrialDetails>,
}

/// The GPUs as this process sees them: NVML, or in tests the scripted GPUs of `BATCHFIT_FAKE_GPUS`
/// ([`fake`]).
pub fn gpus() -> Result<Arc<dyn GpuQuery + Send + Sync>, crate::gpu::GpuError> {
    match fake::Fake::from_env() {
        Some(f) => Ok(Arc::new(f?.gpus)),
        None => Ok(Arc::new(crate::gpu::nvml::RealNvml::get()?)),
    }
}

/// `PYTORCH_CUDA_ALLOC_CONF` for a trial: the user's options (any `per_process_memory_fraction` of
/// theirs replaced) plus the fraction that makes the allocator stop at the limit. `total` is CUDA's
/// total ([`GpuInfo::cuda_total_bytes`]), which the allocator multiplies the fraction by.
pub fn trial_alloc_conf(user: Option<&str>, limit: u64, total: u64) -> String {
    let fraction = (limit as f64 / total.max(1) as f64).clamp(0.0, 1.0);
    let mut parts: Vec<String> = user
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.starts_with("per_process_memory_fraction"))
        .map(String::from)
        .collect();
    parts.push(format!("per_process_memory_fraction:{fraction:.6}"));
    parts.join(",")
}

impl CudaBackend {
    /// The backend for GPU `index`. Fails (with NVML's own reason) when the GPU cannot be queried.
    pub fn new(
        gpus: Arc<dyn GpuQuery + Send + Sync>,
        index: u32,
        exec: Executor,
        alloc_conf: Option<String>,
        timeout: Duration,
    ) -> Result<Self, BackendError> {
        let info = gpus
            .device(index)
            .map_err(|e| BackendError::Environment(e.to_string()))?;
        if info.total_bytes == 0 || info.free_bytes == 0 {
            return Err(BackendError::Environment(format!(
                "NVML reports {} free of {} on GPU {index} ({}): nothing to probe",
                format_size(info.free_bytes),
                format_size(info.total_bytes),
                info.name
            )));
        }
        let device = DeviceInfo {
            kind: DeviceKind::Cuda,
            name: info.name.clone(),
            total_bytes: info.total_bytes,
            free_bytes_at_start: info.free_bytes,
        };
        Ok(CudaBackend {
            gpus,
            index,
            limit: info.free_bytes,
            info,
            device,
            exec,
            alloc_conf,
            timeout,
            group: vec![],
            logs: None,
            trials: 0,
            details: None,
        })
    }

    /// Each trial's whole output into `dir`.
    pub fn with_logs(mut self, dir: std::path::PathBuf) -> Self {
        self.logs = Some(dir);
        self
    }

    /// The GPU as NVML saw it at the start (other processes included).
    pub fn gpu(&self) -> &GpuInfo {
        &self.info
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// Every GPU a trial runs on: this one, then the others of the group.
    fn all_gpus(&self) -> Vec<&GpuInfo> {
        std::iter::once(&self.info).chain(&self.group).collect()
    }

    /// A trial on this GPU and on the GPUs `others` together (a user's torchrun/DDP command
    /// spanning them): each of its processes sees all of them, each GPU is held to the limit, and
    /// the budget is the smallest free memory among them.
    pub fn with_group(mut self, others: &[u32]) -> Result<Self, BackendError> {
        for &i in others {
            let g = self
                .gpus
                .device(i)
                .map_err(|e| BackendError::Environment(e.to_string()))?;
            self.device.free_bytes_at_start = self.device.free_bytes_at_start.min(g.free_bytes);
            self.device.total_bytes = self.device.total_bytes.min(g.total_bytes);
            self.limit = self.limit.min(g.free_bytes);
            self.group.push(g);
        }
        Ok(self)
    }

    /// The used memory of GPU `g` before a trial: wait (up to 2 s) for the previous trial's memory
    /// to be released, and never take a baseline above the one at the start (an inflated baseline
    /// would under-count this trial: the unsafe direction).
    fn baseline(&self, g: &GpuInfo) -> Result<u64, BackendError> {
        let t0 = std::time::Instant::now();
        loop {
            let now = self
                .gpus
                .used_bytes(g.index)
                .map_err(|e| BackendError::Environment(e.to_string()))?;
            if now <= g.used_bytes + (256 << 20) || t0.elapsed() > Duration::from_secs(2) {
                return Ok(now.min(g.used_bytes));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn run_real(
        &mut self,
        workload: &dyn Workload,
        req: TrialRequest,
    ) -> Result<TrialOutcome, BackendError> {
        self.trials += 1;
        let uuids: Vec<String> = self.all_gpus().iter().map(|g| g.uuid.clone()).collect();
        let at = Placement::Cuda {
            nvml_index: self.index,
            uuid: uuids.join(","),
        };
        // (the device's baselines first: a trial whose command was made is ended by this function)
        let indices: Vec<u32> = self.all_gpus().iter().map(|g| g.index).collect();
        let baselines = self
            .all_gpus()
            .iter()
            .map(|g| self.baseline(g))
            .collect::<Result<Vec<_>, _>>()?;
        let (mut cmd, trial) = workload.command(&req, &at);
        // The trial sees exactly these GPUs (this one as cuda:0), whatever CUDA_VISIBLE_DEVICES the
        // user had (NVML's index and CUDA's ordinal differ when it is set or CUDA orders
        // fastest-first). The fraction is of the smallest card's CUDA total: no process of the trial
        // takes more than the limit of any of them.
        let cuda_total = self
            .all_gpus()
            .iter()
            .map(|g| g.cuda_total_bytes())
            .min()
            .unwrap_or(0);
        cmd.env("CUDA_VISIBLE_DEVICES", uuids.join(","))
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env(
                "PYTORCH_CUDA_ALLOC_CONF",
                trial_alloc_conf(self.alloc_conf.as_deref(), self.limit, cuda_total),
            );
        // per GPU: NVML's figure summed over the trial's process tree, and the device's used memory
        let mut pid_peaks: Vec<Option<u64>> = vec![None; indices.len()];
        let mut device_peaks: Vec<Option<u64>> = vec![None; indices.len()];
        let gpus = &self.gpus;
        let tree = workload.measured_by_device();
        let evidence = || workload.evidence_in(&trial);
        let opts = process::Options {
            tree,
            own_child: !tree,
            evidence: Some(process::EvidenceCheck(&evidence)),
            log: self.logs.as_ref().map(|d| {
                d.join(format!(
                    "trial-{:03}-gpu{}-b{}-a{}",
                    self.trials, self.index, req.batch, req.accumulation
                ))
            }),
            ..Default::default()
        };
        let ran = process::run(cmd, &opts, self.timeout, &mut |pids| {
            for (k, &index) in indices.iter().enumerate() {
                if let Ok(Some(b)) = gpus.processes_used(index, pids) {
                    pid_peaks[k] = Some(pid_peaks[k].map_or(b, |p| p.max(b)));
                }
                if let Ok(u) = gpus.used_bytes(index) {
                    device_peaks[k] = Some(device_peaks[k].map_or(u, |p| p.max(u)));
                }
            }
        });
        let judged = ran.map(|ran| match ran {
            Ran::Finished(f) => workload.outcome(&trial, &f),
            Ran::TimedOut { seconds, tail } => (
                TrialOutcome::Timeout { seconds },
                TrialDetails::timed_out(tail),
            ),
        });
        workload.trial_ended(&trial);
        let (out, details) = judged?;
        // The trial's footprint is its largest on any of its GPUs.
        let pid_peak = pid_peaks.iter().flatten().copied().max();
        let delta = device_peaks
            .iter()
            .zip(&baselines)
            .filter_map(|(p, b)| p.map(|p| p.saturating_sub(*b)))
            .max();
        self.details = details.map(|mut d| {
            d.gpu_peaks = indices
                .iter()
                .zip(&pid_peaks)
                .filter_map(|(i, p)| p.map(|p| (*i, p)))
                .collect();
            d
        });
        Ok(self.decide(out, pid_peak, delta))
    }

    /// Combines the child's report with this parent's NVML samples and applies the limit to the
    /// footprint the card gives up. A measurement that failed is an error, never a zero.
    fn decide(
        &self,
        out: TrialOutcome,
        pid_peak: Option<u64>,
        device_delta: Option<u64>,
    ) -> TrialOutcome {
        let measured = |child: Option<GpuMeasure>| -> Option<GpuMeasure> {
            let allocator = child.and_then(|g| g.allocator);
            let child_nvml = child
                .filter(|g| g.method == FootprintMethod::NvmlProcess)
                .map(|g| g.nvml_peak_bytes);
            if pid_peak.is_some() || child_nvml.is_some() {
                let peak = pid_peak.unwrap_or(0).max(child_nvml.unwrap_or(0));
                Some(GpuMeasure {
                    nvml_peak_bytes: peak,
                    method: FootprintMethod::NvmlProcess,
                    allocator,
                })
            } else {
                // The device's change in used memory, or at least the allocator's peak reserve.
                let floor = allocator.map(|a| a.peak_reserved_bytes);
                let peak = match (device_delta, floor) {
                    (None, None) => return None,
                    (d, f) => d.unwrap_or(0).max(f.unwrap_or(0)),
                };
                (peak > 0).then_some(GpuMeasure {
                    nvml_peak_bytes: peak,
                    method: FootprintMethod::NvmlDeviceDelta,
                    allocator,
                })
            }
        };
        match out {
            TrialOutcome::Fits { gpu, .. } | TrialOutcome::Retries { gpu, .. } => {
                match measured(gpu) {
                    None => TrialOutcome::Error {
                        message:
                            "the trial completed, but neither NVML nor the allocator measured its \
                              GPU memory"
                                .into(),
                    },
                    // A `retries` outcome is held to the limit too: retries happen when the
                    // allocator reaches its fraction cap, so NVML's footprint (the cap plus the
                    // CUDA context) is then typically above the limit, and `--allow-retries` must
                    // not accept it as a fit.
                    Some(g) if g.nvml_peak_bytes > self.limit => TrialOutcome::Oom {
                        message: format!(
                            "the trial's footprint on the card ({}, {}) is above the {} limit",
                            format_size(g.nvml_peak_bytes),
                            method_name(g.method),
                            format_size(self.limit)
                        ),
                        peak_bytes: Some(g.nvml_peak_bytes),
                        rss_peak_bytes: None,
                        gpu: Some(g),
                    },
                    Some(g) => out.measured_by(g),
                }
            }
            TrialOutcome::Oom { message, gpu, .. } => {
                let g = measured(gpu);
                TrialOutcome::Oom {
                    message,
                    peak_bytes: g.map(|g| g.nvml_peak_bytes),
                    rss_peak_bytes: None,
                    gpu: g,
                }
            }
            other => other,
        }
    }
}

pub fn method_name(m: FootprintMethod) -> &'static str {
    match m {
        FootprintMethod::NvmlProcess => "NVML, trial process",
        FootprintMethod::NvmlDeviceDelta => "NVML, device used-memory change",
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }
    /// NVML's free memory at the start: what other processes hold is not available to this job.
    fn default_budget(&self) -> u64 {
        self.device.free_bytes_at_start
    }
    fn set_limit(&mut self, limit_bytes: u64) {
        self.limit = limit_bytes;
        if let Executor::Fake(sim) = &mut self.exec {
            sim.set_limit(limit_bytes);
        }
    }
    fn isolation(&self, _req: &TrialRequest) -> Isolation {
        match self.exec {
            Executor::Real(_) => Isolation::Process,
            Executor::Fake(_) => Isolation::None,
        }
    }
    fn limit_mechanism(&self) -> LimitMechanism {
        match self.exec {
            Executor::Real(_) => LimitMechanism::CudaFraction,
            Executor::Fake(_) => LimitMechanism::Simulated,
        }
    }
    fn take_details(&mut self) -> Option<TrialDetails> {
        self.details.take()
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.details = None;
        match &mut self.exec {
            Executor::Fake(sim) => {
                let out = sim.run_trial(req)?;
                let peak = sim.spec().peak_at(req.batch, req.steps, req.accumulation);
                let g = GpuMeasure {
                    nvml_peak_bytes: peak,
                    method: FootprintMethod::NvmlProcess,
                    allocator: None,
                };
                Ok(match out {
                    TrialOutcome::Oom { .. } => TrialOutcome::Oom {
                        message: format!(
                            "CUDA out of memory (simulated). Tried to use {} of a {} limit",
                            format_size(peak),
                            format_size(self.limit)
                        ),
                        peak_bytes: None,
                        rss_peak_bytes: None,
                        gpu: None,
                    },
                    other => other.measured_by(g),
                })
            }
            Executor::Real(w) => {
                let w = Arc::clone(w);
                self.run_real(w.as_ref(), req)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AllocatorReport;
    use fake::fake_h200;

    fn backend(limit: u64) -> CudaBackend {
        let gpus: Arc<dyn GpuQuery + Send + Sync> = Arc::new(fake_h200(vec![]));
        let mut b = CudaBackend::new(
            gpus,
            0,
            Executor::Fake(SimBackend::new(crate::device::sim::SimSpec::affine(
                1 << 30,
                1 << 20,
                141 << 30,
            ))),
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        b.set_limit(limit);
        b
    }

    fn fits(gpu: Option<GpuMeasure>) -> TrialOutcome {
        TrialOutcome::Fits {
            peak_bytes: 1,
            rss_peak_bytes: None,
            step_seconds: 0.1,
            gpu,
        }
    }

    fn alloc(peak_reserved: u64) -> AllocatorReport {
        AllocatorReport {
            peak_allocated_bytes: peak_reserved / 2,
            peak_reserved_bytes: peak_reserved,
            reserved_bytes: peak_reserved,
            alloc_retries: 0,
            ooms: 0,
        }
    }

    #[test]
    fn footprint_is_the_larger_nvml_figure_and_decides_the_fit() {
        let b = backend(10 << 30);
        let child = GpuMeasure {
            nvml_peak_bytes: 6 << 30,
            method: FootprintMethod::NvmlProcess,
            allocator: Some(alloc(5 << 30)),
        };
        // the parent's samples saw more than the child's end-of-trial estimate
        match b.decide(fits(Some(child)), Some(7 << 30), Some(9 << 30)) {
            TrialOutcome::Fits {
                peak_bytes, gpu, ..
            } => {
                assert_eq!(peak_bytes, 7 << 30);
                assert_eq!(gpu.unwrap().method, FootprintMethod::NvmlProcess);
            }
            o => panic!("{o:?}"),
        }
        // above the limit on the card: an oom, whatever the allocator thinks
        let o = b.decide(fits(Some(child)), Some(11 << 30), None);
        assert!(o.is_oom(), "{o:?}");
        assert!(o.message().unwrap().contains("above the"), "{o:?}");
    }

    #[test]
    fn retries_above_the_limit_are_out_of_memory() {
        // --allow-retries turns a `retries` outcome into a fit; one whose footprint on the card is
        // above the limit (the allocator at its cap plus the CUDA context) must not get that far
        let b = backend(10 << 30);
        let child = GpuMeasure {
            nvml_peak_bytes: (10 << 30) + (500 << 20),
            method: FootprintMethod::NvmlProcess,
            allocator: Some(alloc(10 << 30)),
        };
        let retries = TrialOutcome::Retries {
            retries: 3,
            peak_bytes: 1,
            step_seconds: 0.1,
            gpu: Some(child),
        };
        let o = b.decide(retries.clone(), None, None);
        assert!(o.is_oom(), "{o:?}");
        assert!(o.message().unwrap().contains("above the"), "{o:?}");
        // under the limit it stays `retries` (the search's --allow-retries decides)
        let mut under = child;
        under.nvml_peak_bytes = 9 << 30;
        let o = b.decide(
            TrialOutcome::Retries {
                retries: 3,
                peak_bytes: 1,
                step_seconds: 0.1,
                gpu: Some(under),
            },
            None,
            None,
        );
        assert_eq!(o.kind(), "retries", "{o:?}");
    }

    #[test]
    fn falls_back_to_the_device_delta_and_fails_loudly_without_any_measure() {
        let b = backend(10 << 30);
        let child = GpuMeasure {
            nvml_peak_bytes: 0,
            method: FootprintMethod::NvmlDeviceDelta,
            allocator: Some(alloc(3 << 30)),
        };
        match b.decide(fits(Some(child)), None, Some(4 << 30)) {
            TrialOutcome::Fits {
                peak_bytes, gpu, ..
            } => {
                assert_eq!(peak_bytes, 4 << 30);
                assert_eq!(gpu.unwrap().method, FootprintMethod::NvmlDeviceDelta);
            }
            o => panic!("{o:?}"),
        }
        // no sample of the delta: the allocator's reserve is the floor
        match b.decide(fits(Some(child)), None, None) {
            TrialOutcome::Fits { peak_bytes, .. } => assert_eq!(peak_bytes, 3 << 30),
            o => panic!("{o:?}"),
        }
        // nothing measured at all: an error, never a zero
        let o = b.decide(fits(None), None, None);
        assert_eq!(o.kind(), "error", "{o:?}");
    }

    #[test]
    fn alloc_conf_for_trials() {
        assert_eq!(
            trial_alloc_conf(None, 50, 100),
            "per_process_memory_fraction:0.500000"
        );
        assert_eq!(
            trial_alloc_conf(
                Some("expandable_segments:True, per_process_memory_fraction:0.9"),
                25,
                100
            ),
            "expandable_segments:True,per_process_memory_fraction:0.250000"
        );
        // the fraction is of CUDA's total, which leaves out the driver's reserve
        let mut g = fake_h200(vec![]).gpus[0].clone();
        assert_eq!(g.cuda_total_bytes(), g.total_bytes - (600 << 20));
        // a reserve as large as the card is no reserve: the allocator's cap must not vanish
        let mut odd = g.clone();
        odd.reserved_bytes = odd.total_bytes;
        assert_eq!(odd.cuda_total_bytes(), odd.total_bytes);
        g.reserved_bytes = 600 << 20;
        assert_eq!(
            trial_alloc_conf(None, g.cuda_total_bytes() / 2, g.cuda_total_bytes()),
            "per_process_memory_fraction:0.500000"
        );
    }

    #[test]
    fn budget_is_nvml_free_memory() {
        let gpus: Arc<dyn GpuQuery + Send + Sync> =
            Arc::new(fake_h200(vec![crate::protocol::GpuProcess {
                pid: 1234,
                used_bytes: Some(20 << 30),
            }]));
        let free = gpus.device(0).unwrap().free_bytes;
        let b = CudaBackend::new(
            gpus,
            0,
            Executor::Fake(SimBackend::new(crate::device::sim::SimSpec::affine(
                1,
                1,
                1 << 40,
            ))),
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(b.default_budget(), free);
        assert!(free < b.device().total_bytes - (20 << 30));
        assert_eq!(b.gpu().processes.len(), 1);
    }
}
