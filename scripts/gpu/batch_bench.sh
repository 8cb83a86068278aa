#!/usr/bin/env bash
# GPU machine: the paper's batch table — many users on one VRAM budget — shardwise serve against
# llama-server (llama.cpp b6097 of ../peers: the largest -ngl that fits the budget; for MoE also -ngl 99
# --n-cpu-moe N, the smallest N that fits), on the very same GGUF file (`shardwise synth`, one token per
# character in both), loaded by `shardwise loadgen` (N users, 2N streamed completions, ignore_eos),
# interleaved per repeat. A server of N slots gets a context of N x SLOT_CTX (llama.cpp's -c is shared by
# its -np slots the same way). 16 threads, flash attention, greedy.
#   batch_bench.sh OUT MODEL BUDGET SLOT_CTX PROMPT_WORDS MAXTOK "USERS..."
# e.g. batch_bench.sh OUT qwen30b 16G 1024 150 64 "1 4 16 64"   (MODEL: nemo8b f16 or qwen30b q4_0)
# Writes OUT/batch_runs.tsv (one line per run: users, system, config, repeat, tokens/s, TTFT p50/p99 ms,
# errors), OUT/logs.tgz. Env: PEERS, BUNDLE, REPEATS (2), DEADLINE_S (no new users value after; 480),
# REQ_PER_USER (requests per user, 2), PEER_CONFIGS (which llama-server offloads to run: "ngl ncmoe", or one).
set -uo pipefail
out=${1:?usage: batch_bench.sh OUT MODEL BUDGET SLOT_CTX PROMPT_WORDS MAXTOK "USERS..."}
model=$2 budget=$3 slot_ctx=$4 words=$5 maxtok=$6 users=$7
t_start=$(date +%s)
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/peer_env.sh"
reps=${REPEATS:-2}
work=/tmp/shardwise-batch-work
logs="$out/logs"
mkdir -p "$work" "$logs"
machine_facts "$out/machine.txt"
elapsed() { echo $(( $(date +%s) - t_start )); }
dtype=q4_0; [ "$model" = nemo8b ] && dtype=f16
file="$work/$model.$dtype.gguf"
[ -s "$file" ] || "$bin" synth --spec "$model" --dtype "$dtype" --pure --seed 1 -o "$file" 2> "$logs/synth.err" ||
  { echo "synth failed: $(tail -1 "$logs/synth.err")"; exit 2; }
echo "model file $file: $(du -h "$file" | cut -f1) at $(elapsed) s"
source "$(dirname "$0")/peer_fit.sh"
mib=$(python3 -c "import sys; s=sys.argv[1]; print(int(float(s[:-1]) * {'G': 1024, 'M': 1}[s[-1]]))" "$budget")
tsv="$out/batch_runs.tsv"
[ -s "$tsv" ] || printf "model\tbudget\tusers\tsystem\tconfig\trepeat\trc\ttokens_per_s\tttft_p50_ms\tttft_p99_ms\terrors\n" > "$tsv"

# serve_and_load TAG USERS CMD...: starts a server (CMD with PORT in place of the port), waits for
# /health, runs loadgen against it, stops it; loadgen's JSON in logs/TAG.json.
serve_and_load() {
  local tag=$1 n=$2; shift 2
  local port=$((20000 + RANDOM % 20000))
  local cmd=("${@//PORT/$port}")
  "${cmd[@]}" > "$logs/$tag.server.log" 2>&1 &
  local pid=$! ok=0
  for _ in $(seq 1 900); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && { ok=1; break; }
    kill -0 $pid 2> /dev/null || break
    sleep 0.2
  done
  local rc=1
  if [ $ok = 1 ]; then
    local req=$((${REQ_PER_USER:-2} * n)); [ $req -lt 4 ] && req=4
    timeout 300 "$bin" loadgen --url "http://127.0.0.1:$port" --users "$n" --requests $req --prompt-tokens "$words" \
      --max-tokens "$maxtok" --stream --json > "$logs/$tag.json" 2> "$logs/$tag.loadgen.err"
    rc=$?
  fi
  kill -INT $pid 2> /dev/null; sleep 1; kill -9 $pid 2> /dev/null; wait $pid 2> /dev/null
  return $rc
}
row() {  # USERS SYSTEM CONFIG REPEAT RC JSON: one TSV line from loadgen's JSON
  python3 - "$model" "$budget" "$@" >> "$tsv" <<'PY'
import json, sys
model, budget, n, system, cfg, r, rc, path = sys.argv[1:]
try:
    j = json.load(open(path))
    vals = [j["tokens_per_s"], j["ttft_ms"]["p50"], j["ttft_ms"]["p99"], j["errors"]]
except Exception:
    vals = ["", "", "", ""]
print("\t".join(str(x) for x in [model, budget, n, system, cfg, r, rc] + vals))
PY
  echo "users $1 $2 $3 r$4: rc $5, $(tail -1 "$tsv" | cut -f8-11 | tr '\t' ' ')"
}

for n in $users; do
  [ "$(elapsed)" -lt "${DEADLINE_S:-480}" ] || { echo "deadline: users $n not started"; continue; }
  ctx=$((n * slot_ctx))
  configs=()
  peer_configs=${PEER_CONFIGS:-ngl ncmoe}
  [[ " $peer_configs " == *" ngl "* ]] && configs+=("-ngl $(fit_ngl "$ctx" "$mib")")
  if [ "$model" != nemo8b ] && [[ " $peer_configs " == *" ncmoe "* ]]; then
    k=$(fit_ncmoe "$ctx" "$mib")
    [ "$k" = none ] || configs+=("-ngl 99 --n-cpu-moe $k")
  fi
  echo "users $n (ctx $ctx) fitted at $(elapsed) s: ${configs[*]}"
  for r in $(seq 1 "$reps"); do
    for cfg in "${configs[@]}"; do
      tag="u${n}_llama_$(echo "$cfg" | tr -c 'a-zA-Z0-9' '_')_r$r"
      serve_and_load "$tag" "$n" "$peerbin/llama-server" -m "$file" -c "$ctx" -np "$n" -t 16 -fa -ub 1024 \
        --port PORT $cfg
      row "$n" llama-server "$cfg" "$r" $? "$logs/$tag.json"
    done
    tag="u${n}_shardwise_r$r"
    serve_and_load "$tag" "$n" "$bin" serve -m "$file" --device cuda --vram-budget "$budget" --parallel "$n" -c "$ctx" \
      -t 16 --profile "$profile" --port PORT
    row "$n" shardwise "--vram-budget $budget" "$r" $? "$logs/$tag.json"
  done
done
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$logs"
echo "done at $(elapsed) s"
