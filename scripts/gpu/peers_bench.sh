#!/usr/bin/env bash
# GPU machine: shardwise against the peers a user would run instead, on one lease, on the very same GGUF
# file (written by `shardwise synth`: realistic routing, one token per character, so llama.cpp and shardwise
# read the same weights and the same p1k/p4k.txt prompt tokens), interleaved (A B C D A B C D ...):
#   llama.cpp b6097 -ngl N               the largest N whose CUDA buffers (model + KV + compute, its log) fit
#   llama.cpp -ngl 99 --n-cpu-moe N      MoE: the smallest N that fits (the strongest hand-tuned offload)
#   artifact -pipe-shard -mva B          the paper's implementation with its two profiles (peer_profiles.sh)
#   shardwise run --vram-budget B        auto (the planner's choice)
# 16 threads, flash attention on, 64 generated tokens, greedy. A cell is CTX:BUDGET (1024:4G) or `full`
# (the whole model on the GPU). One line per run in OUT/peer_runs.tsv, logs in OUT/logs.tgz, the host
# check (DRAM read, PCIe) in OUT/machine_check.json; scripts/analysis/peers_table.py makes the table.
# usage: peers_bench.sh OUT MODEL CELLS...     MODEL: nemo8b (f16) or qwen30b (q4_0), or either at MIX
# Env: PEERS (.carry/peers: peers_bin.tar.xz, p1k.txt, p4k.txt), PROFILES (the artifact's kept
# concurrent_results.txt; gpu_results.txt too, else gpu_profiler runs here first, unless GPU_PROFILER=skip:
# the artifact then plans from its CPU profile only), REPEATS (3),
# DEADLINE_S (no new cell starts after this many seconds; 480), BUNDLE, MIX (the file's quantisation mix).
set -uo pipefail
out=${1:?usage: peers_bench.sh OUT MODEL CELLS...}
model=${2:?usage: peers_bench.sh OUT MODEL CELLS...}
shift 2
cells=("$@")
t_start=$(date +%s)
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/peer_env.sh"
reps=${REPEATS:-3}
deadline=${DEADLINE_S:-480}
work=/tmp/shardwise-peers-work
logs="$out/logs"
mkdir -p "$work" "$logs"
tsv="$out/peer_runs.tsv"
[ -s "$tsv" ] || printf "model\tcell\tsystem\tconfig\trepeat\trc\tprompt_tokens\tttft_ms\tdecode_tps\tcuda_mib\n" > "$tsv"
machine_facts "$out/machine.txt"
# The lease's host rates: the committed profile's rows measured again, or, where the profile describes
# another machine (the check refuses it), a quick profile of this one (DRAM read, pinned H2D).
"$bin" profile --check "$profile" > "$out/machine_check.json" 2> "$out/machine_check.txt" ||
  "$bin" profile --quick --device cuda --threads 1,16 --out "$out/host_profile.json" > /dev/null 2>> "$out/machine_check.txt"
elapsed() { echo $(( $(date +%s) - t_start )); }

