#!/usr/bin/env python3
"""Fake training command (standard library only): a job whose first big allocation is refused up
front by RLIMIT_DATA, so its data segment never rises near the limit.

  refused.py MODE BATCH

Sizes up to 8 fit: hold BATCH MiB a moment, exit 0. Above 8 the job fails with PyTorch's CPU
allocator's exact refusal text (`DefaultCPUAllocator: can't allocate memory: you tried to allocate N
bytes`), N by MODE:

  crosses   the headroom left under RLIMIT_DATA plus 256 MiB (the request itself crosses the limit)
  fits      1 MiB (a request that would have fit: the limit is not what refused it)
"""
import resource
import sys
import time

mode, batch = sys.argv[1], int(sys.argv[2])


def data_segment():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    sys.exit("refused.py: no VmData in /proc/self/status")


if batch <= 8:
    held = bytearray(batch << 20)
    time.sleep(0.3)
    sys.exit(0)
limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
if limit == resource.RLIM_INFINITY:
    sys.exit("refused.py: run me under RLIMIT_DATA")
time.sleep(0.3)  # long enough for the data segment to be sampled
if mode == "crosses":
    asked = limit - data_segment() + (256 << 20)
elif mode == "fits":
    asked = 1 << 20
else:
    sys.exit(f"refused.py: unknown mode {mode}")
raise RuntimeError(
    "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
    f"you tried to allocate {asked} bytes. Error code 12 (Cannot allocate memory)"
)
