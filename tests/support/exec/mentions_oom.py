#!/usr/bin/env python3
"""Fake training command that mentions an out-of-memory in a log line without running out of memory
(standard library only): what batchfit must not count as evidence, whatever the exit.

  mentions_oom.py MODE BATCH [--from N]

Prints `tip: if you see torch.OutOfMemoryError, lower --batch` first, then holds BATCH MiB
(hold.py, so the peak grows with the batch). Sizes below N (default 9) exit 0. From N up, MODE:

  fits    exits 0 too: every size trains and exits cleanly
  quits   exits 1 at once, saying `config: no learning rate given` (no traceback)
  full    takes the data segment to RLIMIT_DATA (oom.reach_limit: the measured peak at the limit),
          releases it, then exits 1 as `quits` does: a job near its limit that fails for another
          reason
"""
import sys

import hold  # next to this file

mode, batch = sys.argv[1], int(sys.argv[2])
first = int(sys.argv[4]) if sys.argv[3:4] == ["--from"] else 9
print("tip: if you see torch.OutOfMemoryError, lower --batch", file=sys.stderr, flush=True)
held = hold.hold(batch)
if batch < first or mode == "fits":
    sys.exit(0)
if mode == "full":
    import oom

    del oom.reach_limit()[:]
elif mode != "quits":
    sys.exit(f"mentions_oom.py: unknown mode {mode}")
sys.exit("config: no learning rate given")
