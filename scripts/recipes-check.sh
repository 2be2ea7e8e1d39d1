#!/usr/bin/env bash
# recipes-check.sh: run the job-script recipes of docs/recipes.md (the files under examples/) for real,
# on this one machine, without a GPU, and check the numbers they train with.
#
# Stages, in order (RECIPES_STAGES=a,b,… runs only those; the others are listed as NOT RUN):
#   guards            train.py (plain python3, a world of 1) refuses sim plans and exports it cannot honour
#                     (uneven exports, exports whose plan file was rewritten, model flags against the plan's
#                     model, a plan of another model, --accumulation alone over a plan, an --exec plan of
#                     other flags or another train.py) and trains the ones it can; merge-config.sh refuses
#                     an unverified merged plan; probe-exec.sh (stubs of batchfit and torchrun) probes its
#                     training arguments and keeps the trial helper out of the current directory;
#                     shellcheck of examples/ (when installed). ~45 s
#   torchrun          examples/torchrun/launch.sh: a real CPU probe (world size 2) of the model of
#                     examples/torchrun/train.py, whose `--format env` exports torchrun's 2 CPU
#                     processes (gloo) train with; asserts the global batch train.py logged it used =
#                     world size × micro-batch × accumulation of the plan = the plan's global batch; and
#                     that train.py refuses the plan in a job of another world size
#   torchrun-exec     examples/torchrun/probe-exec.sh: the torchrun job itself (torchrun, 2 ranks of
#                     train.py, gloo) probed by `batchfit probe --exec` (each trial the whole job, its
#                     tree in one memory cgroup where one can be made), then trained with that plan by
#                     torchrun; asserts the trials were the whole job (3 processes, rank 0's report of
#                     world size 2), train.py's hash in the plan, an out-of-memory above the answer, and
#                     the numbers trained; NOT RUN when `batchfit probe --help` does not mention --exec
#   deepspeed-merge   examples/deepspeed/merge-config.sh on the torchrun plan (a sim plan when that
#                     stage did not run): with jq and with its python fallback, same result, batchfit's
#                     values in, the rest of ds_config.json kept, train_batch_size = micro × accum × world
#   deepspeed-engine  DeepSpeed itself (pip install deepspeed into a side venv under the work dir that
#                     uses the libtorch venv's torch; or RECIPES_DEEPSPEED_PYTHON) trains 2 optimizer steps
#                     with the merged config, under torchrun, 2 CPU processes (gloo)
#   slurm-cluster     a Slurm cluster on this host from Debian's slurm-wlm and munge (apt-get install when
#                     missing, as root): munged, slurmctld and three slurmd (`slurmd -N`), every file and
#                     port its own (config, state, logs and sockets under the work dir; free ports); the
#                     daemons are stopped at exit, whatever happens (this run's jobs cancelled first).
#                     Without root, apt-get or network: NOT RUN. A cluster that does not come up is a
#                     FAIL with the daemons' last errors (it comes up on Debian 12 without cgroups);
#                     where only the second and third slurmd do not, slurm-two-node is NOT RUN with theirs
#   slurm-array       sbatch examples/slurm/train-array.sbatch as an array of 2 tasks run one after the
#                     other: each probes (sim backend: the point is the cache, whose key holds the free
#                     memory) and trains with `srun torchrun` (2 processes); asserts the second task's plan
#                     came from the first's cache and the numbers each task trained with
#   slurm-two-node    sbatch examples/slurm/multi-node.sbatch on 2 nodes (two slurmd on this host), held while
#                     a requeue's leftovers go to its plans/ID/nodes (they must not be merged): per-node
#                     probe (`srun --ntasks-per-node=1`, sim backend), merge, verify on each node, torchrun
#                     on both nodes (world size 2); asserts the merged plan, the verified plans, the numbers
#
# Every stage ends PASS, FAIL or NOT RUN with the exact reason why; a table at the end gives each
# stage's seconds. Exit code: 1 when a stage FAILED; 0 otherwise, NOT RUN stages included (they are
# listed with their reason, never skipped silently); 2 when the check cannot start (binaries or the
# libtorch venv missing).
#
# Environment:
#   BATCHFIT_BIN_DIR        where batchfit and batchfit-train are (default: the repository's target/release)
#   BATCHFIT_LIBTORCH_VENV  the libtorch venv (default ${XDG_CACHE_HOME:-~/.cache}/batchfit/libtorch-2.11.0):
#                           its python (torch) and torchrun run the training; nothing is installed into it
#   RECIPES_STAGES          comma-separated subset of the stages above
#   RECIPES_NO_INSTALL=1    no apt-get and no pip: the stages that need them are NOT RUN (with that reason)
#   RECIPES_DEEPSPEED_PYTHON  a python that has deepspeed (and torch): no side venv is built
#   RECIPES_KEEP=1          keep the work dir (it is always kept when a stage failed)
#   RECIPES_EXEC_PROBE_ARGS the torchrun-exec stage's probe flags (default below, EXEC_PROBE_ARGS)
#   RECIPES_SUMMARY_FILE    also write the summary there: one line per stage, name, result, seconds
#                           and detail separated by tabs (tests/recipes.rs reads it)
#   RECIPES_WORK_DIR        the work dir (default: a new mktemp -d); everything the check writes is there,
#                           except what apt-get installs
#
# Time it takes: docs/benchmarks.md, "Recipes check times".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
examples=$root/examples
helpers=$here/recipes_check

BIN_DIR=${BATCHFIT_BIN_DIR:-$root/target/release}
VENV=${BATCHFIT_LIBTORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/libtorch-2.11.0}
for b in batchfit batchfit-train batchfit-torch; do
  if [ ! -x "$BIN_DIR/$b" ]; then
    echo "recipes-check: $BIN_DIR/$b is missing: build it (cargo build --release --workspace) or set BATCHFIT_BIN_DIR" >&2
    exit 2
  fi
done
for t in python torchrun; do
  if [ ! -x "$VENV/bin/$t" ]; then
    echo "recipes-check: $VENV/bin/$t is missing: run scripts/setup-libtorch.sh or set BATCHFIT_LIBTORCH_VENV" >&2
    exit 2
  fi
done
BIN_DIR=$(cd "$BIN_DIR" && pwd)
PY=$VENV/bin/python

