#!/usr/bin/env bash
# GPU machine: the check of the vision kernels on the device (`test_gpu "[vision]"`), then vision_ops on
# Qwen2.5-VL-7B's tower with seeded f16 weights, each configuration twice in turn (A B A B) under the
# profile of the card found. Default: the plan's workspace against the fixed 8 MiB at 480p and 1440p.
# Needs a bundle with test_gpu and vision_ops (BINS="cli/shardwise tests/test_gpu dev/vision_ops" bundle.sh).
#   dev/vision_ops/run.sh OUT [CONFIG...]      Env: BUNDLE, ROUNDS (3)
set -uo pipefail
out=${1:?usage: dev/vision_ops/run.sh OUT [CONFIG...]}
shift
cd "$(dirname "$0")/../.."
source scripts/gpu/bundle_env.sh
mkdir -p "$out"
machine_facts "$out/machine.txt"
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(4G/854x480,2560x1440 4G+8M/854x480,2560x1440)
export SHARDWISE_FIXTURES="$PWD/tests/fixtures" SHARDWISE_BIN="$bin"
timeout 150 "$bindir/test_gpu" "[vision]" > "$out/test_gpu_vision.log" 2>&1
echo "test_gpu [vision]: exit $?"; tail -2 "$out/test_gpu_vision.log"
timeout 400 "$bindir/vision_ops" cuda 'synthetic:qwen2vl7b?dtype=f16&seed=1' "${ROUNDS:-3}" "${configs[@]}" \
  "${configs[@]}" "$profile" > "$out/vision_ops.txt" 2>&1
echo "vision_ops: exit $?"
cat "$out/vision_ops.txt"
