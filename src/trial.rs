//! The trial child: the hidden `batchfit __trial SPEC` subcommand.
//!
//! It is the only place (with `batchfit-train`) that runs training steps. It builds the model, runs
//! `steps` full training steps at `batch`, measures, and prints one result line on stdout. The parent
//! ([`crate::backend::cpu`]) sets the memory limit before exec and classifies what comes back; a child
//! that dies without a result line is never counted as a fit.
//!
//! Hang-proofing (a tch OOM panic with backtraces on was seen to deadlock a child at 0% CPU for 19
//! minutes): the parent starts children with `RUST_BACKTRACE=0`, the panic hook installed here does
//! nothing (so it cannot allocate), the panic payload is read after unwinding has freed the step's
//! tensors, and the parent kills a child that outlives `--trial-timeout`.

use crate::backend::{AllocatorReport, FootprintMethod, GpuMeasure, TrialOutcome};
use crate::models::ModelSpec;
use crate::step::{Learner, StepError, Synthetic};
use crate::sysmem;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Printed on stdout once the process is set up (before any model work).
pub const STARTED_MARKER: &str = "BATCHFIT-TRIAL-STARTED";
/// Prefix of the result line on stdout.
pub const RESULT_PREFIX: &str = "BATCHFIT-TRIAL-RESULT ";

/// A fault to inject, for testing the parent's handling (hidden flag; never set by users).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Sleep forever (the parent's timeout must kill it).
    Hang,
    /// Abort with SIGABRT.
    Crash,
    /// Die by SIGKILL (not from the kernel's OOM killer: must count as an error, not an oom).
    Kill,
    /// Report a NaN loss.
    Nan,
    /// Exit 0 without printing a result.
    NoResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultAt {
    pub fault: Fault,
    /// The fault fires for trials at this batch size or larger.
    pub min_batch: u64,
}

impl FaultAt {
    /// Parses `hang`, `crash@512`, `nan@1`, `no-result@64`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, at) = s.split_once('@').unwrap_or((s, "1"));
        let fault = match name {
            "hang" => Fault::Hang,
            "crash" => Fault::Crash,
            "kill" => Fault::Kill,
            "nan" => Fault::Nan,
            "no-result" => Fault::NoResult,
            _ => {
                return Err(format!(
                    "unknown fault {name:?} (hang, crash, kill, nan, no-result)"
                ))
            }
        };
        let min_batch = at.parse().map_err(|_| format!("bad fault batch {at:?}"))?;
        Ok(FaultAt { fault, min_batch })
    }
}

/// Everything a trial child needs (passed as JSON on its command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialSpec {
    pub model: ModelSpec,
    pub batch: u64,
    pub steps: u32,
    /// libtorch intra-op threads (the trainer uses the same number).
    pub threads: u32,
    pub seed: i64,
    /// Micro-batches of `batch` per optimizer step (gradient accumulation).
    #[serde(default = "one")]
    pub accumulation: u32,
    #[serde(default)]
    pub fault: Option<FaultAt>,
    /// Run on this CUDA device (NVML's index; trials run with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so both
    /// orders agree) instead of the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_device: Option<u32>,
}

/// libtorch threads: set identically by trials and the trainer.
pub fn configure_threads(threads: u32) {
    tch::set_num_threads(threads.max(1) as i32);
}

