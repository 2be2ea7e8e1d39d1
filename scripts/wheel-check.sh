#!/usr/bin/env bash
# wheel-check.sh: checks batchfit as users get it, from the installed wheel only. The wheel
# (scripts/build-wheel.sh, or WHEEL=path) goes into a fresh venv in a temp dir, offline
# (`pip install --no-index --no-deps`); the venv sees the libtorch venv's torch through a .pth file
# (the user's torch: the wheel brings none). Every check then runs in a clean environment: no LIBTORCH,
# no LD_LIBRARY_PATH, no PYTHONPATH, HOME and XDG_CACHE_HOME in empty temp dirs, PATH = the venv's bin
# then /usr/bin:/bin. Nothing of the source tree is used after the wheel is built.
#
# Checks (each prints one PASS or FAIL line with what it saw):
#   install      pip installs the wheel offline; the three commands land in the venv's bin/
#   metadata     the installed distribution requires nothing (no torch)
#   version      `batchfit --version` says the wheel's version, in under 0.2 s (best of 3); its peak RSS
#   import       `python -c 'import batchfit; print(batchfit.in_trial())'` prints False outside a trial,
#                from the venv's site-packages, without importing torch; every name of the standalone
#                helper (batchfit.batchfit_trial) is the package's
#   helper       `batchfit python-helper` prints the installed batchfit/batchfit_trial.py, byte for byte
#   python-m     `python -m batchfit --version` runs the same command; a python that has the package
#                but not the command gets the "not installed" error (exit 2)
#   exec-probe   `batchfit probe --exec` of a small torch script that uses `import batchfit` (batch_size,
#                Trial, t.step(samples=…)): every fitting trial's report is in the plan (its batch, the
#                samples counted, torch's version) and its output names the installed package's file
#   model-probe  `batchfit probe --model mlp` (the runner with the user's torch), then
#   train        `batchfit-train --plan` on that plan for 3 steps
#   no-libtorch  `ldd` of `batchfit` and `batchfit-train` names no libtorch (nor anything not found)
#
# Exit: 0 when every check passed, 1 when one failed, 2 when the check cannot start (no wheel, no
# libtorch venv). The work dir is removed unless a check failed or WHEEL_CHECK_KEEP=1.
#
# Environment:
#   WHEEL                   the wheel to check (default: build it with scripts/build-wheel.sh)
#   BATCHFIT_LIBTORCH_VENV  the libtorch venv (default ${XDG_CACHE_HOME:-~/.cache}/batchfit/libtorch-2.11.0)
#   WHEEL_CHECK_KEEP=1      keep the work dir
# shellcheck disable=SC2016 # single-quoted sh -c and python -c programs expand where they run
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

TORCH_VENV=${BATCHFIT_LIBTORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/libtorch-2.11.0}
if [ ! -x "$TORCH_VENV/bin/python" ]; then
  echo "wheel-check: $TORCH_VENV/bin/python is missing: run scripts/setup-libtorch.sh or set BATCHFIT_LIBTORCH_VENV" >&2
  exit 2
fi
if [ -z "${WHEEL:-}" ]; then
  WHEEL=$("$here/build-wheel.sh" | tail -n 1) || { echo "wheel-check: scripts/build-wheel.sh failed" >&2; exit 2; }
fi
if [ ! -f "$WHEEL" ]; then
  echo "wheel-check: WHEEL=$WHEEL is not a file" >&2
  exit 2
