#!/usr/bin/env bash
# The measured table of docs/models.md: every zoo model probed on this machine's CPU under a stated
# budget (real libtorch training steps under RLIMIT_DATA), then a table of the plans.
#
#   bash benches/models_table.sh            # all models (about 60 min on 2 cores)
#   bash benches/models_table.sh mlp gpt    # some
#
# Plans go to benches/data/models/NAME.json (written after each model, so an interrupted run keeps
# what it measured); the table is printed and written to benches/data/models/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(scripts/setup-libtorch.sh)"; export LIBTORCH
cargo build --release --quiet
out=benches/data/models; mkdir -p "$out"
# name | budget | flags (the big transformers use shorter sequences so a CPU probe takes minutes)
rows=(
  "mlp|1GiB|--model mlp"
  "gpt|2GiB|--model gpt"
  "gpt2-small|4GiB|--model gpt2-small --seq-len 128"
  "gpt2-medium|8GiB|--model gpt2-medium --seq-len 128"
  "resnet18|4GiB|--model resnet18"
  "resnet50|3GiB|--model resnet50"
  "vit-b16|3GiB|--model vit-b16"
)
want=("$@")
for row in "${rows[@]}"; do
  IFS='|' read -r name budget flags <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $name " ]]; then continue; fi
  echo "== $name ($budget): batchfit probe $flags" >&2
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  target/release/batchfit probe --backend cpu --memory-budget "$budget" $flags --no-cache \
    --time-limit 1500 --out "$out/$name.json" --format text || echo "exit $? for $name" >&2
  end=$(date +%s.%N)
  python3 - "$out/$name.json" "$start" "$end" "$budget" "$flags" <<'PY'
import json, sys
p, start, end, budget, flags = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
try:
    plan = json.load(open(p))
except FileNotFoundError:
    sys.exit(0)
plan.setdefault("bench", {})
plan["bench"].update({"wall_seconds": round(end - start, 1), "budget": budget, "flags": flags})
json.dump(plan, open(p, "w"), indent=2)
PY
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
order = ["mlp", "gpt", "gpt2-small", "gpt2-medium", "resnet18", "resnet50", "vit-b16"]
lines = ["| model | flags | params | budget | limit | largest micro-batch | peak (of limit) | samples/s | trials | probe wall time | status |",
         "|---|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
gib = 1 << 30
for name in order:
    f = os.path.join(out, name + ".json")
    if not os.path.exists(f):
        continue
    p = json.load(open(f))
    r = p.get("recommendation") or {}
    b = p.get("bench", {})
    peak = r.get("peak_bytes")
    lim = p["limit_bytes"]
    lines.append("| {} | `{}` | {:,} | {} | {:.2f} GiB | {} | {} | {} | {} | {} s | {} |".format(
        name, b.get("flags", ""), p["model"]["parameter_count"], b.get("budget", "?"), lim / gib,
        r.get("max_fitting_batch", "—"),
        "{:.2f} GiB ({:.0%})".format(peak / gib, peak / lim) if peak else "—",
        "{:.1f}".format(r["samples_per_second"]) if r else "—",
        len(p["trials"]), b.get("wall_seconds", "?"), p["status"]))
table = "\n".join(lines)
print(table)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
PY
