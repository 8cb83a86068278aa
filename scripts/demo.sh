#!/usr/bin/env bash
# `make demo`: builds the shardwise binary alone (CUDA only where a GPU is), synthesises a ~0.4B-parameter
# llama-shaped model (builtin spec small_llama, seeded, q8_0) as GGUF, generates on the CPU, runs the plan
# runtime under a VRAM budget (the GPU, or the emulated device), explores schedules on the paper's
# machines and plans from this machine's quick profile. One line per phase with its time; the details
# of each phase are in BUILD/demo/*.log.
# usage: demo.sh BUILD_DIR [JOBS]
set -euo pipefail
build=${1:-build-demo}
jobs=${2:-$(nproc)}
cd "$(dirname "$0")/.."
out="$build/demo"
mkdir -p "$out"
bin="$build/cli/shardwise"
model="$out/small_llama.q8_0.gguf"
has_gpu=0
command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1 && has_gpu=1
t_all=$(date +%s)

# phase NAME LOG COMMAND...: runs COMMAND with its output in LOG, then one line with the time taken.
phase() {
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  printf '%-58s' "$name ..."
  if ! "$@" > "$log" 2>&1; then
    echo " failed (log: $log)"
    tail -20 "$log"
    exit 1
  fi
  echo " $(( $(date +%s) - t0 )) s"
}

cuda=OFF; [ $has_gpu -eq 1 ] && cuda=AUTO
phase "configure ($build, CUDA $cuda)" "$out/configure.log" \
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=$cuda -DSHARDWISE_TESTS=OFF -DSHARDWISE_BENCH=OFF -DSHARDWISE_PYTHON=OFF
phase "build the shardwise binary ($jobs jobs; minutes the first time)" "$out/build.log" cmake --build "$build" -j "$jobs" --target shardwise
[ -f "$model" ] || phase "synthesise small_llama (q8_0, seed 1) as GGUF" "$out/synth.log" \
  "$bin" synth --spec small_llama --dtype q8_0 --seed 1 -o "$model"
echo
"$bin" info "$model"
echo
echo "== generate on the CPU (greedy, 48 tokens; random weights, so the text is random too)"
"$bin" run --model "$model" --prompt "The quick brown fox" -n 48 --greedy
echo
if [ $has_gpu -eq 1 ]; then
  echo "== the plan runtime on the GPU, under a 256 MiB VRAM budget"
  "$bin" run --model "$model" --prompt "The quick brown fox" -n 48 --greedy --device cuda --vram-budget 256M
else
  echo "== no GPU here: the plan runtime on the emulated device, under a 256 MiB budget"
  echo "   (it checks plans, copies and memory like a GPU would; its timings are not GPU numbers)"
  "$bin" run --model "$model" --prompt "The quick brown fox" -n 16 --greedy --device emu --vram-budget 256M
fi
echo
echo "== schedule explorer: qwen30b on the paper's cli3 (RTX 5090, 16 cores), 1K context, per budget"
for b in 2G 4G 8G; do "$bin" plan --model qwen30b --hw cli3 --vram-budget "$b" --ctx 1024 --brief; done
echo
profile="$out/this_machine.profile.json"
if [ $has_gpu -eq 1 ]; then
  phase "measure this machine (shardwise profile --quick)" "$out/profile.log" \
    "$bin" profile --quick --out "$profile" --no-progress
  "$bin" plan --model qwen30b --profile "$profile" --vram-budget 4G --ctx 4096 --brief
else
  phase "measure this machine's CPU (shardwise profile --quick)" "$out/profile.log" \
    "$bin" profile --quick --device cpu --out "$profile" --no-progress
  echo "== qwen30b planned from that profile (the GPU side from the cli3 datasheet)"
  "$bin" plan --model qwen30b --profile "$profile" --hw cli3 --vram-budget 4G --ctx 4096 --brief
fi
echo
echo "demo done in $(( $(date +%s) - t_all )) s. The binary is $bin; try:"
echo "  $bin run --model $model --prompt \"Once upon a time\" -n 64"
echo "  $bin plan --model nemo8b --hw cli2 --vram-budget 4G --ctx 4096 --explain"
echo "  $bin run --help"
