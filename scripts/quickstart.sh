#!/usr/bin/env bash
# The main job on a fresh machine, in one command: install libtorch (once), build, probe, train.
#
#   scripts/quickstart.sh [extra `batchfit probe` flags]
#
# Probes the default model (1024→2048→2048→10 MLP, Adam) for a global batch of 8192 and trains 10
# optimizer steps with the plan it wrote to ./plan.json. The backend is batchfit's default (auto: cuda
# when libtorch sees a GPU and NVML initialises, else cpu; extra flags such as `--backend cpu` go to the
# probe); the budget is BATCHFIT_DEMO_BUDGET (default 1GiB, so the demo takes minutes; `none` uses
# batchfit's own default: 80% of available RAM on cpu, the GPU's free memory on cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(scripts/setup-libtorch.sh)"
export LIBTORCH
# the commands run model trials and training on this venv's torch, as they would on yours
BATCHFIT_PYTHON="$(cd "$LIBTORCH/../../../.." && pwd)/bin/python"
export BATCHFIT_PYTHON
cargo build --release --workspace --bins
budget="${BATCHFIT_DEMO_BUDGET:-1GiB}"
extra=()
[ "$budget" != none ] && extra+=(--memory-budget "$budget")
set +e
./target/release/batchfit probe --global-batch 8192 --out plan.json --format text "${extra[@]}" "$@"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "quickstart: batchfit probe exited with $rc (see docs/exit-codes.md)" >&2
  exit "$rc"
fi
./target/release/batchfit-train --plan plan.json --steps 10 --memory-limit plan