WORK=${RECIPES_WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/recipes-check.XXXXXX")}
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
chmod 755 "$WORK"   # munged wants its socket's directories searchable by all
# batchfit, torchrun and the examples first; sbin for the Slurm daemons
export PATH="$BIN_DIR:$VENV/bin:$PATH:/usr/sbin:/sbin"
# nothing outside the work dir: plan cache, pip, torch extensions, other caches
export BATCHFIT_CACHE_DIR=$WORK/batchfit-cache XDG_CACHE_HOME=$WORK/xdg-cache PIP_CACHE_DIR=$WORK/pip-cache \
  TORCH_EXTENSIONS_DIR=$WORK/torch-extensions PYTHONDONTWRITEBYTECODE=1
unset BATCHFIT_PLAN BATCHFIT_MICRO_BATCH BATCHFIT_ACCUMULATION BATCHFIT_WORLD_SIZE BATCHFIT_STATUS \
  BATCHFIT_PROBE_ARGS SLURM_CONF SLURM_JOB_ID 2>/dev/null || true

# the exec stage's probe: the whole torchrun job (agent + 2 ranks) under 2.5 GiB; a grid of 256 samples
# and 2-step trials (3 for the confirmation) keep it to a few trials of the whole job
EXEC_PROBE_ARGS=${RECIPES_EXEC_PROBE_ARGS:---backend cpu --memory-budget 2.5GiB --multiple-of 256 --steps 2 --confirm-steps 3}
ALL_STAGES=(guards torchrun torchrun-exec deepspeed-merge deepspeed-engine slurm-cluster slurm-array slurm-two-node)
names=() results=() seconds=() details=()
failed=0 current=""
SLURM_DIR=$WORK/slurm

now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Inside a stage (a subshell): end it.
pass() { printf '%s\n' "$*" > "$WORK/.result"; exit 0; }
fail() { printf '%s\n' "$*" > "$WORK/.result"; echo "FAIL: $*"; exit 1; }
notrun() { printf '%s\n' "$*" > "$WORK/.result"; echo "NOT RUN: $*"; exit 3; }
# expect LABEL EXPECTED ACTUAL
expect() {
  if [ "$2" != "$3" ]; then fail "$1: expected $2, got ${3:-nothing}"; fi
  echo "  ok: $1 = $3"
}
# pj FILE EXPR: a value of a JSON file (p is the parsed JSON)
pj() { "$PY" -c 'import json, sys; p = json.load(open(sys.argv[1])); v = eval(sys.argv[2]); print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)' "$1" "$2"; }
# same FILE_A FILE_B EXPR: "yes" when EXPR of both JSON files is equal (as values: jq writes 1.0 as 1)
same() { "$PY" -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
va, vb = (eval(sys.argv[3], {"p": x}) for x in (a, b))
print("yes" if va == vb else f"no: {json.dumps(va)} vs {json.dumps(vb)}")' "$1" "$2" "$3"; }
# field KEY LINE: the value of KEY=value in a log line
field() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" <<<"$2"; }
# timed LABEL CMD…: run CMD, print its wall time
timed() {
  local label=$1 t0 rc; shift; t0=$(now)
  "$@"; rc=$?
  echo "  [$(elapsed "$t0") s] $label (exit $rc)" >&2
  return $rc
}
stage_result() { # NAME: PASS/FAIL/NOT RUN of an earlier stage
  local i; for i in "${!names[@]}"; do [ "${names[$i]}" = "$1" ] && { echo "${results[$i]}"; return; }; done; echo "NOT RUN"
}

wanted() {
  [ -z "${RECIPES_STAGES:-}" ] && return 0
  case ",$RECIPES_STAGES," in *",$1,"*) return 0 ;; esac
  return 1
}

run_stage() {
  local name=$1 t0 rc result detail
  if ! wanted "$name"; then
    names+=("$name"); results+=("NOT RUN"); seconds+=("0.0")
    details+=("not in RECIPES_STAGES=$RECIPES_STAGES"); return
  fi
  echo
  echo "=== $name ==="
  t0=$(now)
  rm -f "$WORK/.result"
  current=$name current_t0=$t0
  ( "stage_${name//-/_}" ) 2>&1 | tee "$WORK/$name.log"
  rc=${PIPESTATUS[0]}
  current=
  detail=$(cat "$WORK/.result" 2>/dev/null || true)
  case $rc in
    0) result=PASS ;;
    3) result="NOT RUN" ;;
    *) result=FAIL; failed=1; [ -n "$detail" ] || detail="the stage exited $rc without a verdict (see $WORK/$name.log)" ;;
  esac
  names+=("$name"); results+=("$result"); seconds+=("$(elapsed "$t0")"); details+=("$detail")
  echo "=== $name: $result ($(elapsed "$t0") s)${detail:+: $detail}"
}

# ---------------------------------------------------------------------------------------------- torchrun

# the training line of train.py's rank 0: "batchfit-recipe: done world_size=… micro_batch=… …"
check_training() { # LOG PLAN WORLD
  local log=$1 plan=$2 world=$3 done_line micro accum global
  done_line=$(grep '^batchfit-recipe: done ' "$log" | tail -n 1)
  [ -n "$done_line" ] || fail "train.py logged no 'done' line (see $log)"
  echo "  train.py: ${done_line#batchfit-recipe: }"
  micro=$(pj "$plan" 'p["recommendation"]["micro_batch"]')
  accum=$(pj "$plan" 'p["recommendation"]["accumulation"]')
  global=$(pj "$plan" 'p["recommendation"]["global_batch"]')
  expect "plan: world size" "$world" "$(pj "$plan" 'p["recommendation"]["world_size"]')"
  expect "plan: micro-batch × accumulation × world size" "$global" "$((micro * accum * world))"
  expect "trained: world size" "$world" "$(field world_size "$done_line")"
  expect "trained: micro-batch" "$micro" "$(field micro_batch "$done_line")"
  expect "trained: accumulation" "$accum" "$(field accumulation "$done_line")"
  expect "trained: global batch (samples per optimizer step, counted on all ranks)" \
    "$((world * micro * accum))" "$(field global_batch "$done_line")"
  TRAINED="$micro × $accum × $world = $global"
}

stage_torchrun() {
  local d=$WORK/torchrun plan t0
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  echo "examples/torchrun/launch.sh: CPU probe of train.py's model (1 GiB, world size 2, global batch 8192), then torchrun, 2 processes"
  t0=$(now)
  NPROC=2 GLOBAL_BATCH=8192 PLAN=plan.json bash "$examples/torchrun/launch.sh" > launch.log 2>&1
  local rc=$?
  grep -v 'Failed to initialize NumPy\|_conversion_method_template' launch.log | sed 's/^/  | /'
  echo "  [$(elapsed "$t0") s] launch.sh (exit $rc)"
  [ $rc -eq 0 ] || fail "examples/torchrun/launch.sh exited $rc (see $d/launch.log)"
  plan=$d/plan.json
  expect "plan: status" complete "$(pj "$plan" 'p["status"]')"
  expect "plan: device" cpu "$(pj "$plan" 'p["device"]["kind"]')"
  local accum; accum=$(pj "$plan" 'p["recommendation"]["accumulation"]')
  # an accumulation of 1 would not show that train.py accumulates; 8192 over 2 ranks needs a
  # micro-batch of 4096 for that, about 3 times what fits under 1 GiB
  [ "$accum" -gt 1 ] || fail "the plan's accumulation is 1: the check needs more than 1 to show the accumulation is trained (probe answered $(pj "$plan" 'p["recommendation"]["max_fitting_batch"]'))"
  grep -q "from the plan's mlp" launch.log || fail "train.py did not build the plan's model (no \"from the plan's mlp\" in its start line)"
  echo "  ok: train.py trained the plan's model"
  check_training launch.log "$plan" 2
  local probe_line; probe_line=$(grep -E '^[0-9]+ trials, ' launch.log | tail -n 1)
  # the guard: a job of another world size would train another global batch
  echo "a job of 1 process with this world-size-2 plan must be refused"
  t0=$(now)
  python3 "$examples/torchrun/train.py" --plan "$plan" > refuse.log 2>&1
  rc=$?
  echo "  [$(elapsed "$t0") s] python3 train.py --plan plan.json, a world of 1 process (exit $rc)"
  [ $rc -ne 0 ] || fail "train.py trained a world-size-2 plan with 1 process"
  grep -q 'the plan is for world size 2, this job has 1 processes' refuse.log \
    || fail "train.py failed for another reason than the world size (see $d/refuse.log)"
  echo "  ok: refused: $(grep -o 'the plan is for world size.*' refuse.log | head -n 1 | cut -c1-100)…"
  pass "plan $TRAINED (probe: $probe_line); torchrun trained global batch $(pj "$plan" 'p["recommendation"]["global_batch"]')"
}

