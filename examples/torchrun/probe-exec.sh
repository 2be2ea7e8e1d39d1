#!/usr/bin/env bash
# Probe the training job itself, then train with torchrun: `batchfit probe --exec` runs each trial as
# one rank of train.py (a fresh process at the trial's batch size, under the trial's memory limit), so
# the plan is proven on exactly the code that then trains, not on a model batchfit rebuilt.
#
#   NPROC=2 GLOBAL_BATCH=8192 examples/torchrun/probe-exec.sh
#
# Needs a batchfit with `probe --exec`, `torchrun` and `python3` (with torch) on PATH. Each trial runs
#   python3 train.py --micro-batch {batch} --accumulation {accumulation} --steps {steps}
# (batchfit fills the placeholders; train.py without torchrun is a world of one process, with the same
# DDP wrapper as every rank). --fingerprint-file puts train.py's content hash in the plan: an edited
# script is another model, and is not answered from the plan cache.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NPROC=${NPROC:-2}
GLOBAL_BATCH=${GLOBAL_BATCH:-8192}
PLAN=${PLAN:-plan-exec.json}
# a Python process with torch starts at ~0.8 GiB of data segment: the budget is above that
PROBE=(--backend cpu --memory-budget 2GiB)
if [ -n "${BATCHFIT_PROBE_ARGS:-}" ]; then read -r -a PROBE <<<"$BATCHFIT_PROBE_ARGS"; fi

# optional: batchfit's trial helper, imported by train.py when it is on the path, reports what each
# trial really trained (batch, steps, step times), so batchfit can check a trial that exited 0
if batchfit python-helper > batchfit_trial.py 2> /dev/null; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  rm -f batchfit_trial.py
fi

vars=$(batchfit probe "${PROBE[@]}" --global-batch "$GLOBAL_BATCH" --world-size "$NPROC" \
         --out "$PLAN" --format env \
         --exec --fingerprint-file "$here/train.py" -- \
         python3 "$here/train.py" --micro-batch '{batch}' --accumulation '{accumulation}' --steps '{steps}') || {
  rc=$?; eval "$vars"
  echo "batchfit: exit $rc, status ${BATCHFIT_STATUS:-none}: no plan to train with" >&2; exit "$rc"; }
eval "$vars"
echo "plan $BATCHFIT_PLAN: micro-batch $BATCHFIT_MICRO_BATCH × accumulation $BATCHFIT_ACCUMULATION" \
     "× world size $BATCHFIT_WORLD_SIZE = global batch $BATCHFIT_GLOBAL_BATCH"
exec torchrun --standalone --nproc-per-node "$NPROC" "$here/train.py" "$@"
