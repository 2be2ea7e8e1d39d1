#!/usr/bin/env python3
"""Python peers of scripts/gpu-check.sh (stage 3): the batch-size finders of Lightning and Accelerate on the
model batchfit probed (see scripts/harness/models.py for how the models match batchfit's).

Modes (one search per process, so each starts with a fresh CUDA caching allocator):

  lightning   Tuner(trainer).scale_batch_size(module, mode="binsearch", init_val=..., max_trials=...,
              steps_per_trial=..., max_val=...) -- the cap max_val raised (Lightning's default is 8192).
              Every batch size it tries is recorded (by wrapping Lightning's own trial runner
              ``batch_size_scaling._try_loop_run``; where a Lightning version lacks it, from the module's
              hooks), with its outcome, time and peak memory.
  accelerate  accelerate.utils.find_executable_batch_size(starting_batch_size=...) around a plain PyTorch
              training function (build the model, Adam, --steps steps): what Accelerate's docs show. It
              multiplies the size by 0.9 after each out-of-memory.
  modelcheck  builds each architecture of --archs on the meta device and compares its parameter count with
              batchfit's (``batchfit models --json`` for the presets, batchfit's formulas otherwise), then runs
              one training step of small versions on --device: cheap proof that the peers' models are
              batchfit's and run.

The JSON --out is rewritten after every trial, so a process killed by the orchestrator's timeout keeps
what it measured. Exit 0 when the search ended with an answer, 1 when it failed (the JSON says why), 2 on
bad usage, 4 when Lightning/Accelerate cannot be imported (the JSON carries ``skipped`` and the reason).

On --device cpu (the --cpu-smoke mode) the process re-executes itself once with batchfit's malloc set-up
(MALLOC_MMAP_THRESHOLD_=65536, MALLOC_ARENA_MAX=2) and, once torch, the framework and the model are loaded,
limits its data segment (RLIMIT_DATA) to what it uses then plus --cpu-headroom bytes, so its searches end
in out-of-memory errors as on a GPU.
"""
import argparse
import json
import os
import resource
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # scripts/: the harnesses' shared package
from harness.files import save_json as write_json  # noqa: E402
from harness.peers import (each_trial, first_line, import_accelerate, import_lightning,  # noqa: E402
                           lightning_is_oom_error, lightning_trainer)
from harness.procs import limit_data, proc_status, reexec_with_malloc_env, reset_rss_peak  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["lightning", "accelerate", "modelcheck"])
    p.add_argument("--arch", help="architecture JSON (batchfit's model.config.architecture)")
    p.add_argument("--archs", help="modelcheck: JSON list of {arch, expected_parameters}")
    p.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16", "bf16"])
    p.add_argument("--precisions", default="fp32", help="modelcheck: comma-separated precisions of the small step")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=3, help="training steps per trial")
    p.add_argument("--init-val", type=int, default=2, help="lightning")
    p.add_argument("--max-val", type=int, default=1 << 20, help="lightning (its default cap is 8192)")
    p.add_argument("--max-trials", type=int, default=25, help="lightning")
    p.add_argument("--start", type=int, default=128, help="accelerate: starting_batch_size")
    p.add_argument("--cpu-headroom", type=int, default=64 << 20, help="cpu: bytes of data segment above the "
                   "process's use once loaded")
    p.add_argument("--threads", type=int, default=0, help="cpu: torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", default=None, help="scratch directory (Lightning's checkpoint of the search)")
    p.add_argument("--out", required=True, help="the result JSON")
    return p.parse_args()


class Recorder:
    """The result JSON, rewritten after every change."""

    def __init__(self, path, base):
        self.path = path
        self.res = dict(base)
        self.res.setdefault("trials", [])
        self.t0 = time.monotonic()
        self.flush()

    def flush(self):
        self.res["seconds"] = round(time.monotonic() - self.t0, 3)
        write_json(self.path, self.res)

    def update(self, **kw):
        self.res.update(kw)
        self.flush()


