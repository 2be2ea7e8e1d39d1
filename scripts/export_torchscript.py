#!/usr/bin/env python3
"""Export a PyTorch nn.Module as a TorchScript file that `batchfit probe --model FILE.pt` can train.

batchfit trains the module through libtorch (no Python at probe time), so the module must be
TorchScript: scripted (torch.jit.script, keeps control flow) or traced (torch.jit.trace, records one
run on example inputs). The exported module must return one tensor whose first dimension is the batch:
logits [B, ..., C] for --loss cross-entropy:C, any shape for mse, per-sample losses for mean.

Your own model:
    python scripts/export_torchscript.py --module mypkg.models:build --kwargs '{"num_classes": 10}' \
        --out model.pt [--mode trace --input 'f32[B,3,224,224]']
then probe it with the same input specs:
    batchfit probe --model model.pt --input 'f32[B,3,224,224]' --loss cross-entropy:10

`--module` names a class or a function returning a module (imported from the current directory or
PYTHONPATH). For --mode trace the example inputs are made from the --input specs with B=2.

Built-in demos (used by batchfit's tests and docs):
    python scripts/export_torchscript.py --demo mlp --out mlp.pt        # f32[B,16] -> 4 classes
    python scripts/export_torchscript.py --demo cnn --out cnn.pt        # f32[B,3,32,32] -> 10 classes
    python scripts/export_torchscript.py --demo two-input --out t.pt    # i64[B,8]<100, f32[B,4] -> 5 classes
"""
import argparse
import importlib
import json
import re
import sys

import torch
from torch import nn

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8}


class DemoMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class DemoCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class DemoTwoInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 12)
        self.dense = nn.Linear(4, 12)
        self.head = nn.Linear(12, 5)

    def forward(self, tokens, feats):
        return self.head(self.emb(tokens).mean(1) + self.dense(feats))


DEMOS = {"mlp": (DemoMlp, ["f32[B,16]"]), "cnn": (DemoCnn, ["f32[B,3,32,32]"]),
         "two-input": (DemoTwoInput, ["i64[B,8]<100", "f32[B,4]"])}

SPEC = re.compile(r"^\s*(\w+)\s*\[([^\]]*)\]\s*(?:<\s*(\d+))?\s*$")


def example(spec, batch=2):
    m = SPEC.match(spec)
    if not m or m.group(1) not in DTYPES:
        sys.exit(f"bad --input {spec!r}: expected DTYPE[DIMS] like f32[B,3,224,224] or i64[B,1024]<50257")
    dims = [batch if d.strip().upper() == "B" else int(d) for d in m.group(2).split(",")]
    dtype = DTYPES[m.group(1)]
    if dtype.is_floating_point:
        return torch.randn(dims, dtype=dtype)
    return torch.randint(0, int(m.group(3) or 2), dims, dtype=dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--module", help="pkg.module:ClassOrFactory building the nn.Module")
    src.add_argument("--demo", choices=sorted(DEMOS), help="a small built-in module")
    ap.add_argument("--kwargs", default="{}", help="JSON keyword arguments for --module")
    ap.add_argument("--mode", choices=["script", "trace"], default="script")
    ap.add_argument("--input", action="append", default=[], help="input spec (for --mode trace)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    if a.demo:
        cls, inputs = DEMOS[a.demo]
        model, inputs = cls(), a.input or inputs
    else:
        mod, _, name = a.module.partition(":")
        if not name:
            sys.exit("--module must be pkg.module:ClassOrFactory")
        sys.path.insert(0, ".")
        model = getattr(importlib.import_module(mod), name)(**json.loads(a.kwargs))
        inputs = a.input
    model.train()
    if a.mode == "trace":
        if not inputs:
            sys.exit("--mode trace needs --input specs for the example inputs")
        ts = torch.jit.trace(model, tuple(example(s) for s in inputs))
    else:
        ts = torch.jit.script(model)
    ts.save(a.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: {type(model).__name__}, {params} parameters; probe with: batchfit probe "
          f"--model {a.out} " + " ".join(f"--input '{s}'" for s in inputs) + " --loss ...")


if __name__ == "__main__":
    main()