fi
WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")
wheel_version=$(basename "$WHEEL" | cut -d- -f2)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/wheel-check.XXXXXX")
failed=0
cleanup() {
  if [ "$failed" -ne 0 ] || [ "${WHEEL_CHECK_KEEP:-0}" = 1 ]; then
    echo "wheel-check: work dir kept: $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
mkdir -p "$WORK/home" "$WORK/cache" "$WORK/tmp" "$WORK/job"
VENV=$WORK/venv

now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
pass() { echo "PASS $1: $2"; }
fail() { echo "FAIL $1: $2"; failed=1; }
# clean CMD…: CMD in the clean environment (cwd: the job directory)
clean() {
  (cd "$WORK/job" && env -i HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" TMPDIR="$WORK/tmp" LANG=C.UTF-8 \
    PATH="$VENV/bin:/usr/bin:/bin" "$@")
}
# pj FILE EXPR: EXPR of the parsed JSON file p, printed (JSON for containers)
pj() { "$TORCH_VENV/bin/python" -c 'import json, sys; p = json.load(open(sys.argv[1])); v = eval(sys.argv[2]); print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)' "$1" "$2"; }

echo "wheel-check: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB); work dir $WORK"

# --- the venv: the torch venv's interpreter (torch's ABI), pip from ensurepip (offline) ---------------
"$TORCH_VENV/bin/python" -m venv "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
torch_site=$("$TORCH_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$torch_site" > "$site/the-users-torch.pth"

# --- install -----------------------------------------------------------------------------------------
t_install=$(now)
if clean python -m pip install --quiet --no-index --no-deps --disable-pip-version-check "$WHEEL" > "$WORK/pip.log" 2>&1; then
  install_s=$(since "$t_install")
  where=$(clean sh -c 'for c in batchfit batchfit-train batchfit-torch; do command -v "$c" || echo "$c: none"; done' | tr '\n' ' ')
  if [ "$where" = "$VENV/bin/batchfit $VENV/bin/batchfit-train $VENV/bin/batchfit-torch " ]; then
    pass install "pip install --no-index --no-deps in ${install_s} s; $where"
  else
    fail install "the commands are not all in $VENV/bin: $where"
  fi
else
  fail install "pip install failed: $(tail -n 5 "$WORK/pip.log")"
  exit 1
fi

# --- metadata ----------------------------------------------------------------------------------------
requires=$(clean python -c 'import importlib.metadata as m; print(m.requires("batchfit"))' 2>&1) || true
if [ "$requires" = None ]; then
  pass metadata "no Requires-Dist (torch is the user's)"
else
  fail metadata "the installed distribution requires: $requires"
fi

# --- version -----------------------------------------------------------------------------------------
best=""
times=()
version_out=""
for _ in 1 2 3; do
  t0=$(now)
  version_out=$(clean batchfit --version 2>&1) || { version_out="failed: $version_out"; break; }
  dt=$(since "$t0")
  times+=("$dt")
  if [ -z "$best" ] || awk -v a="$dt" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$dt; fi
done
rss=$(clean /usr/bin/time -v batchfit --version 2>&1 > /dev/null | sed -n 's/.*Maximum resident set size (kbytes): //p') || true
if [ "$version_out" != "batchfit $wheel_version" ]; then
  fail version "batchfit --version printed '$version_out', not 'batchfit $wheel_version'"
elif awk -v b="$best" 'BEGIN { exit !(b < 0.2) }'; then
  pass version "'$version_out' in ${best} s (runs: ${times[*]} s; peak RSS ${rss:-?} KiB)"
else
  fail version "'$version_out' took ${best} s at best (runs: ${times[*]} s), not under 0.2 s"
fi

# --- import ------------------------------------------------------------------------------------------
imported=$(clean python -c 'import sys, batchfit
t = batchfit.batchfit_trial
names = [n for n in vars(t) if not n.startswith("__") and n not in t._LAZY]
print(batchfit.in_trial(), "torch" in sys.modules, batchfit.__file__, batchfit.__version__,
      [n for n in names if getattr(batchfit, n) is not getattr(t, n)])' 2>&1) || true
if [ "$imported" = "False False $site/batchfit/__init__.py $wheel_version []" ]; then
  pass import "python -c 'import batchfit; print(batchfit.in_trial())' -> False (from $site/batchfit, torch not imported; every name of batchfit_trial is batchfit's)"
else
  fail import "in_trial(), torch imported, file, version: $imported"
fi

# --- helper: one source ------------------------------------------------------------------------------
if clean batchfit python-helper > "$WORK/helper.py" 2> "$WORK/helper.err" && cmp -s "$WORK/helper.py" "$site/batchfit/batchfit_trial.py"; then
  pass helper "batchfit python-helper prints the installed batchfit/batchfit_trial.py ($(wc -c < "$WORK/helper.py") bytes)"
else
  fail helper "batchfit python-helper differs from $site/batchfit/batchfit_trial.py: $(cmp "$WORK/helper.py" "$site/batchfit/batchfit_trial.py" 2>&1; cat "$WORK/helper.err")"
fi

# --- python -m batchfit ------------------------------------------------------------------------------
via_m=$(clean python -m batchfit --version 2>&1) || true
# the package without its command: the torch venv's python (its scripts dir has no batchfit) with the
# installed package on PYTHONPATH, PATH without the venv
set +e
absent=$(cd "$WORK/job" && env -i HOME="$WORK/home" LANG=C.UTF-8 PATH=/usr/bin:/bin PYTHONPATH="$site" \
  "$TORCH_VENV/bin/python" -m batchfit --version 2>&1)
absent_rc=$?
set -e
if [ "$via_m" != "$version_out" ]; then
  fail python-m "python -m batchfit --version printed '$via_m', not '$version_out'"
elif [ "$absent_rc" -ne 2 ] || [[ "$absent" != *"the batchfit command is not installed"* ]]; then
  fail python-m "without the command: exit $absent_rc, '$absent'"
else
  pass python-m "'$via_m'; without the command: exit 2, '${absent%%(*}…'"
fi

# --- exec probe of a script that imports the installed package -----------------------------------------
cat > "$WORK/job/train.py" << 'EOF'
import batchfit
import torch

print("batchfit from", batchfit.__file__)
batch = batchfit.batch_size(default=8)
steps = batchfit.steps(default=3)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with batchfit.Trial(batch=batch) as t:
    for _ in range(steps):
        x, y = torch.randn(batch, 512), torch.randint(0, 10, (batch,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t.step(samples=len(x))
print(f"trained {steps} steps of {batch}")
EOF
t0=$(now)
if clean batchfit probe --backend cpu --memory-budget 3GiB --max-batch 64 --steps 2 --confirm-steps 3 \
  --out "$WORK/plan-exec.json" --exec -- python train.py > "$WORK/exec.log" 2>&1; then
  exec_s=$(since "$t0")
  to_plan_s=$(since "$t_install")
  # every fitting trial: the report of the installed package (its file named in the trial's output),
  # for the batch the trial asked for, read through batch_size(), with the samples t.step() counted
  verdict=$("$TORCH_VENV/bin/python" - "$WORK/plan-exec.json" "batchfit from $site/batchfit/__init__.py" << 'EOF' 2>&1
import json, sys
p = json.load(open(sys.argv[1]))
fit = [t for t in p["trials"] if t["outcome"] == "fits"]
bad = []
for t in fit:
    d = t.get("details") or {}
    r = d.get("report") or {}
    if not (r.get("batch") == t["batch"] == r.get("samples") and r.get("reads_batch") and r.get("torch")
            and d.get("step_time") == "report" and sys.argv[2] in d.get("output_tail", [])):
        bad.append({"batch": t["batch"], "report": r, "output_tail": d.get("output_tail")})
if not fit or bad:
    print("bad:", len(fit), "fitting trials;", json.dumps(bad)[:1500])
else:
    print("ok", p["recommendation"]["max_fitting_batch"], len(fit), fit[0]["details"]["report"]["torch"])
EOF
) || true
  if [[ "$verdict" == ok* ]]; then
    read -r _ answer nfit torch_v <<< "$verdict"
    pass exec-probe "answer $answer; all $nfit fitting trials reported through the installed package (torch $torch_v); probe ${exec_s} s, ${to_plan_s} s from pip install to the plan"
  else
    fail exec-probe "the plan's trials: $verdict"
  fi
else
  fail exec-probe "batchfit probe --exec failed: $(tail -n 8 "$WORK/exec.log")"
fi

# --- model probe through the runner, then train with the plan ------------------------------------------
t0=$(now)
if clean batchfit probe --model mlp --backend cpu --memory-budget 1GiB --max-batch 64 --steps 2 --confirm-steps 3 \
  --out "$WORK/plan-mlp.json" > "$WORK/mlp.log" 2>&1; then
  answer=$(pj "$WORK/plan-mlp.json" 'p["recommendation"]["max_fitting_batch"]' 2>&1) || true
  if [[ "$answer" =~ ^[0-9]+$ ]] && [ "$answer" -ge 1 ]; then
    pass model-probe "answer $answer in $(since "$t0") s"
  else
    fail model-probe "no answer in the plan: $answer"
  fi
  t0=$(now)
  if clean batchfit-train --plan "$WORK/plan-mlp.json" --steps 3 > "$WORK/train.log" 2>&1; then
    pass train "batchfit-train --plan --steps 3 in $(since "$t0") s: $(grep -v '^\s*$' "$WORK/train.log" | tail -n 1)"
  else
    fail train "batchfit-train failed: $(tail -n 8 "$WORK/train.log")"
  fi
else
  fail model-probe "batchfit probe --model mlp failed: $(tail -n 8 "$WORK/mlp.log")"
  fail train "no plan to train with"
fi

# --- the commands link no libtorch -----------------------------------------------------------------------
bad=""
for c in batchfit batchfit-train; do
  deps=$(clean sh -c 'ldd "$(command -v "$1")"' sh "$c" 2>&1) || true
  if grep -Eq 'libtorch|libc10|not found' <<< "$deps"; then
    bad+="$c: $(grep -E 'libtorch|libc10|not found' <<< "$deps" | tr -s ' \t\n' ' ')"
  fi
done
if [ -z "$bad" ]; then
  pass no-libtorch "ldd batchfit, batchfit-train: $(clean sh -c 'ldd "$(command -v batchfit)"' | awk '{print $1}' | tr '\n' ' ')"
else
  fail no-libtorch "$bad"
fi

if [ "$failed" -ne 0 ]; then
  echo "wheel-check: FAILED (logs in $WORK)"
  exit 1
fi
echo "wheel-check: all checks passed"
