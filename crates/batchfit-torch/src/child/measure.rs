//! What a tch trial child measures about itself: its data segment (the quantity `RLIMIT_DATA` acts
//! on), sampled every millisecond, and on CUDA the caching allocator's statistics around the steps
//! plus NVML's figure for this process at the end. The parent adds its own samples (NVML on CUDA)
//! and decides.

use batchfit::platform::sysmem;
use batchfit::protocol::{AllocatorReport, FootprintMethod, GpuMeasure};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Samples the process's data segment every millisecond (trials, and `batchfit-train` under
/// `--memory-limit`).
pub struct DataSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl DataSampler {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        // the data segment now, before the thread's first turn: a step that fails at once (its first
        // allocation refused) is still measured, never read as 0
        let peak = Arc::new(AtomicU64::new(sysmem::vm_data_no_alloc().unwrap_or(0)));
        let (s, p) = (stop.clone(), peak.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                // no heap allocation here: near the limit one could fail and abort the process
                if let Some(d) = sysmem::vm_data_no_alloc() {
                    p.fetch_max(d, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        DataSampler {
            stop,
            peak,
            handle: Some(handle),
        }
    }
    /// The largest data segment seen so far, the data segment now included.
    pub fn peak(&self) -> u64 {
        if let Some(d) = sysmem::vm_data_no_alloc() {
            self.peak.fetch_max(d, Ordering::Relaxed);
        }
        self.peak.load(Ordering::Relaxed)
    }
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// The caching allocator of CUDA device `dev`, emptied and with fresh peaks, before the steps.
pub fn allocator_before(dev: usize) -> Result<crate::allocator::AllocatorStats, String> {
    use crate::allocator;
    allocator::empty_cache()
        .and_then(|_| allocator::reset_peak(dev))
        .and_then(|_| allocator::stats(dev))
        .map_err(|e| format!("cannot read the CUDA allocator's statistics: {e}"))
}

/// The allocator's report of the steps (counters relative to `before`).
pub fn allocator_after(
    dev: usize,
    before: &crate::allocator::AllocatorStats,
) -> Result<AllocatorReport, String> {
    let after = crate::allocator::stats(dev)
        .map_err(|e| format!("cannot read the CUDA allocator's statistics: {e}"))?;
    Ok(AllocatorReport {
        peak_allocated_bytes: after.peak_allocated_bytes,
        peak_reserved_bytes: after.peak_reserved_bytes,
        reserved_bytes: after.reserved_bytes,
        alloc_retries: after.alloc_retries.saturating_sub(before.alloc_retries),
        ooms: after.ooms.saturating_sub(before.ooms),
    })
}

/// The footprint on the card of this process (NVML index `index`) and how it was measured: what
/// the card gives up beyond the allocator's reserve (CUDA context, cuBLAS/cuDNN workspaces) is
/// NVML's figure for this process now minus what the allocator holds now, added to the allocator's
/// peak reserve.
pub fn gpu_footprint(index: u32, report: AllocatorReport) -> (u64, GpuMeasure) {
    use batchfit::gpu::GpuQuery;
    let me = std::process::id();
    let nvml_now = batchfit::gpu::nvml::RealNvml::get()
        .ok()
        .and_then(|n| n.process_used(index, me).ok().flatten());
    match nvml_now {
        Some(now) => {
            let outside = now.saturating_sub(report.reserved_bytes);
            let peak = report.peak_reserved_bytes + outside;
            (
                peak,
                GpuMeasure {
                    nvml_peak_bytes: peak.max(now),
                    method: FootprintMethod::NvmlProcess,
                    allocator: Some(report),
                },
            )
        }
        // NVML cannot attribute memory to this PID (another PID namespace): the parent measures the
        // device's change in used memory instead; report the allocator's peak meanwhile.
        None => (
            report.peak_reserved_bytes,
            GpuMeasure {
                nvml_peak_bytes: 0,
                method: FootprintMethod::NvmlDeviceDelta,
                allocator: Some(report),
            },
        ),
    }
}

#[cfg(test)]
mod sampler_tests {
    use super::DataSampler;

    #[test]
    fn a_sampler_has_measured_the_data_segment_as_soon_as_it_starts() {
        let s = DataSampler::start();
        // before its thread has had a turn: a step refused at once is still measured
        assert!(s.peak() > 0);
        assert!(s.finish() > 0);
    }
}
