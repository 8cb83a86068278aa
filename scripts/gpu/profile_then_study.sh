#!/usr/bin/env bash
# One device call: profile the GPU machine and validate the profile (scripts/gpu/profile.sh), put the
# profile where experiments/planner_accuracy.yaml reads it, then spend the call's remaining minutes on
# the planner-accuracy study (scripts/gpu/oracle_study.sh, resumable). Writes OUT/profile/ and OUT/study/.
#   profile_then_study.sh OUT [CALL_SECONDS]   (default 570: a 10-minute call with margin)
set -uo pipefail
out=${1:?usage: profile_then_study.sh OUT [CALL_SECONDS]}
budget=${2:-570}
t0=$(date +%s)
PROFILE_TIMEOUT=300 VALIDATE_TIMEOUT=150 bash scripts/gpu/profile.sh "$out/profile"
if [ -f "$out/profile/h200-host.profile.json" ]; then
  mkdir -p experiments/results/profile
  cp "$out/profile/h200-host.profile.json" configs/profiles/h200-host.profile.json
  left=$(( (budget - ($(date +%s) - t0)) / 60 ))
  if [ "$left" -ge 1 ]; then
    echo "== study for $left min"
    bash scripts/gpu/oracle_study.sh "$out/study" none "$left"
  else
    echo "no time left for the study"
  fi
fi
