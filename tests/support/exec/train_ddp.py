#!/usr/bin/env python3
"""The train_mlp.py model under DistributedDataParallel (gloo, CPU), launched by torchrun:

    torchrun --nproc-per-node 2 train_ddp.py --batch-size 256 --steps 100 --accumulation 2

Probed by batchfit (the micro-batch is per rank; batchfit_trial.py importable, e.g. on PYTHONPATH):

    batchfit probe --exec -- torchrun --nproc-per-node 2 train_ddp.py --batch-size {batch} --steps {steps} \
        --accumulation {accumulation}

Each optimizer step runs `accumulation` micro-batches per rank; all but the last run under DDP's
no_sync() so gradients are all-reduced once per step. The global batch is world x micro x accumulation
(logged by rank 0). Every rank reports through the helper (rank 0 to BATCHFIT_RESULT, rank r to
BATCHFIT_RESULT.rank<r>); the helper is optional, as in train_mlp.py.
"""
import argparse
import contextlib
import os
import sys
import time

try:
    import batchfit_trial as bt
except ImportError:
    bt = None

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def helper_default(name, default):
    return getattr(bt, name)(default=default) if bt else default


def build_mlp(inputs, hidden, classes):
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None, help="micro-batch per rank (default: helper, else 64)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: helper, else 100)")
    p.add_argument("--accumulation", type=int, default=None, help="micro-batches per step (default: helper, else 1)")
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", default="128,128", help="comma-separated hidden widths")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    batch = args.batch_size if args.batch_size is not None else helper_default("batch_size", 64)
    steps = args.steps if args.steps is not None else helper_default("steps", 100)
    accumulation = args.accumulation if args.accumulation is not None else helper_default("accumulation", 1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_ddp.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DDP(build_mlp(args.input, [int(h) for h in args.hidden.split(",") if h], args.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own data
    if rank == 0:
        print(f"train_ddp: world {world} x micro-batch {batch} x accumulation {accumulation} "
              f"= global batch {world * batch * accumulation}", flush=True)

    step_seconds = []
    last = time.perf_counter()
    for step in range(steps):
        for micro in range(accumulation):
            # gradients are all-reduced on the last micro-batch of the step only
            sync = micro == accumulation - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                x = torch.randn(batch, args.input, generator=gen)
                y = torch.randint(0, args.classes, (batch,), generator=gen)
                loss = loss_fn(model(x), y) / accumulation
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        if rank == 0:
            print(f"step {step + 1}/{steps} loss {loss.item() * accumulation:.4f} {step_seconds[-1]:.3f}s", flush=True)

    if bt:
        bt.report(batch=batch, steps=steps, accumulation=accumulation, step_seconds=step_seconds,
                  rank=rank, world_size=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