class Device:
    """Peak-memory bookkeeping on cuda (allocator) or cpu (VmHWM)."""

    def __init__(self, torch, kind):
        self.torch, self.kind = torch, kind
        self.dev = torch.device("cuda:0" if kind == "cuda" else "cpu")

    def info(self):
        t = self.torch
        if self.kind == "cuda":
            free, total = t.cuda.mem_get_info(0)
            return {"name": t.cuda.get_device_name(0), "total_bytes": total, "free_bytes_at_start": free}
        return {"name": "cpu", "total_bytes": None, "rlimit_data": resource.getrlimit(resource.RLIMIT_DATA)[0]}

    def reset(self):
        """Before a trial: return cached blocks (left by an earlier out-of-memory trial) to the driver, so the
        trial's peak reserved bytes are its own, then reset the peaks."""
        if self.kind == "cuda":
            import gc
            gc.collect()
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(0)
        else:
            reset_rss_peak()

    def peaks(self):
        t = self.torch
        if self.kind == "cuda":
            t.cuda.synchronize()
            return {"peak_reserved_bytes": t.cuda.max_memory_reserved(0),
                    "peak_allocated_bytes": t.cuda.max_memory_allocated(0)}
        return {"peak_rss_bytes": proc_status("VmHWM"), "vm_data_bytes": proc_status("VmData")}

    def sync(self):
        if self.kind == "cuda":
            self.torch.cuda.synchronize()

    def free_cache(self):
        import gc
        gc.collect()
        if self.kind == "cuda":
            self.torch.cuda.empty_cache()


def warm_up(torch, M, arch, precision, device):
    """cpu: one Adam step at batch 1 before the limit is set, so the lazy imports (Adam's first use imports
    torch._dynamo, tens of MiB) and libraries' one-time set-up are part of the loaded size, not of the
    headroom."""
    import gc
    net, _ = M.build(arch)
    dtype = torch.float32
    if precision == "bf16":
        net, dtype = net.to(torch.bfloat16), torch.bfloat16
    opt = M.adam(net.parameters())
    x, y = M.synthetic_batch(arch, 1, device.dev, dtype)
    with autocast_ctx(torch, device, precision):
        loss = M.loss_of(net(x), y)
    loss.backward()
    opt.step()
    del net, opt, x, y, loss
    gc.collect()


def limit_cpu(args, rec):
    """cpu: RLIMIT_DATA = the data segment in use now + headroom (soft and hard)."""
    used = proc_status("VmData") or 0
    limit = used + args.cpu_headroom
    limit_data(limit)
    rec.update(cpu_limit={"vm_data_loaded_bytes": used, "headroom_bytes": args.cpu_headroom,
                          "rlimit_data_bytes": limit})


def versions(torch):
    from harness.pkgversions import package_versions
    v = package_versions(("lightning", "pytorch-lightning", "accelerate", "torchvision"))
    v.update(torch=torch.__version__, cuda=getattr(torch.version, "cuda", None))
    return v


def cpu_memory_error(device, e):
    """cpu (the smoke): under RLIMIT_DATA an allocation outside libtorch's allocator fails as Python's
    MemoryError or a RuntimeError "std::bad_alloc" (C++ allocations), which neither Lightning nor Accelerate counts as
    out of memory. Here the limit stands for the device's memory, so it is one: re-raised as the message
    libtorch's CPU allocator gives, which both recognise. On cuda nothing changes."""
    if device.kind == "cpu" and (isinstance(e, MemoryError) or
                                 (isinstance(e, RuntimeError) and "std::bad_alloc" in str(e))):
        return RuntimeError(f"DefaultCPUAllocator: can't allocate memory (Python MemoryError under the smoke's "
                            f"RLIMIT_DATA: {e!r})")
    return e


