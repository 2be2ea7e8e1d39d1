#!/usr/bin/env python3
"""torchrun's failure report when one rank runs out of memory: a real one, and a fake for fast tests.

Real (needs torch; gloo, CPU), to capture what torchrun prints:

    torchrun --nproc-per-node 2 torchrun_oom.py [--fail-rank 1] [--error KIND] [--record]

  rank --fail-rank raises KIND; the other ranks wait in a barrier until torchrun ends them.
  KIND: memoryerror (Python MemoryError), torch-oom (torch.OutOfMemoryError("CUDA out of memory. ...")),
        cpu-alloc (a real over-sized torch.empty on CPU: DefaultCPUAllocator), shape (a non-OOM RuntimeError)
  --record  wraps main in torch.distributed.elastic's @record, so the error file carries the traceback
            and torchrun's report shows it (without it the report says "To enable traceback see: ...")

Fake (standard library only), for tests that must not need torch:

    torchrun_oom.py --print-sample [FILE]

  prints FILE (default: torchrun_failure_sample.txt next to this script, a captured real run) to stderr
  and exits 1, as torchrun does when a worker fails.
"""
import argparse
import os
import sys


def fail(kind):
    if kind == "memoryerror":
        big = bytearray(1 << 50)  # 1 PiB: MemoryError from Python's allocator
        return big
    import torch
    if kind == "torch-oom":
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 139.80 GiB of which "
            "1.05 GiB is free.")
    if kind == "cpu-alloc":
        return torch.empty(1 << 50, dtype=torch.uint8)
    if kind == "shape":
        return torch.ones(4, 3) @ torch.ones(4, 3)
    raise ValueError(kind)


def main(args):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} of {dist.get_world_size()} up (pid {os.getpid()})", flush=True)
    if rank == args.fail_rank:
        fail(args.error)
    dist.barrier()  # the other ranks wait here until torchrun ends them
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--error", choices=["memoryerror", "torch-oom", "cpu-alloc", "shape"], default="torch-oom")
    p.add_argument("--record", action="store_true")
    p.add_argument("--print-sample", nargs="?", const=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                    "torchrun_failure_sample.txt"))
    a = p.parse_args()
    if a.print_sample:
        with open(a.print_sample) as f:
            sys.stderr.write(f.read())
        sys.exit(1)
    if a.record:
        from torch.distributed.elastic.multiprocessing.errors import record
        record(main)(a)
    else:
        main(a)
