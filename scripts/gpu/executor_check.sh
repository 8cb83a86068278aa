#!/usr/bin/env bash
# Runs on the GPU machine: the GPU suite (CUDA kernels against the CPU blocks, the CUDA device, the PCIe
# cap, every schedule through the runtime against the CPU reference), the kernel micro-benchmarks,
# then a quick pass of the executor benchmarks. Writes into OUT.
set -uo pipefail
out=${1:?usage: executor_check.sh OUT}
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" "$out" && tar -C "$root" -xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}" SHARDWISE_FIXTURES="$PWD/tests/fixtures" SHARDWISE_BIN="$root/bin/shardwise"
cat "$root/REVISION"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== GPU suite: kernels"
timeout 240 "$root/bin/test_gpu" "[kernels]" > "$out/test_gpu_kernels.log" 2>&1; echo "rc=$?"; tail -5 "$out/test_gpu_kernels.log"
grep -B2 -A8 "FAILED" "$out/test_gpu_kernels.log" | head -60
echo "== GPU suite: device, PCIe cap, runtime"
timeout 240 "$root/bin/test_gpu" "~[kernels]~[bench]" > "$out/test_gpu_runtime.log" 2>&1; echo "rc=$?"; tail -5 "$out/test_gpu_runtime.log"
grep -E "achieved|uncapped" "$out/test_gpu_runtime.log"
grep -B2 -A8 "FAILED" "$out/test_gpu_runtime.log" | head -60
echo "== kernel micro-benchmarks"
timeout 120 "$root/bin/test_gpu" "[bench]" -s > "$out/test_gpu_bench.log" 2>&1; echo "rc=$?"
grep -iE "GB/s|TFLOP|us |ms " "$out/test_gpu_bench.log" | head -40
echo "== executor quick benchmarks"
timeout 200 bash scripts/gpu/executor_bench.sh "$out" quick
