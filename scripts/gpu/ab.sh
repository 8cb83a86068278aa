#!/usr/bin/env bash
# GPU machine: two builds of shardwise measured against each other on one lease. ROUNDS rounds of
# bench.sh's PART for bundle A and bundle B, alternating which goes first (A B, B A, ...) so host drift
# during the call falls on both sides; then a table per row with the median and the spread of each side
# and B's ratio to A.
#   ab.sh OUT [ROUNDS] [PART]     Env: BUNDLE_A, BUNDLE_B (bundle.sh outputs), SYNTH_A, SYNTH_B (each side's
#   bench.sh SYNTH: options that make the two builds generate the same synthetic weights), and bench.sh's own.
set -uo pipefail
out=${1:?usage: ab.sh OUT [ROUNDS] [PART]}
rounds=${2:-3}
part=${3:-whole}
: "${BUNDLE_A:?BUNDLE_A: the baseline bundle}" "${BUNDLE_B:?BUNDLE_B: the bundle under test}"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  order="A B"; [ $((r % 2)) -eq 0 ] && order="B A"
  for side in $order; do
    bundle=$BUNDLE_A synth=${SYNTH_A:-}
    [ "$side" = B ] && bundle=$BUNDLE_B synth=${SYNTH_B:-}
    mkdir -p "$out/$side"
    echo "== round $r, $side ($(date -u +%T))"
    BUNDLE=$bundle SYNTH=$synth bash "$(dirname "$0")/bench.sh" "$out/$side/r$r" "$part" > "$out/$side/r$r.log" 2>&1 ||
      echo "bench.sh failed: $out/$side/r$r.log"
  done
done
python3 scripts/analysis/ab_summary.py "$out/A" "$out/B" | tee "$out/ab_summary.txt"
