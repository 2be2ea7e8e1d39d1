#!/usr/bin/env python3
"""A plain PyTorch script that trains from a DataLoader over an in-memory dataset of `--samples`
samples, without batchfit's helper: the job whose DataLoader yields fewer samples than the batch it
was given when the dataset is shorter (or with `--clamp`, `min(batch, len(dataset))`, which changes
nothing here but says it), so that batchfit's DataLoader watcher is what tells.

    python train_dataset.py --batch-size 256 --steps 3 --samples 64

A sample is `--input` float32 values (256 KiB at the default 65536), so the memory of a batch that
really reaches the model grows with it. `--no-torch` runs a job that never imports torch (it only
writes `--marker`, if given). `--report` writes batchfit's helper report (batchfit_trial on
PYTHONPATH), which names the job's packages, as a warm trial needs.
"""
import argparse
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--input", type=int, default=65536)
    p.add_argument("--clamp", action="store_true")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--report", action="store_true")
    p.add_argument("--marker", default=None, help="a file this run appends a line to")
    args = p.parse_args()
    if args.marker:
        with open(args.marker, "a") as f:
            f.write("job\n")
    if args.no_torch:
        print("train_dataset: no torch, nothing trained")
        return
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(args.samples, args.input), torch.randint(0, 10, (args.samples,)))
    batch = min(args.batch_size, len(ds)) if args.clamp else args.batch_size
    loader = DataLoader(ds, batch_size=batch, shuffle=True)
    model = nn.Sequential(nn.Linear(args.input, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == args.steps:
                break
    print(f"train_dataset: {step} steps at batch {args.batch_size}", file=sys.stderr)
    if args.report:
        import batchfit_trial

        batchfit_trial.report(batch=args.batch_size, steps=step, accumulation=1)


if __name__ == "__main__":
    main()
