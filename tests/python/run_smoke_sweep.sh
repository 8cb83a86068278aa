#!/bin/sh
# CTest fixture: the smoke sweep (experiments/smoke.yaml) on the emulated device into a fresh file, for the
# Python tests and the notebooks ($SHARDWISE_SMOKE_RESULTS).
set -eu
out=${1:?usage: run_smoke_sweep.sh OUT.jsonl}
mkdir -p "$(dirname "$out")"
rm -f "$out"
"$SHARDWISE_BIN" sweep "$SHARDWISE_REPO/experiments/smoke.yaml" --device emu --out "$out" --no-progress
