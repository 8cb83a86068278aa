#!/usr/bin/env bash
# GPU machine: the CUDA kernels measured. (1) the kernel benchmarks of the GPU suite (test_gpu [bench]:
# GEMV rates per dtype, decode attention per context, each checked before it is timed); (2) where a step's
# GPU time goes, kernel by kernel, under Nsight Compute: plan runs chosen with `run --profiler-runs A:B`
# (kernels serialised, so no overlap) of qwen30b's 512-token GPU-only step and nemo8b's whole-model decode.
# One archive back: OUT/kprof.tgz with NAME.kernels.csv per run (scripts/analysis/kernel_summary.py).
#   kernels.sh OUT [bench|ncu|all]
set -uo pipefail
out=${1:?usage: kernels.sh OUT [bench|ncu|all]}
part=${2:-all}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out/kprof"
machine_facts "$out/machine.txt"
if [ "$part" != ncu ]; then
  echo "== kernel benchmarks"
  SHARDWISE_FIXTURES="$PWD/tests/fixtures" timeout 240 "$bindir/test_gpu" "[bench]" -s > "$out/kernel_bench.log" 2>&1
  echo "rc=$?"; grep -iE "GB/s|TFLOP|us |ms " "$out/kernel_bench.log" | head -40
fi
[ "$part" = bench ] && exit 0
ncu=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 2; }
kern() {  # name run-args... (plan runs chosen with --profiler-runs inside them)
  local name=$1; shift
  timeout 240 "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv --cache-control none \
    --clock-control none "$bin" run "$@" > "$out/kprof/$name.csv" 2> "$out/kprof/$name.err"
  echo "$name rc=$? $(grep -c gpu__time_duration "$out/kprof/$name.csv") kernels"
  python3 scripts/analysis/ncu_kernels.py "$out/kprof/$name.csv" "$out/kprof/$name.kernels.csv" && rm -f "$out/kprof/$name.csv"
}
p1024=$(python3 scripts/analysis/random_tokens.py 1024 1024 32000)
p960=$(python3 scripts/analysis/random_tokens.py 960 960 32000)
echo "== kernels under Nsight Compute"
kern qwen30b_step512 --model "synthetic:qwen30b?dtype=q4_0&seed=1" --threads 16 --vram-budget 4G --ctx 4096 --profile "$profile" \
  --device cuda --schedule gpu-only --batch 512 --tokens "$p1024" -n 2 --greedy --json --profiler-runs 1:2
kern nemo8b_decode --model "synthetic:nemo8b?dtype=f16&seed=1" --threads 16 --device cuda --vram-budget 40G --ctx 1024 \
  --no-cuda-graphs --tokens "$p960" -n 6 --greedy --profile "$profile" --json --profiler-runs 3:5
tar -C "$out" -czf "$out/kprof.tgz" kprof && rm -rf "$out/kprof"
