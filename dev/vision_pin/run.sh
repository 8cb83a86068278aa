#!/usr/bin/env bash
# GPU machine: vision_pin on Qwen2.5-VL-7B's tower with seeded f16 weights at 480p, 1080p and 1440p
# within 4G (pageable, pin+encode+unpin, pinned; interleaved rounds). Needs a bundle with vision_pin
# (BINS="cli/shardwise dev/vision_pin" bundle.sh).
#   dev/vision_pin/run.sh OUT [BUDGET] [SIZE...]      Env: BUNDLE, ROUNDS (3)
set -uo pipefail
out=${1:?usage: dev/vision_pin/run.sh OUT [BUDGET] [SIZE...]}
budget=${2:-4G}
shift $(($# > 1 ? 2 : 1))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(854x480 1920x1080 2560x1440)
cd "$(dirname "$0")/../.."
source scripts/gpu/bundle_env.sh
mkdir -p "$out"
machine_facts "$out/machine.txt"
timeout 300 "$bindir/vision_pin" 'synthetic:qwen2vl7b?dtype=f16&seed=1' "$budget" "${ROUNDS:-3}" "${sizes[@]}" \
  > "$out/vision_pin.txt" 2>&1
echo "vision_pin: exit $?"
cat "$out/vision_pin.txt"