# The artifact's profiles: kept ones where carried, else measured here.
prof="$work/profiles"
mkdir -p "$prof"
cp -f "${PROFILES:-results/peers/profiles}"/*_results.txt "$prof/" 2>/dev/null
if [ ! -s "$prof/gpu_results.txt" ] && [ "${GPU_PROFILER:-run}" != skip ]; then
  scripts/gpu/peer_profiles.sh "$out/profiles" gpu 300 > /dev/null
  cp -f "$out/profiles/gpu_results.txt" "$prof/" 2>/dev/null
fi
echo "artifact profiles: $(ls "$prof" | tr '\n' ' ') at $(elapsed) s"

# MIX (a llama-quantize mix, e.g. q4_K_M) writes that mix; without it nemo8b is f16 and qwen30b q4_0 throughout.
if [ -n "${MIX:-}" ]; then dtype=$MIX; pure=""; else dtype=q4_0; [ "$model" = nemo8b ] && dtype=f16; pure=--pure; fi
file="$work/$model.$dtype.gguf"
label=$model  # the model column of the runs
[ -n "${MIX:-}" ] && label="$model $dtype"
[ -s "$file" ] || "$bin" synth --spec "$model" --dtype "$dtype" $pure --seed 1 -o "$file" 2> "$logs/synth.err" ||
  { echo "synth failed: $(tail -1 "$logs/synth.err")"; exit 2; }
sync
echo "model file $file: $(du -h "$file" | cut -f1) at $(elapsed) s"

source "$(dirname "$0")/peer_fit.sh"
record() {  # CELL SYSTEM CONFIG REPEAT RC LOG: one TSV line from a llama-cli log
  local log=$6
  local pt=$(grep -oP "prompt eval time\s*=\s*[\d.]+ ms /\s*\K\d+" "$log" | tail -1)
  local pe=$(grep -oP "prompt eval time\s*=\s*\K[\d.]+" "$log" | tail -1)
  local tps=$(grep "eval time" "$log" | grep -v prompt | grep -oP "[\d.]+(?= tokens per second)" | tail -1)
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$label" "$1" "$2" "$3" "$4" "$5" "${pt:-}" "${pe:-}" "${tps:-}" \
    "$(cuda_mib "$log")" >> "$tsv"
  echo "$1 $2 $3 r$4: rc $5, ${pt:-?} prompt tokens, TTFT ${pe:-?} ms, ${tps:-?} tokens/s"
}

for cell in "${cells[@]}"; do
  [ "$(elapsed)" -lt "$deadline" ] || { echo "deadline: $cell not started"; continue; }
  if [ "$cell" = full ]; then ctx=1024 budget=full; else ctx=${cell%%:*} budget=${cell#*:}; fi
  pf="$PWD/${PEERS:-.carry/peers}/p$((ctx / 1024))k.txt"
  prompt=$(cat "$pf")
  systems=()
  if [ "$budget" = full ]; then
    systems=("llama|-ngl $((layers + 1))|" "shardwise||")
  else
    mib=$(python3 -c "import sys; s=sys.argv[1]; print(int(float(s[:-1]) * {'G': 1024, 'M': 1}[s[-1]]))" "$budget")
    ngl=$(fit_ngl "$ctx" "$mib")
    systems=("llama|-ngl $ngl|")
    if [ "$model" != nemo8b ]; then
      n=$(fit_ncmoe "$ctx" "$mib")
      [ "$n" = none ] || systems+=("llama|-ngl 99 --n-cpu-moe $n|")
    fi
    systems+=("artifact|-pipe-shard -mva $mib --cpu-profile $prof/concurrent_results.txt --gpu-profile $prof/gpu_results.txt|GGML_CUDA_PIPELINE_SHARDING=1 GGML_CUDA_REGISTER_HOST=1")
    systems+=("shardwise|--vram-budget ${mib}M|")
    echo "$cell fitted at $(elapsed) s: ${systems[*]}"
  fi
  for r in $(seq 1 "$reps"); do
    for s in "${systems[@]}"; do
      IFS='|' read -r sys cfg envs <<< "$s"
      tag="${cell//:/_}_${sys}_$(echo "$cfg" | awk '{print $1 $2 $3 $4}' | tr -c 'a-zA-Z0-9' '_')_r$r"
      if [ "$sys" = shardwise ]; then
        budget_args=($cfg)
        timeout -k 5 240 "$bin" run --model "$file" --prompt "$prompt" -n 64 --greedy --ignore-eos --threads 16 \
          --ctx "$ctx" --device cuda "${budget_args[@]}" --profile "$profile" --json > "$logs/$tag.json" 2> "$logs/$tag.err"
        rc=$?
        python3 - "$logs/$tag.json" "$label" "$cell" "${cfg:-whole}" "$r" "$rc" >> "$tsv" <<'PY'
import json, sys
path, model, cell, cfg, r, rc = sys.argv[1:]
try:
    j = json.load(open(path))
    row = [j["n_prompt_tokens"], j["ttft_ms"], j["decode_tokens_per_s"], ""]
except Exception:
    row = ["", "", "", ""]
print("\t".join(str(x) for x in [model, cell, "shardwise", cfg, r, rc] + row))
PY
        echo "$cell shardwise ${cfg:-whole} r$r: rc $rc, $(tail -1 "$tsv" | cut -f7-9 | tr '\t' ' ')"
      else
        llama "$logs/$tag.log" "$ctx" "$pf" 64 "$envs" $cfg
        rc=$?
        record "$cell" "$sys" "$(echo "$cfg" | sed 's/ --cpu-profile.*//')" "$r" $rc "$logs/$tag.log"
      fi
    done
  done
done
python3 scripts/analysis/peers_table.py "$out" | tee "$out/table.md"
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$logs"
echo "done at $(elapsed) s"
