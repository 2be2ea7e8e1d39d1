#!/usr/bin/env python3
"""Fake training command that trains nothing and exits 0 with a report that does not match the request.

  liar.py [--lie batch|steps|accumulation|no-report|garbage|schema] [--helper DIR]

  batch         reports half the batch it was given (at least 1; a script with a hard-coded batch size)
  steps         reports one step fewer than asked (a script that stopped early but exited 0)
  accumulation  reports accumulation 1 whatever was asked (a script that ignores it)
  no-report     writes no report at all
  garbage       writes a result file that is not JSON
  schema        writes a well-formed report with schema "batchfit-trial-report/999"
The request comes from BATCHFIT_BATCH / BATCHFIT_STEPS / BATCHFIT_ACCUMULATION (set by batchfit); the
report goes to BATCHFIT_RESULT through batchfit_trial (from --helper DIR, else sys.path). Standard
library only.
"""
import argparse
import json
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lie", choices=["batch", "steps", "accumulation", "no-report", "garbage", "schema"],
                   default="batch")
    p.add_argument("--helper", help="directory holding batchfit_trial.py")
    args = p.parse_args()
    if args.helper:
        sys.path.insert(0, args.helper)
    import batchfit_trial as bt

    batch, steps, accum = bt.batch_size(default=8), bt.steps(default=3), bt.accumulation(default=1)
    result = os.environ.get("BATCHFIT_RESULT")
    if args.lie == "batch":
        bt.report(batch=max(1, batch // 2), steps=steps, accumulation=accum, step_seconds=[0.01] * steps)
    elif args.lie == "steps":
        bt.report(batch=batch, steps=steps - 1, accumulation=accum, step_seconds=[0.01] * (steps - 1))
    elif args.lie == "accumulation":
        bt.report(batch=batch, steps=steps, accumulation=1, step_seconds=[0.01] * steps)
    elif args.lie == "garbage" and result:
        with open(result, "w") as f:
            f.write("{this is not json\n")
    elif args.lie == "schema" and result:
        bt.report(batch=batch, steps=steps, accumulation=accum, step_seconds=[0.01] * steps)
        with open(result) as f:
            obj = json.load(f)
        obj["schema"] = "batchfit-trial-report/999"
        with open(result, "w") as f:
            json.dump(obj, f)
    print(f"liar: asked batch {batch}, steps {steps}, accumulation {accum}; lie: {args.lie}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