/// Samples the process's data segment every millisecond: the quantity `RLIMIT_DATA` acts on.
/// (Trials, and `batchfit-train` under `--memory-limit`.)
pub struct DataSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl DataSampler {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), peak.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(st) = sysmem::proc_status() {
                    p.fetch_max(st.vm_data, Ordering::Relaxed);
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
    /// The largest data segment seen so far.
    pub fn peak(&self) -> u64 {
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// Runs the trial in this process and returns its outcome. `Err` carries a message for setup failures.
pub fn run(spec: &TrialSpec) -> TrialOutcome {
    if let Some(f) = spec.fault.filter(|f| spec.batch >= f.min_batch) {
        match f.fault {
            Fault::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            Fault::Crash => std::process::abort(),
            Fault::Kill => {
                // SAFETY: raising a signal on ourselves.
                unsafe { libc::raise(libc::SIGKILL) };
                unreachable!("SIGKILL cannot be caught")
            }
            Fault::NoResult => {
                let _ = std::io::stdout().flush();
                // SAFETY: exiting without running destructors is the point of this fault.
                unsafe { libc::_exit(0) }
            }
            Fault::Nan => {
                return TrialOutcome::Error {
                    message: StepError::NonFinite(f64::NAN).to_string(),
                }
            }
        }
    }
    configure_threads(spec.threads);
    if let Some(index) = spec.cuda_device {
        return run_cuda(spec, index);
    }
    let sampler = DataSampler::start();
    let result = train(spec, tch::Device::Cpu);
    let sampled = sampler.finish();
    let end = sysmem::proc_status().unwrap_or_default();
    // The quantity RLIMIT_DATA acts on. (An estimate from the RSS high-water mark was tried and
    // over-counts: it includes library pages faulted in during the steps.)
    let peak = sampled.max(end.vm_data);
    let rss = Some(end.vm_hwm);
    outcome(
        onednn_starved(result, peak, sysmem::data_limit()),
        peak,
        rss,
        None,
    )
}

/// oneDNN (libtorch's CPU convolutions) reports a failed allocation of its scratchpad or workspace
/// as "could not execute a primitive". Under `RLIMIT_DATA`, when the data segment had reached 95 % of
/// the limit, memory is what failed: the error becomes an OOM, saying why (the failures seen were at
/// 99-100 %). Farther from the limit it stays an error: libtorch's own footprint alone can be most of
/// a small limit, and a real oneDNN failure must not pass for a size that does not fit.
fn onednn_starved(result: Steps, peak: u64, limit: Option<u64>) -> Steps {
    let err = match result {
        Ok(Err(e)) => e,
        Err(payload) => crate::step::classify(crate::step::panic_message(payload.as_ref())),
        done => return done,
    };
    Ok(Err(match err {
        StepError::Other(m) => match onednn_oom(&m, peak, limit) {
            Some(oom) => StepError::Oom(oom),
            None => StepError::Other(m),
        },
        e => e,
    }))
}

/// The OOM message for `msg` when it is oneDNN's failure and the data segment (`peak`) had reached
/// 95 % of `limit` (see [`onednn_starved`]); `None` otherwise.
pub fn onednn_oom(msg: &str, peak: u64, limit: Option<u64>) -> Option<String> {
    let limit = limit.filter(|&l| l > 0 && peak.saturating_mul(20) >= l.saturating_mul(19))?;
    crate::oom::is_onednn_failure(msg).then(|| {
        format!(
            "{msg} (oneDNN failed with the data segment at {:.0}% of the memory limit: an \
             allocation inside it ran out)",
            peak as f64 / limit as f64 * 100.0
        )
    })
}

/// What a trial's steps return: a caught panic, a step's error, or the seconds of each step.
type Steps = std::thread::Result<Result<Vec<f64>, StepError>>;

/// The training steps of a trial; `Ok` holds the seconds per micro-batch of each step.
fn train(spec: &TrialSpec, device: tch::Device) -> Steps {
    std::panic::catch_unwind(|| -> Result<Vec<f64>, StepError> {
        let mut learner = Learner::new(&spec.model, device, 1e-3, spec.seed)?;
        let mut data = Synthetic::for_spec(&spec.model);
        let mut times = Vec::with_capacity(spec.steps as usize);
        let micro = vec![spec.batch; spec.accumulation.max(1) as usize];
        for _ in 0..spec.steps {
            let t0 = Instant::now();
            learner.step(&micro, &mut data)?;
            if let tch::Device::Cuda(i) = device {
                // kernels run asynchronously: a step ends when the device is done
                tch::Cuda::synchronize(i as i64);
            }
            // Seconds per micro-batch, so samples/s = batch / step_seconds also under accumulation.
            times.push(t0.elapsed().as_secs_f64() / micro.len() as f64);
        }
        Ok(times)
    })
}

/// Turns the steps' result into an outcome with the measured peak.
fn outcome(result: Steps, peak: u64, rss: Option<u64>, gpu: Option<GpuMeasure>) -> TrialOutcome {
    let allocator = gpu.and_then(|g| g.allocator);
    let ooms = allocator.map_or(0, |a| a.ooms);
    let outcome_of_error = |e: StepError| match e {
        StepError::Oom(m) => TrialOutcome::Oom {
            message: m,
            peak_bytes: Some(peak),
            rss_peak_bytes: rss,
            gpu,
        },
        // cuDNN and cuBLAS catch the allocator's "out of memory" and try with less workspace; when no
        // choice is left they raise their own error (e.g. "GET was unable to find an engine to
        // execute this computation"). The allocator's OOM counter says memory is what ran out; other
        // errors (a device-side assert, bad data) stay errors whatever the counter says.
        StepError::Other(m) if ooms > 0 && crate::oom::is_cuda_library_failure(&m) => {
            TrialOutcome::Oom {
                message: format!(
                    "{m} (the CUDA allocator ran out of memory {ooms} time(s) in this trial)"
                ),
                peak_bytes: Some(peak),
                rss_peak_bytes: rss,
                gpu,
            }
        }
        other => TrialOutcome::Error {
            message: other.to_string(),
        },
    };
    match result {
        Ok(Ok(mut times)) => {
            let step_seconds = if times.len() >= 2 {
                median(&mut times[1..])
            } else {
                median(&mut times)
            };
            // The allocator counts a retry (cache flushed, allocation tried again) also before each
            // OOM it raises, including those cuDNN catches while it looks for a smaller workspace:
            // only retries that succeeded mean "fits only by flushing the cache".
            match allocator.map(|a| a.alloc_retries.saturating_sub(a.ooms)) {
                Some(retries) if retries > 0 => TrialOutcome::Retries {
                    retries,
                    peak_bytes: peak,
                    step_seconds,
                    gpu,
                },
                _ => TrialOutcome::Fits {
                    peak_bytes: peak,
                    rss_peak_bytes: rss,
                    step_seconds,
                    gpu,
                },
            }
        }
        Ok(Err(e)) => outcome_of_error(e),
        Err(payload) => outcome_of_error(crate::step::classify(crate::step::panic_message(
            payload.as_ref(),
        ))),
    }
}

/// A trial on CUDA device `index`: the caching allocator's statistics (through the shim) around the
/// steps, and NVML's view of this process at the end. The parent samples NVML during the trial and
/// decides with the larger of its samples and this report.
fn run_cuda(spec: &TrialSpec, index: u32) -> TrialOutcome {
    use crate::gpu::allocator;
    use crate::gpu::GpuQuery;
    // The parent starts the trial with CUDA_VISIBLE_DEVICES = this GPU's UUID: it is cuda:0 here.
    // `index` is NVML's, for NVML's per-process figure.
    let dev = 0usize;
    if !tch::Cuda::is_available() || tch::Cuda::device_count() < 1 {
        return TrialOutcome::Error {
            message: format!(
                "libtorch sees no CUDA device for GPU {index} (CUDA_VISIBLE_DEVICES={})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
            ),
        };
    }
    // Start from an empty cache and fresh peaks (a fresh process has them; a worker needs them).
    let before = allocator::empty_cache()
        .and_then(|_| allocator::reset_peak(dev))
        .and_then(|_| allocator::stats(dev));
    let before = match before {
        Ok(s) => s,
        Err(e) => {
            return TrialOutcome::Error {
                message: format!("cannot read the CUDA allocator's statistics: {e}"),
            }
        }
    };
    let result = train(spec, tch::Device::Cuda(dev));
    let after = match allocator::stats(dev) {
        Ok(s) => s,
        Err(e) => {
            return TrialOutcome::Error {
                message: format!("cannot read the CUDA allocator's statistics: {e}"),
            }
        }
    };
    let report = AllocatorReport {
        peak_allocated_bytes: after.peak_allocated_bytes,
        peak_reserved_bytes: after.peak_reserved_bytes,
        reserved_bytes: after.reserved_bytes,
        alloc_retries: after.alloc_retries.saturating_sub(before.alloc_retries),
        ooms: after.ooms.saturating_sub(before.ooms),
    };
    // What the card gives up beyond the allocator's reserve (CUDA context, cuBLAS/cuDNN workspaces):
    // NVML's figure for this process now minus what the allocator holds now.
    let me = std::process::id();
    let nvml_now = crate::gpu::nvml::RealNvml::get()
        .ok()
        .and_then(|n| n.process_used(index, me).ok().flatten());
    let (peak, gpu) = match nvml_now {
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
    };
    outcome(result, peak, None, Some(gpu))
}

/// Entry point of the hidden subcommand: set up, report start, run, print the result, `_exit(0)`.
pub fn child_main(spec_json: &str) -> ! {
    // A hook that does nothing: it cannot allocate, so it cannot deadlock after an OOM.
    std::panic::set_hook(Box::new(|_| {}));
    let out = match serde_json::from_str::<TrialSpec>(spec_json) {
        Ok(spec) => {
            println!("{STARTED_MARKER}");
            let _ = std::io::stdout().flush();
            run(&spec)
        }
        Err(e) => TrialOutcome::Error {
            message: format!("bad trial spec: {e}"),
        },
    };
    let line = format!(
        "{RESULT_PREFIX}{}\n",
        serde_json::to_string(&out).unwrap_or_default()
    );
    let mut so = std::io::stdout();
    let _ = so.write_all(line.as_bytes());
    let _ = so.flush();
    // Skip libtorch's static destructors: the result is out, nothing else matters.
    // SAFETY: terminating the process.
    unsafe { libc::_exit(0) }
}

/// One trial request to the worker: the batch and steps; the rest comes from the worker's template.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct WorkerRequest {
    pub batch: u64,
    pub steps: u32,
    #[serde(default = "one")]
    pub accumulation: u32,
}

fn one() -> u32 {
    1
}

/// Entry point of the hidden `__worker TEMPLATE` subcommand (hybrid isolation): `TEMPLATE` is a
/// [`TrialSpec`] (model, threads, seed); one [`WorkerRequest`] per stdin line, the peak marks reset
/// before each, one result line each; exits at end of input.
pub fn worker_main(template_json: &str) -> ! {
    std::panic::set_hook(Box::new(|_| {}));
    let mut so = std::io::stdout();
    let _ = writeln!(so, "{STARTED_MARKER}");
    let _ = so.flush();
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::BufRead::read_line(&mut stdin.lock(), &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let parsed = serde_json::from_str::<TrialSpec>(template_json).and_then(|t| {
            serde_json::from_str::<WorkerRequest>(line.trim()).map(|r| TrialSpec {
                batch: r.batch,
                steps: r.steps,
                accumulation: r.accumulation,
                ..t
            })
        });
        let out = match parsed {
            Ok(spec) => {
                // Give freed heap back (RLIMIT_DATA counts it) and reset the peak mark, so this trial
                // starts as close to a fresh process as one process can.
                // SAFETY: plain libc call.
                unsafe { libc::malloc_trim(0) };
                let _ = sysmem::reset_peak_rss();
                run(&spec)
            }
            Err(e) => TrialOutcome::Error {
                message: format!("bad trial spec: {e}"),
            },
        };
        let _ = writeln!(
            so,
            "{RESULT_PREFIX}{}",
            serde_json::to_string(&out).unwrap_or_default()
        );
        let _ = so.flush();
    }
    // SAFETY: terminating the process.
    unsafe { libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(alloc_retries: u64, ooms: u64) -> Option<GpuMeasure> {
        Some(GpuMeasure {
            nvml_peak_bytes: 10 << 30,
            method: FootprintMethod::NvmlProcess,
            allocator: Some(AllocatorReport {
                alloc_retries,
                ooms,
                ..Default::default()
            }),
        })
    }

    fn done() -> Steps {
        Ok(Ok(vec![0.3, 0.1, 0.1]))
    }

    fn failed(e: StepError) -> Steps {
        Ok(Err(e))
    }

    #[test]
    fn retries_before_caught_ooms_are_not_retries() {
        // cuDNN caught two OOMs (each preceded by a retry) and the steps completed: a fit
        let o = outcome(done(), 1 << 30, None, gpu(2, 2));
        assert_eq!(o.kind(), "fits", "{o:?}");
        // one retry succeeded besides the one before a caught OOM: a `retries` outcome, counting one
        match outcome(done(), 1 << 30, None, gpu(3, 2)) {
            TrialOutcome::Retries { retries, .. } => assert_eq!(retries, 1),
            o => panic!("{o:?}"),
        }
        // off CUDA there is no allocator report
        assert_eq!(outcome(done(), 1 << 30, None, None).kind(), "fits");
    }

    #[test]
    fn onednn_failure_near_the_data_limit_is_an_oom() {
        let primitive = || failed(StepError::Other("could not execute a primitive".into()));
        let gib = 1u64 << 30;
        match onednn_starved(primitive(), gib * 97 / 100, Some(gib)) {
            Ok(Err(StepError::Oom(m))) => assert!(m.contains("at 97% of the memory limit"), "{m}"),
            r => panic!(
                "not an OOM: {:?}",
                r.map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
            ),
        }
        // the same failure far from the limit, or without one, stays an error
        for (peak, limit) in [(gib * 9 / 10, Some(gib)), (gib, None)] {
            let o = outcome(onednn_starved(primitive(), peak, limit), peak, None, None);
            assert_eq!(o.kind(), "error", "{peak} {limit:?}");
        }
        // other errors near the limit are left alone, a panic with oneDNN's text is caught too
        let o = onednn_starved(
            failed(StepError::Other("shape mismatch".into())),
            gib,
            Some(gib),
        );
        assert_eq!(outcome(o, gib, None, None).kind(), "error");
        let panic = |m: &str| -> Steps { Err(Box::new(m.to_string())) };
        let p = panic("could not execute a primitive");
        assert_eq!(
            outcome(onednn_starved(p, gib, Some(gib)), gib, None, None).kind(),
            "oom"
        );
        // creating a primitive fails for shapes oneDNN does not support: never an OOM
        let p = panic("could not create a primitive descriptor");
        assert_eq!(
            outcome(onednn_starved(p, gib, Some(gib)), gib, None, None).kind(),
            "error"
        );
        // completed steps pass through
        assert_eq!(
            outcome(onednn_starved(done(), gib, Some(gib)), gib, None, None).kind(),
            "fits"
        );
    }

    #[test]
    fn a_library_error_after_allocator_ooms_is_an_oom() {
        let engine = || {
            StepError::Other("GET was unable to find an engine to execute this computation".into())
        };
        let o = outcome(failed(engine()), 1 << 30, None, gpu(1, 1));
        match &o {
            TrialOutcome::Oom { message, .. } => {
                assert!(message.contains("unable to find an engine"), "{message}");
                assert!(message.contains("ran out of memory 1 time(s)"), "{message}");
            }
            o => panic!("{o:?}"),
        }
        // other errors stay errors after a caught OOM
        let assert = || StepError::Other("CUDA error: device-side assert triggered".into());
        assert_eq!(
            outcome(failed(assert()), 1 << 30, None, gpu(1, 1)).kind(),
            "error"
        );
        // without an OOM counted, the library's text is an error, not proof of a size that does not fit
        assert_eq!(
            outcome(failed(engine()), 1 << 30, None, gpu(0, 0)).kind(),
            "error"
        );
        assert_eq!(
            outcome(failed(engine()), 1 << 30, None, None).kind(),
            "error"
        );
        // a diverged step stays an error whatever the allocator saw
        let nan = outcome(
            failed(StepError::NonFinite(f64::NAN)),
            1 << 30,
            None,
            gpu(1, 1),
        );
        assert_eq!(nan.kind(), "error");
        // a panic with libtorch's OOM text is an OOM as before
        let p: Steps = Err(Box::new(
            "CUDA out of memory. Tried to allocate 2.00 GiB".to_string(),
        ));
        assert_eq!(outcome(p, 1 << 30, None, gpu(1, 1)).kind(), "oom");
    }
}
