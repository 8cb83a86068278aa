#!/usr/bin/env bash
# GPU machine: a sample of the planner-accuracy study's decisions measured again on this lease
# (experiments/planner_accuracy_resample.yaml), planned from the profile of the card found. The machine
# check is off and no configuration waits for a calmer machine: the lease-to-lease spread is what this
# measures. Writes OUT/oracle.jsonl, sweep.log, summary.json, machine.txt, machine_check.txt (the
# profile's check, for the record); compare with
#   scripts/analysis/resample_spread.py results/planner_accuracy/oracle.jsonl OUT/oracle.jsonl
#   resample.sh OUT [MINUTES]      Env: BUNDLE, PROFILE.
set -uo pipefail
out=${1:?usage: resample.sh OUT [MINUTES]}
minutes=${2:-5}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
cat "$out/machine.txt"
echo "profile: $profile"
"$bin" profile --check "$profile" > "$out/machine_check.json" 2> "$out/machine_check.txt"
echo "profile check rc=$?"; tail -3 "$out/machine_check.txt"
timeout $((minutes * 60 + 60)) "$bin" sweep experiments/planner_accuracy_resample.yaml --device cuda \
  --out "$out/oracle.jsonl" --resume --max-minutes "$minutes" --no-progress --profile "$profile" \
  --machine-check off --calm 0 > "$out/summary.json" 2> "$out/sweep.log"
rc=$?
echo "sweep rc=$rc"; tail -4 "$out/sweep.log"; cat "$out/summary.json"
exit $rc
