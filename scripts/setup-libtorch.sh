#!/usr/bin/env bash
# Installs libtorch (PyTorch 2.11.0 from PyPI, the version tch 0.24.0 binds to) into a
# virtual environment OUTSIDE the clone, so fresh clones and CI runs reuse it.
#
#   default location: ${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/libtorch-2.11.0
#   override:         BATCHFIT_LIBTORCH_VENV=/some/dir
#
# Idempotent: when the venv already holds torch 2.11.0 it prints the path in well under a second.
# Nothing in batchfit ever deletes this directory (`batchfit cache clear` does not touch it).
# Prints the LIBTORCH directory (…/site-packages/torch) as its last line.
set -euo pipefail
TORCH_VERSION=2.11.0
VENV="${BATCHFIT_LIBTORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/libtorch-$TORCH_VERSION}"
PY="${PYTHON:-python3}"

find_torch() {
  local d
  for d in "$VENV"/lib/python3*/site-packages/torch; do
    if [ -f "$d/lib/libtorch_cpu.so" ] && [ -f "$VENV/.batchfit-ok-$TORCH_VERSION" ]; then
      echo "$d"; return 0
    fi
  done
  return 1
}

if dir=$(find_torch); then
  echo "$dir"; exit 0
fi

echo "batchfit: installing torch==$TORCH_VERSION into $VENV (about 1 minute, 4.6 GB)" >&2
mkdir -p "$(dirname "$VENV")"
# A lock so two builds started at once do not install into the same venv together.
exec 9>"$VENV.lock"
flock 9
if dir=$(find_torch); then echo "$dir"; exit 0; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" >&2
touch "$VENV/.batchfit-ok-$TORCH_VERSION"
dir=$(find_torch) || { echo "batchfit: torch installed but libtorch_cpu.so not found under $VENV" >&2; exit 3; }
echo "$dir"
