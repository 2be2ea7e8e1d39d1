//! `batchfit-train`: trains with a plan's micro-batch and accumulation.
//!
//! It rebuilds the model from the plan alone (`model.config`), refuses a plan it cannot trust (another
//! model, another device, a partial search) unless `--force`, and runs the very step code and process
//! set-up (malloc, threads) of the probe's trials, so a size the probe proved is a size that trains.
//!
//! Exit codes: [`batchfit::exit`] (`Program::Train`). An out-of-memory during training is decided by
//! the one classifier ([`batchfit::protocol::classify`]) with the same evidence a trial has.

mod process;
mod trust;

use crate::child::{configure_threads, measure::DataSampler};
use crate::model::data::FileData;
use crate::model::step::{panic_message, DataSource, Learner, StepError, Synthetic};
use anyhow::{anyhow, Context};
use batchfit::accumulate::MAX_ACCUMULATION;
use batchfit::cli::TrainArgs;
use batchfit::device::DeviceKind;
use batchfit::exit::{self, fail, Exit, Fail};
use batchfit::plan::model::{Architecture, ModelSpec};
use batchfit::plan::{count, ModelInfo, Plan};
use batchfit::platform::sysmem;
use batchfit::platform::units::{format_size, parse_size};
use batchfit::protocol::classify::{classify, Evidence, Verdict};
use process::{cuda_environment, start_as_trials_did};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use trust::refuse_or_warn;

/// `batchfit-torch train ARGS…` (what the `batchfit-train` launcher starts): `args` are the
/// trainer's own arguments, without the program name.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
    sysmem::configure_malloc();
    std::panic::set_hook(Box::new(|_| {}));
    let argv = std::iter::once(std::ffi::OsString::from("batchfit-train")).chain(args);
    let args: TrainArgs = match batchfit::cli::parse_or_exit(argv) {
        Ok(a) => a,
        Err(exit) => return exit.into(),
    };
    exit::finish("batchfit-train", run(&args).map(|()| Exit::Success))
}

/// What `--memory-limit` says: none, the plan's limit, or a size.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MemoryLimit {
    None,
    Plan,
    Bytes(u64),
}

impl MemoryLimit {
    fn parse(v: &str) -> Result<MemoryLimit, Fail> {
        match v.trim() {
            "none" => Ok(MemoryLimit::None),
            "plan" => Ok(MemoryLimit::Plan),
            other => match parse_size(other) {
                Ok(0) => Err(Fail(
                    Exit::Usage,
                    anyhow!("--memory-limit must be greater than 0 (or `none`, or `plan`)"),
                )),
                Ok(b) => Ok(MemoryLimit::Bytes(b)),
                Err(e) => Err(Fail(
                    Exit::Usage,
                    anyhow!("--memory-limit: {e}; or `plan` (the plan's limit), or `none`"),
                )),
            },
        }
    }
    fn bytes(self, plan: &Plan) -> Option<u64> {
        match self {
            MemoryLimit::None => None,
            MemoryLimit::Plan => Some(plan.job_limit_bytes()),
            MemoryLimit::Bytes(b) => Some(b),
        }
    }
}

/// Checks of the arguments alone, before the plan is read: a usage error is exit 2 whatever the
/// plan is.
fn check_args(a: &TrainArgs) -> Result<MemoryLimit, Fail> {
    let usage = |m: String| Err(Fail(Exit::Usage, anyhow!(m)));
    if !a.lr.is_finite() || a.lr <= 0.0 {
        return usage(format!(
            "--lr {} must be a positive number (e.g. 1e-3)",
            a.lr
        ));
    }
    if a.micro_batch == Some(0) || a.accumulation == Some(0) || a.steps == 0 {
        return usage("--micro-batch, --accumulation and --steps must be at least 1".into());
    }
    if let Some(acc) = a.accumulation.filter(|&acc| acc > MAX_ACCUMULATION) {
        return usage(format!(
            "--accumulation {acc} is more than the {MAX_ACCUMULATION} micro-batches per step batchfit \
             runs; use a larger --micro-batch"
        ));
    }
    MemoryLimit::parse(&a.memory_limit)
}