stage_torchrun_exec() {
  if ! batchfit probe --help 2>/dev/null | grep -q -- '--exec'; then
    notrun "exec stage: this batchfit has no --exec ($BIN_DIR/batchfit probe --help does not mention it)"
  fi
  local d=$WORK/torchrun-exec plan t0 rc sha
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  echo "examples/torchrun/probe-exec.sh: batchfit probe --exec of the torchrun job itself (2 processes, gloo; $EXEC_PROBE_ARGS), then torchrun trains with the plan"
  t0=$(now)
  NPROC=2 GLOBAL_BATCH=8192 PLAN=plan-exec.json BATCHFIT_PROBE_ARGS="$EXEC_PROBE_ARGS" \
    bash "$examples/torchrun/probe-exec.sh" > launch.log 2>&1
  rc=$?
  grep -v 'Failed to initialize NumPy\|_conversion_method_template\|^W[0-9].*run.py\|^\*\*\*\*' launch.log | sed 's/^/  | /'
  echo "  [$(elapsed "$t0") s] probe-exec.sh (exit $rc)"
  [ $rc -eq 0 ] || fail "examples/torchrun/probe-exec.sh exited $rc (see $d/launch.log)"
  plan=$d/plan-exec.json
  expect "plan: status" complete "$(pj "$plan" 'p["status"]')"
  expect "plan: model kind" exec "$(pj "$plan" 'p["model"]["kind"]')"
  # what each trial ran is the torchrun job, not one rank of it
  expect "plan: the probed command is torchrun with 2 processes" yes \
    "$(pj "$plan" '"yes" if p["model"]["argv"][0].endswith("torchrun") and "--nproc-per-node" in p["model"]["argv"] and p["model"]["argv"][p["model"]["argv"].index("--nproc-per-node") + 1] == "2" else " ".join(p["model"]["argv"])')"
  # what the plan was proven on is train.py: its content hash is in the plan (--fingerprint-file)
  sha=$(sha256sum "$examples/torchrun/train.py" | cut -d' ' -f1)
  grep -q "$sha" "$plan" || fail "the plan does not hold train.py's SHA-256 $sha: not proven on this train.py"
  echo "  ok: the plan holds train.py's SHA-256 (${sha:0:12}…)"
  echo "  limit: $(pj "$plan" 'p["limit_mechanism"]') of $(pj "$plan" 'p["limit_bytes"]') bytes around each trial"
  local micro; micro=$(pj "$plan" 'p["recommendation"]["micro_batch"]')
  expect "plan: trials of the micro-batch that fit" yes \
    "$(pj "$plan" '"yes" if any(t["batch"] == p["recommendation"]["micro_batch"] and t["outcome"] == "fits" for t in p["trials"]) else "no"')"
  # every fitting trial was the whole job: torchrun's agent and both ranks (rank 0's report says world 2)
  expect "plan: fitting trials with fewer than 3 processes or a report of another world size" none \
    "$(pj "$plan" '" ".join(str(t["batch"]) for t in p["trials"] if t["outcome"] == "fits" and ((t.get("details") or {}).get("processes", 0) < 3 or ((t.get("details") or {}).get("report") or {}).get("world_size") != 2)) or "none"')"
  expect "plan: the search saw the job run out of memory" yes \
    "$(pj "$plan" '"yes" if p["recommendation"].get("first_failing_batch") and any(t["outcome"] == "oom" for t in p["trials"]) else "no"')"
  local accum; accum=$(pj "$plan" 'p["recommendation"]["accumulation"]')
  [ "$accum" -gt 1 ] || fail "the plan's accumulation is 1: the check needs more than 1 to show the accumulation is trained (probe answered $(pj "$plan" 'p["recommendation"]["max_fitting_batch"]'))"
  check_training launch.log "$plan" 2
  local probe_line; probe_line=$(grep -E '^[0-9]+ trials, ' launch.log | tail -n 1)
  pass "plan from --exec of the torchrun job ($probe_line; largest micro-batch per rank $(pj "$plan" 'p["recommendation"]["max_fitting_batch"]'), $(pj "$plan" 'p["limit_mechanism"]')): $TRAINED; torchrun trained it"
}

# ------------------------------------------------------------------------------------------------ guards

# refused CMD…: run CMD (train.py or a script) in a subshell; it must exit 2 with "error:" and the
# pattern in GUARD_EXPECT on its output; the label is GUARD_LABEL
refused() {
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "$GUARD_LABEL: accepted (exit 0), it must be refused; output: $(tail -n 1 <<<"$out")"
  grep -q -- "$GUARD_EXPECT" <<<"$out" \
    || fail "$GUARD_LABEL: exit $rc without \"$GUARD_EXPECT\": $(tail -n 2 <<<"$out" | tr '\n' ' ' | cut -c1-300)"
  echo "  ok: refused (exit $rc): $GUARD_LABEL: $(grep -m1 -o -- "error: .*" <<<"$out" | cut -c1-110)…"
}

