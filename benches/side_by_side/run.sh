#!/usr/bin/env bash
# Real side-by-side benchmark on CPU: batchfit vs Lightning's batch-size finder (and Accelerate's), same MLP,
# same RLIMIT_DATA. Results: benches/data/side_by_side.json, benches/data/lightning_real_sequence.json,
# benches/data/accelerate_real_sequence.json, and the side-by-side section of docs/benchmarks.md.
#
#   benches/side_by_side/run.sh                       # everything, B = 1.25GiB, N = 5 (about 30 min on 2 shared cores)
#   benches/side_by_side/run.sh --budget 1GiB --steps 5 --stages batchfit,lightning,doc
#   benches/side_by_side/run.sh --stages doc          # only re-render the doc section from the saved results
#   benches/side_by_side/run.sh --help                # all flags (run.py)
#
# Environment: BATCHFIT_LIBTORCH_VENV (default ${XDG_CACHE_HOME:-~/.cache}/batchfit/libtorch-2.11.0) must hold
# torch 2.11.0 (scripts/setup-libtorch.sh) plus lightning==2.6.6 (and accelerate for that stage);
# SIDE_BY_SIDE_NO_BUILD=1 skips `cargo build --release --bins`; extra flags go to run.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="${BATCHFIT_LIBTORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/libtorch-2.11.0}"
py="$venv/bin/python"
if [[ ! -x "$py" ]]; then
  echo "run.sh: no Python at $py; run scripts/setup-libtorch.sh first" >&2
  exit 2
fi
if ! "$py" -c 'import lightning' 2>/dev/null; then
  echo "run.sh: Lightning is missing; install it: $venv/bin/pip install lightning==2.6.6 accelerate" >&2
  exit 2
fi
build=1
bin_args=()
for a in "$@"; do
  case "$a" in
    -h|--help|--stages=doc|--bin-dir|--bin-dir=*) build=0 ;;
  esac
done
[[ " $* " == *" --stages doc "* ]] && build=0
[[ "${SIDE_BY_SIDE_NO_BUILD:-0}" == 1 ]] && build=0
if [[ $build == 1 ]]; then
  LIBTORCH="$(bash scripts/setup-libtorch.sh)"
  export LIBTORCH
  cargo build --release --bins >&2
fi
if [[ " $* " != *" --bin-dir"* && " $* " != *" -h "* && " $* " != *" --help "* ]]; then
  # Run copies, so a rebuild of target/release during the benchmark cannot swap binaries between stages.
  snap="$root/target/side-by-side/bin"
  mkdir -p "$snap"
  cp -f target/release/batchfit target/release/batchfit-train "$snap/"
  bin_args=(--bin-dir "$snap")
fi
exec "$py" "$root/benches/side_by_side/run.py" --python "$py" "${bin_args[@]}" "$@"