/// The trainer's stages, each handing on what the next needs: the plan and its model, the process
/// set up as the probe's trials were, the step's micro-batches, the model and data, the training
/// loop, the report.
fn run(a: &TrainArgs) -> Result<(), Fail> {
    let memory_limit = check_args(a)?;
    let plan = Plan::read(&a.plan).map_err(fail(Exit::Usage))?;
    let model = built_in_model(a, &plan)?;
    if let (DeviceKind::Cpu, Some(limit)) = (plan.device.kind, memory_limit.bytes(&plan)) {
        start_as_trials_did(&plan, limit, a.quiet)?;
    }
    if plan.device.kind == DeviceKind::Cuda {
        cuda_environment(&plan, memory_limit)?;
    }
    refuse_or_warn(a, &plan)?;
    let step = StepSizes::choose(a, &plan)?;
    let cuda_index = set_up_device(a, &plan, memory_limit)?;
    let spec = model_spec(a, &plan, &model.config)?;
    let file_data = load_data(a, &plan, &spec, memory_limit)?;
    if !a.quiet {
        batchfit::note!(
            "batchfit-train: {} ({} params), {} of {} samples ({}: {})",
            model.name,
            model.parameter_count,
            count(a.steps as usize, "optimizer step", "optimizer steps"),
            step.samples(),
            count(step.micro_batches.len(), "micro-batch", "micro-batches"),
            batchfit::plan::describe_micro_batches(&step.micro_batches),
        );
    }
    // On cpu the data segment is sampled as a trial samples it (the same thread, so the same
    // set-up): the quantity a cpu plan's limit and "peak" are about.
    let sampler = cuda_index.is_none().then(DataSampler::start);
    let failure = StepFailure {
        plan: &a.plan,
        micro: step.micro,
        cuda_index,
        sampler: sampler.as_ref(),
    };
    let t_start = Instant::now();
    let (loss, sps) = train(a, &plan, &spec, cuda_index, file_data, &step, &failure)?;
    let peak = peak_memory(&plan, cuda_index, sampler.as_ref())?;
    println!(
        "trained {} of {} samples in {:.1} s: final loss {loss:.4}, {sps:.0} samples/s, {peak}",
        count(a.steps as usize, "step", "steps"),
        step.samples(),
        t_start.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// The plan's built-in model; a plan proven for the user's own command is not one this trainer runs.
fn built_in_model<'p>(a: &TrainArgs, plan: &'p Plan) -> Result<&'p ModelInfo, Fail> {
    plan.model.model().ok_or_else(|| {
        Fail(
            Exit::Usage,
            anyhow!(
                "{} was proven for your own command ({}), which batchfit-train cannot run: in the job \
                 script, run that command with the plan's numbers, e.g. eval \"$(batchfit show {} \
                 --format env)\" and pass $BATCHFIT_MICRO_BATCH and $BATCHFIT_ACCUMULATION to it",
                a.plan.display(),
                plan.model.name(),
                a.plan.display()
            ),
        )
    })
}

/// One optimizer step's micro-batches: the plan's, or those `--micro-batch` and `--accumulation`
/// override them with.
struct StepSizes {
    micro: u64,
    micro_batches: Vec<u64>,
}

impl StepSizes {
    fn choose(a: &TrainArgs, plan: &Plan) -> Result<StepSizes, Fail> {
        let rec = plan.recommendation.as_ref();
        let micro = a
            .micro_batch
            .or(rec.map(|r| r.micro_batch))
            .ok_or_else(|| {
                Fail(
                    Exit::Usage,
                    anyhow!(
                        "{} has no recommendation; give --micro-batch and --accumulation",
                        a.plan.display()
                    ),
                )
            })?;
        let acc = a.accumulation.or(rec.map(|r| r.accumulation)).unwrap_or(1);
        let micro_batches: Vec<u64> = match rec {
            Some(r) if a.micro_batch.is_none() && a.accumulation.is_none() => {
                r.micro_batches.clone()
            }
            _ => vec![micro; acc as usize],
        };
        if a.micro_batch.is_some() || a.accumulation.is_some() {
            batchfit::note!(
                "batchfit-train: override: micro-batch {micro} × accumulation {acc} (plan: {})",
                rec.map_or("none".into(), |r| format!(
                    "{} × {}",
                    r.micro_batch, r.accumulation
                ))
            );
        }
        Ok(StepSizes {
            micro,
            micro_batches,
        })
    }

    /// Samples in one optimizer step.
    fn samples(&self) -> u64 {
        self.micro_batches.iter().sum()
    }
}

