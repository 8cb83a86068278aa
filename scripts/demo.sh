#!/usr/bin/env bash
# `make demo`: installs the Debian packages that are missing, builds the shardwise binary alone (no tests,
# benchmarks or Python; CUDA only where a GPU is), synthesises a ~0.4B-parameter llama-shaped model
# (builtin spec small_llama, seeded, q8_0) as GGUF, generates on the CPU, runs the plan runtime under a
# VRAM budget (the GPU, or the emulated device), explores schedules on the paper's machines and plans from
# this machine's quick profile. One line per step with its time; each step's output goes to
# BUILD/demo/*.log, and the results worth reading are shown below their step.
# usage: demo.sh BUILD_DIR [JOBS]
set -euo pipefail
build=${1:-build-demo}
jobs=${2:-$(nproc)}
cd "$(dirname "$0")/.."
out="$build/demo"
mkdir -p "$out"
bin="$build/cli/shardwise"
model="$out/small_llama.q8_0.gguf"
prompt="The quick brown fox"
has_gpu=0
command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1 && has_gpu=1
t_all=$(date +%s)
steps=8
step_no=0

# step NAME LOG COMMAND...: runs COMMAND with its output in LOG and prints "[k/n] NAME ... N s"; on
# failure, the log's last 30 lines and the exit status.
step() {
  local name=$1 log=$2; shift 2
  local t0
  t0=$(date +%s)
  step_no=$((step_no + 1))
  printf '[%d/%d] %s ... ' "$step_no" "$steps" "$name"
  if ! "$@" > "$log" 2>&1; then
    echo "failed after $(( $(date +%s) - t0 )) s (log: $log)"
    tail -30 "$log"
    exit 1
  fi
  echo "$(( $(date +%s) - t0 )) s"
}

# show LOG: a step's output, indented under its line (blank lines dropped).
show() {
  sed -e '/^[[:space:]]*$/d' -e 's/^/      /' "$1"
  echo
}

step "Debian packages (scripts/install_deps.sh)" "$out/deps.log" ./scripts/install_deps.sh

cuda=OFF
[ $has_gpu -eq 1 ] && cuda=AUTO
step "configure $build/ (CUDA $([ $cuda = OFF ] && echo "off: no GPU here" || echo "for this GPU"))" "$out/configure.log" \
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_CUDA=$cuda -DSHARDWISE_TESTS=OFF -DSHARDWISE_BENCH=OFF \
  -DSHARDWISE_PYTHON=OFF
step "build the shardwise binary ($jobs jobs; minutes the first time)" "$out/build.log" \
  cmake --build "$build" -j "$jobs" --target shardwise

synthesise() {
  [ -f "$model" ] || "$bin" synth --spec small_llama --dtype q8_0 --seed 1 -o "$model" || return 1
  "$bin" info "$model" | sed '/^by kind:/,$d'  # the shape and sizes; not the bytes per tensor kind
}
step "synthesise small_llama (q8_0, seed 1) as GGUF$([ -f "$model" ] && echo ": there from an earlier demo")" \
  "$out/synth.log" synthesise
show "$out/synth.log"

step "generate 48 tokens on the CPU (random weights: random text)" "$out/run_cpu.log" \
  "$bin" run --model "$model" --prompt "$prompt" -n 48 --greedy
show "$out/run_cpu.log"

if [ $has_gpu -eq 1 ]; then
  step "the plan runtime on the GPU under a 256 MiB VRAM budget" "$out/run_budget.log" \
    "$bin" run --model "$model" --prompt "$prompt" -n 48 --greedy --device cuda --vram-budget 256M
else
  step "the plan runtime on the emulated device (no GPU) under a 256 MiB budget" "$out/run_budget.log" \
    "$bin" run --model "$model" --prompt "$prompt" -n 16 --greedy --device emu --vram-budget 256M
  echo "      (the emulated device checks plans, copies and memory as a GPU would; its timings are not GPU numbers)"
fi
show "$out/run_budget.log"

plan_budgets() {
  for b in 2G 4G 8G; do "$bin" plan --model qwen30b --hw cli3 --vram-budget "$b" --ctx 1024 --brief || return 1; done
}
step "plan qwen30b on the paper's cli3 (RTX 5090, 16 cores) at 2G/4G/8G, 1K context" "$out/plan_cli3.log" plan_budgets
show "$out/plan_cli3.log"

profile="$out/this_machine.profile.json"
if [ $has_gpu -eq 1 ]; then
  profile_and_plan() {
    "$bin" profile --quick --out "$profile" --no-progress &&
      "$bin" plan --model qwen30b --profile "$profile" --vram-budget 4G --ctx 4096 --brief
  }
  step "measure this machine (profile --quick), then plan qwen30b from it" "$out/profile.log" profile_and_plan
else
  profile_and_plan() {
    "$bin" profile --quick --device cpu --out "$profile" --no-progress &&
      "$bin" plan --model qwen30b --profile "$profile" --hw cli3 --vram-budget 4G --ctx 4096 --brief
  }
  step "measure this CPU (profile --quick), then plan qwen30b from it (GPU side: cli3's datasheet)" \
    "$out/profile.log" profile_and_plan
fi
grep -F "qwen30b" "$out/profile.log" | sed 's/^/      /'
echo

echo "demo done in $(( $(date +%s) - t_all )) s (logs: $out/). The binary is $bin; try:"
echo "  $bin run --model $model --prompt \"Once upon a time\" -n 64"
echo "  $bin plan --model nemo8b --hw cli2 --vram-budget 4G --ctx 4096 --explain"
echo "  $bin run --help"
echo "(\`make\` builds everything else: the tests, the Python package in build/python; README.md, Quick start)"
