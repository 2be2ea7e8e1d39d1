//! The tch model's trial child: the runner's `batchfit-torch trial SPEC` and `batchfit-torch worker
//! TEMPLATE` subcommands.
//!
//! With `batchfit-train`, the only place that runs training steps. It builds the model, runs `steps`
//! full training steps at `batch`, measures ([`measure`]), classifies a failure with the one
//! classifier ([`batchfit::protocol::classify`]), and prints one result line on stdout
//! ([`batchfit::protocol::result_line`]). The parent (a [`batchfit::device`]) sets the memory limit
//! before exec and hands what came back to `batchfit::workload::ModelWorkload`; a child that dies without a
//! result line is never counted as a fit.
//!
//! Hang-proofing (a tch OOM panic with backtraces on was seen to deadlock a child at 0% CPU for 19
//! minutes): the parent starts children with `RUST_BACKTRACE=0`, the panic hook installed here does
//! nothing (so it cannot allocate), the panic payload is read after unwinding has freed the step's
//! tensors, and the parent kills a child that outlives `--trial-timeout`.

pub mod measure;

use crate::model::step::{panic_message, Learner, StepError, Synthetic};
use batchfit::platform::sysmem;
use batchfit::protocol::classify::{classify, Evidence, Verdict};
use batchfit::protocol::{GpuMeasure, TrialOutcome, TrialRequest, STARTED_MARKER};
use batchfit::workload::fault::Fault;
pub use batchfit::workload::runner::TrialSpec;
use measure::DataSampler;
use std::io::Write;
use std::time::Instant;

