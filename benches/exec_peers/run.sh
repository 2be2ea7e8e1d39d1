#!/usr/bin/env bash
# batchfit probe --exec vs Lightning's and Accelerate's batch-size finders on the same training scripts, on
# CPU, each answer against the script's true maximum (issue #13). Results: benches/data/exec_peers.json and
# the exec-peers section of docs/benchmarks.md.
#
#   benches/exec_peers/run.sh                              # everything: about 35 min on 2 shared cores
#   benches/exec_peers/run.sh --mechanisms rlimit --scripts plain --stages batchfit,truth,doc
#   benches/exec_peers/run.sh --stages doc                 # only re-render the doc section
#   benches/exec_peers/run.sh --help                       # all flags (run.py)
#
# Environment: BATCHFIT_BENCH_VENV (default ${XDG_CACHE_HOME:-~/.cache}/batchfit/bench-venv): a venv whose
# python imports torch 2.11, lightning and accelerate (tests/support/exec/MEASUREMENTS.md says how to make
# one that uses the libtorch venv's torch); EXEC_PEERS_NO_BUILD=1 skips `cargo build --release --bins`.
# The cgroup rows need the right to create memory cgroups (root, or a delegated cgroup).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="${BATCHFIT_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/bench-venv}"
py="$venv/bin/python"
if [[ ! -x "$py" ]]; then
  echo "run.sh: no Python at $py (set BATCHFIT_BENCH_VENV)" >&2
  exit 2
fi
if ! "$py" -c 'import torch, lightning, accelerate' 2>/dev/null; then
  echo "run.sh: $py cannot import torch, lightning and accelerate" >&2
  exit 2
fi
build=1
for a in "$@"; do
  case "$a" in -h|--help|--bin-dir|--bin-dir=*) build=0 ;; esac
done
[[ " $* " == *" --stages doc "* || "${EXEC_PEERS_NO_BUILD:-0}" == 1 ]] && build=0
if [[ $build == 1 ]]; then
  LIBTORCH="$(bash scripts/setup-libtorch.sh)"
  export LIBTORCH
  cargo build --release --bins >&2
fi
bin_args=()
if [[ " $* " != *" --bin-dir"* && " $* " != *" -h "* && " $* " != *" --help "* ]]; then
  # copies, so a rebuild of target/release during the benchmark cannot swap binaries between stages
  snap="$root/target/exec-peers/bin"
  mkdir -p "$snap"
  cp -f target/release/batchfit target/release/batchfit-train "$snap/"
  bin_args=(--bin-dir "$snap")
fi
exec python3 "$root/benches/exec_peers/run.py" --python "$py" "${bin_args[@]}" "$@"
