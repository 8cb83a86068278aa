#!/usr/bin/env bash
# GPU machine: the vision encoder's oracle (experiments/vision_encoder.yaml) on this lease, planned from
# the profile of the card found: every schedule of Qwen2.5-VL-7B's tower at 480p-1440p under each budget,
# encoded for real, against the planner's price, with the device's peak. Writes OUT/vision_sweep.jsonl,
# sweep.log, summary.json, machine.txt and table.md (scripts/analysis/vision_sweep_table.py).
#   vision_sweep.sh OUT [MINUTES]      Env: BUNDLE, PROFILE.
set -uo pipefail
out=${1:?usage: vision_sweep.sh OUT [MINUTES]}
minutes=${2:-4}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
cat "$out/machine.txt"
echo "profile: $profile"
timeout $((minutes * 60 + 60)) "$bin" sweep experiments/vision_encoder.yaml --device cuda --profile "$profile" \
  --out "$out/vision_sweep.jsonl" --resume --max-minutes "$minutes" --no-progress > "$out/summary.json" 2> "$out/sweep.log"
rc=$?
echo "sweep rc=$rc"; tail -4 "$out/sweep.log"; cat "$out/summary.json"
python3 "$(dirname "$0")/../analysis/vision_sweep_table.py" "$out/vision_sweep.jsonl" > "$out/table.md" && cat "$out/table.md"
exit $rc
