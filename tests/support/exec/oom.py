#!/usr/bin/env python3
"""Runs out of memory for real, for the fake training commands of the tests (standard library only).

batchfit counts an out-of-memory message only where the trial's measurements agree with its limit
running out, so a fake that merely prints `MemoryError` far below the limit is an error, not a proof.
This one reaches the limit: it reserves private writable address space (what RLIMIT_DATA counts;
never touched, so it costs no memory) in blocks from 64 MiB down to 1 MiB until the kernel refuses,
holds it for a moment so that batchfit's samples see the data segment at its limit, then raises
MemoryError, as a job whose allocation failed at its limit does. Without a finite RLIMIT_DATA there
is no limit to reach (a memory cgroup charges only touched pages): it raises MemoryError at once,
which batchfit reads as text only.

  python3 oom.py [MESSAGE]      (a shell fake: `[ "$1" -le 7 ] || exec python3 oom.py`)
  python3 oom.py --say TEXT     (the limit reached, TEXT on stderr, exit 1: a failure in a wording
                                 of its own, for `--oom-pattern`)
  import oom; oom.run_out(MESSAGE)
  import oom; held = oom.reach_limit()   (the limit reached; the fake then fails its own way)
"""
import mmap
import resource
import sys
import time


def reach_limit(hold=0.2):
    """Takes the data segment to RLIMIT_DATA (within 1 MiB) and holds it `hold` seconds; returns the
    mappings (keep them to keep the segment there). Nothing without a finite RLIMIT_DATA."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    held = []
    if soft != resource.RLIM_INFINITY:
        block = 64 << 20
        while block >= 1 << 20:
            try:
                held.append(mmap.mmap(-1, block, flags=mmap.MAP_PRIVATE,
                                      prot=mmap.PROT_READ | mmap.PROT_WRITE))
            except OSError:
                block //= 2
        time.sleep(hold)
    return held


def run_out(message="", hold=0.2):
    held = reach_limit(hold)
    raise MemoryError(message) if message else MemoryError()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--say"]:
        held = reach_limit()
        print(" ".join(sys.argv[2:]), file=sys.stderr, flush=True)
        sys.exit(1)
    run_out(" ".join(sys.argv[1:]))
