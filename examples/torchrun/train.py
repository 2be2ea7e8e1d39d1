#!/usr/bin/env python3
"""Data-parallel training (PyTorch DDP) with the micro-batch and accumulation of a batchfit plan.

Run it under torchrun, e.g. after `eval "$(batchfit probe ... --format env)"`:

    torchrun --standalone --nproc-per-node 2 train.py

Where the batch sizes come from (the first that applies wins):
  1. --micro-batch / --accumulation (e.g. the {batch} and {accumulation} of `batchfit probe --exec`)
  2. --plan PLAN.json (a plan of `batchfit probe`, `merge` or `verify`)
  3. the exports of `batchfit probe ... --format env` or `batchfit show PLAN --format env`:
     BATCHFIT_MICRO_BATCH, BATCHFIT_ACCUMULATION, BATCHFIT_WORLD_SIZE, BATCHFIT_PLAN

The model is the plan's when the plan holds batchfit's `mlp` (its model.config: input, hidden, classes,
optimizer), so this trains exactly what was probed; else the --input/--hidden/--classes flags. Replace
build_model() and batches() with your own model and data loader; keep the loop's shape: `accumulation`
micro-batches of `micro_batch` samples per optimizer step, gradients synchronised on the last one only.

A plan is solved for a world size: a job started with another number of processes would train another
global batch, so that is refused (exit 2). Rank 0 logs, for each optimizer step, the global batch it
actually used (the samples that went through forward and backward on every rank, summed with an
all_reduce), and at the end one line for job scripts to read:

    batchfit-recipe: done world_size=2 micro_batch=1024 accumulation=4 global_batch=8192 steps=2 ...

Without torchrun (plain `python train.py`) it runs as a world of one process.
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # optional: `batchfit python-helper > batchfit_trial.py`; under `batchfit probe --exec` it tells
    import batchfit_trial  # batchfit what each trial really trained (batch, steps, step times)
except ImportError:
    batchfit_trial = None


def log(msg):
    print(f"batchfit-recipe: {msg}", flush=True)


def die(msg, code=2):
    print(f"batchfit-recipe: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan", help="a batchfit plan (JSON); default: $BATCHFIT_PLAN for the model")
    p.add_argument("--micro-batch", type=int, help="overrides the plan's micro-batch")
    p.add_argument("--accumulation", type=int, help="overrides the plan's accumulation")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input", type=int, default=65536, help="MLP input features (no mlp plan)")
    p.add_argument("--hidden", default="16", help="MLP hidden widths, comma-separated (no mlp plan)")
    p.add_argument("--classes", type=int, default=10, help="MLP classes (no mlp plan)")
    p.add_argument("--optimizer", default="adam", choices=["sgd", "momentum", "adam", "adamw"])
    return p.parse_args()


def read_plan(path):
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read the plan {path}: {e}")
    if plan.get("schema_version") != 1:
        die(f"{path}: plan schema {plan.get('schema_version')!r}, this script reads 1")
    if plan.get("status") != "complete" or not plan.get("recommendation"):
        die(f"{path}: status {plan.get('status')!r}, no recommendation to train with")
    if plan.get("verified") is False:
        die(f"{path}: not verified (a merged plan): run `batchfit verify` on this node first")
    return plan


def batch_settings(args):
    """(micro_batch, accumulation, plan world size or None, plan or None, source)."""
    plan, micro, accum, world, source = None, None, 1, None, "flags"
    if args.plan:
        plan = read_plan(args.plan)
        rec = plan["recommendation"]
        micro, accum, world, source = rec["micro_batch"], rec["accumulation"], rec["world_size"], f"plan {args.plan}"
    elif args.micro_batch is None and "BATCHFIT_MICRO_BATCH" in os.environ:
        if os.environ.get("BATCHFIT_STATUS", "complete") != "complete":
            die(f"BATCHFIT_STATUS={os.environ['BATCHFIT_STATUS']}: no recommendation to train with")
        micro = int(os.environ["BATCHFIT_MICRO_BATCH"])
        accum = int(os.environ["BATCHFIT_ACCUMULATION"])
        world = int(os.environ["BATCHFIT_WORLD_SIZE"])
        source = "BATCHFIT_* environment"
        if os.environ.get("BATCHFIT_PLAN"):  # exported with --out: the model comes from there
            plan = read_plan(os.environ["BATCHFIT_PLAN"])
    if args.micro_batch is not None:
        micro, world, source = args.micro_batch, None, "flags"
    if args.accumulation is not None:
        accum = args.accumulation
    if micro is None:
        die("no micro-batch: give --plan, --micro-batch, or the exports of `batchfit ... --format env`")
    if micro < 1 or accum < 1:
        die(f"micro-batch {micro} and accumulation {accum} must be at least 1")
    if plan and plan["recommendation"].get("uneven"):
        die("an --allow-uneven plan has micro-batches of two sizes; this script trains one size")
    return micro, accum, world, plan, source


def model_settings(args, plan):
    arch = ((plan or {}).get("model", {}).get("config") or {}).get("architecture") or {}
    if arch.get("name") == "mlp":
        optimizer = plan["model"]["config"].get("optimizer", args.optimizer)
        precision = plan["model"]["config"].get("precision", "fp32")
        if precision != "fp32":
            die(f"the plan's precision is {precision}; this example trains fp32")
        return arch["input"], list(arch["hidden"]), arch["classes"], optimizer, "the plan's mlp"
    hidden = [int(h) for h in args.hidden.split(",") if h]
    return args.input, hidden, args.classes, args.optimizer, "flags"


def build_model(inp, hidden, classes):
    """batchfit's mlp: Linear layers with ReLU between them."""
    dims = [inp] + hidden + [classes]
    layers = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    return torch.optim.Adam(params, lr=1e-3)


