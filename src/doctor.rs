//! `batchfit doctor`: what the GPUs hold, and why a job can run out of memory while memory looks free.
//!
//! A pure function of what NVML reports (and, optionally, a plan), so it is tested with fakes. The JSON
//! form always parses, with the error inside when there is no driver.

use crate::gpu::{GpuError, GpuInfo, GpuQuery};
use crate::plan::Plan;
use crate::platform::units::format_size;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
    /// Why "out of memory although memory looks free" can happen here, most relevant first.
    pub findings: Vec<String>,
    /// What to do about it.
    pub advice: Vec<String>,
    /// batchfit's torch runner (for `--model` probes and `batchfit-train`) and the torch it found,
    /// or why not (`--exec` probes need neither).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_runner: Option<String>,
}

const GENERIC: &[&str] = &[
    "nvidia-smi's \"free\" is free *now*: the CUDA context of a new process (several hundred MiB) and \
     other processes' later allocations come out of it",
    "PyTorch's caching allocator keeps freed blocks reserved for reuse; reserved-but-unallocated memory \
     counts as used to the card, and a large request can fail although the sum of free blocks is enough \
     (fragmentation)",
    "an allocation that first fails makes the allocator flush its cache and retry; a batch that only fits \
     after retries runs slowly and fails under slight pressure",
];

pub fn diagnose(q: &dyn GpuQuery, plan: Option<&Plan>) -> DoctorReport {
    let mut r = DoctorReport {
        ok: true,
        error: None,
        driver_version: None,
        gpus: vec![],
        findings: vec![],
        advice: vec![],
        torch_runner: None,
    };
    match q.driver_version().and_then(|v| q.devices().map(|g| (v, g))) {
        Err(e) => {
            r.ok = false;
            r.error = Some(e.to_string());
            if matches!(e, GpuError::NoDriver(_)) {
                r.advice.push("on this machine, probe with --backend cpu, or test the search with --backend sim".into());
            }
        }
        Ok((v, gpus)) => {
            r.driver_version = Some(v);
            r.findings.extend(gpus.iter().flat_map(gpu_findings));
            r.gpus = gpus;
        }
    }
    if let Some((p, rec)) = plan.and_then(|p| Some((p, p.recommendation.as_ref()?))) {
        let findings = plan_findings(p, rec, &r.gpus);
        r.findings.extend(findings);
    }
    r.findings.extend(GENERIC.iter().map(|s| s.to_string()));
    r.advice.extend(ADVICE.map(String::from));
    r
}

/// What doctor always advises.
const ADVICE: [&str; 5] = [
    "run `batchfit probe` on the machine and in the conditions of the job, and train with its micro-batch \
     and accumulation (`--format env` or `--format deepspeed` for job scripts)",
    "a smaller micro-batch with more accumulation steps gives the same gradients (except for batch-coupled \
     layers such as BatchNorm)",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to reduce fragmentation",
    "use bf16 mixed precision (--precision amp-bf16) to shrink activations",
    "keep --reserve for what the probe does not run (evaluation, pinned data-loader memory)",
];

/// What a GPU shows now: other processes' memory, and memory no visible process accounts for.
fn gpu_findings(g: &crate::gpu::GpuInfo) -> Vec<String> {
    let mut out = vec![];
    let others: Vec<_> = g
        .processes
        .iter()
        .filter(|p| p.pid != std::process::id())
        .collect();
    if !others.is_empty() {
        let known: u64 = others.iter().filter_map(|p| p.used_bytes).sum();
        let unknown = others.iter().filter(|p| p.used_bytes.is_none()).count();
        out.push(format!(
            "GPU {} ({}) has {} other process(es) holding {}{}: that memory is not yours, and they can \
             grow while your job runs",
            g.index,
            g.name,
            others.len(),
            format_size(known),
            if unknown > 0 { format!(" (+{unknown} whose usage NVML does not report)") } else { String::new() }
        ));
    }
    let unexplained = g
        .used_bytes
        .saturating_sub(g.processes.iter().filter_map(|p| p.used_bytes).sum());
    if unexplained > (1 << 30) {
        out.push(format!(
            "GPU {}: {} is used but attributed to no visible process (another container's PID \
             namespace, or the driver)",
            g.index,
            format_size(unexplained)
        ));
    }
    out
}

