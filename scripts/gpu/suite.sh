#!/usr/bin/env bash
# GPU machine: the GPU test suite (CUDA kernels against the CPU reference, the CUDA device, the PCIe cap,
# every schedule through the runtime against the CPU path), then the user's path on GGUF files
# (gguf_suite.sh, one cell per model unless CELLS is given). Exit 1 when any part fails.
# Needs the bundle with test_gpu (bundle.sh packs it by default) and, for the GGUF part, PEERS.
#   suite.sh OUT [tests|gguf|all]      Env: CELLS (gguf_suite.sh's, default "1024:4G"), BUNDLE, PEERS.
set -uo pipefail
out=${1:?usage: suite.sh OUT [tests|gguf|all]}
part=${2:-all}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
cat "$out/machine.txt"
export SHARDWISE_FIXTURES="$PWD/tests/fixtures" SHARDWISE_BIN="$bin"
rc=0
if [ "$part" != gguf ]; then
  echo "== GPU suite: kernels"
  timeout 300 "$bindir/test_gpu" "[kernels]" > "$out/test_gpu_kernels.log" 2>&1 || rc=1
  tail -3 "$out/test_gpu_kernels.log"; grep -B2 -A8 "FAILED" "$out/test_gpu_kernels.log" | head -60
  echo "== GPU suite: device, PCIe cap, runtime"
  timeout 300 "$bindir/test_gpu" "~[kernels]~[bench]" > "$out/test_gpu_runtime.log" 2>&1 || rc=1
  tail -3 "$out/test_gpu_runtime.log"; grep -B2 -A8 "FAILED" "$out/test_gpu_runtime.log" | head -60
fi
if [ "$part" != tests ]; then
  echo "== GGUF files through every schedule"
  BUNDLE=${BUNDLE:-build-gpu/bundle.tar.xz} bash "$(dirname "$0")/gguf_suite.sh" "$out" "nemo8b qwen30b" "${CELLS:-1024:4G}" || rc=1
fi
# The test logs name sources and fixtures relative to the repository (the binaries carry the build
# machine's source paths, the fixtures this machine's), not by either machine's paths.
for f in "$out"/test_gpu_*.log; do [ -f "$f" ] && sed -i -E 's#/[^ :]*/(tests/)#\1#g' "$f"; done
echo "suite: $([ $rc -eq 0 ] && echo passed || echo FAILED)"
exit $rc
