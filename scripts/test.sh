#!/usr/bin/env bash
# The whole test suite, on a fresh machine, in one command: install libtorch (once), then
# `cargo test --release` (unit, property and integration tests; the integration tests run the real
# binaries, including real libtorch trials on CPU under a small memory limit).
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(scripts/setup-libtorch.sh)"
export LIBTORCH
cargo test --release "$@"
