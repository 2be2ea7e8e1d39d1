#!/usr/bin/env python3
"""A plain PyTorch training script whose DataLoader has persistent workers holding memory of their own:
a small token model (embedding, mean, linear) on synthetic token ids made by 2 worker processes
(`persistent_workers=True`), each of which allocates and keeps a buffer (`--worker-mib`, default 48)
in `worker_init_fn`, as a worker that opens a dataset, a tokenizer or a cache does.

    python train_loader.py --batch-size 64 --steps 3

The job's memory is the main process's (torch, the model, the optimizer, the activations: 0.5 MiB a
sample at the defaults) plus each worker's buffer plus the batches in flight (token ids, 512 bytes a
sample, in shared memory between a worker and the main process): batchfit has to count the whole
process tree, once per page. Reports through the helper
(batchfit_trial, optional) like train_mlp.py.
"""
import argparse
import time

try:
    import batchfit_trial as bt
except ImportError:  # the helper is optional
    bt = None

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WORKER_BUFFER = []


class Synthetic(Dataset):
    def __init__(self, n, inputs, vocab, classes):
        self.n, self.inputs, self.vocab, self.classes = n, inputs, vocab, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        # cheap to make (the trial's time is the job's start, not its data)
        return torch.arange(self.inputs) * (i + 1) % self.vocab, int(i % self.classes)


def hold(mib):
    """The worker's own memory: `mib` MiB allocated and touched, kept while the worker lives."""
    def init(_worker_id):
        buf = bytearray(mib * 1024 * 1024)
        buf[::4096] = b"\x01" * (len(buf) // 4096)
        WORKER_BUFFER.append(buf)
    return init


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--input", type=int, default=64, help="tokens a sample")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dim", type=int, default=1024, help="embedding width")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-mib", type=int, default=48)
    a = p.parse_args()
    torch.manual_seed(0)
    embed, head = nn.Embedding(a.vocab, a.dim), nn.Linear(a.dim, a.classes)
    model = lambda x: head(embed(x).relu().mean(dim=1))  # noqa: E731
    params = list(embed.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = Synthetic(a.batch_size * a.steps, a.input, a.vocab, a.classes)
    loader = DataLoader(data, batch_size=a.batch_size, num_workers=a.workers, persistent_workers=True,
                        prefetch_factor=1, worker_init_fn=hold(a.worker_mib))
    step_seconds, last = [], time.perf_counter()
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        print(f"step {step + 1}/{a.steps} loss {loss.item():.4f}", flush=True)
    print(f"train_loader: trained batch {a.batch_size} for {a.steps} steps with {a.workers} persistent "
          f"workers", flush=True)
    if bt:
        bt.report(batch=a.batch_size, steps=a.steps, accumulation=1, step_seconds=step_seconds)


if __name__ == "__main__":
    main()
