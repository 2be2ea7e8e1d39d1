#!/usr/bin/env python3
"""Fake training command for fast tests of `batchfit probe --exec`: standard library only, no torch.

Each "step" allocates and touches (one write per page) `batch x K` MiB plus keeps a fixed base
allocated for the whole run (like weights), so its peak memory is `base + batch x K` MiB. A step
allocates its memory one sample at a time, so under RLIMIT_DATA the data segment climbs to the limit
and the kernel refuses the next sample's (Python raises `MemoryError`; the step's memory is held a
moment, as a real step's is while the error propagates, so the limit's samples see it). With
`--capacity-mib C` it runs out of memory for real (oom.py: its data segment taken to the limit) when
`base + batch x K > C`, for exact tests under a limit far above C.

  hog.py --batch {batch} [--steps {steps}] [--mib-per-sample K] [--base-mib B] [--capacity-mib C]
         [--sleep S] [--report] [--helper DIR] [--report-steps N] [--linger S] [--evaluate F]

Without --batch the batch comes from BATCHFIT_BATCH (an error if neither is there); without --steps
from BATCHFIT_STEPS, else 3. `--report` writes the trial report through batchfit_trial (imported from
--helper DIR, else from sys.path), saying `--report-steps N` steps when given (a job that did fewer
than asked). `--linger S` sleeps S seconds after the report, before exit 0 (a job's teardown:
checkpoint saving, logger flush). `--evaluate F` then runs an evaluation pass that needs
`base + batch x K x F` MiB (out of memory for real above the capacity, as a step is): a job whose
memory peaks after its last step. Exit 0 after the last step (and the evaluation).
"""
import argparse
import os
import sys
import time

MIB = 1024 * 1024
PAGE = 4096


def env_int(name):
    raw = os.environ.get(name)
    return int(raw) if raw else None


def touch(buf):
    """Write one byte per page so the memory is really used (RSS), not only reserved."""
    n = len(buf)
    buf[::PAGE] = b"\x01" * ((n + PAGE - 1) // PAGE)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=env_int("BATCHFIT_BATCH"))
    p.add_argument("--steps", type=int, default=env_int("BATCHFIT_STEPS") or 3)
    p.add_argument("--mib-per-sample", type=float, default=1.0, help="K: MiB per sample and step")
    p.add_argument("--base-mib", type=float, default=8.0, help="kept for the whole run")
    p.add_argument("--capacity-mib", type=float, help="raise MemoryError when base + batch*K exceeds it")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    p.add_argument("--report", action="store_true", help="write the trial report through batchfit_trial")
    p.add_argument("--helper", help="directory holding batchfit_trial.py")
    p.add_argument("--report-steps", type=int, help="steps the report says (default: the steps done)")
    p.add_argument("--linger", type=float, default=0.0, help="seconds to sleep after the report")
    p.add_argument("--evaluate", type=float, help="F: an evaluation pass of batch*K*F MiB after it")
    args = p.parse_args()
    if args.batch is None:
        sys.exit("hog.py: no batch size: pass --batch N or set BATCHFIT_BATCH")
    if args.batch < 1 or args.steps < 0:
        sys.exit(f"hog.py: bad batch {args.batch} or steps {args.steps}")

    bt = None
    if args.report:
        if args.helper:
            sys.path.insert(0, args.helper)
        try:
            import batchfit_trial as bt
        except ImportError as e:
            sys.exit(f"hog.py: --report needs batchfit_trial.py (--helper DIR or sys.path): {e}")

    need_mib = args.base_mib + args.batch * args.mib_per_sample
    if args.capacity_mib is not None and need_mib > args.capacity_mib:
        import oom  # next to this file

        oom.run_out(f"hog: {need_mib:g} MiB needed, capacity {args.capacity_mib:g} MiB")

    base = bytearray(int(args.base_mib * MIB))
    touch(base)
    if bt:
        bt.start()
    for _ in range(args.steps):
        activations = []
        try:
            for _ in range(args.batch):
                sample = bytearray(int(args.mib_per_sample * MIB))  # MemoryError at the limit
                touch(sample)
                activations.append(sample)
        except MemoryError:
            time.sleep(0.2)
            raise
        del activations
        if args.sleep:
            time.sleep(args.sleep)
        if bt:
            bt.step()
    if bt:
        bt.report(batch=args.batch, accumulation=1, steps=args.report_steps)
    print(f"hog: batch {args.batch}, {args.steps} steps, peak about {need_mib:g} MiB", flush=True)
    time.sleep(args.linger)
    if args.evaluate is not None:
        eval_mib = args.base_mib + args.batch * args.mib_per_sample * args.evaluate
        if args.capacity_mib is not None and eval_mib > args.capacity_mib:
            import oom  # next to this file

            oom.run_out(f"hog: the evaluation needs {eval_mib:g} MiB, capacity {args.capacity_mib:g} MiB")
        outputs = bytearray(int(args.batch * args.mib_per_sample * args.evaluate * MIB))
        touch(outputs)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
