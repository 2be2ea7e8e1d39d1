#!/usr/bin/env bash
# gpu-check.sh: the one prepared script that proves batchfit on a real NVIDIA GPU.
#
# Stages (each one's results are written as soon as it ends; in fact after every item):
#   1  `batchfit doctor`; a CUDA probe of ResNet-50 (fp32 and amp-bf16, 224x224) and of gpt2-small
#      (amp-bf16, sequence 1024); then `batchfit-train` runs 50 steps with each recommendation under
#      the plan's limit: an out-of-memory there fails the stage
#   2  the true maximum of each model: a fine scan of fresh `batchfit-train --micro-batch N --force` runs
#      on the whole GPU, above batchfit's answer (which keeps a 5 % margin)
#   3  Lightning's scale_batch_size(mode="binsearch", cap raised) and Accelerate's
#      find_executable_batch_size on the same models, in Python (scripts/gpu_check/peers.py)
#   4  your own script: a plain PyTorch training job of ResNet-50 (amp-bf16) and of gpt2-small (amp-bf16)
#      (scripts/gpu_check/job.py, the peers' models) probed by `batchfit probe --exec`, and the job's own
#      true maximum by the same fine scan as stage 2, of fresh runs of the job; the table sets stage 1's
#      answer for batchfit's own model beside the --exec answer and the job's true maximum. Its own
#      time caps (exec_probe_time_limit, exec_scan_seconds: about 5 min for both models); select it
#      alone with --stages 4
#
# It writes a results table (trials, wall time, answer, true maximum, answer / true maximum, peak memory /
# capacity), stamped with nvidia-smi's line for the GPU and the commit, to OUT/results.md and, on a GPU
# run only, to docs/gpu-results.md; raw JSON (stage1.json … stage4.json, plans/, peers/, exec/,
# logs/) beside it. --cpu-smoke runs the same stages on CPU with tiny models and writes only to OUT
# (tests/gpu_check.rs runs it).
#
# Needs: python3 with torch 2.11 (its libtorch is what the binaries load, through LD_LIBRARY_PATH, so
# binaries built on another machine work), for stage 3 Lightning and Accelerate (missing ones are
# reported as skipped, with the reason), nvidia-smi. No network.
#
# Time: --time-budget (default 300 s) bounds a call; an item that would not get the time it needs is
# reported "not-run" and the summary prints the call that finishes the work (what succeeded is kept).
# On an H200 the four stages together are expected to need 15-20 minutes, so plan two or three calls
# (e.g. --stages 1,2 then --stages 3,4), or a longer --time-budget. On a machine where only a few files of $OUT come back (the device tool returns 8),
# keep OUT elsewhere and bring back one archive of it (written when the call ends, also on a signal):
#   bash scripts/gpu-check.sh --out /tmp/gc --archive "$OUT/gpu-check.tgz" --time-budget 540; rc=$?
#   cp /tmp/gc/results.md docs/gpu-results.md "$OUT/" 2>/dev/null; exit $rc
# and, for the stages the summary lists as not run, the same call again at once with --stages.
#
# --cpu-smoke models: an MLP in fp32 and a one-layer GPT in bf16 under a small RLIMIT_DATA budget (no
# ResNet: it takes minutes on CPU, see CPU_SLOTS in scripts/gpu_check/check.py); stage 4 probes the MLP's
# Python job (a memory cgroup per trial where this process may make one, else RLIMIT_DATA); about 4-6
# minutes.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELPERS="$ROOT/scripts/gpu_check"

