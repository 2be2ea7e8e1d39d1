#!/usr/bin/env bash
# End-to-end soundness benchmark: a recommendation must train. Probes a model on CPU under a real
# memory limit, then trains `batchfit-train` for many steps with the plan, under the same limit
# (--memory-limit plan), both at the recommended micro-batch × accumulation and at the largest
# fitting size itself. Any OOM in training is a bug in the probe. Results: docs/soundness.md.
#
#   benches/soundness.sh [BUDGET=1GiB] [STEPS=50] [extra probe flags…]
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-1GiB}"; steps="${2:-50}"; shift $(( $# > 2 ? 2 : $# )) || true
LIBTORCH="$(scripts/setup-libtorch.sh)"; export LIBTORCH
cargo build --release --bins -q
out=target/soundness; mkdir -p "$out"
t0=$(date +%s.%N)
./target/release/batchfit probe --backend cpu --memory-budget "$budget" --global-batch 16384 \
  --out "$out/plan.json" --quiet --no-cache --format text "$@" | tee "$out/probe.txt"
t1=$(date +%s.%N)
max=$(python3 -c "import json;print(json.load(open('$out/plan.json'))['recommendation']['max_fitting_batch'])")
rec=$(python3 -c "import json;r=json.load(open('$out/plan.json'))['recommendation'];print(r['micro_batch'],r['accumulation'])")
set +e
./target/release/batchfit-train --plan "$out/plan.json" --steps "$steps" --memory-limit plan -q > "$out/train-rec.txt" 2>&1
rc1=$?
./target/release/batchfit-train --plan "$out/plan.json" --steps "$steps" --memory-limit plan -q \
  --micro-batch "$max" --accumulation 1 > "$out/train-max.txt" 2>&1
rc2=$?
./target/release/batchfit-train --plan "$out/plan.json" --steps 3 --memory-limit plan -q \
  --micro-batch "$((max + 1))" --accumulation 1 > "$out/train-above.txt" 2>&1
rc3=$?
set -e
t2=$(date +%s.%N)
{
  echo "# Soundness: recommendations train under the limit they were probed for"
  echo
  echo "Run by \`benches/soundness.sh $budget $steps $*\` on $(nproc) cores, $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)."
  echo
  echo "| what | result |"
  echo "|---|---|"
  echo "| probe | $(head -1 "$out/probe.txt") ($(python3 -c "print(round($t1-$t0,1))") s, $(python3 -c "import json;print(len(json.load(open('$out/plan.json'))['trials']))") trials) |"
  echo "| recommended micro × accumulation ($rec), $steps steps under the plan's limit | exit $rc1: $(tail -1 "$out/train-rec.txt") |"
  echo "| largest fitting size $max × 1, $steps steps under the plan's limit | exit $rc2: $(tail -1 "$out/train-max.txt") |"
  echo "| one above ($((max + 1))), 3 steps (informational: exit 6 = out of memory; exit 0 means the trainer needs slightly less than the probe's trial process, the safe side) | exit $rc3 |"
} > docs/soundness.md
cat docs/soundness.md
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