def autocast_ctx(torch, device, precision):
    import contextlib
    if precision == "amp-bf16":
        return torch.autocast(device_type=device.kind, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------------------
# Lightning
# ------------------------------------------------------------------------------------------------------

def mode_lightning(args, rec, torch, M, device):
    import inspect
    import tempfile
    import warnings

    try:
        pl, Tuner, bss, pkg = import_lightning()
    except Exception as e:  # noqa: BLE001
        rec.update(skipped=f"Lightning cannot be imported: {type(e).__name__}: {first_line(e)}")
        return 4
    is_oom_error = lightning_is_oom_error()
    warnings.filterwarnings("ignore")
    from torch.utils.data import DataLoader, Dataset

    arch = json.loads(args.arch)
    trials = rec.res["trials"]
    state = {}
    wrapped = hasattr(bss, "_try_loop_run")

    class Indices(Dataset):
        # longer than any size tried, so Lightning's "batch size >= dataset length" stop never triggers
        def __len__(self):
            return 1 << 22

        def __getitem__(self, i):
            return i

    class Peer(pl.LightningModule):
        def __init__(self, batch_size):
            super().__init__()
            self.net, self.model_source = M.build(arch)
            self.batch_size = batch_size
            self.steps_run = 0

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            n = int(batch.shape[0])
            dtype = next(self.net.parameters()).dtype
            x, y = M.synthetic_batch(arch, n, self.device, dtype if dtype.is_floating_point else torch.float32)
            loss = M.loss_of(self.net(x), y)
            self.steps_run += 1
            return loss

        def configure_optimizers(self):
            return M.adam(self.parameters())

        def train_dataloader(self):
            return DataLoader(Indices(), batch_size=self.batch_size, shuffle=False, num_workers=0)

        # peaks of each fit; and the trial record itself when Lightning's trial runner cannot be wrapped
        def on_train_start(self):
            device.reset()
            if not wrapped:
                trials.append({"batch": int(self.batch_size), "outcome": "running", "t0": time.monotonic()})
                rec.flush()

        def on_train_end(self):
            state["fit_peaks"] = device.peaks()
            if not wrapped and trials and trials[-1]["outcome"] == "running":
                t = trials[-1]
                t.update(outcome="fits", seconds=round(time.monotonic() - t.pop("t0"), 3), **state["fit_peaks"])
                rec.flush()

    def trainer(root):
        return lightning_trainer(pl, args.steps, root, accelerator="gpu" if device.kind == "cuda" else "cpu",
                                 precision=M.LIGHTNING_PRECISION[args.precision])

    if wrapped:
        def begin(tr, params):
            model = tr.lightning_module
            b, before, t0 = int(model.batch_size), model.steps_run, time.monotonic()
            state.pop("fit_peaks", None)
            trial = {"batch": b, "outcome": "running"}
            trials.append(trial)
            rec.flush()
            return trial, model, before, t0

        def failed(token, e):
            trial, model, before, t0 = token
            failure = cpu_memory_error(device, e)
            trial.update(outcome="oom" if is_oom_error(failure) else "error", message=first_line(failure),
                         seconds=round(time.monotonic() - t0, 3), steps_run=model.steps_run - before)
            rec.flush()
            return failure

        def fitted(token):
            trial, model, before, t0 = token
            trial.update(outcome="fits", seconds=round(time.monotonic() - t0, 3),
                         steps_run=model.steps_run - before, **(state.get("fit_peaks") or device.peaks()))
            rec.flush()

        bss._try_loop_run = each_trial(bss._try_loop_run, begin, fitted, failed)

    tmp = args.tmp or None
    if tmp:
        os.makedirs(tmp, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp) as root:
        torch.manual_seed(args.seed)
        module = Peer(args.init_val)
        tr = trainer(root)
        if device.kind == "cpu":
            warm_up(torch, M, arch, args.precision, device)
            limit_cpu(args, rec)
        rec.update(model_source=module.model_source, parameters=M.parameter_count(module.net),
                   recording="wrapped _try_loop_run" if wrapped else "module hooks (no _try_loop_run)",
                   framework=pkg)
        sig = inspect.signature(Tuner.scale_batch_size).parameters
        kw = dict(mode="binsearch", steps_per_trial=args.steps, init_val=args.init_val, max_trials=args.max_trials)
        if "max_val" in sig:
            kw["max_val"] = args.max_val
        else:
            rec.update(note="this Lightning has no max_val: its cap cannot be raised")
        if "margin" in sig and sig["margin"].default is not inspect.Parameter.empty:
            rec.update(lightning_margin=sig["margin"].default)
        rec.update(call={k: v for k, v in kw.items()})
        t0 = time.monotonic()
        try:
            answer = Tuner(tr).scale_batch_size(module, **kw)
        except BaseException as e:  # noqa: BLE001
            rec.update(error=f"{type(e).__name__}: {first_line(e)}", search_seconds=round(time.monotonic() - t0, 3),
                       traceback=traceback.format_exc()[-2000:])
            return 1
        search = round(time.monotonic() - t0, 3)
    if not wrapped:
        for t in trials:
            if t["outcome"] == "running":  # started, never ended: Lightning caught an error (OOM or other)
                t.pop("t0", None)
                t["outcome"] = "failed"
        rec.update(note="trials recorded from the module's hooks (this Lightning has no _try_loop_run): a "
                        "failed trial's cause is not known")
    rec.update(answer=int(answer) if answer is not None else None, search_seconds=search, done=True)
    return 0 if answer is not None else 1


# ------------------------------------------------------------------------------------------------------
# Accelerate
# ------------------------------------------------------------------------------------------------------

def mode_accelerate(args, rec, torch, M, device):
    try:
        find_executable_batch_size, should_reduce_batch_size = import_accelerate()
    except Exception as e:  # noqa: BLE001
        rec.update(skipped=f"Accelerate cannot be imported: {type(e).__name__}: {first_line(e)}")
        return 4
    arch = json.loads(args.arch)
    trials = rec.res["trials"]
    bf16 = args.precision == "bf16"

    def make():
        with device.dev:
            net, src = M.build(arch)
        if bf16:
            net = net.to(torch.bfloat16)
        return net, src

    # one build before the search: the model source, and on cpu the loaded size the limit starts from
    net, src = make()
    rec.update(model_source=src, parameters=M.parameter_count(net))
    del net
    device.free_cache()
    if device.kind == "cpu":
        warm_up(torch, M, arch, args.precision, device)
        limit_cpu(args, rec)

    def steps(batch_size):
        # the tensors live in this frame only, so they are freed with the exception that ends it
        torch.manual_seed(args.seed)
        net, _ = make()
        net.train()
        opt = M.adam(net.parameters())
        dtype = torch.bfloat16 if bf16 else torch.float32
        for _ in range(args.steps):
            x, y = M.synthetic_batch(arch, batch_size, device.dev, dtype)
            with autocast_ctx(torch, device, args.precision):
                loss = M.loss_of(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        device.sync()
        if not torch.isfinite(loss).item():
            raise FloatingPointError(f"non-finite loss {loss.item()}")

    def begin(batch_size):
        trial = {"batch": int(batch_size), "outcome": "running"}
        trials.append(trial)
        rec.flush()
        t0 = time.monotonic()
        device.reset()
        return trial, t0

    def failed(token, e):
        trial, t0 = token
        failure = cpu_memory_error(device, e)
        trial.update(outcome="oom" if should_reduce_batch_size(failure) else "error",
                     message=first_line(failure), seconds=round(time.monotonic() - t0, 3))
        rec.flush()
        return failure

    def fitted(token):
        trial, t0 = token
        trial.update(outcome="fits", seconds=round(time.monotonic() - t0, 3), **device.peaks())
        rec.flush()

    def run_steps(batch_size):
        steps(batch_size)
        return int(batch_size)

    train = find_executable_batch_size(each_trial(run_steps, begin, fitted, failed),
                                       starting_batch_size=args.start)

    rec.update(call={"starting_batch_size": args.start, "steps": args.steps})
    t0 = time.monotonic()
    try:
        answer = train()
    except BaseException as e:  # noqa: BLE001
        rec.update(error=f"{type(e).__name__}: {first_line(e)}", search_seconds=round(time.monotonic() - t0, 3))
        return 1
    rec.update(answer=answer, search_seconds=round(time.monotonic() - t0, 3), done=True)
    return 0


# ------------------------------------------------------------------------------------------------------
# model check
# ------------------------------------------------------------------------------------------------------

def mode_modelcheck(args, rec, torch, M, device):
    items = json.loads(args.archs)
    checks = []
    rec.update(checks=checks)
    ok = True
    for it in items:
        arch = it["arch"]
        c = {"model": M.describe(arch), "expected_parameters": it.get("expected_parameters")}
        checks.append(c)
        try:
            with torch.device("meta"):
                net, src = M.build(arch)
            n = M.parameter_count(net)
            c.update(parameters=n, model_source=src)
            exp = c["expected_parameters"] or M.expected_parameters(arch)
            c["expected_parameters"] = exp
            c["match"] = exp is None or n == exp
            ok &= c["match"]
        except Exception as e:  # noqa: BLE001
            c.update(error=f"{type(e).__name__}: {first_line(e)}")
            ok = False
        rec.flush()
    # one real training step of small versions, with each precision the run uses
    small = [{"name": "resnet18", "image_size": 33, "classes": 1000},
             {"name": "gpt", "layers": 1, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": 100}]
    precisions = [p for p in args.precisions.split(",") if p]
    steps = []
    rec.update(steps=steps)
    for arch in small:
        for prec in precisions:
            s = {"model": M.describe(arch), "precision": prec}
            steps.append(s)
            try:
                torch.manual_seed(0)
                with device.dev:
                    net, _ = M.build(arch)
                dtype = torch.float32
                if prec == "bf16":
                    net, dtype = net.to(torch.bfloat16), torch.bfloat16
                opt = M.adam(net.parameters())
                for _ in range(2):
                    x, y = M.synthetic_batch(arch, 2, device.dev, dtype)
                    with autocast_ctx(torch, device, prec):
                        loss = M.loss_of(net(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                s.update(loss=float(loss.detach()), ok=bool(torch.isfinite(loss).item()))
                ok &= s["ok"]
            except Exception as e:  # noqa: BLE001
                s.update(ok=False, error=f"{type(e).__name__}: {first_line(e)}")
                ok = False
            rec.flush()
    rec.update(ok=ok, done=True)
    return 0 if ok else 1


def main():
    args = parse_args()
    if args.device == "cpu" and args.mode != "modelcheck":
        reexec_with_malloc_env()
    rec = Recorder(args.out, {"tool": args.mode, "device_kind": args.device, "precision": args.precision,
                              "steps_per_trial": args.steps, "pid": os.getpid()})
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        rec.update(skipped=f"torch cannot be imported: {type(e).__name__}: {first_line(e)}")
        return 4
    from harness import models as M

    if args.threads:
        torch.set_num_threads(args.threads)
    rec.update(versions=versions(torch))
    if args.device == "cuda" and not torch.cuda.is_available():
        rec.update(error="torch sees no CUDA device")
        return 1
    device = Device(torch, args.device)
    rec.update(device=device.info())
    if args.arch:
        rec.update(model=M.describe(json.loads(args.arch)))
    if args.mode == "lightning":
        return mode_lightning(args, rec, torch, M, device)
    if args.mode == "accelerate":
        return mode_accelerate(args, rec, torch, M, device)
    return mode_modelcheck(args, rec, torch, M, device)


if __name__ == "__main__":
    sys.exit(main())
