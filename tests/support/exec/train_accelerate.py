#!/usr/bin/env python3
"""An Accelerate training loop (``Accelerator`` on CPU, ``accelerator.accumulate``/``backward``) fed by a
DataLoader with two persistent worker processes, each holding a sample cache: the script of
train_workers.py as an Accelerate user writes it. Needs Accelerate (the benchmark venv).

    python train_accelerate.py --batch-size 64 --steps 100 --accumulation 2
    batchfit probe --exec -- python train_accelerate.py --batch-size {batch} --steps {steps} --accumulation {accumulation}

``train(args, batch, steps, accumulation)`` is a function of its own so that Accelerate's own finder,
``find_executable_batch_size``, can wrap it (benches/exec_peers/peer.py does). Reports to batchfit through
the helper (batchfit_trial.py on PYTHONPATH or next to the script) when it is there.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import batchfit_trial as bt
except ImportError:
    bt = None

import torch
from accelerate import Accelerator
from torch import nn

from train_workers import build_mlp, loader, parse_args as workers_args


def parse_args(argv=None):
    return workers_args(argv)


def train(args, batch, steps, accumulation, log=True):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    torch.manual_seed(args.seed)
    model = build_mlp(args.input, [int(h) for h in args.hidden.split(",") if h], args.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt, data = accelerator.prepare(model, opt, loader(args, batch, steps, accumulation))
    loss_fn = nn.CrossEntropyLoss()
    step_seconds, last, it = [], time.perf_counter(), iter(data)
    for step in range(steps):
        for _ in range(accumulation):
            x, y = next(it)
            with accelerator.accumulate(model):
                loss = loss_fn(model(x), y)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        if log:
            accelerator.print(f"step {step + 1}/{steps} loss {loss.item():.4f} {step_seconds[-1]:.3f}s")
    del it
    accelerator.free_memory()
    return step_seconds


def main():
    args = parse_args()
    batch = args.batch_size if args.batch_size is not None else (bt.batch_size(default=64) if bt else 64)
    steps = args.steps if args.steps is not None else (bt.steps(default=100) if bt else 100)
    accumulation = args.accumulation if args.accumulation is not None else (bt.accumulation(default=1) if bt else 1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_accelerate.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")
    step_seconds = train(args, batch, steps, accumulation)
    print(f"train_accelerate: trained batch {batch} x accumulation {accumulation} for {steps} steps, "
          f"{sum(step_seconds):.2f}s", flush=True)
    if bt:
        bt.report(batch=batch, steps=steps, accumulation=accumulation, step_seconds=step_seconds)


if __name__ == "__main__":
    main()
