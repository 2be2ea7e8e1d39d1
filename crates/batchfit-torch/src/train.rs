//! `batchfit-train`: trains with a plan's micro-batch and accumulation.
//!
//! It rebuilds the model from the plan alone (`model.config`), refuses a plan it cannot trust (another
//! model, another device, a partial search) unless `--force`, and runs the very step code and process
//! set-up (malloc, threads) of the probe's trials, so a size the probe proved is a size that trains.
//!
//! Exit codes: [`batchfit::exit`] (`Program::Train`). An out-of-memory during training is decided by
//! the one classifier ([`batchfit::protocol::classify`]) with the same evidence a trial has.

use crate::child::{configure_threads, measure::DataSampler};
use crate::model::step::{panic_message, DataSource, Learner, StepError, Synthetic};
use anyhow::{anyhow, Context};
use batchfit::accumulate::MAX_ACCUMULATION;
use batchfit::cli::TrainArgs;
use batchfit::device::cuda;
use batchfit::device::DeviceKind;
use batchfit::exit::{self, fail, Exit, Fail};
use batchfit::plan::model::{Architecture, ModelSpec};
use batchfit::plan::{count, Plan, Status};
use batchfit::platform::sysmem;
use batchfit::platform::units::{format_size, parse_size};
use batchfit::protocol::classify::{classify, Evidence, Verdict};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

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