stage_guards() {
  local d=$WORK/guards t=$examples/torchrun/train.py sim sha out rc
  local small=base=600MiB,per-sample=512KiB,capacity=1GiB other=base=600MiB,per-sample=1MiB,capacity=1GiB
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  export T=$t
  sim=(--backend sim --mlp-input 65536 --mlp-hidden 16 --world-size 1 --quiet)
  echo "train.py with plans it cannot honour (plain python, a world of 1; sim plans of train.py's mlp), merge-config.sh, probe-exec.sh's arguments"
  batchfit probe "${sim[@]}" --sim "$small" --global-batch 1024 --out "$d/w1.json" --format env > w1.env || fail "sim probe failed"
  # the control: the exports as they are train micro × accumulation × 1
  (set -a; . ./w1.env; python3 "$t" --steps 1) > ok.log 2>&1 || fail "train.py refused good exports (see $d/ok.log)"
  check_training ok.log "$d/w1.json" 1
  echo "  ok: the exports of a sim plan trained ($TRAINED)"

  GUARD_LABEL="exports whose plan file another job rewrote (same --out)" GUARD_EXPECT="was rewritten since the probe"
  refused bash -c '. ./w1.env && batchfit probe "$@" > /dev/null && exec python3 "$T" --steps 1' probe "${sim[@]}" \
    --sim "$other" --global-batch 1024 --out "$d/w1.json" --format env
  batchfit probe "${sim[@]}" --sim "$small" --global-batch 1024 --out "$d/w1.json" --format env > w1.env || fail "sim probe failed"

  GUARD_LABEL="the exports of an --allow-uneven plan (micro-batches 512 and 511), no --out" GUARD_EXPECT="BATCHFIT_UNEVEN=1"
  batchfit probe "${sim[@]}" --sim "$small" --global-batch 1023 --allow-uneven --format env > uneven.env || fail "sim probe failed"
  grep -q 'BATCHFIT_UNEVEN=1' uneven.env || fail "the uneven probe's exports have no BATCHFIT_UNEVEN=1: $(tr '\n' ' ' < uneven.env)"
  refused bash -c '. ./uneven.env && exec python3 "$T" --steps 1'

  GUARD_LABEL="--hidden 32 with the exports of a plan of hidden 16" GUARD_EXPECT="another model than the plan's"
  refused bash -c '. ./w1.env && exec python3 "$T" --steps 1 --hidden 32'
  GUARD_LABEL="--accumulation 1 over the plan's accumulation 2" GUARD_EXPECT="without --micro-batch would change the accumulation"
  refused bash -c '. ./w1.env && exec python3 "$T" --steps 1 --accumulation 1'
  GUARD_LABEL="a plan of another model (gpt)" GUARD_EXPECT="the plan is for model 'gpt'"
  batchfit probe --backend sim --sim base=600MiB,per-sample=1MiB,capacity=4GiB --model gpt --global-batch 64 \
    --quiet --out gpt.json --format json > /dev/null || fail "sim probe of gpt failed"
  refused python3 "$t" --plan gpt.json --steps 1

  # an --exec plan (as probe-exec.sh writes: train.py's hash, the command with its model flags),
  # written from the sim plan: train.py trains it only with the same flags and the same file
  sha=$(sha256sum "$t" | cut -d' ' -f1)
  "$PY" - "$t" "$sha" <<'PYEOF' || fail "cannot write the exec plans"
import json, sys
p = json.load(open("w1.json"))
p["model"] = {"kind": "exec", "fingerprint": "0" * 64, "environment": [],
              "argv": ["torchrun", "--standalone", "--nproc-per-node", "1", sys.argv[1], "--hidden", "32",
                       "--micro-batch", "{batch}", "--accumulation", "{accumulation}", "--steps", "{steps}"],
              "fingerprint_files": [{"path": sys.argv[1], "sha256": sys.argv[2]}]}
json.dump(p, open("exec.json", "w"))
p["model"]["fingerprint_files"][0]["sha256"] = "0" * 64
json.dump(p, open("exec-other-script.json", "w"))
PYEOF
  python3 "$t" --plan exec.json --steps 1 --hidden 32 > exec-ok.log 2>&1 || fail "train.py refused the --exec plan with its own flags (see $d/exec-ok.log)"
  check_training exec-ok.log "$d/exec.json" 1
  GUARD_LABEL="an --exec plan probed with --hidden 32, trained without it" GUARD_EXPECT="probe with the same flags"
  refused python3 "$t" --plan exec.json --steps 1
  GUARD_LABEL="an --exec plan of another version of train.py" GUARD_EXPECT="not proven on this script"
  refused python3 "$t" --plan exec-other-script.json --steps 1 --hidden 32

  # merge-config.sh: a merged plan is unverified until `batchfit verify`
  batchfit probe "${sim[@]}" --sim "$small" --global-batch 1024 --out a.json --format json > /dev/null \
    && batchfit probe "${sim[@]}" --sim "$other" --global-batch 1024 --out b.json --format json > /dev/null \
    && batchfit merge a.json b.json --global-batch 1024 --world-size 1 --out merged.json --format json > /dev/null 2>&1 \
    || fail "sim probes or merge failed"
  cp "$examples/deepspeed/ds_config.json" ds_config.json
  local nojq
  for nojq in "" 1; do
    GUARD_LABEL="merge-config.sh${nojq:+ (python, NO_JQ=1)} of an unverified merged plan" GUARD_EXPECT="not verified"
    out=$(NO_JQ=$nojq bash "$examples/deepspeed/merge-config.sh" merged.json ds_config.json 2> merge.err); rc=$?
    [ $rc -ne 0 ] && [ -z "$out" ] || fail "$GUARD_LABEL: exit $rc, printed $(wc -c <<<"$out") bytes (a config for DeepSpeed)"
    grep -q "$GUARD_EXPECT" merge.err || fail "$GUARD_LABEL: exit $rc for another reason: $(cat merge.err)"
    echo "  ok: refused (exit $rc): $GUARD_LABEL"
  done
  batchfit verify merged.json --out verified.json > /dev/null 2>&1 || fail "batchfit verify of the merged sim plan failed"
  bash "$examples/deepspeed/merge-config.sh" verified.json ds_config.json > ds.json || fail "merge-config.sh refused the verified plan"
  expect "merge-config.sh of the verified plan: train_micro_batch_size_per_gpu" \
    "$(pj verified.json 'p["recommendation"]["micro_batch"]')" "$(pj ds.json 'p["train_micro_batch_size_per_gpu"]')"

  # probe-exec.sh: the training run's train.py arguments are probed too, and the trial helper goes
  # to a directory of its own (a batchfit_trial.py in the current directory, here a symlink, is left
  # alone); stubs of batchfit and torchrun record their arguments
  mkdir -p stub job && printf 'precious\n' > precious.txt && ln -sf "$d/precious.txt" job/batchfit_trial.py
  cat > stub/batchfit <<'SH'
#!/usr/bin/env bash
case $1 in
  python-helper) echo 'HELPER = 1' ;;
  probe) printf '%s\n' "$@" > "$STUB_LOG/probe.args"; printf '%s\n' "${PYTHONPATH:-}" > "$STUB_LOG/probe.pythonpath"
         echo "export BATCHFIT_MICRO_BATCH=64 BATCHFIT_ACCUMULATION=2 BATCHFIT_GLOBAL_BATCH=256 BATCHFIT_WORLD_SIZE=2 BATCHFIT_STATUS=complete BATCHFIT_PLAN=/nonexistent" ;;
  *) exit 2 ;;
