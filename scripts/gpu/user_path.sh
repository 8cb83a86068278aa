#!/usr/bin/env bash
# GPU machine: the user's main path, measured. (1) `run` on the peers' GGUF files (nemo8b f16, qwen30b
# q4_0 with a q4_0 output; gen_models.py from PEERS) with the 960-token p1k.txt prompt, 64 tokens, a
# 4096M budget, on CUDA and on the CPU path (tokens must match); (2) a GGUF written by `synth` against
# the in-memory `synthetic:` source of the same spec and seed (the same weights), REPEATS interleaved
# runs each: TTFT, tokens/s and load time side by side (the file should run within 10% of memory).
# usage: user_path.sh OUT [MODELS]     Env: PEERS (required), REPEATS (3), WORK (/tmp/gguf), BUNDLE,
# PARTS ("files synth": which of (1) and (2) to run).
set -uo pipefail
out=${1:?usage: user_path.sh OUT [MODELS]}
models=${2:-qwen30b nemo8b}
source "$(dirname "$0")/bundle_env.sh"
peers=${PEERS:?PEERS=folder with gen_models.py, gguf-py, p1k.txt}
reps=${REPEATS:-3}
work=${WORK:-/tmp/gguf}
dir="$out/user_path"
mkdir -p "$work" "$dir"
cat "$(dirname "$bin")/../REVISION" > "$dir/REVISION" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$dir/machine.txt"; uname -r >> "$dir/machine.txt"
fails=0
run() {  # run NAME LIMIT_S ARGS...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s%N)
  timeout -k 5 "$limit" "$bin" run "$@" --json > "$dir/$name.json" 2> "$dir/$name.err"
  local rc=$?
  echo "$name rc=$rc wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a "$dir/walls.txt"
  [ $rc -eq 0 ] || { fails=$((fails + 1)); tail -c 400 "$dir/$name.err"; }
}
parts=${PARTS:-files synth}
[[ " $parts " == *" files "* ]] && echo "== (1) the issue's command on the peers' files, CUDA and CPU"
for m in $models; do
  [[ " $parts " == *" files "* ]] || break
  f="$work/$m.gguf"
  [ -s "$f" ] || OUT_Q4_0=1 GGUF_PY="$peers/gguf-py" python3 "$peers/gen_models.py" "$m" "$f"
  args=(--model "$f" --prompt "$(cat "$peers/p1k.txt")" -n 64 --greedy --ignore-eos --threads 16 --ctx 1024)
  SHARDWISE_LOG=debug run "${m}_1024_4G_auto" 300 "${args[@]}" --device cuda --vram-budget 4096M --profile "$profile"
  run "${m}_1024_cpu" 300 "${args[@]}" --device cpu
done
[[ " $parts " == *" synth "* ]] && echo "== (2) synth's GGUF against synthetic: (same spec and seed), interleaved"
toks=$(python3 scripts/analysis/random_tokens.py 960 1 32000)
for m in $models; do
  [[ " $parts " == *" synth "* ]] || break
  dt=q4_0; [ "$m" = nemo8b ] && dt=f16
  f="$work/${m}_synth_${dt}.gguf"
  [ -s "$f" ] || "$bin" synth --spec "$m" --dtype $dt --pure --seed 1 -o "$f" 2> "$dir/${m}_synth.err"
  sync  # the file's writeback would otherwise compete with the first runs for the CPU and DRAM
  for r in $(seq 1 "$reps"); do
    order="file memory"; [ $((r % 2)) -eq 0 ] && order="memory file"
    for src in $order; do
      model="$f"; [ $src = memory ] && model="synthetic:$m?dtype=$dt&seed=1"
      run "${m}_synth_${src}_r$r" 300 --model "$model" --tokens "$toks" -n 64 --greedy --threads 16 --ctx 1024 \
        --device cuda --vram-budget 4096M --profile "$profile"
    done
  done
done
python3 scripts/analysis/user_path_summary.py "$dir" | tee "$dir/summary.txt"
tar -C "$out" -czf "$out/user_path.tgz" user_path
echo "user path: $fails failed runs"
[ $fails -eq 0 ]
