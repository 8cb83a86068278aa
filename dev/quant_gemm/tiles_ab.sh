#!/usr/bin/env bash
# GPU machine: the quantised prefill GEMM's tile against the previous one, on one lease. The bundle under
# test (BUNDLE: shardwise and test_gpu) first passes the GPU suite's kernel and K-quant cases; then each
# cell's prompt (960 random ids) runs through every binary in turn (forward, then backward, ...), in-memory
# synthetic weights of one block type with the same seed, 8 greedy tokens. One line per run in
# OUT/runs.tsv (cell, side, round, prefill ms, decode tokens/s, the greedy ids); the ids of the two sides
# must agree.
#   dev/quant_gemm/tiles_ab.sh OUT [ROUNDS]
# Env: BUNDLE, OTHERS ("NAME=FILE.xz ...": the binaries compared with the bundle's, xz), DEADLINE_S, CELLS
set -uo pipefail
out=${1:?usage: tiles_ab.sh OUT [ROUNDS]}
rounds=${2:-2}
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
source "$(dirname "$0")/../../scripts/gpu/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
sides=()
declare -A exe
for o in ${OTHERS:?OTHERS: NAME=FILE.xz of the binaries to compare}; do
  name=${o%%=*}
  exe[$name]=/tmp/shardwise-$name
  xz -dc "${o#*=}" > "${exe[$name]}" && chmod +x "${exe[$name]}"
  sides+=("$name")
done
exe[new]=$bin
sides+=(new)
"$bindir/test_gpu" "[kernels],[kquants]" > "$out/test_gpu.log" 2>&1
tail -3 "$out/test_gpu.log"
grep -q "All tests passed" "$out/test_gpu.log" || { echo "GPU suite failed: no timing"; exit 1; }
ids=$(python3 scripts/analysis/random_tokens.py 960 960 32000)
cells=${CELLS:-"nemo8b:q4_K:40G nemo8b:q6_K:40G nemo8b:q4_0:40G qwen30b:q4_0:40G qwen30b:q4_K:40G nemo8b:q4_K:4G"}
printf 'cell\tside\tround\tprefill_ms\tdecode_tps\tids\n' > "$out/runs.tsv"
one() {  # one CELL SIDE ROUND BINARY
  IFS=: read -r model dtype budget <<< "$1"
  timeout 120 "$4" run --model "synthetic:$model?dtype=$dtype&seed=1" --tokens "$ids" -n 8 --greedy --threads 16 \
    --ctx 1024 --device cuda --vram-budget "$budget" --profile "$profile" --json 2> "$out/err_$2.txt" |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
print('$1', '$2', $3, round(j['prefill_ms'], 1), round(j.get('decode_tokens_per_s', 0), 1),
      ','.join(map(str, j['generated_ids'])), sep='\t')" >> "$out/runs.tsv" || echo "$1 $2 $3: failed" | tee -a "$out/failed.txt"
}
for r in $(seq 1 "$rounds"); do
  for cell in $cells; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "deadline: stopped before round $r, $cell"; break 2; }
    order=("${sides[@]}")
    [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "${sides[@]}" | tac))
    for side in "${order[@]}"; do one "$cell" "$side" "$r" "${exe[$side]}"; done
  done
done
cut -f1-5 "$out/runs.tsv"
