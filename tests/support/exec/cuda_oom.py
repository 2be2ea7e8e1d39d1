#!/usr/bin/env python3
"""Fake training command: prints PyTorch's CUDA out-of-memory traceback when the batch is too big.

  cuda_oom.py [--batch {batch}] [--threshold T] [--style plain|torchrun-rank] [--reach-limit]

Batch from --batch, else BATCHFIT_BATCH. batch > T (default 32): the traceback below on stderr, exit 1
(what an uncaught torch.OutOfMemoryError does); otherwise it holds `batch` MiB a moment and exits 0. Standard library only. The message is
torch 2.11's (c10/cuda/CUDACachingAllocator.cpp), numbers made up for an H200. With --reach-limit the
data segment is first taken to RLIMIT_DATA (oom.py), so that a cpu probe's measurements agree with the
message (batchfit counts an out-of-memory message only then); without it the message comes at a tiny
peak, as from a job whose GPU ran out while batchfit limited its host memory.
"""
import argparse
import os
import sys

TRACEBACK = """Traceback (most recent call last):
  File "/home/user/project/train.py", line 61, in <module>
    main()
  File "/home/user/project/train.py", line 52, in main
    loss.backward()
  File "/usr/local/lib/python3.11/site-packages/torch/_tensor.py", line 630, in backward
    torch.autograd.backward(
  File "/usr/local/lib/python3.11/site-packages/torch/autograd/__init__.py", line 364, in backward
    _engine_run_backward(
  File "/usr/local/lib/python3.11/site-packages/torch/autograd/graph.py", line 865, in _engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of 139.80 GiB \
of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. Of the \
allocated memory {alloc:.2f} GiB is allocated by PyTorch, and {unalloc:.2f} GiB is reserved by PyTorch but unallocated. \
If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
fragmentation.  See documentation for Memory Management  \
(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=int(os.environ.get("BATCHFIT_BATCH") or 0) or None)
    p.add_argument("--threshold", type=int, default=32, help="largest batch that fits")
    p.add_argument("--reach-limit", action="store_true", help="take the data segment to RLIMIT_DATA first")
    args = p.parse_args()
    if args.batch is None:
        sys.exit("cuda_oom.py: no batch size: pass --batch N or set BATCHFIT_BATCH")
    print(f"cuda_oom: batch {args.batch}, fits up to {args.threshold}", flush=True)
    if args.batch <= args.threshold:
        import hold  # next to this file: memory that grows with the batch

        hold.hold(args.batch)
        return 0
    if args.reach_limit:
        import oom  # next to this file

        held = oom.reach_limit()  # noqa: F841 (kept until exit)
    tried = 0.5 * args.batch / args.threshold
    free = 1.05
    used = 139.80 - free
    alloc = used - 2.91
    sys.stderr.write(TRACEBACK.format(tried=tried, free=free, used=used, alloc=alloc, unalloc=2.91))
    return 1


if __name__ == "__main__":
    sys.exit(main())
