#!/usr/bin/env bash
# Probe, then train with torchrun on this machine.
#
# batchfit finds the largest micro-batch that fits one rank, splits GLOBAL_BATCH into
# micro-batch × accumulation × NPROC and exports the answer; train.py (next to this script) reads the
# exports and trains with them. Run it anywhere: the plan is written to $PLAN (default ./plan.json).
#
#   NPROC=2 GLOBAL_BATCH=8192 examples/torchrun/launch.sh [train.py arguments]
#
# Needs `batchfit` and `torchrun` on PATH. The probe below is a CPU probe of train.py's default model
# under 1 GiB, so it runs as is on a laptop; on GPUs put your device and model there, e.g.
#   PROBE=(--backend cuda --gpus all --model gpt2-small --precision amp-bf16)
# (or set BATCHFIT_PROBE_ARGS, split on spaces). Several nodes: see examples/slurm/multi-node.sbatch.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NPROC=${NPROC:-2}                    # processes (one per GPU) on this machine
GLOBAL_BATCH=${GLOBAL_BATCH:-8192}   # samples per optimizer step, all ranks together
PLAN=${PLAN:-plan.json}
PROBE=(--backend cpu --memory-budget 1GiB --mlp-input 65536 --mlp-hidden 16)
if [ -n "${BATCHFIT_PROBE_ARGS:-}" ]; then read -r -a PROBE <<<"$BATCHFIT_PROBE_ARGS"; fi

# --format env prints shell exports on stdout (progress goes to stderr). Capture first: `eval "$(…)"`
# would succeed whatever batchfit's exit code was.
vars=$(batchfit probe "${PROBE[@]}" --global-batch "$GLOBAL_BATCH" --world-size "$NPROC" \
         --out "$PLAN" --format env) || {
  rc=$?; eval "$vars"
  echo "batchfit: exit $rc, status ${BATCHFIT_STATUS:-none}: no plan to train with" >&2; exit "$rc"; }
eval "$vars"
echo "plan $BATCHFIT_PLAN: micro-batch $BATCHFIT_MICRO_BATCH × accumulation $BATCHFIT_ACCUMULATION" \
     "× world size $BATCHFIT_WORLD_SIZE = global batch $BATCHFIT_GLOBAL_BATCH"

# the BATCHFIT_* exports are inherited by every rank
exec torchrun --standalone --nproc-per-node "$NPROC" "$here/train.py" "$@"
