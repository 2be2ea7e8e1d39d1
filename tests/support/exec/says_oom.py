#!/usr/bin/env python3
"""Fake training command whose failures say "out of memory" without any memory running out
(standard library only): what batchfit must not count as out of memory.

  says_oom.py MODE BATCH [--from N]

Sizes below N (default 5) fit: exit 0. From N up, MODE:

  upload   raises RuntimeError("checkpoint upload failed: remote said 'out of memory' (HTTP 507)")
  hint     prints a hint that mentions 'out of memory' on stderr and exits 1
"""
import sys
import time

mode, batch = sys.argv[1], int(sys.argv[2])
first = int(sys.argv[4]) if sys.argv[3:4] == ["--from"] else 5
time.sleep(0.1)  # long enough to be measured
if batch < first:
    sys.exit(0)
if mode == "upload":
    raise RuntimeError("checkpoint upload failed: remote said 'out of memory' (HTTP 507)")
if mode == "hint":
    print(f"step 1 at batch {batch}: loss 2.31", flush=True)
    print("hint: if training stops with 'out of memory', lower --batch-size", file=sys.stderr)
    sys.exit(1)
sys.exit(f"says_oom.py: unknown mode {mode}")
