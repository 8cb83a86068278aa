#!/usr/bin/env bash
# GPU machine: the decode step of a whole model on the GPU with every tensor of one block type, for each
# type: the GEMV kernels' rates on real shapes (the step's bytes over its time, fixed costs included).
# One line per type in OUT/rates.txt: the file's bytes, prefill ms for the prompt, the median decode
# step, and the bytes the run uploaded (the weights read per step).
#   kquant_rates.sh OUT [MODEL] [TYPES...]    defaults: nemo8b; q4_0 q4_K q6_K q5_K q3_K q2_K q8_0
# Env: BUNDLE, PROMPT (a prompt file; default .carry/peers/p1k.txt).
set -uo pipefail
out=${1:?usage: kquant_rates.sh OUT [MODEL] [TYPES...]}
model=${2:-nemo8b}
shift $(( $# > 1 ? 2 : 1 ))
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_0 q4_K q6_K q5_K q3_K q2_K q8_0)
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
for t in "${types[@]}"; do
  file=/tmp/shardwise-rates.gguf
  "$bin" synth --spec "$model" --dtype "$t" --pure --seed 1 -o "$file" > /dev/null 2>&1 || { echo "== $t synth failed" >> "$out/rates.txt"; continue; }
  echo "== $t $(stat -c %s "$file")" >> "$out/rates.txt"
  timeout 60 "$bin" run -m "$file" --device cuda -f "${PROMPT:-.carry/peers/p1k.txt}" -n 33 --temp 0 --json 2>/dev/null |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
d = sorted(s['ms'] for s in j['steps'] if s['tokens'] == 1)
print('prefill_ms', round(j['prefill_ms'], 1), 'decode_median_ms', round(d[len(d) // 2], 3), 'uploaded', j['uploaded_bytes'])" \
    >> "$out/rates.txt" 2>&1
  rm -f "$file"
done
cat "$out/rates.txt"
