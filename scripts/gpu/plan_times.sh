#!/usr/bin/env bash
# GPU machine: the planning time of qwen235b's whole table (every tier) with the committed profile, at 2G,
# 4G and 8G and contexts of 1K, 16K and 64K, with 16 threads and with 1. One line per plan in OUT/plan_times.txt.
#   plan_times.sh OUT      Env: BUNDLE.
set -uo pipefail
OUT=${1:?usage: plan_times.sh OUT}
mkdir -p "$OUT"
source "$(dirname "$0")/bundle_env.sh"
machine_facts "$OUT/machine.txt"
for th in 16 1; do for ctx in 1024 16384 65536; do for b in 2G 4G 8G; do
  "$bin" plan --model qwen235b --profile configs/profiles/h200-host.profile.json --vram-budget $b --ctx $ctx --threads $th --json 2>/dev/null |
    python3 -c "import sys,json; j=json.load(sys.stdin); print('threads $th ctx $ctx budget $b planning_ms %.1f decode_tps %.2f' % (j['planning_ms'], j['predicted_decode_tokens_per_s']))" >> "$OUT/plan_times.txt"
done; done; done
cat "$OUT/plan_times.txt"