esac
SH
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$@" > "$STUB_LOG/torchrun.args"\n' > stub/torchrun
  chmod +x stub/batchfit stub/torchrun
  (cd job && PATH=$d/stub:$PATH STUB_LOG=$d NPROC=2 GLOBAL_BATCH=256 bash "$examples/torchrun/probe-exec.sh" --hidden 64 --steps 5) \
    > exec-stub.log 2>&1 || fail "probe-exec.sh with stubs exited $? (see $d/exec-stub.log)"
  expect "probe-exec.sh: the probed command (after --)" \
    "torchrun --standalone --nproc-per-node 2 $t --hidden 64 --steps 5 --micro-batch {batch} --accumulation {accumulation} --steps {steps}" \
    "$(sed -n '/^--$/,$p' probe.args | tail -n +2 | tr '\n' ' ' | sed 's/ $//')"
  expect "probe-exec.sh: the training command" "--standalone --nproc-per-node 2 $t --hidden 64 --steps 5" \
    "$(tr '\n' ' ' < torchrun.args | sed 's/ $//')"
  expect "the current directory's batchfit_trial.py (a symlink to precious.txt): its target" precious "$(cat precious.txt)"
  local hdir; hdir=$(cut -d: -f1 probe.pythonpath)
  case $hdir in "$d"/job*|"") fail "the trials' PYTHONPATH starts with ${hdir:-nothing}, not a directory of the helper's own" ;; esac
  [ ! -e "$hdir" ] || fail "the helper's directory $hdir is still there after the probe"
  echo "  ok: the trial helper was on the trials' PYTHONPATH in $hdir, removed after the probe"

  if command -v shellcheck > /dev/null; then
    shellcheck "$examples"/torchrun/*.sh "$examples"/slurm/*.sbatch "$examples"/deepspeed/*.sh > shellcheck.log 2>&1 \
      || fail "shellcheck of examples/: $(head -n 5 shellcheck.log | tr '\n' ' ')"
    echo "  ok: shellcheck: examples/ clean"
  else
    echo "  (shellcheck is not installed: the examples were not linted)"
  fi
  pass "train.py refused 7 plans it cannot honour and trained 2 it can; merge-config.sh refused an unverified plan; probe-exec.sh probes its training arguments"
}

# --------------------------------------------------------------------------------------------- deepspeed

stage_deepspeed_merge() {
  local d=$WORK/deepspeed plan
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  if [ -f "$WORK/torchrun/plan.json" ]; then
    plan=$WORK/torchrun/plan.json
    echo "the plan of stage torchrun: $plan"
  else
    plan=$d/plan.json
    echo "stage torchrun made no plan: a sim plan (world size 2, global batch 8192)"
    timed "batchfit probe --backend sim" batchfit probe --backend sim --sim base=600MiB,per-sample=512KiB,capacity=1GiB \
      --mlp-input 65536 --mlp-hidden 16 --global-batch 8192 --world-size 2 --out "$plan" --quiet --format json \
      > /dev/null || fail "the sim probe failed"
  fi
  local micro accum world global
  micro=$(pj "$plan" 'p["recommendation"]["micro_batch"]')
  accum=$(pj "$plan" 'p["recommendation"]["accumulation"]')
  world=$(pj "$plan" 'p["recommendation"]["world_size"]')
  global=$(pj "$plan" 'p["recommendation"]["global_batch"]')
  cp "$examples/deepspeed/ds_config.json" ds_config.json
  if command -v jq > /dev/null; then
    timed "merge-config.sh (jq)" bash "$examples/deepspeed/merge-config.sh" "$plan" ds_config.json > merged-jq.json \
      || fail "merge-config.sh (jq) failed"
  else
    echo "  jq is not installed: only the python fallback is checked"
  fi
  NO_JQ=1 timed "merge-config.sh (python fallback, NO_JQ=1)" bash "$examples/deepspeed/merge-config.sh" "$plan" ds_config.json \
    > merged-py.json || fail "merge-config.sh (python) failed"
  local m
  for m in merged-jq.json merged-py.json; do
    [ -f "$m" ] || continue
    echo " $m:"
    expect "  train_micro_batch_size_per_gpu" "$micro" "$(pj "$m" 'p["train_micro_batch_size_per_gpu"]')"
    expect "  gradient_accumulation_steps" "$accum" "$(pj "$m" 'p["gradient_accumulation_steps"]')"
    expect "  train_batch_size (= micro × accumulation × world size $world)" "$((micro * accum * world))" "$(pj "$m" 'p["train_batch_size"]')"
    expect "  the rest of ds_config.json kept" yes \
      "$(same ds_config.json "$m" '{k: v for k, v in p.items() if not k.startswith(("train_", "gradient_acc"))}')"
  done
  if [ -f merged-jq.json ]; then
    expect "jq and python merges agree" yes "$(same merged-jq.json merged-py.json 'p')"
  fi
  cp merged-py.json ds_config.batchfit.json
  pass "train_batch_size $global = $micro × $accum × $world$( [ -f merged-jq.json ] && echo ' (jq and python)' || echo ' (python; no jq)')"
}

stage_deepspeed_engine() {
  local d=$WORK/deepspeed dspy tver line t0 rc
  [ -f "$d/ds_config.batchfit.json" ] || notrun "no merged config: stage deepspeed-merge did not pass"
  cd "$d" || fail "no $d"
  if [ -n "${RECIPES_DEEPSPEED_PYTHON:-}" ]; then
    dspy=$RECIPES_DEEPSPEED_PYTHON
  elif [ -n "${RECIPES_NO_INSTALL:-}" ]; then
    notrun "DeepSpeed is not installed here and RECIPES_NO_INSTALL is set (give RECIPES_DEEPSPEED_PYTHON, a python with deepspeed)"
  else
    # a side venv with the libtorch venv's torch (a .pth file), never a second torch: pip is held to
    # the installed torch version by a constraint
    tver=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))') || fail "cannot read the torch version"
    "$PY" -m venv "$d/dsvenv" || fail "python -m venv failed"
    "$PY" -c 'import site; print(site.getsitepackages()[0])' > "$(echo "$d"/dsvenv/lib/python3*/site-packages)/libtorch-venv.pth"
    echo "torch==$tver" > constraints.txt
    echo "pip install deepspeed into a side venv (torch $tver from $VENV)"
    t0=$(now)
    DS_BUILD_OPS=0 "$d/dsvenv/bin/pip" install --disable-pip-version-check -q -c constraints.txt deepspeed > pip.log 2>&1
    rc=$?
    echo "  [$(elapsed "$t0") s] pip install deepspeed (exit $rc)"
    if [ $rc -ne 0 ]; then
      tail -n 5 pip.log | sed 's/^/  | /'
      notrun "pip install deepspeed failed (no network or no wheel for this Python): $(grep -m1 -i 'error' pip.log | cut -c1-160)"
    fi
    dspy=$d/dsvenv/bin/python
  fi
  local torch_file; torch_file=$("$dspy" -c 'import torch; print(torch.__file__)' 2>/dev/null)
  echo "  deepspeed's python: $dspy; torch from $torch_file"
  if [ -z "${RECIPES_DEEPSPEED_PYTHON:-}" ]; then
    case $torch_file in "$VENV"/*) ;; *) fail "the side venv's torch is not the libtorch venv's ($torch_file)" ;; esac
  fi
  t0=$(now)
  DS_ACCELERATOR=cpu "$dspy" -m torch.distributed.run --standalone --nproc-per-node 2 "$helpers/deepspeed_engine.py" \
    ds_config.batchfit.json > engine.log 2>&1
  rc=$?
  echo "  [$(elapsed "$t0") s] deepspeed.initialize + 2 optimizer steps, torchrun 2 CPU processes (exit $rc)"
  [ $rc -eq 0 ] || {
      grep -v Warning engine.log | tail -n 20 | sed 's/^/  | /'
      fail "DeepSpeed did not train with the merged config (see $d/engine.log)"; }
  line=$(grep '^deepspeed-engine: ' engine.log | tail -n 1)
  [ -n "$line" ] || fail "no result line from the DeepSpeed run (see $d/engine.log)"
  echo "  ${line}"
  local m=ds_config.batchfit.json
  expect "DeepSpeed world size" 2 "$(field world_size "$line")"
  expect "DeepSpeed train_batch_size" "$(pj $m 'p["train_batch_size"]')" "$(field train_batch_size "$line")"
  expect "DeepSpeed micro-batch" "$(pj $m 'p["train_micro_batch_size_per_gpu"]')" "$(field micro_batch "$line")"
  expect "DeepSpeed accumulation" "$(pj $m 'p["gradient_accumulation_steps"]')" "$(field accumulation "$line")"
  expect "DeepSpeed optimizer steps" 2 "$(field optimizer_steps "$line")"
  expect "samples per DeepSpeed optimizer step, all ranks" "$(pj $m 'p["train_batch_size"]')" "$(field samples_per_step "$line")"
  pass "DeepSpeed $(field deepspeed "$line") trained 2 steps of train_batch_size $(field train_batch_size "$line") with the merged config"
}

# ------------------------------------------------------------------------------------------------- slurm

slurm_log_tail() { # FILE: its last errors, for a reason
  grep -v -i 'pmix' "$1" 2>/dev/null | grep -i -E 'error|fatal' | tail -n 3 | tr '\n' ' ' | cut -c1-400
}

# apt_get ARGS…: apt-get, its output to the work dir, its time on the stage's output
apt_get() {
  local t0 rc; t0=$(now)
  DEBIAN_FRONTEND=noninteractive apt-get "$@" >> "$WORK/apt/apt-get.log" 2>&1; rc=$?
  echo "  [$(elapsed "$t0") s] apt-get $* (exit $rc)"
  return $rc
}
apt_install() { apt_get install -y -q --no-install-recommends slurm-wlm munge; }

# leftovers LABEL: processes of this run's jobs and daemons still alive (their working directory is
# under the work dir: job steps run in their submit directory, slurmstepd in the log directory)
leftovers() {
  local p cwd
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
    cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || continue
    case $cwd in "$WORK"|"$WORK"/*) [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" = Z ] || echo "$p" ;; esac
  done
}

stop_cluster() {
  [ -f "$SLURM_DIR/started" ] || return 0
  export SLURM_CONF=$SLURM_DIR/slurm.conf
  local f pid i left
  # cancel this run's jobs (an interrupted check leaves them running), wait until they are gone
  if [ -s "$SLURM_DIR/jobs" ]; then
    # shellcheck disable=SC2046  # one job id per line
    scancel $(cat "$SLURM_DIR/jobs") >> "$SLURM_DIR/log/stop.log" 2>&1
    for i in $(seq 60); do [ -z "$(squeue -h 2>>"$SLURM_DIR/log/stop.log")" ] && break; sleep 0.5; done
    [ -z "$(squeue -h 2>/dev/null)" ] || echo "recipes-check: jobs still in the queue after 30 s: $(squeue -h -o '%i %T' | tr '\n' ' ')"
  fi
  scontrol shutdown >> "$SLURM_DIR/log/stop.log" 2>&1
  for i in $(seq 20); do
    pgrep -F "$SLURM_DIR/run/slurmctld.pid" > /dev/null 2>&1 || break; sleep 0.5
  done
  for f in "$SLURM_DIR"/run/slurmd-*.pid "$SLURM_DIR/run/slurmctld.pid" "$SLURM_DIR/run/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null; fi
  done
  sleep 0.5
  for f in "$SLURM_DIR"/run/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null; echo "recipes-check: killed $(basename "$f" .pid) (pid $pid) with SIGKILL"; fi
  done
  left=$(leftovers)
  if [ -n "$left" ]; then
    echo "recipes-check: processes of this run's jobs still alive, killed: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)" | tr '\n' ';')"
    kill -9 $left 2>/dev/null
  fi
  rm -f "$SLURM_DIR/started"
  echo "recipes-check: Slurm cluster stopped (munged, slurmctld, slurmd)"
}

stage_slurm_cluster() {
  local missing=() c
  for c in slurmctld slurmd sbatch srun scontrol squeue sinfo scancel munged munge; do
    command -v "$c" > /dev/null || missing+=("$c")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ -z "${RECIPES_NO_INSTALL:-}" ] || notrun "Slurm is not installed (no ${missing[*]}) and RECIPES_NO_INSTALL is set"
    [ "$(id -u)" -eq 0 ] || notrun "Slurm is not installed (no ${missing[*]}) and installing it needs root (apt-get install slurm-wlm munge)"
    command -v apt-get > /dev/null || notrun "Slurm is not installed (no ${missing[*]}) and there is no apt-get to install it (not Debian/Ubuntu)"
    echo "installing Slurm and MUNGE (missing: ${missing[*]})"
    mkdir -p "$WORK/apt"
    if ! apt_install; then
      apt_get update -q
      apt_install || notrun "apt-get install slurm-wlm munge failed: $(tail -n 2 "$WORK/apt/apt-get.log" | tr '\n' ' ')"
    fi
  fi
  [ "$(id -u)" -eq 0 ] || notrun "slurmd runs as root (it starts job steps as the job's user) and this check runs as $(id -un)"
  echo "  $(slurmd -V) ($(command -v slurmd)), munge $(munged -V 2>&1 | head -n 1 | awk '{print $1}')"
  local run=$SLURM_DIR/run host p_ctld p0 p1 p2 cpus i
  mkdir -p "$run" "$SLURM_DIR"/{state,log,spool/rc0,spool/rc1,spool/rc2,munge} || fail "cannot make $SLURM_DIR"
  chmod 755 "$SLURM_DIR" "$run"; chmod 700 "$SLURM_DIR/munge"
  # MUNGE with its own key, socket, pid and log: another munged on this host is left alone
  head -c 1024 /dev/urandom > "$SLURM_DIR/munge/munge.key" && chmod 600 "$SLURM_DIR/munge/munge.key"
  touch "$SLURM_DIR/started"   # from here on the EXIT trap stops what was started
  munged --force --socket="$run/munge.sock" --key-file="$SLURM_DIR/munge/munge.key" \
    --log-file="$SLURM_DIR/log/munged.log" --pid-file="$run/munged.pid" --seed-file="$SLURM_DIR/munge/seed" \
    < /dev/null > "$SLURM_DIR/log/munged.out" 2>&1 || fail "munged did not start: $(cat "$SLURM_DIR/log/munged.out")"
  munge --socket="$run/munge.sock" -n | unmunge --socket="$run/munge.sock" > /dev/null \
    || fail "munge credentials do not round-trip through $run/munge.sock: $(tail -n 3 "$SLURM_DIR/log/munged.log")"
  echo "  munged up ($run/munge.sock)"
  host=$(hostname -s)
  read -r p_ctld p0 p1 p2 < <("$PY" -c 'import socket
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
  cpus=$(nproc)
  # No cgroups anywhere (proctrack/linuxproc, task/none, no accounting); three slurmd on this host with
  # their own names and ports: rc0 for single-node jobs, rc1 and rc2 for a two-node allocation.
  cat > "$SLURM_DIR/slurm.conf" <<EOF
ClusterName=recipes
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p_ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$run/munge.sock
CredType=cred/munge
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=rc0 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=$p0 CPUs=$cpus State=UNKNOWN
NodeName=rc1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=$p1 CPUs=$cpus State=UNKNOWN
NodeName=rc2 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=$p2 CPUs=$cpus State=UNKNOWN
PartitionName=one Nodes=rc0 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=two Nodes=rc1,rc2 MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  export SLURM_CONF=$SLURM_DIR/slurm.conf
  slurmctld -f "$SLURM_CONF" < /dev/null > "$SLURM_DIR/log/slurmctld.out" 2>&1 \
    || fail "slurmctld did not start: $(cat "$SLURM_DIR/log/slurmctld.out") $(slurm_log_tail "$SLURM_DIR/log/slurmctld.log")"
  for n in rc0 rc1 rc2; do
    slurmd -f "$SLURM_CONF" -N "$n" < /dev/null > "$SLURM_DIR/log/slurmd-$n.out" 2>&1 \
      || echo "  slurmd -N $n did not start: $(cat "$SLURM_DIR/log/slurmd-$n.out") $(slurm_log_tail "$SLURM_DIR/log/slurmd-$n.log")"
  done
  local states=""
  for i in $(seq 60); do
    states=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort | tr '\n' ' ')
    case $states in *"rc0=idle"*"rc1=idle"*"rc2=idle"*) break ;; esac
    sleep 0.5
  done
  echo "  nodes: $states"
  case $states in
    *"rc0=idle"*) ;;
    *) fail "node rc0 did not come up (sinfo: ${states:-no answer}); slurmctld: $(slurm_log_tail "$SLURM_DIR/log/slurmctld.log"); slurmd: $(slurm_log_tail "$SLURM_DIR/log/slurmd-rc0.log")" ;;
  esac
  case $states in
    *"rc1=idle"*"rc2=idle"*) echo two > "$SLURM_DIR/two-nodes" ;;
    *) echo "a second and third slurmd (slurmd -N rc1/rc2, own ports) did not come up: sinfo '$states'; rc1: $(slurm_log_tail "$SLURM_DIR/log/slurmd-rc1.log"); rc2: $(slurm_log_tail "$SLURM_DIR/log/slurmd-rc2.log")" > "$SLURM_DIR/two-nodes-reason" ;;
  esac
  pass "$(slurmd -V) on $host: slurmctld, slurmd rc0$( [ -f "$SLURM_DIR/two-nodes" ] && echo ', rc1, rc2') up (ports $p_ctld, $p0-$p2; munge socket under the work dir)"
}

# wait_job ID TIMEOUT: wait until the job (all array tasks) left the queue; print each record's
# "JobId JobState ExitCode"
wait_job() {
  local id=$1 limit=$2 t0; t0=$(now)
  while [ -n "$(squeue -h -j "$id" 2>/dev/null)" ]; do
    if awk -v e="$(elapsed "$t0")" -v l="$limit" 'BEGIN { exit !(e > l) }'; then
      squeue -j "$id" | sed 's/^/  | /'
      scancel "$id"
      fail "job $id still running after $limit s: cancelled"
    fi
    sleep 1
  done
  # "JobId=2 ArrayJobId=1 ArrayTaskId=1 … JobState=COMPLETED … ExitCode=0:0" → "1_1 COMPLETED 0:0"
  scontrol -o show job "$id" 2>/dev/null | sed -e 's/^JobId=[^ ]* ArrayJobId=\([^ ]*\) ArrayTaskId=\([^ ]*\)/JobId=\1_\2/' \
    | sed -n 's/^JobId=\([^ ]*\) .* JobState=\([^ ]*\) .* ExitCode=\([^ ]*\).*/\1 \2 \3/p' | sort
}

