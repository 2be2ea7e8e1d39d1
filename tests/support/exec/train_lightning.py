#!/usr/bin/env python3
"""The train_mlp.py model as a LightningModule, trained by `Trainer(max_steps=..., accumulate_grad_batches=...)`
on CPU, reporting to batchfit through `batchfit_trial.BatchfitCallback`. Needs Lightning (the benchmark
venv); batchfit_trial.py must be importable (next to the script or on PYTHONPATH).

    python train_lightning.py --batch-size 256 --steps 100 --accumulation 2
    batchfit probe --exec -- python train_lightning.py --batch-size {batch} --steps {steps} --accumulation {accumulation}

Synthetic data: an IterableDataset that yields whole batches (DataLoader(batch_size=None)), so a batch
costs one randn, as in train_mlp.py. The module builds its own loader from its `batch_size` attribute
(`train_dataloader()`), the layout Lightning's batch-size finder (`Tuner.scale_batch_size`) needs: the
benchmark in benches/exec_peers/ runs that finder on this module and trainer (`build_model`,
`make_trainer`).
"""
import argparse
import sys

import batchfit_trial as bt
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

try:
    import lightning as L
except ImportError:
    import pytorch_lightning as L


class Batches(IterableDataset):
    def __init__(self, batch, inputs, classes, seed):
        self.batch, self.inputs, self.classes, self.seed = batch, inputs, classes, seed

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            yield (torch.randn(self.batch, self.inputs, generator=gen),
                   torch.randint(0, self.classes, (self.batch,), generator=gen))


class MLP(L.LightningModule):
    def __init__(self, inputs, hidden, classes, lr, batch_size=64, seed=0):
        super().__init__()
        self.batch_size, self.seed = batch_size, seed
        layers, width = [], inputs
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)
        self.loss_fn = nn.CrossEntropyLoss()
        self.lr = lr
        self.inputs, self.classes = inputs, classes

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(Batches(self.batch_size, self.inputs, self.classes, self.seed), batch_size=None)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--accumulation", type=int, default=None)
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", default="128,128")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_model(args, batch):
    torch.manual_seed(args.seed)
    return MLP(args.input, [int(h) for h in args.hidden.split(",") if h], args.classes, args.lr, batch, args.seed)


def make_trainer(steps, accumulation, **extra):
    """The script's Trainer (`extra`: more Trainer arguments, e.g. default_root_dir)."""
    return L.Trainer(max_steps=steps, accumulate_grad_batches=accumulation, accelerator="cpu", devices=1,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[bt.BatchfitCallback()], **extra)


def main():
    args = parse_args()
    batch = args.batch_size if args.batch_size is not None else bt.batch_size(default=64)
    steps = args.steps if args.steps is not None else bt.steps(default=100)
    accumulation = args.accumulation if args.accumulation is not None else bt.accumulation(default=1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_lightning.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")

    model = build_model(args, batch)
    trainer = make_trainer(steps, accumulation)
    trainer.fit(model)
    print(f"train_lightning: trained batch {batch} x accumulation {accumulation} for {trainer.global_step} steps",
          flush=True)


if __name__ == "__main__":
    main()
