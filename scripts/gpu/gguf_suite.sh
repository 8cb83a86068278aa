#!/usr/bin/env bash
# GPU machine: `run` on GGUF files through the CUDA path, as a user runs it. Writes the model files
# with the peers' gen_models.py (PEERS=folder with gen_models.py, gguf-py/, p1k.txt, p4k.txt; nemo8b
# f16, qwen30b q4_0 with a q4_0 output), then for each model and cell (context:budget; 1K runs p1k.txt,
# 4K p4k.txt) runs every schedule with N generated tokens under a time limit and checks the tokens
# against the CPU path's on the same prompt. Any mismatch, error or timeout fails the suite (exit 1),
# loudly; a forced schedule with no feasible plan at a budget is skipped and listed.
# usage: gguf_suite.sh OUT [MODELS] [CELLS]   e.g. gguf_suite.sh OUT "nemo8b qwen30b" "1024:2G 1024:4G 4096:4G"
# Env: N (tokens, 8), LIMIT_S (per run, 180), WORK (model files, /tmp/gguf), BUNDLE (scripts/gpu/bundle_env.sh).
# The default cells take ~15 min on the H200 host: give fewer cells per 10-minute device call.
set -uo pipefail
out=${1:?usage: gguf_suite.sh OUT [MODELS] [CELLS]}
models=${2:-nemo8b qwen30b}
cells=${3:-1024:2G 1024:4G 1024:8G 4096:2G 4096:4G 4096:8G}
source "$(dirname "$0")/bundle_env.sh"
peers=${PEERS:?PEERS=folder with gen_models.py, gguf-py, p1k.txt, p4k.txt}
n=${N:-8}
limit=${LIMIT_S:-180}
work=${WORK:-/tmp/gguf}
dir="$out/gguf_suite"
mkdir -p "$work" "$dir"
cat "$(dirname "$bin")/../REVISION" > "$dir/REVISION" 2>/dev/null
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r; } > "$dir/machine.txt"
threads=16
fails=0

model_file() {  # writes the model once per machine
  local f="$work/$1.gguf"
  if [ ! -s "$f" ]; then
    OUT_Q4_0=1 GGUF_PY="$peers/gguf-py" python3 "$peers/gen_models.py" "$1" "$f" >&2 || { echo "cannot write $f" >&2; return 1; }
  fi
  echo "$f"
}

# run NAME ARGS...: one `run --json` under the time limit; a non-zero exit or a timeout is a failure.
run() {
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout -k 5 "$limit" "$bin" run "$@" --json > "$dir/$name.json" 2> "$dir/$name.err"
  local rc=$?
  local wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $rc -ne 0 ] && grep -q "has no feasible plan" "$dir/$name.err"; then
    echo "skip $name: $(tail -c 200 "$dir/$name.err")"
    rm -f "$dir/$name.json"
  elif [ $rc -ne 0 ]; then
    fails=$((fails + 1))
    [ $rc -eq 124 ] && echo "FAIL $name: no result within $limit s" || echo "FAIL $name: exit $rc: $(tail -c 300 "$dir/$name.err")"
  fi
  echo "$name rc=$rc wall_ms=$wall" >> "$dir/walls.txt"
}

for m in $models; do
  f=$(model_file "$m") || { fails=$((fails + 1)); continue; }
  scheds="auto gpu-only static dynamic layer-split"
  [ "$m" = qwen30b ] && scheds="$scheds cpu-moe"
  for cell in $cells; do
    ctx=${cell%%:*} b=${cell##*:}
    prompt="$peers/p1k.txt"; [ "$ctx" -ge 4096 ] && prompt="$peers/p4k.txt"
    common=(--model "$f" --prompt "$(cat "$prompt")" -n "$n" --greedy --ignore-eos --threads $threads --ctx "$ctx")
    [ -s "$dir/${m}_${ctx}_cpu.json" ] || run "${m}_${ctx}_cpu" "${common[@]}" --device cpu
    for s in $scheds; do
      run "${m}_${ctx}_${b}_${s}" "${common[@]}" --device cuda --vram-budget "$b" --schedule "$s" --profile "$profile"
    done
  done
done
python3 scripts/analysis/compare_runs.py "$dir" | tee "$dir/summary.txt"
cmp_rc=${PIPESTATUS[0]}
tar -C "$out" -czf "$out/gguf_suite.tgz" gguf_suite
echo "gguf suite: $fails failed runs; token check exit $cmp_rc"
[ $fails -eq 0 ] && [ $cmp_rc -eq 0 ]