need_cluster() {
  [ "$(stage_result slurm-cluster)" = PASS ] || notrun "no Slurm cluster: stage slurm-cluster $(stage_result slurm-cluster | tr 'A-Z' 'a-z')"
  export SLURM_CONF=$SLURM_DIR/slurm.conf
}

# shellcheck disable=SC2054  # the commas are the sim spec's
SLURM_SIM=(--backend sim --sim base=600MiB,per-sample=2MiB,capacity=1.2GiB --mlp-input 65536 --mlp-hidden 16)

stage_slurm_array() {
  need_cluster
  local d=$WORK/slurm-array id t0 states out0 out1 p0 p1
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  cp "$examples/slurm/train-array.sbatch" "$examples/torchrun/train.py" .
  echo "sbatch train-array.sbatch (--array=0-1%1; probe: ${SLURM_SIM[*]}; NPROC=2, GLOBAL_BATCH=1536)"
  echo "  (sim backend: the cache key holds the free memory in 1/16 steps, which other jobs on this host move)"
  t0=$(now)
  # the example's own cache (the submit directory's .batchfit-cache), not the check's
  id=$(env -u BATCHFIT_CACHE_DIR NPROC=2 GLOBAL_BATCH=1536 BATCHFIT_PROBE_ARGS="${SLURM_SIM[*]}" \
         sbatch --parsable train-array.sbatch) || fail "sbatch refused the job"
  id=${id%%;*}
  echo "$id" >> "$SLURM_DIR/jobs"
  echo "  array job $id submitted"
  states=$(wait_job "$id" 300) || exit $?
  echo "  [$(elapsed "$t0") s] array job $id done:"; sed 's/^/    /' <<<"$states"
  expect "array tasks that ended COMPLETED with exit 0:0" 2 "$(grep -c ' COMPLETED 0:0$' <<<"$states")"
  out0=$d/batchfit-array-${id}_0.out out1=$d/batchfit-array-${id}_1.out
  for f in "$out0" "$out1"; do
    [ -f "$f" ] || fail "no output file $f"
    echo "  --- $(basename "$f")"
    grep -v 'Failed to initialize NumPy\|_conversion_method_template\|^W[0-9]\|OMP_NUM_THREADS\|\*\*\*\*' "$f" | sed 's/^/  | /'
  done
  grep -q 'plan from cache' "$out0" && fail "task 0 answered from the cache: the cache was not empty"
  echo "  ok: task 0 probed (no 'plan from cache')"
  grep -q '^batchfit: plan from cache (' "$out1" || fail "task 1 did not answer from the plan cache (no 'batchfit: plan from cache (' in $out1)"
  echo "  ok: task 1: $(grep -o '^batchfit: plan from cache ([^,]*' "$out1" | cut -c1-120)…"
  expect "plans in the shared cache $d/.batchfit-cache" 1 "$(ls "$d"/.batchfit-cache/*.json 2>/dev/null | wc -l)"
  p0=$d/plans/batchfit-array-$id-0.json p1=$d/plans/batchfit-array-$id-1.json
  expect "task 1's recommendation = task 0's" "$(pj "$p0" 'p["recommendation"]')" "$(pj "$p1" 'p["recommendation"]')"
  check_training "$out0" "$p0" 2
  check_training "$out1" "$p1" 2
  pass "2 array tasks, the second from the first's cache; each trained $TRAINED through srun + torchrun"
}

