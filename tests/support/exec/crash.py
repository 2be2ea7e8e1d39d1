#!/usr/bin/env python3
"""Fake training command that fails in a way that is NOT running out of memory.

  crash.py [--mode error|segv|abort|exit|recovered-oom] [--code N] [--from N]

With --from N, sizes below N train instead (hold BATCH/16 MiB a moment, so the peak grows with the
batch) and exit 0: a job that breaks only from some size up (a shape that stops matching).

  error          (default) a PyTorch-style shape-mismatch RuntimeError traceback on stderr, exit 1
  segv           SIGSEGV to itself (no Python traceback; the exit status says signal 11)
  abort          SIGABRT via os.abort() (what a C++ `terminate` does, without std::bad_alloc)
  exit           prints `crash: giving up` on stderr and exits with --code (default 2)
  recovered-oom  prints an OOM message as a log line (as a script that caught it and went on would)
                 and exits 0 (for measure.py the exit status decides; batchfit reads the decisive
                 lines of an exit 0 too and makes this trial an error, neither a fit nor an OOM:
                 docs/errors.md, "A job that catches its out-of-memory")
Standard library only.
"""
import argparse
import os
import signal
import sys


def forward(x_shape, w_shape):
    # torch's own wording for a matmul shape error
    raise RuntimeError(
        f"mat1 and mat2 shapes cannot be multiplied ({x_shape[0]}x{x_shape[1]} and {w_shape[0]}x{w_shape[1]})"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["error", "segv", "abort", "exit", "recovered-oom"], default="error")
    p.add_argument("--code", type=int, default=2)
    p.add_argument("--batch", type=int, default=int(os.environ.get("BATCHFIT_BATCH") or 64))
    p.add_argument("--from", dest="first", type=int, default=0)
    args = p.parse_args()
    if args.batch < args.first:
        import hold  # next to this file

        hold.hold(args.batch / 16)
        return 0
    print(f"crash: batch {args.batch}, mode {args.mode}", flush=True)
    if args.mode == "error":
        forward((args.batch, 1024), (512, 10))
    elif args.mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif args.mode == "abort":
        os.abort()
    elif args.mode == "exit":
        print("crash: giving up", file=sys.stderr, flush=True)
        sys.exit(args.code)
    elif args.mode == "recovered-oom":
        print("warning: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; "
              "retrying with a smaller batch", file=sys.stderr, flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
