#!/usr/bin/env bash
# Runs the planner-accuracy study (experiments/planner_accuracy.yaml) on the GPU machine with the bundle
# from scripts/gpu/bundle.sh (nothing is built there): one `shardwise sweep --device cuda --resume
# --max-minutes M` call that continues the results so far and stops cleanly between rows, so a device
# call of at most 10 minutes never cuts a row. Run it again (with the file it wrote) until it says
# "complete". Writes into OUT: oracle.jsonl (all rows so far), sweep_<n>.log, machine.txt.
#
#   oracle_study.sh OUT [PREVIOUS.jsonl] [MINUTES] [EXPERIMENT.yaml]
#     PREVIOUS  results of earlier calls to continue (default: experiments/results/planner_accuracy/oracle.jsonl
#               when it exists; copy each call's OUT/oracle.jsonl there so the next call carries it)
#     MINUTES   --max-minutes for this call (default 9)
#   SWEEP_ARGS="..." adds options to the sweep (e.g. --machine-check off: measure even where the machine
#   check refuses the profile; the rows' sweep header records that no check ran; --timelines OUT/timelines:
#   each measured row's step recorded as a trace, brought back as OUT/timelines.tgz — for the targeted
#   experiments: a trace is 0.1-1 MB)
set -uo pipefail
out=${1:?usage: oracle_study.sh OUT [PREVIOUS.jsonl] [MINUTES] [EXPERIMENT.yaml]}
prev=${2:-experiments/results/planner_accuracy/oracle.jsonl}
minutes=${3:-9}
experiment=${4:-experiments/planner_accuracy.yaml}
mkdir -p "$out"
# A previous file named but not there (not carried, mistyped) would silently start the study over.
if [ -n "${2:-}" ] && [ "$2" != none ] && [ ! -f "$2" ]; then echo "no $2: give the previous results file, or none to start anew"; exit 2; fi

# The bundle: always the one carried with this call (a warm machine may hold an older one).
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf build-gpu/bundle.tar.xz || { echo "no build-gpu/bundle.tar.xz (run scripts/gpu/bundle.sh and carry it)"; exit 2; }
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
bin="$root/bin/shardwise"
{
  echo "date: $(date -u +%FT%TZ)"; echo "revision: $(tr '\n' ' ' < "$root/REVISION" 2>/dev/null || echo unknown)"
  lscpu | grep -E "Model name|^CPU\(s\)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

results="$out/oracle.jsonl"
if [ -f "$prev" ]; then
  cp "$prev" "$results"
  echo "continuing $prev ($(grep -c '"record":"row"' "$results") rows)"
else
  echo "starting a new results file"
fi
n=$(ls "$out"/sweep_*.log 2>/dev/null | wc -l)
log="$out/sweep_$n.log"
# (The call's log starts with the sweep's own estimate; a separate --predict would plan everything twice.)
"$bin" sweep "$experiment" --device cuda --out "$results" --resume --max-minutes "$minutes" --no-progress ${SWEEP_ARGS:-} \
  > "$out/summary_$n.json" 2> "$log"
rc=$?
tail -5 "$log"
cat "$out/summary_$n.json"
python3 - "$results" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{") and '"record":"row"' in l]
c = collections.Counter(r["status"] for r in rows)
print(f"{len(rows)} rows so far: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
for r in rows:
    if r["status"] == "error":
        print("ERROR", r["model"], r["budget"], r["ctx"], r["threads"], r["pcie_cap"], r["tier"], r["schedule"], r["reason"][:200])
PY
# At most 8 files come back from a device call: traces of --timelines travel as one archive.
if [ -d "$out/timelines" ]; then tar -C "$out" -czf "$out/timelines.tgz" timelines && rm -rf "$out/timelines"; fi
if grep -q '"complete":true' "$out/summary_$n.json"; then
  echo "STUDY COMPLETE: copy $results to experiments/results/planner_accuracy/oracle.jsonl and run"
  echo "  shardwise report experiments/results/planner_accuracy/oracle.jsonl --out experiments/results/planner_accuracy"
else
  echo "NOT COMPLETE: copy $results to experiments/results/planner_accuracy/oracle.jsonl and call this script again"
fi
exit $rc