/// What a plan's recommendation says against the GPUs seen now: its headroom, the allocator's
/// view, sizes that needed retries, other processes when it was made, free memory since.
fn plan_findings(
    p: &Plan,
    rec: &crate::plan::Recommendation,
    gpus: &[crate::gpu::GpuInfo],
) -> Vec<String> {
    let mut out = vec![format!(
        "the plan ({} on {}) measured {} at micro-batch {} against a limit of {} ({} headroom, margin {:.0}%)",
        p.model.name(),
        p.device.name,
        format_size(rec.peak_bytes),
        rec.micro_batch,
        format_size(p.limit_bytes),
        format_size(p.limit_bytes.saturating_sub(rec.peak_bytes)),
        p.margin * 100.0
    )];
    out.extend(allocator_finding(p, rec));
    let retried: Vec<String> = p
        .trials
        .iter()
        .filter(|t| t.outcome.kind() == "retries")
        .map(|t| t.batch.to_string())
        .collect();
    if !retried.is_empty() {
        out.push(format!(
            "trials at micro-batch {} completed only after the allocator freed its cache and retried: \
             such sizes run slowly and fail under a little more pressure (the plan stays below them)",
            retried.join(", ")
        ));
    }
    if let Some(gs) = p.gpu.as_ref().filter(|g| !g.other_processes.is_empty()) {
        out.push(format!(
            "when the plan was made, {} other process(es) held {} on GPU {}; the plan's budget excludes it",
            gs.other_processes.len(),
            format_size(gs.other_processes_bytes),
            gs.index
        ));
    }
    let now = gpus.iter().find(|g| g.name == p.device.name);
    if let Some(g) = now.filter(|g| g.free_bytes < p.device.free_bytes_at_start) {
        out.push(format!(
            "GPU {} has {} free now, less than the {} when the plan was made: re-probe before training",
            g.index,
            format_size(g.free_bytes),
            format_size(p.device.free_bytes_at_start)
        ));
    }
    out
}

/// The allocator's view of the recommended size (CUDA plans): what is reserved but not in tensors is
/// the cache and its fragmentation, which nvidia-smi counts as used.
fn allocator_finding(p: &Plan, rec: &crate::plan::Recommendation) -> Option<String> {
    let (g, a) = p
        .trials
        .iter()
        .filter(|t| t.batch == rec.micro_batch && t.outcome.fits())
        .filter_map(|t| t.outcome.gpu().and_then(|g| g.allocator.map(|a| (g, a))))
        .max_by_key(|(_, a)| a.peak_reserved_bytes)?;
    Some(format!(
        "at micro-batch {}: tensors peaked at {}, the caching allocator reserved {} ({} reserved but \
         unallocated: cache and fragmentation), and the card gave up {} in all ({}; the rest is the CUDA \
         context and library workspaces)",
        rec.micro_batch,
        format_size(a.peak_allocated_bytes),
        format_size(a.peak_reserved_bytes),
        format_size(a.peak_reserved_bytes.saturating_sub(a.peak_allocated_bytes)),
        format_size(g.nvml_peak_bytes),
        crate::device::cuda::method_name(g.method)
    ))
}

impl DoctorReport {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        match (&self.error, &self.driver_version) {
            (Some(e), _) => s += &format!("GPUs: none usable: {e}\n"),
            (None, Some(v)) => s += &format!("NVIDIA driver {v}, {} GPU(s)\n", self.gpus.len()),
            _ => {}
        }
        for g in &self.gpus {
            s += &format!(
                "  GPU {} {} ({}): {} total, {} used, {} free{}\n",
                g.index,
                g.name,
                g.uuid,
                format_size(g.total_bytes),
                format_size(g.used_bytes),
                format_size(g.free_bytes),
                if g.reserved_bytes > 0 {
                    format!(
                        ", {} reserved by the driver (CUDA's total is {})",
                        format_size(g.reserved_bytes),
                        format_size(g.cuda_total_bytes())
                    )
                } else {
                    String::new()
                }
            );
            for p in &g.processes {
                s += &format!(
                    "    pid {:>8}: {}\n",
                    p.pid,
                    p.used_bytes
                        .map_or("usage not reported".into(), format_size)
                );
            }
        }
        if let Some(t) = &self.torch_runner {
            s += &format!("Model runner: {t}\n");
        }
        s += "\nWhy a job can run out of memory while memory looks free:\n";
        for f in &self.findings {
            s += &format!("  - {f}\n");
        }
        s += "\nWhat to do:\n";
        for a in &self.advice {
            s += &format!("  - {a}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::fake::{fake_h200, FakeGpus};
    use crate::gpu::GpuProcess;

    #[test]
    fn reports_other_processes_and_advice() {
        let f = fake_h200(vec![
            GpuProcess {
                pid: 4242,
                used_bytes: Some(20 << 30),
            },
            GpuProcess {
                pid: 4343,
                used_bytes: None,
            },
        ]);
        let r = diagnose(&f, None);
        assert!(r.ok);
        assert_eq!(r.gpus.len(), 1);
        assert!(
            r.findings[0].contains("2 other process(es) holding 20.00 GiB (+1 whose usage"),
            "{:?}",
            r.findings
        );
        let t = r.to_text();
        assert!(
            t.contains("NVIDIA H200")
                && t.contains("expandable_segments")
                && t.contains("pid     4242: 20.00 GiB")
                && t.contains("600.00 MiB reserved by the driver (CUDA's total is 140.41 GiB)"),
            "{t}"
        );
        let j: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(j["gpus"][0]["processes"][0]["pid"], 4242);
    }

    #[test]
    fn no_driver_is_an_error_inside_valid_json() {
        let f = FakeGpus {
            fail: Some(GpuError::NoDriver(
                "libnvidia-ml.so.1: cannot open shared object file".into(),
            )),
            ..Default::default()
        };
        let r = diagnose(&f, None);
        assert!(!r.ok);
        let j = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert!(v["error"].as_str().unwrap().contains("--backend cpu"));
        assert!(
            v["gpus"].as_array().unwrap().is_empty(),
            "no zeros invented"
        );
    }
}