/// The probe's trials' process set-up (threads), the device (a cuda plan's GPU is `cuda:0` here,
/// see [`cuda_environment`]; `None` is cpu) and, on cpu, the data-segment limit of
/// `--memory-limit`.
fn set_up_device(
    a: &TrainArgs,
    plan: &Plan,
    memory_limit: MemoryLimit,
) -> Result<Option<u32>, Fail> {
    configure_threads(plan.runtime.threads);
    let cuda_index = (plan.device.kind == DeviceKind::Cuda).then_some(0u32);
    if cuda_index.is_some() && !tch::Cuda::is_available() {
        return Err(Fail(
            Exit::Environment,
            anyhow!(
                "{} is a cuda plan, and libtorch sees no CUDA device here (no driver, or \
                 CUDA_VISIBLE_DEVICES hides it); train on the GPU the plan names, or re-probe here",
                a.plan.display()
            ),
        ));
    }
    match memory_limit.bytes(plan) {
        _ if cuda_index.is_some() => {}
        None => {}
        Some(bytes) => {
            sysmem::set_data_limit(bytes)
                .with_context(|| {
                    format!(
                        "cannot set the data-segment limit to {}",
                        format_size(bytes)
                    )
                })
                .map_err(fail(Exit::Environment))?;
        }
    }
    Ok(cuda_index)
}

/// The model to build: the plan's config, a TorchScript model's file checked against the hash the
/// plan recorded (at `--model-file` when it moved).
fn model_spec(a: &TrainArgs, plan: &Plan, config: &ModelSpec) -> Result<ModelSpec, Fail> {
    use batchfit::workload::script::{self, ScriptError};
    let mut spec = config.clone();
    let Architecture::Torchscript { file, sha256, .. } = &mut spec.architecture else {
        if a.model_file.is_some() {
            return Err(Fail(
                Exit::Usage,
                anyhow!(
                    "--model-file is for TorchScript plans; this plan's model is the built-in {}",
                    plan.model.name()
                ),
            ));
        }
        return Ok(spec);
    };
    let path = a
        .model_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(&*file));
    match script::verify(&path, sha256) {
        Ok(()) => {}
        Err(e @ ScriptError::Changed { .. }) if !a.force => {
            return Err(Fail(
                Exit::Refused,
                anyhow!("refusing {}: {e}", a.plan.display()),
            ));
        }
        Err(e @ ScriptError::Changed { .. }) => {
            batchfit::note!("batchfit-train: warning (--force): {e}");
        }
        Err(e) => {
            return Err(Fail(
                Exit::Usage,
                anyhow!("{e} (the plan's model; pass --model-file PATH if it moved)"),
            ))
        }
    }
    *file = path.to_string_lossy().into_owned();
    Ok(spec)
}

/// `--data`, loaded and checked against the model; on cpu, a warning when it takes more of the
/// memory than the probe reserved for it.
fn load_data(
    a: &TrainArgs,
    plan: &Plan,
    spec: &ModelSpec,
    memory_limit: MemoryLimit,
) -> Result<Option<FileData>, Fail> {
    let Some(path) = &a.data else {
        return Ok(None);
    };
    let d = FileData::load(path, spec).map_err(fail(Exit::Usage))?;
    if !a.quiet {
        batchfit::note!(
            "batchfit-train: data: {} ({} samples, {} in memory)",
            path.display(),
            d.rows(),
            format_size(d.bytes())
        );
    }
    // The whole file is in this process's memory, which no trial had: on cpu it takes from the
    // headroom the plan measured, unless the probe reserved room for it.
    if plan.device.kind == DeviceKind::Cpu
        && d.bytes() > plan.reserve_bytes.saturating_add(plan.limit_bytes / 100)
    {
        batchfit::note!(
            "batchfit-train: warning: --data holds {} in memory, which the probe's trials did not \
             have (its plan reserved {} with --reserve); the plan's micro-batch may not fit {}. \
             Re-probe with --reserve {} or more, or train without a memory limit",
            format_size(d.bytes()),
            format_size(plan.reserve_bytes),
            if memory_limit == MemoryLimit::None {
                "in the memory the probe was given"
            } else {
                "under --memory-limit"
            },
            format_size(d.bytes().next_power_of_two().max(1 << 20))
        );
    }
    Ok(Some(d))
}

/// What a failed step was, decided by the one classifier with the evidence a trial has, gathered
/// the same way: OOMs the CUDA allocator raised in this process (cuDNN and cuBLAS catch them and,
/// when no choice is left, raise their own error), and under a cpu memory limit the data segment,
/// sampled as in trials.
struct StepFailure<'a> {
    plan: &'a std::path::Path,
    micro: u64,
    cuda_index: Option<u32>,
    sampler: Option<&'a DataSampler>,
}