/// For a cuda plan: the GPU's environment, set before anything touches CUDA (CUDA reads
/// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` at its first call, the allocator its config at its
/// first allocation): this machine's GPU at the plan's NVML index becomes `cuda:0`, with the plan's
/// allocator settings and, with `--memory-limit`, the fraction that stops the allocator at the limit.
fn cuda_environment(plan: &Plan, memory_limit: MemoryLimit) -> Result<(), Fail> {
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
    let conf = match memory_limit.bytes(plan) {
        None => user,
        Some(bytes) => Some(cuda::trial_alloc_conf(user.as_deref(), bytes, cuda_total)),
    };
    match conf {
        Some(c) => std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", c),
        None => std::env::remove_var("PYTORCH_CUDA_ALLOC_CONF"),
    }
    Ok(())
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

/// Set in the trainer's own environment when it started itself again the way trials start.
const SETUP_ENV: &str = "BATCHFIT_TRAIN_AS_TRIAL";

/// Under a cpu memory limit, starts this trainer again as the probe's trial processes were started,
/// so the limit bounds the same kind of process: `RLIMIT_DATA` set before exec (the loader's and
/// libtorch's start-up count against it as in a trial), the plan's `RLIMIT_STACK` and
/// memory-relevant environment (thread stacks are data), no backtraces. Returns only when this
/// process already is that one (or on plans that do not record their set-up, where it applies
/// what it can in place).
fn start_as_trials_did(plan: &Plan, limit: u64, quiet: bool) -> Result<(), Fail> {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(SETUP_ENV).is_some() {
        return Ok(());
    }
    let Some(setup) = plan.runtime.process.as_ref() else {
        if !quiet {
            eprintln!(
                "batchfit-train: note: this plan does not record how its trial processes were \
                 started (an older batchfit made it); the memory limit applies to this process as it \
                 is (its stack limit and OpenMP settings may differ from the trials')"
            );
        }
        return Ok(());
    };
    // What differs from the trials' set-up, said once (the job's own settings are overridden).
    let mut changes = vec![];
    let shown = |v: Option<u64>| v.map_or("unlimited".to_string(), format_size);
    if sysmem::stack_limit() != setup.stack_limit_bytes {
        changes.push(format!(
            "RLIMIT_STACK {} → {}",
            shown(sysmem::stack_limit()),
            shown(setup.stack_limit_bytes)
        ));
    }
    let now = sysmem::memory_env();
    for k in sysmem::MEMORY_ENV {
        match (now.get(*k), setup.env.get(*k)) {
            (a, b) if a == b => {}
            (Some(a), None) => changes.push(format!("{k}={a} → unset")),
            (a, Some(b)) => changes.push(format!(
                "{k}={} → {k}={b}",
                a.map_or("(unset)", String::as_str)
            )),
            (None, None) => {}
        }
    }
    if !quiet && !changes.is_empty() {
        eprintln!(
            "batchfit-train: under the memory limit, running as the probe's trials ran: {}",
            changes.join(", ")
        );
    }
    let exe = std::env::current_exe()
        .context("cannot find my own executable to start under the plan's set-up")
        .map_err(fail(Exit::Environment))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(SETUP_ENV, "1")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    for k in sysmem::MEMORY_ENV {
        match setup.env.get(*k) {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let stack = setup.stack_limit_bytes;
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let set = |res, v: Option<u64>| {
                let v = v.map_or(libc::RLIM_INFINITY, |v| v as libc::rlim_t);
                let mut cur = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(res, &mut cur);
                // the soft limit as the trials had it, within the hard limit we have
                let lim = libc::rlimit {
                    rlim_cur: v.min(cur.rlim_max),
                    rlim_max: cur.rlim_max,
                };
                libc::setrlimit(res, &lim)
            };
            if set(libc::RLIMIT_STACK, stack) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let data = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &data) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let e = cmd.exec();
    Err(Fail(
        Exit::Environment,
        anyhow!("cannot start again under the plan's process set-up: {e}"),
    ))
}

fn run(a: &TrainArgs) -> Result<(), Fail> {
    let memory_limit = check_args(a)?;
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
    if let (DeviceKind::Cpu, Some(limit)) = (plan.device.kind, memory_limit.bytes(&plan)) {
        start_as_trials_did(&plan, limit, a.quiet)?;
    }
    if plan.device.kind == DeviceKind::Cuda {
        cuda_environment(&plan, memory_limit)?;
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
    if let Some(w) = less_memory_than_at_probe_time(&plan) {
        eprintln!("batchfit-train: warning: {w}");
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
    match memory_limit.bytes(&plan) {
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
    let mut spec: ModelSpec = model.config.clone();
    if let Architecture::Torchscript { file, sha256, .. } = &mut spec.architecture {
        let path = a
            .model_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(&*file));
        use batchfit::workload::script::{self, ScriptError};
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
        Some(path) => {
            Some(crate::model::data::FileData::load(path, &spec).map_err(fail(Exit::Usage))?)
        }
        None => None,
    };
    if let (Some(d), false) = (&file_data, a.quiet) {
        eprintln!(
            "batchfit-train: data: {} ({} samples, {} in memory)",
            a.data.as_ref().expect("set").display(),
            d.rows(),
            format_size(d.bytes())
        );
    }
    // The whole file is in this process's memory, which no trial had: on cpu it takes from the
    // headroom the plan measured, unless the probe reserved room for it.
    if let (Some(d), DeviceKind::Cpu) = (&file_data, plan.device.kind) {
        if d.bytes() > plan.reserve_bytes.saturating_add(plan.limit_bytes / 100) {
            eprintln!(
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
    }
    let per_step: u64 = micro_batches.iter().sum();
    if !a.quiet {
        eprintln!(
            "batchfit-train: {} ({} params), {} of {} samples ({}: {})",
            model.name,
            model.parameter_count,
            count(a.steps as usize, "optimizer step", "optimizer steps"),
            per_step,
            count(micro_batches.len(), "micro-batch", "micro-batches"),
            batchfit::plan::describe_micro_batches(&micro_batches),
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
            .and_then(|i| crate::allocator::stats(i as usize).ok())
            .map_or(0, |s| s.ooms)
    };
    // On cpu the data segment is sampled as a trial samples it (the same thread, so the same
    // set-up): the quantity a cpu plan's limit and "peak" are about.
    let sampler = cuda_index.is_none().then(DataSampler::start);
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
                None => Box::new(Synthetic::with_seed(&spec, plan.runtime.seed)),
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
    let peak = match cuda_index {
        Some(i) => crate::allocator::stats(i as usize)
            .map(|s| format!("peak CUDA reserved {}", format_size(s.peak_reserved_bytes)))
            .map_err(|e| {
                Fail(
                    Exit::Environment,
                    anyhow!("cannot read the CUDA allocator's peak: {e}"),
                )
            })?,
        None => {
            let st = sysmem::proc_status().map_err(|e| {
                Fail(
                    Exit::Environment,
                    anyhow!("cannot read /proc/self/status: {e}"),
                )
            })?;
            let data = sampler
                .as_ref()
                .map_or(0, DataSampler::peak)
                .max(st.vm_data);
            // the same measure, and the same words, as the probe's "peak" of a cpu trial
            format!(
                "peak data segment {} ({:.0}% of the plan's {} limit), peak RSS {}",
                format_size(data),
                100.0 * data as f64 / plan.job_limit_bytes().max(1) as f64,
                format_size(plan.job_limit_bytes()),
                format_size(st.vm_hwm)
            )
        }
    };
    println!(
        "trained {} of {} samples in {:.1} s: final loss {loss:.4}, {sps:.0} samples/s, {peak}",
        count(a.steps as usize, "step", "steps"),
        per_step,
        t_start.elapsed().as_secs_f64(),
    );
    Ok(())
}
