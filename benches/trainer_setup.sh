#!/usr/bin/env bash
# Does `batchfit-train --memory-limit plan` bound the same process the probe's trials were? Probes
# the default MLP on CPU under a real memory limit, then runs, at the largest fitting size and the
# first failing one, (a) the trial child itself again (`batchfit __trial`, under RLIMIT_DATA set
# before exec, as the cpu device starts it) and (b) the trainer, in the probe's environment and in
# job environments that differ from it (OpenMP stack size, stack limit). Prints a markdown table of
# exit codes and peak data segments; docs/soundness.md ("The trainer runs as the trials did") holds
# a run.
#
#   benches/trainer_setup.sh [BUDGET=1GiB]
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-1GiB}"
LIBTORCH="$(scripts/setup-libtorch.sh)"; export LIBTORCH
cargo build --release --bins -q
out=target/trainer-setup; mkdir -p "$out"
# a copy of the binaries: a rebuild during the run would change the process being measured
cp target/release/batchfit target/release/batchfit-train "$out/"
B="$out"
"$B/batchfit" probe --backend cpu --memory-budget "$budget" --out "$out/plan.json" --quiet \
  --no-cache --format json > /dev/null
read -r max fail steps limit < <(python3 -c "
import json; p=json.load(open('$out/plan.json')); r=p['recommendation']
f=r['first_failing_batch']
s=max(t['steps'] for t in p['trials'] if t['batch']==f and t['outcome']=='oom')
print(r['max_fitting_batch'], f, s, p['limit_bytes'])")
child() { # batch steps → "outcome peak_MiB"
  python3 - "$out/plan.json" "$B/batchfit" "$1" "$2" <<'PY'
import json, os, resource, subprocess, sys
plan, exe, batch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = json.load(open(plan)); lim = p['limit_bytes']
spec = {"model": p['model']['config'], "batch": batch, "steps": steps,
        "threads": p['runtime']['threads'], "seed": p['runtime']['seed'], "accumulation": 1}
def pre():
    os.setpgid(0, 0)
    resource.setrlimit(resource.RLIMIT_DATA, (lim, lim))
o = subprocess.run([exe, '__trial', json.dumps(spec)], capture_output=True, text=True,
                   preexec_fn=pre, env=dict(os.environ, RUST_BACKTRACE='0', RUST_LIB_BACKTRACE='0'))
r = [l for l in o.stdout.splitlines() if l.startswith('BATCHFIT-TRIAL-RESULT')]
j = json.loads(r[-1].split(' ', 1)[1]) if r else {'outcome': 'no-result'}
peak = j.get('peak_bytes')
print(j['outcome'], f"{peak / 2**20:.2f} MiB" if peak else "-")
PY
}
trainer() { # batch steps [env…] → "exit N, peak"
  local b=$1 s=$2; shift 2
  set +e
  env "$@" "$B/batchfit-train" --plan "$out/plan.json" --micro-batch "$b" --accumulation 1 \
    --steps "$s" --memory-limit plan -q > "$out/t.out" 2> "$out/t.err"
  local rc=$?
  set -e
  echo "exit $rc, $(grep -o 'peak data segment [0-9.]* MiB' "$out/t.out" || echo 'out of memory')"
}
echo "Probe: largest fitting $max, first failing $fail (out of memory with $steps steps), limit $limit bytes."
echo
echo "| process | $max × $steps steps | $fail × $steps steps |"
echo "|---|---|---|"
echo "| trial child (\`batchfit __trial\`, as the probe starts it) | $(child "$max" "$steps") | $(child "$fail" "$steps") |"
echo "| trainer, the probe's environment | $(trainer "$max" "$steps" X=1) | $(trainer "$fail" "$steps" X=1) |"
echo "| trainer, \`OMP_STACKSIZE=256M\` in the job | $(trainer "$max" "$steps" OMP_STACKSIZE=256M) | $(trainer "$fail" "$steps" OMP_STACKSIZE=256M) |"
echo "| trainer, \`ulimit -s unlimited\` in the job | $(ulimit -s unlimited; trainer "$max" "$steps" X=1) | $(ulimit -s unlimited; trainer "$fail" "$steps" X=1) |"
echo "| trainer, \`ulimit -s 65536\` in the job | $(ulimit -s 65536; trainer "$max" "$steps" X=1) | $(ulimit -s 65536; trainer "$fail" "$steps" X=1) |"
