#!/usr/bin/env bash
# `make demo`: the main job on an embedded default. Synthesises a ~0.4B-parameter llama-shaped model
# (builtin spec small_llama, seeded, q8_0), writes it as GGUF, shows its shape and runs real
# generation on the CPU with every core, printing TTFT and tokens/s; then the plan runtime under a
# VRAM budget (GPU, or the emulated device), the schedule explorer, and a plan from this machine's
# quick profile.
set -euo pipefail
build=${1:-build}
bin="$build/cli/shardwise"
out="$build/demo"
mkdir -p "$out"
model="$out/small_llama.q8_0.gguf"
echo "== shardwise demo: synthesise, inspect, generate on the CPU =="
if [ ! -f "$model" ]; then
  "$bin" synth --spec small_llama --dtype q8_0 --seed 1 -o "$model"
fi
"$bin" info "$model"
echo
echo "== generation (greedy, 48 tokens; the weights are random, so the text is too) =="
"$bin" run --model "$model" --prompt "The quick brown fox" -n 48 --greedy
echo
echo "== the same as JSON (what the oracle and scripts read) =="
"$bin" run --model "$model" --prompt "The quick brown fox" -n 16 --greedy --json
echo
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
  echo "== the same model through the plan runtime on the GPU, under a 256 MiB VRAM budget =="
  "$bin" run --model "$model" --prompt "The quick brown fox" -n 48 --greedy --device cuda --vram-budget 256M
else
  echo "== no GPU here: the plan runtime on the emulated device, under a 256 MiB budget =="
  echo "   (the emulated device checks plans, copies and memory; its timings are not GPU numbers)"
  "$bin" run --model "$model" --prompt "The quick brown fox" -n 16 --greedy --device emu --vram-budget 256M
fi
echo
echo "== schedule explorer: predicted decode speed and time to first token (1K prompt) on the paper's machines =="
for m in qwen30b nemo8b; do
  for hw in cli1 cli2 cli3; do
    for b in 2G 4G 8G; do "$bin" plan --model "$m" --hw "$hw" --vram-budget "$b" --ctx 1024 --brief; done
  done
done
echo
echo "== one plan table in full: qwen30b on cli3 with a 4G budget, 4K context =="
"$bin" plan --model qwen30b --hw cli3 --vram-budget 4G --ctx 4096
echo
profile="$out/this_machine.profile.json"
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
  echo "== this machine measured (shardwise profile --quick), then qwen30b planned from the measurements =="
  "$bin" profile --quick --out "$profile" --no-progress
  "$bin" plan --model qwen30b --profile "$profile" --vram-budget 4G --ctx 4096 --brief
else
  echo "== this machine's CPU measured (shardwise profile --quick), GPU side from the cli3 datasheet =="
  "$bin" profile --quick --device cpu --out "$profile" --no-progress
  "$bin" plan --model qwen30b --profile "$profile" --hw cli3 --vram-budget 4G --ctx 4096 --brief
fi
