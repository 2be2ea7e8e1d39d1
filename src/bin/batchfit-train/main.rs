//! `batchfit-train`: trains with a plan's micro-batch and accumulation.
//!
//! It rebuilds the model from the plan alone (`model.config`), refuses a plan it cannot trust (another
//! model, another device, a partial search) unless `--force`, and runs the very step code and process
//! set-up (malloc, threads) of the probe's trials, so a size the probe proved is a size that trains.
//!
//! Exit codes: [`batchfit::exit`] (`Program::Train`). An out-of-memory during training is decided by
//! the one classifier ([`batchfit::protocol::classify`]) with the same evidence a trial has.

use anyhow::{anyhow, Context};
use batchfit::device::cuda;
use batchfit::device::DeviceKind;
use batchfit::exit::{self, fail, Exit, Fail};
use batchfit::plan::model::{Architecture, ModelSpec};
use batchfit::plan::{Plan, Status};
use batchfit::platform::sysmem;
use batchfit::platform::units::{format_size, parse_size};
use batchfit::protocol::classify::{classify, Evidence, Verdict};
use batchfit::workload::child::{configure_threads, measure::DataSampler};
use batchfit::workload::model::step::{panic_message, DataSource, Learner, StepError, Synthetic};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

fn exit_codes() -> String {
    exit::help(exit::Program::Train)
}

#[derive(Debug, Parser)]
#[command(name = "batchfit-train", version, about = "Trains with the micro-batch and accumulation of a batchfit plan", after_help = exit_codes())]
struct Args {
    /// The plan written by `batchfit probe --out`.
    #[arg(long)]
    plan: PathBuf,
    /// Optimizer steps to run (each of `accumulation` micro-batches).
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Override the plan's micro-batch (for experiments; reported as an override).
    #[arg(long)]
    micro_batch: Option<u64>,
    /// Override the plan's accumulation (for experiments; reported as an override).
    #[arg(long)]
    accumulation: Option<u64>,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Train even with a plan that is partial or made for another model or device.
    #[arg(long)]
    force: bool,
    /// Run under a data-segment limit (cpu): `plan` (the plan's limit), a size like 1GiB, or `none`.
    #[arg(long, default_value = "none")]
    memory_limit: String,
    /// Train on real data: a .safetensors or .npz file with tensors `x` (inputs; `x0`, `x1`, … for
    /// several) and `y` (targets), samples along the first dimension. Default: synthetic data of the
    /// model's shapes, as in probing.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Where the TorchScript model file is now (default: the path in the plan). Its SHA-256 must
    /// match the plan's.
    #[arg(long, value_name = "FILE.pt")]
    model_file: Option<PathBuf>,
    /// Only the final summary.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    sysmem::configure_malloc();
    std::panic::set_hook(Box::new(|_| {}));
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Success
            }
            .into();
        }
    };
    exit::finish("batchfit-train", run(&args).map(|()| Exit::Success))
}