usage() {
  cat <<'EOF'
Usage: bash scripts/gpu-check.sh [--cpu-smoke] [--bin DIR] [--out DIR] [--stages 1,2,3,4]
                                 [--time-budget S] [--python PY] [--commit C] [--set KEY=VALUE]... [--redo]
                                 [--archive FILE.tgz]

Proves batchfit on a real NVIDIA GPU (see the header of this script for the stages).

  --bin DIR          where batchfit, batchfit-train and batchfit-torch are (default: target/release); built elsewhere
                     is fine: libtorch comes from PY's torch through LD_LIBRARY_PATH
  --out DIR          results and raw data (default: gpu-check-results/ in the repository)
  --stages LIST      stages to run, e.g. 3,4 for a second call (default 1,2,3,4; 4 is --exec of
                     the Python job); what already succeeded in OUT with the same binaries is kept,
                     not run again
  --time-budget S    seconds for this call (default 300 on a GPU, 900 with --cpu-smoke): an item
                     that would not get enough of what is left is not started and is reported as
                     "not-run", to be finished by a second call with --stages
  --python PY        the Python with torch (default: python3; --cpu-smoke: the libtorch venv of
                     scripts/setup-libtorch.sh when there is one)
  --commit C         the commit to stamp (default: git rev-parse --short HEAD, else a COMMIT file in
                     the repository or in --bin, else "unknown")
  --set KEY=VALUE    change a setting (list below), e.g. --set train_steps=20
  --redo             run every item again, even those that succeeded in an earlier call
  --archive FILE     when the call ends (also on TERM/INT), write OUT as a gzipped tar to FILE
  --cpu-smoke        the same stages on CPU with tiny models; writes OUT only (never docs/gpu-results.md)
  -h, --help         this help

Exit: 0 every stage run is ok; 1 a stage failed or is incomplete (the summary says what to run next);
2 bad usage; 3 environment (no GPU for a GPU run, no torch in PY).

Settings (--set KEY=VALUE):
EOF
  local p
  p=$(command -v python3 || true)
  if [ -n "$p" ]; then
    "$p" "$HELPERS/check.py" knobs 2>/dev/null
  else
    echo "  (python3 not found: see KNOBS in scripts/gpu_check/check.py)"
  fi
}

die() { echo "gpu-check: $1" >&2; exit "${2:-2}"; }

