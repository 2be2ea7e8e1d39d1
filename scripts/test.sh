#!/usr/bin/env bash
# The whole test suite, on a fresh machine, in one command: install PyTorch (once, into a venv outside
# the clone), build the workspace (the `batchfit` command, which links no libtorch, and the torch
# runner `batchfit-torch`, built against that venv's torch), then run every test: the `batchfit`
# package's (unit, property and integration tests that run the real binaries, including real libtorch
# trials on CPU under a small memory limit) and the runner's own.
#
# The binaries find the venv's torch at run time through BATCHFIT_PYTHON, as they find a user's.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(scripts/setup-libtorch.sh)"
export LIBTORCH
BATCHFIT_PYTHON="$(cd "$LIBTORCH/../../../.." && pwd)/bin/python"
export BATCHFIT_PYTHON
cargo build --release --workspace --bins
cargo test --release -p batchfit "$@"
# the runner's unit tests load libtorch in the test process itself: put it on the library path
LD_LIBRARY_PATH="$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --release -p batchfit-torch "$@"
