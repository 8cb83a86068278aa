#!/usr/bin/env bash
# GPU machine: the planner-accuracy study (an experiment YAML swept with every schedule run for real), in
# calls of at most 10 minutes. Each call continues the results so far (`sweep --resume --max-minutes`,
# which stops between rows); call it again with the file it wrote until it says complete. A new study
# first checks that this machine is the committed profile's (`profile --check`); on another machine it
# profiles this one first (profile.sh, no validation) and plans from that profile.
#   study.sh OUT [PREVIOUS.jsonl|none] [MINUTES] [EXPERIMENT.yaml]
# Writes OUT/oracle.jsonl (all rows so far), sweep_<n>.log, summary_<n>.json, machine.txt and, when it
# profiled, OUT/profile/. SWEEP_ARGS adds sweep options (e.g. --timelines OUT/timelines).
set -uo pipefail
out=${1:?usage: study.sh OUT [PREVIOUS.jsonl|none] [MINUTES] [EXPERIMENT.yaml]}
prev=${2:-none}
minutes=${3:-9}
experiment=${4:-experiments/planner_accuracy.yaml}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
cat "$out/machine.txt"
if [ "$prev" != none ] && [ ! -f "$prev" ]; then echo "no $prev: give the previous results file, or none"; exit 2; fi
results="$out/oracle.jsonl"
args=()
if [ "$prev" != none ]; then
  cp "$prev" "$results"
  echo "continuing $prev"
elif ! "$bin" profile --check "$profile" > "$out/machine_check.json" 2> "$out/machine_check.txt"; then
  echo "this machine is not the profile's ($(tail -1 "$out/machine_check.txt")): profiling it first"
  t0=$(date +%s)
  PROFILE_TIMEOUT=300 VALIDATE=0 PROFILE_NAME=this-host bash "$(dirname "$0")/profile.sh" "$out/profile"
  [ -f "$out/profile/this-host.profile.json" ] || { echo "profiling failed"; exit 1; }
  args=(--profile "$out/profile/this-host.profile.json")
  minutes=$(( minutes - ($(date +%s) - t0 + 59) / 60 ))
fi
[ "$minutes" -ge 1 ] || { echo "no minutes left for the sweep"; exit 0; }
n=$(ls "$out"/sweep_*.log 2>/dev/null | wc -l)
"$bin" sweep "$experiment" --device cuda --out "$results" --resume --max-minutes "$minutes" --no-progress "${args[@]}" \
  ${SWEEP_ARGS:-} > "$out/summary_$n.json" 2> "$out/sweep_$n.log"
rc=$?
tail -5 "$out/sweep_$n.log"
python3 scripts/analysis/study_progress.py "$results"
# At most 8 files come back from a device call: traces of --timelines travel as one archive.
if [ -d "$out/timelines" ]; then tar -C "$out" -czf "$out/timelines.tgz" timelines && rm -rf "$out/timelines"; fi
if grep -q '"complete":true' "$out/summary_$n.json"; then
  echo "STUDY COMPLETE: copy $results into results/ and run shardwise report on it"
else
  echo "NOT COMPLETE: carry $results and call: study.sh OUT $results"
fi
exit $rc