# Everything runs inside main, called on the last line: bash reads a script as it runs, so without this
# an edit or checkout of this file during a run would change the commands still to come.
main() {
  mode=gpu
  out=""
  bin=""
  stages="1,2,3,4"
  py=""
  budget=""
  commit=""
  commit_source="given with --commit"
  redo=0
  archive=""
  archive_given=0
  sets=()

  need_value() { [ "$2" -ge 2 ] || die "$1 needs a value (see --help)"; }

  while [ $# -gt 0 ]; do
    case "$1" in
      --cpu-smoke) mode=cpu ;;
      --out) need_value "$1" $#; out=$2; shift ;;
      --out=*) out=${1#*=} ;;
      --bin) need_value "$1" $#; bin=$2; shift ;;
      --bin=*) bin=${1#*=} ;;
      --stages) need_value "$1" $#; stages=$2; shift ;;
      --stages=*) stages=${1#*=} ;;
      --time-budget) need_value "$1" $#; budget=$2; shift ;;
      --time-budget=*) budget=${1#*=} ;;
      --python) need_value "$1" $#; py=$2; shift ;;
      --python=*) py=${1#*=} ;;
      --commit) need_value "$1" $#; commit=$2; shift ;;
      --commit=*) commit=${1#*=} ;;
      --set) need_value "$1" $#; sets+=("--set=$2"); shift ;;
      --set=*) sets+=("--set=${1#*=}") ;;
      --redo) redo=1 ;;
      --archive) need_value "$1" $#; archive=$2; archive_given=1; shift ;;
      --archive=*) archive=${1#*=}; archive_given=1 ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
  done

  # --stages: digits 1-4, comma-separated; run in ascending order, each once
  stage_list=()
  IFS=',' read -r -a _st <<<"$stages"
  for s in 1 2 3 4; do
    for x in "${_st[@]}"; do
      x=${x// /}
      case "$x" in 1|2|3|4) ;; *) die "--stages: '$x' is not a stage (1, 2, 3 or 4)" ;; esac
      if [ "$x" = "$s" ]; then stage_list+=("$s"); break; fi
    done
  done
  [ ${#stage_list[@]} -gt 0 ] || die "--stages: no stage given"
  stages=$(IFS=','; echo "${stage_list[*]}")

  if [ -z "$budget" ]; then
    if [ "$mode" = gpu ]; then budget=300; else budget=900; fi
  fi
  case "$budget" in ''|*[!0-9.]*) die "--time-budget: '$budget' is not a number of seconds" ;; esac

  [ -n "$out" ] || out="$ROOT/gpu-check-results"
  mkdir -p "$out/logs" || die "cannot create $out" 3
  out="$(cd "$out" && pwd -P)"
  if [ "$archive_given" = 1 ]; then
    [ -n "$archive" ] || die "--archive needs a file name (FILE.tgz)"
    case "$archive" in *.tgz|*.tar.gz) ;; *) die "--archive: '$archive' should end in .tgz or .tar.gz" ;; esac
    mkdir -p "$(dirname "$archive")" || die "--archive: cannot create the folder of $archive" 3
    archive="$(cd "$(dirname "$archive")" && pwd -P)/$(basename "$archive")"
    case "$archive/" in "$out"/*) die "--archive: $archive is inside --out $out" ;; esac
  fi
  # The archive of OUT, when asked for: written however the call ends from here on (the EXIT trap
  # also runs after a signal's handler exits). tar's own messages go outside OUT; its exit 1 ("file
  # changed as we read it") still leaves a complete archive.
  pack() {
    [ -n "$archive" ] || return 0
    local err rc
    err=$(mktemp) || err=/dev/null
    tar czf "$archive.tmp" -C "$(dirname "$out")" "$(basename "$out")" 2>"$err"
    rc=$?
    if [ "$rc" -le 1 ] && mv -f "$archive.tmp" "$archive"; then
      echo "gpu-check: archive of $out: $archive" >&2
    else
      rm -f "$archive.tmp"
      echo "gpu-check: WARNING: could not write the archive $archive (tar exit $rc): $(tail -n 1 "$err" 2>/dev/null)" >&2
    fi
    [ "$err" = /dev/null ] || rm -f "$err"
  }
  trap pack EXIT

  [ -n "$bin" ] || bin="$ROOT/target/release"
  [ -d "$bin" ] || die "--bin $bin is not a directory" 3
  bin="$(cd "$bin" && pwd)"

  # ---- the Python with torch, and the libtorch the binaries load ------------------------------------
  if [ -z "$py" ]; then
    py=python3
    if [ "$mode" = cpu ]; then
      venv_py=""
      if [ -n "${LIBTORCH:-}" ] && [ -x "$LIBTORCH/../../../../bin/python" ]; then
        venv_py="$(cd "$LIBTORCH/../../../../bin" && pwd)/python"
      else
        v="${BATCHFIT_LIBTORCH_VENV:-${XDG_CACHE_HOME:-${HOME:-}/.cache}/batchfit/libtorch-2.11.0}"
        [ -x "$v/bin/python" ] && venv_py="$v/bin/python"
      fi
      [ -n "$venv_py" ] && py=$venv_py
    fi
  fi
  py_abs=$(command -v "$py" 2>/dev/null) || die "no Python at '$py' (--python)" 3
  py=$py_abs
  echo "gpu-check: mode $mode, stages $stages, time budget ${budget} s, out $out" >&2
  echo "gpu-check: python $py; binaries $bin" >&2

  torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>"$out/logs/torch-import.err") \
    || die "$py cannot import torch: $(tail -n 1 "$out/logs/torch-import.err")" 3
  nv_dirs=$("$py" - "$torch_dir" <<'PYEOF'
import glob, os, sys
site = os.path.dirname(sys.argv[1])
dirs = []
for pat in ("nvidia/*/lib", "nvidia/*/lib64", "nvidia/lib"):
    dirs += [d for d in sorted(glob.glob(os.path.join(site, pat))) if os.path.isdir(d)]
print(":".join(dirs))
PYEOF
  )
  export LD_LIBRARY_PATH="$torch_dir/lib${nv_dirs:+:$nv_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu-check: libtorch from $torch_dir/lib" >&2
  # the batchfit commands find the same torch through this interpreter
  export BATCHFIT_PYTHON="$py"

  # ---- the stamp: the device and the commit -------------------------------------------------------
  if [ "$mode" = gpu ]; then
    if ! smi=$(timeout 60 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1); then
      die "nvidia-smi failed (${smi:-no output}): no NVIDIA GPU here. Without one, use --cpu-smoke" 3
    fi
    [ -n "$smi" ] || die "nvidia-smi lists no GPU. Without one, use --cpu-smoke" 3
    timeout 60 nvidia-smi >"$out/logs/nvidia-smi.txt" 2>&1
    stamp=${smi//$'\n'/; }
  else
    cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
    stamp="${cpu:-unknown CPU} ($(nproc 2>/dev/null || echo '?') cores), CPU smoke"
  fi
  if [ -z "$commit" ]; then
    if c=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) && [ -n "$c" ]; then
      commit=$c
      commit_source=git
      if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- src Cargo.toml Cargo.lock build.rs 2>/dev/null)" ]; then
        commit_source="git; uncommitted changes in src/, Cargo.*, build.rs"
      fi
    elif [ -s "$ROOT/COMMIT" ]; then
      commit=$(head -n 1 "$ROOT/COMMIT" | cut -c1-80)
      commit_source="COMMIT file"
    elif [ -s "$bin/COMMIT" ]; then
      commit=$(head -n 1 "$bin/COMMIT" | cut -c1-80)
      commit_source="COMMIT file beside the binaries"
    else
      commit=unknown
      commit_source="no git, no COMMIT file"
    fi
  fi

  # ---- the binaries start? (a missing library or an old glibc shows here, not in every stage) -------
  version="?"
  for b in batchfit batchfit-train batchfit-torch; do
    if [ ! -x "$bin/$b" ]; then
      echo "gpu-check: WARNING: $bin/$b is missing or not executable; the stages that need it will fail" >&2
    elif ! "$bin/$b" --version >"$out/logs/$b.version" 2>&1; then
      ldd "$bin/$b" >"$out/logs/$b.ldd" 2>&1
      echo "gpu-check: WARNING: $bin/$b does not start: $(head -n 1 "$out/logs/$b.version"); ldd: $out/logs/$b.ldd" >&2
    elif [ "$b" = batchfit ]; then
      version=$(head -n 1 "$out/logs/$b.version")
    fi
  done

  # ---- the GPU-only unit test of the allocator shim, when its test binary was carried along -------
  # (build it here with `cargo test --release -p batchfit-torch --lib --no-run` and copy the printed
  # target/release/deps/batchfit_torch-HASH as BIN/batchfit-lib-tests)
  if [ "$mode" = gpu ] && [ -x "$bin/batchfit-lib-tests" ]; then
    if "$bin/batchfit-lib-tests" --ignored --exact allocator::tests::stats_follow_a_cuda_allocation \
        >"$out/logs/shim-test.log" 2>&1; then
      echo "gpu-check: allocator shim test on the GPU: passed ($out/logs/shim-test.log)" >&2
    else
      echo "gpu-check: WARNING: allocator shim test on the GPU FAILED: see $out/logs/shim-test.log" >&2
    fi
  fi

  # (--opt=VALUE: values may begin with a dash)
  init_args=(init "--out=$out" --mode "$mode" "--bin=$bin" "--python=$py" "--root=$ROOT"
    --time-budget "$budget" "--stamp-device=$stamp" "--commit=$commit" "--commit-source=$commit_source"
    "--batchfit-version=$version" --stages "$stages")
  [ "$redo" = 1 ] && init_args+=(--redo)
  "$py" "$HELPERS/check.py" "${init_args[@]}" ${sets[@]+"${sets[@]}"} || die "cannot set up the run (see above)"
  echo "gpu-check: device: $stamp; commit $commit ($commit_source)" >&2

  # ---- the stages: each in its own process, timed; a failing stage does not stop the next -----------
  child=""
  on_signal() {
    if [ -n "$child" ]; then
      kill -TERM "$child" 2>/dev/null
      wait "$child" 2>/dev/null
    fi
    echo "gpu-check: stopped by a signal; what was measured is in $out" >&2
    exit "$1"
  }
  trap 'on_signal 143' TERM
  trap 'on_signal 130' INT

  t_all=$(date +%s.%N)
  for s in "${stage_list[@]}"; do
    echo "gpu-check: stage $s" >&2
    t0=$(date +%s.%N)
    "$py" "$HELPERS/check.py" stage "$s" --out "$out" &
    child=$!
    wait "$child"
    rc=$?
    child=""
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    "$py" "$HELPERS/check.py" finish "$s" --out "$out" --rc "$rc" --seconds "$secs"
  done
  total=$(awk -v a="$t_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  echo "gpu-check: stages took ${total} s" >&2
  "$py" "$HELPERS/check.py" summary --out "$out" --stages "$stages"
  exit $?
}

main "$@"
exit $?
