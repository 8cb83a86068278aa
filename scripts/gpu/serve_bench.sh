#!/usr/bin/env bash
# GPU machine: `shardwise serve` under load from `shardwise loadgen`, one server per --parallel value:
# aggregate tokens/s, TTFT and inter-token latency percentiles as users grow (continuous batching).
#   serve_bench.sh OUT MODEL BUDGET SLOT_CTX PROMPT MAXTOK "USERS..."
# e.g. serve_bench.sh OUT 'synthetic:nemo8b?dtype=q4_0&seed=1' 4G 1024 512 64 "1 4 16"
# Each users value N runs a server with --parallel N and a context of N x SLOT_CTX, then 2N requests
# (at least 4) from N users, streamed. Writes OUT/serve_<N>.json (loadgen's JSON), serve_<N>.log.
set -uo pipefail
out=${1:?usage: serve_bench.sh OUT MODEL BUDGET SLOT_CTX PROMPT MAXTOK "USERS..."}
model=$2 budget=$3 slot_ctx=$4 prompt=$5 maxtok=$6 users=$7
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/serve_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
for n in $users; do
  log="$out/serve_$n.log"
  start_serve "$out/serve_$n.out" "$log" -m "$model" --device cuda --vram-budget "$budget" --parallel "$n" \
    -c $((n * slot_ctx)) -t 16
  if [ -z "$url" ]; then echo "users $n: the server did not start"; tail -5 "$log"; kill $pid 2> /dev/null; continue; fi
  req=$((2 * n)); [ $req -lt 4 ] && req=4
  timeout 240 "$bin" loadgen --url "$url" --users "$n" --requests $req --prompt-tokens "$prompt" --max-tokens "$maxtok" \
    --stream --json > "$out/serve_$n.json" 2>> "$log"
  echo "users $n: rc=$? $(head -c 600 "$out/serve_$n.json")"
  curl -s "$url/metrics" | grep -E "^shardwise_(vram|device|batch|requests)" >> "$log" 2> /dev/null
  kill -INT $pid; wait $pid
done