stage_slurm_two_node() {
  need_cluster
  [ -f "$SLURM_DIR/two-nodes" ] || notrun "no second slurmd on this host: $(cat "$SLURM_DIR/two-nodes-reason" 2>/dev/null)"
  local d=$WORK/slurm-two-node id t0 states out pd n micro
  mkdir -p "$d" && cd "$d" || fail "cannot make $d"
  cp "$examples/slurm/multi-node.sbatch" "$examples/torchrun/train.py" .
  echo "sbatch -p two multi-node.sbatch (2 nodes × 1 process; probe: ${SLURM_SIM[*]}; GLOBAL_BATCH=1536)"
  t0=$(now)
  # held, to leave in its plans/ID/nodes what a first run of a requeued job (same id) would have left:
  # a node's partial plan and a plan of a node (and a model) the job no longer has; the job must not
  # merge them
  id=$(BATCHFIT_CACHE_DIR=$d/cache NPROC=1 GLOBAL_BATCH=1536 BATCHFIT_PROBE_ARGS="${SLURM_SIM[*]}" \
         sbatch --parsable --hold --partition=two multi-node.sbatch) || fail "sbatch refused the job"
  id=${id%%;*}
  echo "$id" >> "$SLURM_DIR/jobs"
  mkdir -p "plans/$id/nodes"
  batchfit probe "${SLURM_SIM[@]}" --global-batch 1536 --world-size 2 --max-trials 2 --no-cache --quiet \
    --out "plans/$id/nodes/rc1.json" --format json > /dev/null 2>&1
  [ -f "plans/$id/nodes/rc1.partial.json" ] || fail "no partial plan for the requeue's leftovers"
  batchfit probe --backend sim --sim base=600MiB,per-sample=1MiB,capacity=4GiB --model gpt --global-batch 1536 \
    --world-size 2 --quiet --no-cache --out "plans/$id/nodes/gone.json" --format json > /dev/null 2>&1 \
    || fail "the sim probe of gpt failed"
  scontrol release "$id" || fail "scontrol release $id failed"
  echo "  job $id submitted (held; a first run's rc1.partial.json and gone.json (gpt) put in plans/$id/nodes; released)"
  states=$(wait_job "$id" 300) || exit $?
  echo "  [$(elapsed "$t0") s] job $id done: $states"
  out=$d/batchfit-multinode-$id.out
  [ -f "$out" ] && grep -v 'Failed to initialize NumPy\|_conversion_method_template\|^W[0-9]\|OMP_NUM_THREADS\|\*\*\*\*' "$out" | sed 's/^/  | /'
  expect "job state" "$id COMPLETED 0:0" "$states"
  pd=$d/plans/$id
  expect "per-node plans" "rc1.json rc2.json" "$(cd "$pd/nodes" && ls | tr '\n' ' ' | sed 's/ $//')"
  for n in rc1 rc2; do expect "$n's probe: status" complete "$(pj "$pd/nodes/$n.json" 'p["status"]')"; done
  expect "merged: verified" false "$(pj "$pd/merged.json" 'p.get("verified")')"
  expect "merged: sources" 2 "$(pj "$pd/merged.json" 'len(p.get("sources", []))')"
  micro=$(pj "$pd/merged.json" 'p["recommendation"]["micro_batch"]')
  local smallest; smallest=$(for n in rc1 rc2; do pj "$pd/nodes/$n.json" 'p["recommendation"]["max_fitting_batch"]'; done | sort -n | head -n 1)
  [ "$micro" -le "$smallest" ] || fail "the merged micro-batch $micro is above the smallest node's largest fit $smallest"
  echo "  ok: merged micro-batch $micro ≤ the smallest largest fit of the nodes ($smallest)"
  for n in rc1 rc2; do
    expect "verified-$n.json: verified" true "$(pj "$pd/verified-$n.json" 'p.get("verified")')"
    expect "verified-$n.json: recommendation = merged" "$(pj "$pd/merged.json" 'p["recommendation"]["micro_batches"], p["recommendation"]["accumulation"]')" \
      "$(pj "$pd/verified-$n.json" 'p["recommendation"]["micro_batches"], p["recommendation"]["accumulation"]')"
  done
  check_training "$out" "$pd/verified-rc1.json" 2
  pass "probe on rc1 and rc2 (srun --ntasks-per-node=1), merge, verify on each, torchrun on 2 nodes trained $TRAINED"
}

