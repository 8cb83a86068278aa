#!/usr/bin/env bash
# Runs on the GPU machine with the bundle from scripts/gpu/bundle.sh: measured timelines (next to
# the planner's simulated ones) of single configurations the planner-accuracy study got wrong, to see
# which action ran longer than predicted. One archive back: OUT/probe.tgz.
#   timeline_probe.sh OUT "MODEL BUDGET CTX THREADS CAP SCHEDULE" ...
# MODEL is a synthetic spec (e.g. "synthetic:nemo8b?dtype=f16&seed=1"); a 256-token prompt, 8 new
# tokens, the first 4 plan runs recorded (the prefill step, then decode steps). BATCH=64 cuts the
# prompt into steps of 64 tokens (`run --batch`): the recorded runs are then four 64-token steps (the
# study's 64-token rows, e.g. qwen30b GPU-only under-predicted ~25%: results/moe_prefill_cpu_eb86ed1/).
# PROMPT=N sets the prompt's length (256; with BATCH=512, PROMPT=1024 records 512-token steps).
# RUNS=A:B records plan runs [A, B) instead of the first 4 (the prefill's runs first: one per chunk; then one
# per decode step), N=M generates M tokens instead of 8; RUN_ARGS adds options to `run` (e.g.
# --next-layer-hits off); NAME_SUFFIX tells such probes apart.
set -uo pipefail
out=${1:?usage: timeline_probe.sh OUT "MODEL BUDGET CTX THREADS CAP SCHEDULE" ...}
shift
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out/probe"
toks=$(python3 -c "import random; random.seed(256); print(','.join(str(random.randrange(3, 32000)) for _ in range(${PROMPT:-256})))")
for cfg in "$@"; do
  read -r model budget ctx threads cap sched <<< "$cfg"
  name=$(echo "${model#synthetic:}_${budget}_${ctx}_t${threads}_${cap}_${sched}${BATCH:+_b$BATCH}${PROMPT:+_p$PROMPT}${NAME_SUFFIX:-}" | tr -c 'A-Za-z0-9_.\n-' '_')
  echo "== $name"
  timeout 120 "$bin" run --model "$model" --tokens "$toks" -n "${N:-8}" --greedy --threads "$threads" --ctx "$ctx" \
    --device cuda --vram-budget "$budget" --pcie-cap "$cap" --schedule "$sched" --profile "$profile" --json \
    --timeline "$out/probe/$name.json" --timeline-runs "${RUNS:-4}" ${BATCH:+--batch "$BATCH"} ${RUN_ARGS:-} \
    > "$out/probe/$name.run.json" 2> "$out/probe/$name.err"
  echo "rc=$? $(tail -c 300 "$out/probe/$name.err")"
done
tar -C "$out" -czf "$out/probe.tgz" probe && rm -rf "$out/probe"