/// libtorch threads: set identically by trials and the trainer.
pub fn configure_threads(threads: u32) {
    tch::set_num_threads(threads.max(1) as i32);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// What a trial's steps return: a caught panic, a step's error, or the seconds of each step.
type Steps = std::thread::Result<Result<Vec<f64>, StepError>>;

/// What a trial's failure is evidence of (beyond its message).
#[derive(Debug, Clone, Copy, Default)]
struct Context {
    data_peak: Option<u64>,
    data_limit: Option<u64>,
    allocator_ooms: u64,
}

/// Runs the trial in this process and returns its outcome.
pub fn run(spec: &TrialSpec) -> TrialOutcome {
    if let Some(Fault::Nan) = spec.fault.and_then(|f| f.fire(spec.batch)) {
        return TrialOutcome::Error {
            message: StepError::NonFinite(f64::NAN).to_string(),
        };
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
    let ctx = Context {
        data_peak: Some(peak),
        data_limit: sysmem::data_limit(),
        allocator_ooms: 0,
    };
    outcome(result, peak, Some(end.vm_hwm), None, ctx)
}

/// The training steps of a trial; `Ok` holds the seconds per micro-batch of each step.
fn train(spec: &TrialSpec, device: tch::Device) -> Steps {
    std::panic::catch_unwind(|| -> Result<Vec<f64>, StepError> {
        let mut learner = Learner::new(&spec.model, device, 1e-3, spec.seed)?;
        let mut data = Synthetic::with_seed(&spec.model, spec.seed);
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

/// Turns the steps' result into an outcome with the measured peak; a failure is classified with the
/// evidence of `ctx`.
fn outcome(
    result: Steps,
    peak: u64,
    rss: Option<u64>,
    gpu: Option<GpuMeasure>,
    ctx: Context,
) -> TrialOutcome {
    let failed = |message: String| {
        let verdict = classify(&Evidence {
            message: &message,
            allocator_ooms: ctx.allocator_ooms,
            data_peak: ctx.data_peak,
            data_limit: ctx.data_limit,
            ..Default::default()
        });
        match verdict {
            Verdict::Oom(message) => TrialOutcome::Oom {
                message,
                peak_bytes: Some(peak),
                rss_peak_bytes: rss,
                gpu,
            },
            Verdict::Error(message) | Verdict::OomRejected(message) => {
                TrialOutcome::Error { message }
            }
        }
    };
    match result {
        Ok(Ok(mut times)) => {
            let step_seconds = if times.len() >= 2 {
                median(&mut times[1..])
            } else {
                median(&mut times)
            };
            TrialOutcome::completed(peak, rss, step_seconds, gpu)
        }
        Ok(Err(e @ StepError::NonFinite(_))) => TrialOutcome::Error {
            message: e.to_string(),
        },
        Ok(Err(StepError::Failed(m))) => failed(m),
        Err(payload) => failed(panic_message(payload.as_ref()).to_string()),
    }
}

/// A trial on CUDA device `index` (NVML's; the parent exposes it as `cuda:0`): the caching
/// allocator's statistics around the steps, and NVML's view of this process at the end. The parent
/// samples NVML during the trial and decides with the larger of its samples and this report.
fn run_cuda(spec: &TrialSpec, index: u32) -> TrialOutcome {
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
    let before = match measure::allocator_before(dev) {
        Ok(s) => s,
        Err(message) => return TrialOutcome::Error { message },
    };
    let result = train(spec, tch::Device::Cuda(dev));
    let report = match measure::allocator_after(dev, &before) {
        Ok(r) => r,
        Err(message) => return TrialOutcome::Error { message },
    };
    let (peak, gpu) = measure::gpu_footprint(index, report);
    let ctx = Context {
        allocator_ooms: report.ooms,
        ..Default::default()
    };
    outcome(result, peak, None, Some(gpu), ctx)
}

/// Prints `outcome`'s result line on stdout.
fn print_result(outcome: &TrialOutcome) {
    let mut so = std::io::stdout();
    let _ = so.write_all(batchfit::protocol::result_line(outcome).as_bytes());
    let _ = so.flush();
}

/// Entry point of `batchfit-torch trial SPEC`: set up, report start, run, print the
/// result, `_exit(0)`. A spec that does not parse is a usage error (exit 2, no result line).
pub fn child_main(spec_json: &str) -> ! {
    // A hook that does nothing: it cannot allocate, so it cannot deadlock after an OOM.
    std::panic::set_hook(Box::new(|_| {}));
    let spec = match serde_json::from_str::<TrialSpec>(spec_json) {
        Ok(spec) if u64::from(spec.accumulation) <= batchfit::accumulate::MAX_ACCUMULATION => spec,
        Ok(spec) => {
            batchfit::note!(
                "batchfit: error: bad trial spec (an internal subcommand): accumulation {} is more \
                 than {}",
                spec.accumulation,
                batchfit::accumulate::MAX_ACCUMULATION
            );
            std::process::exit(batchfit::exit::Exit::Usage.code().into());
        }
        Err(e) => {
            batchfit::note!("batchfit: error: bad trial spec (an internal subcommand): {e}");
            std::process::exit(batchfit::exit::Exit::Usage.code().into());
        }
    };
    println!("{STARTED_MARKER}");
    let _ = std::io::stdout().flush();
    print_result(&run(&spec));
    // Skip libtorch's static destructors: the result is out, nothing else matters.
    // SAFETY: terminating the process.
    unsafe { libc::_exit(0) }
}

/// Entry point of `batchfit-torch worker TEMPLATE` (hybrid isolation): `TEMPLATE` is a
/// [`TrialSpec`] (model, threads, seed); one [`TrialRequest`] (JSON) per stdin line, the peak marks
/// reset before each, one result line each; exits at end of input.
pub fn worker_main(template_json: &str) -> ! {
    std::panic::set_hook(Box::new(|_| {}));
    let template = match serde_json::from_str::<TrialSpec>(template_json) {
        Ok(t) => t,
        Err(e) => {
            batchfit::note!("batchfit: error: bad worker template (an internal subcommand): {e}");
            std::process::exit(batchfit::exit::Exit::Usage.code().into());
        }
    };
    println!("{STARTED_MARKER}");
    let _ = std::io::stdout().flush();
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::BufRead::read_line(&mut stdin.lock(), &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let out = match serde_json::from_str::<TrialRequest>(line.trim()) {
            Ok(r) => {
                let spec = TrialSpec {
                    batch: r.batch,
                    steps: r.steps,
                    accumulation: r.accumulation,
                    ..template.clone()
                };
                // Give freed heap back (RLIMIT_DATA counts it) and reset the peak mark, so this trial
                // starts as close to a fresh process as one process can.
                // SAFETY: plain libc call.
                unsafe { libc::malloc_trim(0) };
                let _ = sysmem::reset_peak_rss();
                run(&spec)
            }
            Err(e) => TrialOutcome::Error {
                message: format!("bad trial request: {e}"),
            },
        };
        print_result(&out);
    }
    // SAFETY: terminating the process.
    unsafe { libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit::protocol::{AllocatorReport, FootprintMethod};

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

    fn failed(m: &str) -> Steps {
        Ok(Err(StepError::Failed(m.into())))
    }

    fn cuda(ooms: u64) -> Context {
        Context {
            allocator_ooms: ooms,
            ..Default::default()
        }
    }

    #[test]
    fn retries_before_caught_ooms_are_not_retries() {
        // cuDNN caught two OOMs (each preceded by a retry) and the steps completed: a fit
        let o = outcome(done(), 1 << 30, None, gpu(2, 2), cuda(2));
        assert_eq!(o.kind(), "fits", "{o:?}");
        // one retry succeeded besides the one before a caught OOM: a `retries` outcome, counting one
        match outcome(done(), 1 << 30, None, gpu(3, 2), cuda(2)) {
            TrialOutcome::Retries { retries, .. } => assert_eq!(retries, 1),
            o => panic!("{o:?}"),
        }
        // off CUDA there is no allocator report
        let o = outcome(done(), 1 << 30, None, None, Context::default());
        assert_eq!(o.kind(), "fits");
    }

    #[test]
    fn failures_are_classified_with_the_trials_evidence() {
        let gib = 1u64 << 30;
        let at_limit = Context {
            data_peak: Some(gib * 97 / 100),
            data_limit: Some(gib),
            allocator_ooms: 0,
        };
        let o = outcome(
            failed("could not execute a primitive"),
            gib,
            None,
            None,
            at_limit,
        );
        assert!(o.is_oom(), "{o:?}");
        let o = outcome(
            failed("could not execute a primitive"),
            gib,
            None,
            None,
            Context::default(),
        );
        assert_eq!(o.kind(), "error");
        // a panic with oneDNN's text is classified too
        let p: Steps = Err(Box::new("could not execute a primitive".to_string()));
        assert!(outcome(p, gib, None, None, at_limit).is_oom());
        let engine = "GET was unable to find an engine to execute this computation";
        assert!(outcome(failed(engine), gib, None, gpu(1, 1), cuda(1)).is_oom());
        assert_eq!(
            outcome(failed(engine), gib, None, gpu(0, 0), cuda(0)).kind(),
            "error"
        );
        // a diverged step stays an error whatever the allocator saw
        let nan = Ok(Err(StepError::NonFinite(f64::NAN)));
        assert_eq!(outcome(nan, gib, None, gpu(1, 1), cuda(1)).kind(), "error");
        // a panic with libtorch's OOM text is an OOM
        let p: Steps = Err(Box::new(
            "CUDA out of memory. Tried to allocate 2.00 GiB".to_string(),
        ));
        assert!(outcome(p, gib, None, gpu(1, 1), cuda(1)).is_oom());
    }
}