def batches(micro, inp, classes, generator):
    """Synthetic data: replace with your data loader (one micro-batch per next())."""
    while True:
        x = torch.randn(micro, inp, generator=generator)
        y = torch.randint(classes, (micro,), generator=generator)
        yield x, y


def init_distributed():
    if "WORLD_SIZE" not in os.environ:  # plain `python train.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")  # CPU; use "nccl" and torch.cuda.set_device(LOCAL_RANK) on GPUs
    return dist.get_rank(), dist.get_world_size()


def main():
    args = parse_args()
    micro, accum, plan_world, plan, source = batch_settings(args)
    if batchfit_trial and batchfit_trial.in_trial():  # a trial of `batchfit probe --exec`
        asked = (batchfit_trial.batch_size(default=micro), batchfit_trial.accumulation(default=accum))
        if asked != (micro, accum):
            die(f"batchfit asked for micro-batch {asked[0]} × accumulation {asked[1]}, the flags say {micro} × {accum}")
    rank, world = init_distributed()
    if plan_world is not None and plan_world != world:
        die(
            f"the plan is for world size {plan_world}, this job has {world} processes: it would train a "
            f"global batch of {micro * accum * world}, not {micro * accum * plan_world}; probe with "
            f"--world-size {world}"
        )
    inp, hidden, classes, opt_name, model_source = model_settings(args, plan)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = DDP(build_model(inp, hidden, classes))
    opt = make_optimizer(opt_name, model.parameters())
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own data
    data = batches(micro, inp, classes, gen)
    if rank == 0:
        log(
            f"start world_size={world} micro_batch={micro} accumulation={accum} (from {source}); "
            f"model mlp {inp}->{','.join(map(str, hidden))}->{classes} {opt_name} (from {model_source})"
        )
    start = time.monotonic()
    used = []
    trial = batchfit_trial.Trial(batch=micro, accumulation=accum) if batchfit_trial else contextlib.nullcontext()
    with trial as t:
        for step in range(args.steps):
            opt.zero_grad(set_to_none=True)
            samples = 0
            for i in range(accum):
                x, y = next(data)
                # gradients are all-reduced on the last micro-batch of the step only
                sync = contextlib.nullcontext() if i + 1 == accum else model.no_sync()
                with sync:
                    loss = F.cross_entropy(model(x), y) / accum  # mean over the accumulated batch
                    loss.backward()
                samples += x.shape[0]
            opt.step()
            if t:
                t.step()
            total = torch.tensor([samples], dtype=torch.int64)
            dist.all_reduce(total)  # the samples of this optimizer step on all ranks
            used.append(int(total.item()))
            if rank == 0:
                log(f"step {step + 1}/{args.steps} loss {loss.item() * accum:.4f} global_batch={used[-1]}")
    seconds = time.monotonic() - start
    if rank == 0:
        batch = used[0] if used and all(u == used[0] for u in used) else "varied:" + ",".join(map(str, used))
        log(
            f"done world_size={world} micro_batch={micro} accumulation={accum} global_batch={batch} "
            f"steps={len(used)} seconds={seconds:.1f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
