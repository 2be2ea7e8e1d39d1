#!/usr/bin/env python3
"""A plain PyTorch training loop fed by a DataLoader with persistent worker processes, the way most real
scripts load data: each worker builds its own sample cache (``--worker-mib`` of tensors, touched) and
collates whole batches that reach the trainer through shared memory, ``prefetch_factor`` batches ahead.

    python train_workers.py --batch-size 64 --steps 100 --workers 2
    batchfit probe --exec -- python train_workers.py --batch-size {batch} --steps {steps} --accumulation {accumulation}

What the workers add is the point: every worker is a forked process (its own data segment under
``RLIMIT_DATA``; in the same memory cgroup as the trainer), each holds its cache, and the batches in flight
(workers × prefetch_factor, each ``batch × input`` floats) live in shared memory. The model is the
benchmark's MLP (``--input`` -> ``--hidden`` -> 10, AdamW). Under batchfit the run ends with a report
through the helper (batchfit_trial.py on PYTHONPATH or next to the script); without it nothing changes.
"""
import argparse
import sys
import time

try:
    import batchfit_trial as bt
except ImportError:
    bt = None

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Samples(Dataset):
    """Synthetic samples drawn from a per-worker cache: each worker, on its first sample, allocates and
    fills `cache_mib` MiB (a stand-in for decoded images or a tokenizer's tables held per worker)."""

    def __init__(self, n, inputs, classes, cache_mib, seed):
        self.n, self.inputs, self.classes, self.cache_mib, self.seed = n, inputs, classes, cache_mib, seed
        self.cache = None

    def __len__(self):
        return self.n

    def _fill(self):
        info = get_worker_info()
        gen = torch.Generator().manual_seed(self.seed + (info.id if info else 0))
        rows = max(1, (self.cache_mib << 20) // (4 * self.inputs))
        self.cache = torch.randn(rows, self.inputs, generator=gen)

    def __getitem__(self, i):
        if self.cache is None:
            self._fill()
        x = self.cache[i % self.cache.shape[0]] + 0.01 * torch.randn(self.inputs)
        return x, i % self.classes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None, help="micro-batch (default: helper, else 64)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: helper, else 100)")
    p.add_argument("--accumulation", type=int, default=None, help="micro-batches per step (default: helper, else 1)")
    p.add_argument("--input", type=int, default=16384)
    p.add_argument("--hidden", default="16", help="comma-separated hidden widths")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor")
    p.add_argument("--worker-mib", type=int, default=32, help="each worker's sample cache, MiB")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_mlp(inputs, hidden, classes):
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def loader(args, batch, steps, accumulation):
    ds = Samples(batch * steps * accumulation, args.input, args.classes, args.worker_mib, args.seed)
    kw = dict(num_workers=args.workers, persistent_workers=True, prefetch_factor=args.prefetch) if args.workers else {}
    return DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True, **kw)


def train(args, batch, steps, accumulation, log=True):
    """`steps` optimizer steps of `accumulation` micro-batches of `batch` samples from the workers; returns
    each step's wall seconds (a function of its own so that a finder that wraps one, Accelerate's
    find_executable_batch_size, can call it)."""
    torch.manual_seed(args.seed)
    model = build_mlp(args.input, [int(h) for h in args.hidden.split(",") if h], args.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    data = iter(loader(args, batch, steps, accumulation))
    step_seconds, last = [], time.perf_counter()
    for step in range(steps):
        for _ in range(accumulation):
            x, y = next(data)
            loss = loss_fn(model(x), y) / accumulation
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        if log:
            print(f"step {step + 1}/{steps} loss {loss.item() * accumulation:.4f} {step_seconds[-1]:.3f}s", flush=True)
    del data
    return step_seconds


def main():
    args = parse_args()
    batch = args.batch_size if args.batch_size is not None else (bt.batch_size(default=64) if bt else 64)
    steps = args.steps if args.steps is not None else (bt.steps(default=100) if bt else 100)
    accumulation = args.accumulation if args.accumulation is not None else (bt.accumulation(default=1) if bt else 1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_workers.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")
    step_seconds = train(args, batch, steps, accumulation)
    print(f"train_workers: trained batch {batch} x accumulation {accumulation} for {steps} steps with "
          f"{args.workers} workers, {sum(step_seconds):.2f}s", flush=True)
    if bt:
        bt.report(batch=batch, steps=steps, accumulation=accumulation, step_seconds=step_seconds)


if __name__ == "__main__":
    main()