# ----------------------------------------------------------------------------------------------- main

t_start=$(now)
finish() {
  local rc=$?
  if [ -n "${current:-}" ]; then   # a signal ended the check inside a stage
    names+=("$current"); results+=(FAIL); seconds+=("$(elapsed "$current_t0")")
    details+=("interrupted (exit $rc) during this stage"); failed=1
  fi
  stop_cluster
  echo
  echo "=== recipes-check summary ($(elapsed "$t_start") s; batchfit from $BIN_DIR; work dir $WORK) ==="
  printf '%-17s %-8s %8s  %s\n' stage result seconds detail
  local i npass=0 nfail=0 nnot=0
  for i in "${!names[@]}"; do
    printf '%-17s %-8s %8s  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${details[$i]}"
    case ${results[$i]} in PASS) npass=$((npass + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; *) nnot=$((nnot + 1)) ;; esac
  done
  echo "$npass PASS, $nfail FAIL, $nnot NOT RUN (NOT RUN does not fail the check; the reason is above)"
  if [ -n "${RECIPES_SUMMARY_FILE:-}" ]; then
    for i in "${!names[@]}"; do printf '%s\t%s\t%s\t%s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${details[$i]}"; done \
      > "$RECIPES_SUMMARY_FILE"
  fi
  if [ $failed -eq 0 ] && [ $rc -eq 0 ] && [ -z "${RECIPES_KEEP:-}" ] && [ -z "${RECIPES_WORK_DIR:-}" ]; then
    rm -rf "$WORK"
  else
    echo "work dir kept: $WORK"
  fi
}
trap finish EXIT
trap 'echo "recipes-check: interrupted"; exit 130' INT
trap 'echo "recipes-check: terminated"; exit 143' TERM

echo "recipes-check: batchfit $("$BIN_DIR/batchfit" --version 2>/dev/null | awk '{print $2}') from $BIN_DIR; torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) from $VENV; work dir $WORK"
for s in "${ALL_STAGES[@]}"; do run_stage "$s"; done
exit $failed