impl StepFailure<'_> {
    fn fail(&self, e: StepError) -> Fail {
        let m = match e {
            StepError::Failed(m) => m,
            other => return Fail(Exit::Environment, anyhow!("training failed: {other}")),
        };
        let verdict = classify(&Evidence {
            message: &m,
            allocator_ooms: self.cuda_ooms(),
            // a data segment that could not be read is no measurement (never 0 bytes)
            data_peak: self.sampler.map(DataSampler::peak).filter(|&p| p > 0),
            data_limit: sysmem::data_limit(),
            ..Default::default()
        });
        match verdict {
            Verdict::Oom(message) => self.oom(message),
            Verdict::Error(message) | Verdict::OomRejected(message) => {
                Fail(Exit::Environment, anyhow!("training failed: {message}"))
            }
        }
    }

    fn cuda_ooms(&self) -> u64 {
        self.cuda_index
            .and_then(|i| crate::allocator::stats(i as usize).ok())
            .map_or(0, |s| s.ooms)
    }

    fn oom(&self, e: String) -> Fail {
        Fail(
            Exit::OutOfMemory,
            anyhow!(
                "out of memory during training at micro-batch {} (plan {}): {e}. Re-probe with \
                 `batchfit probe … --out {}` under today's conditions, or pass a smaller --micro-batch with a \
                 larger --accumulation",
                self.micro,
                self.plan.display(),
                self.plan.display()
            ),
        )
    }
}

/// The training loop: `--steps` optimizer steps of `step`'s micro-batches on the file's data or
/// synthetic data, a line a step unless `--quiet`; the last step's loss and samples per second. A
/// panic in libtorch is a failed step.
fn train(
    a: &TrainArgs,
    plan: &Plan,
    spec: &ModelSpec,
    cuda_index: Option<u32>,
    file_data: Option<FileData>,
    step: &StepSizes,
    failure: &StepFailure,
) -> Result<(f64, f64), Fail> {
    let device = match cuda_index {
        Some(i) => tch::Device::Cuda(i as usize),
        None => tch::Device::Cpu,
    };
    let per_step = step.samples();
    let step_err = |e| failure.fail(e);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        || -> Result<(f64, f64), Fail> {
            let mut learner =
                Learner::new(spec, device, a.lr, plan.runtime.seed).map_err(step_err)?;
            let mut data: Box<dyn DataSource> = match file_data {
                Some(d) => Box::new(d),
                None => Box::new(Synthetic::with_seed(spec, plan.runtime.seed)),
            };
            let mut last = (f64::NAN, 0.0);
            for s in 1..=a.steps {
                let t0 = Instant::now();
                let loss = learner
                    .step(&step.micro_batches, data.as_mut())
                    .map_err(step_err)?;
                let sps = per_step as f64 / t0.elapsed().as_secs_f64();
                if !a.quiet {
                    println!(
                        "step {s:>5}/{}  loss {loss:.4}  {sps:>10.0} samples/s",
                        a.steps
                    );
                }
                last = (loss, sps);
            }
            Ok(last)
        },
    ));
    match result {
        Ok(r) => r,
        Err(payload) => Err(failure.fail(StepError::Failed(
            panic_message(payload.as_ref()).to_string(),
        ))),
    }
}

/// The peak the report gives, in the probe's words for a trial: the CUDA allocator's peak reserved,
/// or on cpu the data segment's peak (sampled, and as the kernel last counted it) and the RSS's.
fn peak_memory(
    plan: &Plan,
    cuda_index: Option<u32>,
    sampler: Option<&DataSampler>,
) -> Result<String, Fail> {
    if let Some(i) = cuda_index {
        return crate::allocator::stats(i as usize)
            .map(|s| format!("peak CUDA reserved {}", format_size(s.peak_reserved_bytes)))
            .map_err(|e| {
                Fail(
                    Exit::Environment,
                    anyhow!("cannot read the CUDA allocator's peak: {e}"),
                )
            });
    }
    let st = sysmem::proc_status().map_err(|e| {
        Fail(
            Exit::Environment,
            anyhow!("cannot read /proc/self/status: {e}"),
        )
    })?;
    let data = sampler.map_or(0, DataSampler::peak).max(st.vm_data);
    Ok(format!(
        "peak data segment {} ({:.0}% of the plan's {} limit), peak RSS {}",
        format_size(data),
        100.0 * data as f64 / plan.job_limit_bytes().max(1) as f64,
        format_size(plan.job_limit_bytes()),
        format_size(st.vm_hwm)
    ))
}
