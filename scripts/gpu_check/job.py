#!/usr/bin/env python3
"""A plain PyTorch training job of one of gpu-check's models: what a user's own script looks like, for stage 4
of scripts/gpu-check.sh (``batchfit probe --exec`` of this job, and the job's own true maximum).

    python job.py --arch-file ARCH.json --precision fp32|amp-bf16|bf16 --device cuda|cpu \
                  --batch-size N --steps S [--threads T]

The model is the architecture in ARCH.json (batchfit's ``model.config.architecture``: ResNet-50 from
torchvision or its built-in copy, batchfit's GPT-2 layout, the MLP; scripts/harness/models.py), trained with
Adam (lr 1e-3) on synthetic batches drawn on the device, in the precision given (amp-bf16: autocast around
forward and loss, f32 weights; bf16: bf16 weights and inputs) -- the Python twin of what batchfit's own
trial trains for that model, so its answers can be set side by side.

Nothing in it knows about batchfit except the optional helper ``batchfit_trial`` (``batchfit python-helper``;
importable through PYTHONPATH): under ``batchfit probe --exec`` it reports the batch, steps and step times
and, on CUDA, the caching allocator's peaks. An out-of-memory is the framework's own exception, unhandled
(``torch.OutOfMemoryError`` on CUDA; on CPU ``DefaultCPUAllocator: can't allocate memory`` or
``MemoryError`` under RLIMIT_DATA, or the kernel's OOM killer in a memory cgroup). Exit 0 when all steps
ran with a finite loss.
"""
import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/: harness

try:
    import batchfit_trial as bt
except ImportError:  # optional
    bt = None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch-file", required=True)
    p.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16", "bf16"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with open(args.arch_file) as f:
        arch = json.load(f)

    import torch
    from harness import models as M

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("job.py: torch sees no CUDA device")
    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    torch.manual_seed(args.seed)
    with dev:
        net, source = M.build(arch)
    dtype = torch.float32
    if args.precision == "bf16":
        net, dtype = net.to(torch.bfloat16), torch.bfloat16
    net.train()
    opt = M.adam(net.parameters())
    amp = (torch.autocast(device_type=args.device, dtype=torch.bfloat16) if args.precision == "amp-bf16"
           else contextlib.nullcontext())
    print(f"job.py: {M.describe(arch)} ({source}), {args.precision}, batch {args.batch_size} on {dev}", flush=True)
    trial = bt.Trial(batch=args.batch_size, accumulation=1) if bt else contextlib.nullcontext()
    with trial as t:
        for step in range(args.steps):
            x, y = M.synthetic_batch(arch, args.batch_size, dev, dtype)
            with amp:
                loss = M.loss_of(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
            if t:
                t.step()
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
        if not torch.isfinite(loss).item():
            sys.exit(f"job.py: non-finite loss {loss.item()}")
    peak = torch.cuda.max_memory_reserved(0) if args.device == "cuda" else None
    print(f"job.py: trained {args.steps} steps of {args.batch_size}"
          + (f"; CUDA peak reserved {peak} bytes" if peak is not None else ""), flush=True)


if __name__ == "__main__":
    main()
