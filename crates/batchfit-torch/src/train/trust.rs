//! Whether to trust a plan on this machine: the trainer refuses a plan made on another torch or
//! device, a partial or unverified one, or one whose model config is not the model it names (exit 5
//! unless `--force`), and warns when less memory is free than when it was probed.

use anyhow::anyhow;
use batchfit::cli::TrainArgs;
use batchfit::device::cuda;
use batchfit::device::DeviceKind;
use batchfit::exit::{Exit, Fail};
use batchfit::plan::{Plan, Status};
use batchfit::platform::sysmem;
use batchfit::platform::units::format_size;

/// The version of the torch this process runs on: what the launcher found (the torch whose `lib/` it
/// put on the library path, as a probe finds it for its trials), else read beside the
/// `libtorch_cpu.so` this process mapped.
fn torch_here() -> Option<String> {
    if let Some(v) = std::env::var_os(batchfit::workload::runner::TORCH_VERSION_ENV) {
        return Some(v.to_string_lossy().into_owned()).filter(|v| !v.is_empty());
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))?;
    let torch = std::path::Path::new(lib).parent()?.parent()?;
    batchfit::workload::runner::torch_version(torch)
}

/// Reasons to refuse a plan (exit 5 unless --force).
fn refusals(plan: &Plan) -> Vec<String> {
    let mut r = vec![];
    // The plan's sizes were proven on the torch its trials ran on; another torch (another version,
    // or another build of it: CPU-only, another CUDA) allocates differently.
    if let (Some(made_on), Some(here)) = (plan.tool.libtorch_version.as_deref(), torch_here()) {
        if made_on != here {
            r.push(format!(
                "the plan was made on PyTorch {made_on} and this trainer runs on PyTorch {here}; \
                 re-probe on this torch, or run `batchfit verify PLAN` with it first, or use --force"
            ));
        }
    }
    match plan.status {
        Status::Complete => {}
        Status::Partial => r.push(format!(
            "the plan is partial (stopped: {}); finish the probe, or use --force",
            plan.stop_detail
        )),
        Status::NothingFits => r.push("the plan says nothing fits".into()),
    }
    if !plan.is_verified() {
        r.push(if plan.sources.is_empty() {
            "the plan is not verified (its last `batchfit verify` failed); re-probe, or use --force"
                .into()
        } else {
            format!(
                "the plan was merged from {} plans of other machines and is not verified here; run \
                 `batchfit verify PLAN` on this machine first, or use --force",
                plan.sources.len()
            )
        });
    }
    if let Some(m) = plan.model.model() {
        let rebuilt = m.config.fingerprint();
        if rebuilt != m.fingerprint {
            r.push(format!(
                "the plan was made for another model: its fingerprint is {} but its model config builds {}",
                m.fingerprint.get(..12).unwrap_or(&m.fingerprint),
                &rebuilt[..12]
            ));
        }
    }
    r.extend(another_device(plan));
    r
}

/// Why the plan's device is not this machine's, if it is not: another cpu (name, memory), a GPU
/// this machine lacks or another one at the plan's index, or the sim backend.
fn another_device(plan: &Plan) -> Option<String> {
    match plan.device.kind {
        DeviceKind::Cpu => {
            let name = sysmem::cpu_name();
            let total = sysmem::meminfo().map(|m| m.0).unwrap_or(0);
            let total = sysmem::cgroup_limit().map_or(total, |c| c.min(total));
            (name != plan.device.name || total != plan.device.total_bytes).then(|| {
                format!(
                    "the plan was made on another device: {} with {} (this machine: {} with {})",
                    plan.device.name,
                    format_size(plan.device.total_bytes),
                    name,
                    format_size(total)
                )
            })
        }
        DeviceKind::Cuda => another_gpu(plan),
        other @ DeviceKind::Sim => Some(format!(
            "the plan was made on the {other} backend ({}); batchfit-train runs cpu and cuda plans",
            plan.device.name
        )),
    }
}

/// Why the plan's GPU is not this machine's at the plan's NVML index, if it is not.
fn another_gpu(plan: &Plan) -> Option<String> {
    let index = plan.gpu.as_ref().map_or(0, |g| g.index);
    match cuda::gpus().and_then(|q| q.device(index)) {
        Err(e) => Some(format!(
            "the plan was made on cuda ({}, GPU {index}), which this machine cannot use: {e}",
            plan.device.name
        )),
        Ok(g) if g.name != plan.device.name || g.total_bytes != plan.device.total_bytes => {
            Some(format!(
                "the plan was made on another device: {} with {} (GPU {index} here: {} with {})",
                plan.device.name,
                format_size(plan.device.total_bytes),
                g.name,
                format_size(g.total_bytes)
            ))
        }
        Ok(_) if !tch::Cuda::is_available() => Some(format!(
            "NVML sees GPU {index} but libtorch sees no CUDA device here"
        )),
        Ok(_) => None,
    }
}

/// Whether the device has less memory free now than at probe time (other processes may leave too
/// little for the plan's micro-batch): cpu from `MemAvailable` (cgroup-aware), cuda from NVML.
fn less_memory_than_at_probe_time(plan: &Plan) -> Option<String> {
    let (now, what) = match plan.device.kind {
        DeviceKind::Cpu => (
            sysmem::available_bytes().ok()?,
            "of memory is available".to_string(),
        ),
        DeviceKind::Cuda => {
            let index = plan.gpu.as_ref().map_or(0, |g| g.index);
            let g = cuda::gpus().and_then(|q| q.device(index)).ok()?;
            let others: Vec<String> = g
                .processes
                .iter()
                .filter(|p| p.pid != std::process::id())
                .map(|p| match p.used_bytes {
                    Some(b) => format!("PID {} holds {}", p.pid, format_size(b)),
                    None => format!("PID {}", p.pid),
                })
                .collect();
            (
                g.free_bytes,
                format!(
                    "is free on GPU {index}{}",
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", others.join(", "))
                    }
                ),
            )
        }
        DeviceKind::Sim => return None,
    };
    let then = plan.device.free_bytes_at_start;
    ((now as f64) < then as f64 * 0.95 || now < plan.limit_bytes).then(|| {
        format!(
            "{} {what} now, less than the {} at probe time; other processes may leave too little \
             for the plan's micro-batch",
            format_size(now),
            format_size(then)
        )
    })
}

/// Refuses a plan this machine cannot trust (exit 5), or with `--force` warns of each reason; warns
/// too when less memory is free than at probe time.
pub(super) fn refuse_or_warn(a: &TrainArgs, plan: &Plan) -> Result<(), Fail> {
    let refused = refusals(plan);
    if !refused.is_empty() {
        if !a.force {
            return Err(Fail(
                Exit::Refused,
                anyhow!("refusing {}: {}", a.plan.display(), refused.join("; ")),
            ));
        }
        for r in &refused {
            batchfit::note!("batchfit-train: warning (--force): {r}");
        }
    }
    if let Some(w) = less_memory_than_at_probe_time(plan) {
        batchfit::note!("batchfit-train: warning: {w}");
    }
    Ok(())
}
