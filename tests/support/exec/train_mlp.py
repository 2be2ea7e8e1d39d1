#!/usr/bin/env python3
"""A plain PyTorch training script (no framework): an MLP on synthetic data with AdamW.

It is the kind of script a user already has; batchfit's helper is optional to it. Run by hand:

    python train_mlp.py --batch-size 256 --steps 100

Probed by batchfit (the helper, batchfit_trial.py, importable: next to the script or on PYTHONPATH):

    batchfit probe --exec -- python train_mlp.py --batch-size {batch} --steps {steps} --accumulation {accumulation}

Without the flags the values come from the helper (BATCHFIT_BATCH, ...), else the defaults below. Each
optimizer step runs `accumulation` micro-batches of `batch-size` samples (loss scaled by 1/accumulation).
Under batchfit the run ends with a report (batch, steps, accumulation, time per step); without the helper
or outside batchfit there is none and nothing else changes.

The default model, 256 -> 128 -> 128 -> 10 (ReLU, cross-entropy), is small so that a CPU probe under
about 1 GiB of RLIMIT_DATA stays short (MEASUREMENTS.md); `--input 1024 --hidden 2048,2048` is
batchfit's own default MLP (1024 -> 2048 -> 2048 -> 10).
"""
import argparse
import os
import sys
import time

try:
    import batchfit_trial as bt
except ImportError:  # the helper is optional: the script runs the same without it
    bt = None

import torch
from torch import nn


def helper_default(name, default):
    """The helper's value (BATCHFIT_* under batchfit) when it is there, else `default`."""
    return getattr(bt, name)(default=default) if bt else default


def build_mlp(inputs, hidden, classes):
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None, help="micro-batch (default: helper, else 64)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: helper, else 100)")
    p.add_argument("--accumulation", type=int, default=None, help="micro-batches per step (default: helper, else 1)")
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", default="128,128", help="comma-separated hidden widths")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def train(args, batch, steps, accumulation, log=True):
    """Builds the model and optimizer and runs `steps` optimizer steps of `accumulation` micro-batches of
    `batch` samples; returns each step's wall seconds. (A function of its own so that a batch-size finder
    that wraps a training function, e.g. Accelerate's find_executable_batch_size, can call it: the
    benchmark in benches/exec_peers/ does.)"""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_mlp(args.input, [int(h) for h in args.hidden.split(",") if h], args.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    step_seconds = []
    last = time.perf_counter()
    for step in range(steps):
        for _ in range(accumulation):
            x = torch.randn(batch, args.input)
            y = torch.randint(0, args.classes, (batch,))
            loss = loss_fn(model(x), y) / accumulation
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        if log:
            print(f"step {step + 1}/{steps} loss {loss.item() * accumulation:.4f} {step_seconds[-1]:.3f}s", flush=True)
    return step_seconds


def main():
    args = parse_args()
    batch = args.batch_size if args.batch_size is not None else helper_default("batch_size", 64)
    steps = args.steps if args.steps is not None else helper_default("steps", 100)
    accumulation = args.accumulation if args.accumulation is not None else helper_default("accumulation", 1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_mlp.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")
    if bt is None and os.environ.get("BATCHFIT_RESULT"):
        print("train_mlp.py: BATCHFIT_RESULT is set but batchfit_trial is not importable: no report",
              file=sys.stderr)

    step_seconds = train(args, batch, steps, accumulation)

    print(f"train_mlp: trained batch {batch} x accumulation {accumulation} for {steps} steps, "
          f"{sum(step_seconds):.2f}s", flush=True)
    if bt:
        bt.report(batch=batch, steps=steps, accumulation=accumulation, step_seconds=step_seconds)


if __name__ == "__main__":
    main()
