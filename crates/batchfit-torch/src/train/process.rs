//! The trainer's process, set up as the probe's trials were, so that a size the probe proved under a
//! limit is trained under the same kind of limit: for a cuda plan the GPU's environment before CUDA
//! starts, under a cpu memory limit this trainer started again with the trials' rlimits and
//! environment.

use super::MemoryLimit;
use anyhow::{anyhow, Context};
use batchfit::device::cuda;
use batchfit::exit::{fail, Exit, Fail};
use batchfit::plan::{Plan, ProcessSetup};
use batchfit::platform::sysmem;
use batchfit::platform::units::format_size;

/// For a cuda plan: the GPU's environment, set before anything touches CUDA (CUDA reads
/// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` at its first call, the allocator its config at its
/// first allocation): this machine's GPU at the plan's NVML index becomes `cuda:0`, with the plan's
/// allocator settings and, with `--memory-limit`, the fraction that stops the allocator at the limit.
pub(super) fn cuda_environment(plan: &Plan, memory_limit: MemoryLimit) -> Result<(), Fail> {
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

/// Set in the trainer's own environment when it started itself again the way trials start.
const SETUP_ENV: &str = "BATCHFIT_TRAIN_AS_TRIAL";

/// Under a cpu memory limit, starts this trainer again as the probe's trial processes were started,
/// so the limit bounds the same kind of process: `RLIMIT_DATA` set before exec (the loader's and
/// libtorch's start-up count against it as in a trial), the plan's `RLIMIT_STACK` and
/// memory-relevant environment (thread stacks are data), no backtraces. Returns only when this
/// process already is that one (or on plans that do not record their set-up, where it applies
/// what it can in place).
pub(super) fn start_as_trials_did(plan: &Plan, limit: u64, quiet: bool) -> Result<(), Fail> {
    if std::env::var_os(SETUP_ENV).is_some() {
        return Ok(());
    }
    let Some(setup) = plan.runtime.process.as_ref() else {
        if !quiet {
            batchfit::note!(
                "batchfit-train: note: this plan does not record how its trial processes were \
                 started (an older batchfit made it); the memory limit applies to this process as it \
                 is (its stack limit and OpenMP settings may differ from the trials')"
            );
        }
        return Ok(());
    };
    // What differs from the trials' set-up, said once (the job's own settings are overridden).
    let changes = differences_from(setup);
    if !quiet && !changes.is_empty() {
        batchfit::note!(
            "batchfit-train: under the memory limit, running as the probe's trials ran: {}",
            changes.join(", ")
        );
    }
    exec_as(setup, limit)
}

/// How this process's stack limit and memory-relevant environment differ from the trials' `setup`.
fn differences_from(setup: &ProcessSetup) -> Vec<String> {
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
    changes
}

/// Replaces this process with this trainer again, with its arguments, under the trials' `setup`
/// and `RLIMIT_DATA` at `limit`; returns only when that fails.
fn exec_as(setup: &ProcessSetup, limit: u64) -> Result<(), Fail> {
    use std::os::unix::process::CommandExt;
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
