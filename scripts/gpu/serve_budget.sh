#!/usr/bin/env bash
# GPU machine: VRAM budget changes under load. `shardwise serve` at budget A with --parallel N, loaded by
# `shardwise loadgen` (N users, streamed); meanwhile POST /admin/budget to B, then back to A. Writes
# OUT/budget_changes.jsonl (each change's report), OUT/loadgen.json (no request may fail), OUT/serve.log.
#   serve_budget.sh OUT MODEL A B N SLOT_CTX PROMPT MAXTOK REQUESTS
set -uo pipefail
out=${1:?usage: serve_budget.sh OUT MODEL A B N SLOT_CTX PROMPT MAXTOK REQUESTS}
model=$2 a=$3 b=$4 n=$5 slot_ctx=$6 prompt=$7 maxtok=$8 requests=$9
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/serve_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
start_serve "$out/serve.out" "$out/serve.log" -m "$model" --device cuda --vram-budget "$a" --parallel "$n" \
  -c $((n * slot_ctx)) -t 16 --profile "$profile"
[ -n "$url" ] || { echo "the server did not start"; tail -5 "$out/serve.log"; exit 1; }
"$bin" loadgen --url "$url" --users "$n" --requests "$requests" --prompt-tokens "$prompt" --max-tokens "$maxtok" \
  --stream --json > "$out/loadgen.json" 2> "$out/loadgen.log" &
lg=$!
for to in "$b" "$a"; do
  sleep ${PAUSE_S:-4}
  curl -s "$url/admin/budget" -d "{\"vram_budget\": \"$to\"}" >> "$out/budget_changes.jsonl"; echo >> "$out/budget_changes.jsonl"
  curl -s "$url/metrics" | grep -E "^shardwise_(vram_arena_bytes|device_peak_bytes|batch_size|requests_failed)" >> "$out/serve.log"
done
wait $lg
echo "loadgen rc=$?"; cat "$out/budget_changes.jsonl"; head -c 800 "$out/loadgen.json"; echo
kill -INT $pid; wait $pid
