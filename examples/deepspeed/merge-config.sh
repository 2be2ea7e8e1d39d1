#!/usr/bin/env bash
# Put a batchfit plan's batch sizes into a DeepSpeed config:
#
#   merge-config.sh plan.json ds_config.json > ds_config.batchfit.json
#   deepspeed --num_gpus 8 train.py --deepspeed_config ds_config.batchfit.json
#
# `batchfit show PLAN --format deepspeed` prints {"train_micro_batch_size_per_gpu": micro,
# "gradient_accumulation_steps": accumulation, "train_batch_size": global}; it is merged over your
# config, so batchfit's three values win and everything else stays as you wrote it. DeepSpeed checks
# train_batch_size = micro × accumulation × its world size: probe with --world-size = the number of
# GPUs the job runs on. Needs `batchfit`, and jq or python3.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PLAN.json DS_CONFIG.json > MERGED.json" >&2; exit 2; }
plan=$1 config=$2
# nothing on stdout and a non-zero exit for an incomplete plan (and for an --allow-uneven one:
# DeepSpeed has one micro-batch size)
batch=$(batchfit show "$plan" --format deepspeed)
[ -n "$batch" ] || { echo "$plan: no recommendation (is the plan complete?)" >&2; exit 1; }
if command -v jq >/dev/null && [ -z "${NO_JQ:-}" ]; then
  jq -s '.[0] * .[1]' "$config" <(printf '%s\n' "$batch")
else
  python3 -c 'import json, sys
config = json.load(open(sys.argv[1]))
config.update(json.loads(sys.argv[2]))
print(json.dumps(config, indent=2))' "$config" "$batch"
fi
