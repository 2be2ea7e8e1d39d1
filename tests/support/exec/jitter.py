#!/usr/bin/env python3
"""A fake training command whose peak moves from run to run (standard library only): BATCH MiB plus a
jitter of 0 to JITTER MiB that changes with each trial (drawn from BATCHFIT_TRIAL, so a probe is
repeatable), plus ACCUMULATING MiB (default 0) when it accumulates (BATCHFIT_ACCUMULATION above 1),
allocated 1 MiB at a time so that a limit stops it where its memory reaches the limit; then it holds
its memory JITTER_HOLD seconds (default 0.15) and exits.

  python3 jitter.py BATCH JITTER [ACCUMULATING]
"""
import os
import sys
import time

batch, jitter = int(sys.argv[1]), int(sys.argv[2])
accumulating = int(sys.argv[3]) if len(sys.argv) > 3 else 0
trial = int(os.environ.get("BATCHFIT_TRIAL", "0"))
extra = (trial * 7919 + 13) % (jitter + 1)
if int(os.environ.get("BATCHFIT_ACCUMULATION", "1")) > 1:
    extra += accumulating
chunks = []
for _ in range(batch + extra):
    c = bytearray(1 << 20)
    c[::4096] = b"\x01" * 256
    chunks.append(c)
time.sleep(float(os.environ.get("JITTER_HOLD", "0.15")))
