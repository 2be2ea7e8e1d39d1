#!/usr/bin/env bash
# Probe the torchrun job itself, then train with the plan: `batchfit probe --exec` runs the whole job
# (torchrun, its NPROC ranks of train.py) as each trial, fresh, at the trial's micro-batch per rank and
# under the trial's memory limit, so the plan is proven on exactly the job that then trains — its DDP
# buckets, gloo/NCCL buffers and every rank — not on a model batchfit rebuilt.
#
#   NPROC=2 GLOBAL_BATCH=8192 examples/torchrun/probe-exec.sh [train.py arguments for the training run]
#
# Needs a batchfit with `probe --exec`, and `torchrun` and `python3` (with torch) on PATH. Each trial runs
#   torchrun --standalone --nproc-per-node NPROC train.py --micro-batch {batch} --accumulation {accumulation} --steps {steps}
# (batchfit fills the placeholders). On CPU the limit holds the job's whole process tree (torchrun's agent
# and every rank) in one memory cgroup where batchfit may make one (the plan's limit_mechanism says
# cgroup-v1/v2), else RLIMIT_DATA on each process; so the budget below is the whole job's: a Python
# process with torch needs ~0.4 GiB of resident memory before its first sample, three of them ~1.1 GiB.
# On GPUs: PROBE=(--backend cuda --gpus 0,1) gives every trial both GPUs (world size 2), the limit per GPU.
# --fingerprint-file puts train.py's content hash in the plan: an edited script is another job, and is
# not answered from the plan cache.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NPROC=${NPROC:-2}
GLOBAL_BATCH=${GLOBAL_BATCH:-8192}
PLAN=${PLAN:-plan-exec.json}
# sizes on a grid of 64: a coarser grid is fewer trials (each one starts the whole job)
PROBE=(--backend cpu --memory-budget 2.5GiB --multiple-of 64)
if [ -n "${BATCHFIT_PROBE_ARGS:-}" ]; then read -r -a PROBE <<<"$BATCHFIT_PROBE_ARGS"; fi

# optional: batchfit's trial helper, imported by train.py when it is on the path, reports what each
# rank of each trial really trained (batch, steps, step times, world size), so batchfit can check a
# trial that exited 0
if batchfit python-helper > batchfit_trial.py 2> /dev/null; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  rm -f batchfit_trial.py
fi

vars=$(batchfit probe "${PROBE[@]}" --global-batch "$GLOBAL_BATCH" --world-size "$NPROC" \
         --out "$PLAN" --format env \
         --exec --fingerprint-file "$here/train.py" -- \
         torchrun --standalone --nproc-per-node "$NPROC" \
         "$here/train.py" --micro-batch '{batch}' --accumulation '{accumulation}' --steps '{steps}') || {
  rc=$?; eval "$vars"
  echo "batchfit: exit $rc, status ${BATCHFIT_STATUS:-none}: no plan to train with" >&2; exit "$rc"; }
eval "$vars"
echo "plan $BATCHFIT_PLAN: micro-batch $BATCHFIT_MICRO_BATCH × accumulation $BATCHFIT_ACCUMULATION" \
     "× world size $BATCHFIT_WORLD_SIZE = global batch $BATCHFIT_GLOBAL_BATCH"
# the same job, with the plan's numbers (the BATCHFIT_* exports, inherited by every rank)
exec torchrun --standalone --nproc-per-node "$NPROC" "$here/train.py" "$@"
