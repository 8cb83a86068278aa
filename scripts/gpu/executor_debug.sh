#!/usr/bin/env bash
# Runs on the GPU machine: reproduces runtime failures with every action traced (the last lines before
# an error show where it happened), with a backtrace when gdb is there, then re-measures nemo8b.
set -uo pipefail
out=${1:?usage: executor_debug.sh OUT}
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" "$out" && tar -C "$root" -xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
bin="$root/bin/shardwise"
cat "$root/REVISION"
trace() {  # name, args...
  local name=$1; shift
  echo "== $name"
  SHARDWISE_TRACE_ACTIONS=1 timeout 120 "$bin" run "$@" > "$out/$name.out" 2> "$out/$name.err"
  echo "rc=$?"; tail -4 "$out/$name.err"; head -c 300 "$out/$name.out"; echo
  if command -v gdb > /dev/null; then
    timeout 120 gdb -batch -ex run -ex bt --args "$bin" run "$@" > "$out/$name.gdb" 2>&1
    grep -A12 -E "SIGSEGV|SIGABRT|signal" "$out/$name.gdb" | head -20
  fi
}
trace llama_gpuonly --model tests/fixtures/hf/llama --tokens 1,2,3,4,5,6,7,8,9 -n 4 --greedy --ctx 48 --device cuda --vram-budget 2359296 --schedule gpu-only --json
trace tiny_moe --model "synthetic:tiny_moe?dtype=q4_0&seed=1" --tokens 1,2,3,4,5,6,7,8,9 -n 4 --greedy --ctx 48 --device cuda --vram-budget 64M --json
trace qwen30b_2l --model "synthetic:qwen30b?dtype=q4_0&seed=1&layers=2" --tokens 1,2,3,4,5,6,7,8,9 -n 4 --greedy --ctx 64 --device cuda --vram-budget 4G --json
echo "== nemo8b again (load-time upload, whole-prompt steps)"
QUICK_MODELS=nemo8b timeout 200 bash scripts/gpu/executor_bench.sh "$out" quick 2>&1