/// Reasons to refuse a plan (exit 5 unless --force).
fn refusals(plan: &Plan) -> Vec<String> {
    let mut r = vec![];
    match plan.status {
        Status::Complete => {}
        Status::Partial => r.push(format!(
            "the plan is partial (stopped: {}); finish the probe, or use --force",
            plan.stop_detail
        )),
        Status::NothingFits => r.push("the plan says nothing fits".into()),
    }
    if plan.verified == Some(false) {
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
    match plan.device.kind {
        DeviceKind::Cpu => {
            let name = sysmem::cpu_name();
            let total = sysmem::meminfo().map(|m| m.0).unwrap_or(0);
            let total = sysmem::cgroup_limit().map_or(total, |c| c.min(total));
            if name != plan.device.name || total != plan.device.total_bytes {
                r.push(format!(
                    "the plan was made on another device: {} with {} (this machine: {} with {})",
                    plan.device.name,
                    format_size(plan.device.total_bytes),
                    name,
                    format_size(total)
                ));
            }
        }
        DeviceKind::Cuda => {
            let index = plan.gpu.as_ref().map_or(0, |g| g.index);
            match cuda::gpus().and_then(|q| q.device(index)) {
                Err(e) => r.push(format!(
                    "the plan was made on cuda ({}, GPU {index}), which this machine cannot use: {e}",
                    plan.device.name
                )),
                Ok(g) if g.name != plan.device.name || g.total_bytes != plan.device.total_bytes => {
                    r.push(format!(
                        "the plan was made on another device: {} with {} (GPU {index} here: {} with {})",
                        plan.device.name,
                        format_size(plan.device.total_bytes),
                        g.name,
                        format_size(g.total_bytes)
                    ))
                }
                Ok(_) if !tch::Cuda::is_available() => r.push(format!(
                    "NVML sees GPU {index} but libtorch sees no CUDA device here"
                )),
                Ok(_) => {}
            }
        }
        other @ DeviceKind::Sim => r.push(format!(
            "the plan was made on the {other} backend ({}); batchfit-train runs cpu and cuda plans",
            plan.device.name
        )),
    }
    r
}

/// For a cuda plan: the GPU's environment, set before anything touches CUDA (CUDA reads
/// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` at its first call, the allocator its config at its
/// first allocation): this machine's GPU at the plan's NVML index becomes `cuda:0`, with the plan's
/// allocator settings and, with `--memory-limit`, the fraction that stops the allocator at the limit.
fn cuda_environment(plan: &Plan, memory_limit: &str) -> Result<(), Fail> {
    let index = plan.gpu.as_ref().map_or(0, |g| g.index);
    // CUDA's total, which the allocator multiplies the fraction by (NVML's total less the driver's
    // reserve), from this GPU when NVML answers.
    let mut cuda_total = plan.device.total_bytes;
    if let Ok(g) = cuda::gpus().and_then(|q| q.device(index)) {
        std::env::set_var("CUDA_VISIBLE_DEVICES", &g.uuid);
        cuda_total = g.cuda_total_bytes();
    }
    std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    let user = plan.gpu.as_ref().and_then(|g| g.alloc_conf.clone());
    let conf = match memory_limit {
        "none" => user,
        v => {
            let bytes = if v == "plan" {
                plan.limit_bytes
            } else {
                parse_size(v).map_err(fail(Exit::Usage))?
            };
            Some(cuda::trial_alloc_conf(user.as_deref(), bytes, cuda_total))
        }
    };
    match conf {
        Some(c) => std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", c),
        None => std::env::remove_var("PYTORCH_CUDA_ALLOC_CONF"),
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), Fail> {
    let plan = Plan::read(&a.plan).map_err(fail(Exit::Usage))?;
    let Some(model) = plan.model.model() else {
        return Err(Fail(
            Exit::Usage,
            anyhow!(
                "{} was proven for your own command ({}), which batchfit-train cannot run: in the job \
                 script, run that command with the plan's numbers, e.g. eval \"$(batchfit show {} \
                 --format env)\" and pass $BATCHFIT_MICRO_BATCH and $BATCHFIT_ACCUMULATION to it",
                a.plan.display(),
                plan.model.name(),
                a.plan.display()
            ),
        ));
    };
    if plan.device.kind == DeviceKind::Cuda {
        cuda_environment(&plan, &a.memory_limit)?;
    }
    let refused = refusals(&plan);
    if !refused.is_empty() {
        if !a.force {
            return Err(Fail(
                Exit::Refused,
                anyhow!("refusing {}: {}", a.plan.display(), refused.join("; ")),
            ));
        }
        for r in &refused {
            eprintln!("batchfit-train: warning (--force): {r}");
        }
    }
    if plan.device.kind == DeviceKind::Cpu {
        if let Ok((_, avail)) = sysmem::meminfo() {
            if (avail as f64) < plan.device.free_bytes_at_start as f64 * 0.95
                || avail < plan.limit_bytes
            {
                eprintln!(
                    "batchfit-train: warning: {} of memory is available now, less than the {} at probe time; \
                     other processes may leave too little for the plan's micro-batch",
                    format_size(avail),
                    format_size(plan.device.free_bytes_at_start)
                );
            }
        }
    }
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
    if micro == 0 || acc == 0 || a.steps == 0 {
        return Err(Fail(
            Exit::Usage,
            anyhow!("--micro-batch, --accumulation and --steps must be at least 1"),
        ));
    }
    let micro_batches: Vec<u64> = match rec {
        Some(r) if a.micro_batch.is_none() && a.accumulation.is_none() => r.micro_batches.clone(),
        _ => vec![micro; acc as usize],
    };
    if a.micro_batch.is_some() || a.accumulation.is_some() {
        eprintln!(
            "batchfit-train: override: micro-batch {micro} × accumulation {acc} (plan: {})",
            rec.map_or("none".into(), |r| format!(
                "{} × {}",
                r.micro_batch, r.accumulation
            ))
        );
    }
    // Same process set-up as the probe's trials.
    configure_threads(plan.runtime.threads);
    // cuda plans: the plan's GPU is cuda:0 here (see cuda_environment)
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
    let device = match cuda_index {
        Some(i) => tch::Device::Cuda(i as usize),
        None => tch::Device::Cpu,
    };
    match a.memory_limit.as_str() {
        _ if cuda_index.is_some() => {}
        "none" => {}
        v => {
            let bytes = if v == "plan" {
                plan.limit_bytes
            } else {
                parse_size(v).map_err(fail(Exit::Usage))?
            };
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
    let mut spec: ModelSpec = model.config.clone();
    if let Architecture::Torchscript { file, sha256, .. } = &mut spec.architecture {
        let path = a
            .model_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(&*file));
        use batchfit::workload::model::script::{self, ScriptError};
        match script::verify(&path, sha256) {
            Ok(()) => {}
            Err(e @ ScriptError::Changed { .. }) if !a.force => {
                return Err(Fail(
                    Exit::Refused,
                    anyhow!("refusing {}: {e}", a.plan.display()),
                ));
            }
            Err(e @ ScriptError::Changed { .. }) => {
                eprintln!("batchfit-train: warning (--force): {e}");
            }
            Err(e) => {
                return Err(Fail(
                    Exit::Usage,
                    anyhow!("{e} (the plan's model; pass --model-file PATH if it moved)"),
                ))
            }
        }
        *file = path.to_string_lossy().into_owned();
    } else if a.model_file.is_some() {
        return Err(Fail(
            Exit::Usage,
            anyhow!(
                "--model-file is for TorchScript plans; this plan's model is the built-in {}",
                plan.model.name()
            ),
        ));
    }
    let file_data = match &a.data {
        Some(path) => Some(
            batchfit::workload::model::data::FileData::load(path, &spec)
                .map_err(fail(Exit::Usage))?,
        ),
        None => None,
    };
    if let (Some(d), false) = (&file_data, a.quiet) {
        eprintln!(
            "batchfit-train: data: {} ({} samples)",
            a.data.as_ref().expect("set").display(),
            d.rows()
        );
    }
    let per_step: u64 = micro_batches.iter().sum();
    if !a.quiet {
        eprintln!(
            "batchfit-train: {} ({} params), {} optimizer steps of {} samples ({} micro-batch{} of {})",
            model.name,
            model.parameter_count,
            a.steps,
            per_step,
            micro_batches.len(),
            if micro_batches.len() == 1 { "" } else { "es" },
            micro
        );
    }
    let oom = |e: String| {
        Fail(
            Exit::OutOfMemory,
            anyhow!(
                "out of memory during training at micro-batch {micro} (plan {}): {e}. Re-probe with \
                 `batchfit probe … --out {}` under today's conditions, or pass a smaller --micro-batch with a \
                 larger --accumulation",
                a.plan.display(),
                a.plan.display()
            ),
        )
    };
    // The evidence a trial has, gathered the same way: OOMs the CUDA allocator raised in this process
    // (cuDNN and cuBLAS catch them and, when no choice is left, raise their own error), and under a
    // cpu memory limit the data segment, sampled as in trials.
    let cuda_ooms = || {
        cuda_index
            .and_then(|i| batchfit::gpu::allocator::stats(i as usize).ok())
            .map_or(0, |s| s.ooms)
    };
    let sampler = (cuda_index.is_none() && sysmem::data_limit().is_some()).then(DataSampler::start);
    let step_err = |e: StepError| match e {
        StepError::Failed(m) => {
            let verdict = classify(&Evidence {
                message: &m,
                allocator_ooms: cuda_ooms(),
                data_peak: sampler.as_ref().map(DataSampler::peak),
                data_limit: sysmem::data_limit(),
                ..Default::default()
            });
            match verdict {
                Verdict::Oom(message) => oom(message),
                Verdict::Error(message) => {
                    Fail(Exit::Environment, anyhow!("training failed: {message}"))
                }
            }
        }
        other => Fail(Exit::Environment, anyhow!("training failed: {other}")),
    };
    let t_start = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        || -> Result<(f64, f64), Fail> {
            let mut learner =
                Learner::new(&spec, device, a.lr, plan.runtime.seed).map_err(step_err)?;
            let mut data: Box<dyn DataSource> = match file_data {
                Some(d) => Box::new(d),
                None => Box::new(Synthetic::for_spec(&spec)),
            };
            let mut last = (f64::NAN, 0.0);
            for s in 1..=a.steps {
                let t0 = Instant::now();
                let loss = learner
                    .step(&micro_batches, data.as_mut())
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
    let (loss, sps) = match result {
        Ok(r) => r?,
        Err(payload) => {
            return Err(step_err(StepError::Failed(
                panic_message(payload.as_ref()).to_string(),
            )));
        }
    };
    let peak =
        match cuda_index {
            Some(i) => batchfit::gpu::allocator::stats(i as usize)
                .map(|s| format!("peak CUDA reserved {}", format_size(s.peak_reserved_bytes)))
                .map_err(|e| {
                    Fail(
                        Exit::Environment,
                        anyhow!("cannot read the CUDA allocator's peak: {e}"),
                    )
                })?,
            None => format!(
                "peak RSS {}",
                format_size(sysmem::proc_status().map(|s| s.vm_hwm).map_err(|e| Fail(
                    Exit::Environment,
                    anyhow!("cannot read the peak RSS: {e}")
                ))?)
            ),
        };
    println!(
        "trained {} steps of {} samples in {:.1} s: final loss {loss:.4}, {sps:.0} samples/s, {peak}",
        a.steps,
        per_step,
        t_start.elapsed().as_secs_f64(),
    );
    Ok(())
}
