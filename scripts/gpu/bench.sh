#!/usr/bin/env bash
# GPU machine: the executor's benchmark rows on in-memory synthetic weights (nemo8b f16, qwen30b q4_0),
# 16 threads, 960- and 4032-token prompts of random ids, 64 generated tokens, every schedule per
# context:budget cell, plus the whole model on the GPU. One JSON line per run (run --json and the
# plan's predictions) in OUT/executor_runs.jsonl, then a table. Not a peer comparison: peers are
# measured on the same lease and files by their own harness.
#   bench.sh OUT [all|nemo8b|qwen30b|quick|whole|whole-timeline]
#   all: both models' cells and the whole model; quick: 1K/4G with the main schedules, and the whole
#   model; whole: the whole model kernel by kernel and as CUDA graphs; whole-timeline: the whole
#   model with the measured timeline of decode runs TIMELINE_RUNS (30:36) -> OUT/timelines.tgz.
#   Env: CELLS ("1024:2G 1024:4G 1024:8G 4096:4G"), MODELS, HOST_KV_ATTENTION, RUN_ARGS, BUNDLE, PROFILE,
#   SYNTH (options of the synthetic model, e.g. "?routing=concentrated"), SCHEDS (the schedules of a cell).
set -uo pipefail
out=${1:?usage: bench.sh OUT [all|nemo8b|qwen30b|quick|whole|whole-timeline]}
part=${2:-all}
source "$(dirname "$0")/bundle_env.sh"
[ -f "$profile" ] || { echo "no profile $profile"; exit 2; }
mkdir -p "$out"
machine_facts "$out/machine.txt"
runs="$out/executor_runs.jsonl"
# Is this the machine the profile describes? Recorded, not enforced: the rows measure the executor either
# way; the predictions beside them hold only on the profile's machine.
"$bin" profile --check "$profile" > "$out/machine_check.json" 2> "$out/machine_check.txt" ||
  echo "WARNING: $(tail -1 "$out/machine_check.txt")"
p960=$(python3 scripts/analysis/random_tokens.py 960 960 32000)
p4032=$(python3 scripts/analysis/random_tokens.py 4032 4032 32000)

one() {  # model ctx budget schedule [graphs|nographs|timeline]
  local model=$1 ctx=$2 budget=$3 sched=$4 mode=${5:-graphs} toks=$p960 extra=()
  [ "$ctx" = 1024 ] || toks=$p4032
  [ "$mode" = nographs ] && extra=(--no-cuda-graphs)
  if [ "$mode" = timeline ]; then  # recording slows steps: only these rows record
    mkdir -p "$out/timelines"
    extra=(--timeline "$out/timelines/${model}_${ctx}_${budget}_${sched}.json" --timeline-runs "${TIMELINE_RUNS:-30:36}")
  fi
  rm -f "$out/run.json"
  "$bin" run --model "synthetic:$model${SYNTH:-}" --tokens "$toks" -n 64 --greedy --threads 16 --ctx "$ctx" --device cuda \
    --vram-budget "$budget" --schedule "$sched" --profile "$profile" --json --host-kv-attention "${HOST_KV_ATTENTION:-choose}" \
    "${extra[@]}" ${RUN_ARGS:-} > "$out/run.json" 2> "$out/err.txt"
  "$bin" plan --model "$model" --profile "$profile" --vram-budget "$budget" --ctx "$ctx" --threads 16 --json \
    --host-kv-attention "${HOST_KV_ATTENTION:-choose}" > "$out/plan.json" 2> /dev/null
  python3 scripts/analysis/bench_row.py "$model" "$ctx" "$budget" "$sched" "$mode" "$out/run.json" "$out/plan.json" \
    "$out/err.txt" >> "$runs"
}

models=()
whole=0
case $part in
  all) models=(${MODELS:-nemo8b qwen30b}); whole=1 ;;
  nemo8b|qwen30b) models=($part) ;;
  quick) for m in ${MODELS:-nemo8b qwen30b}; do for s in auto gpu-only static dynamic layer-split; do one "$m" 1024 4G "$s"; done; done
         whole=1 ;;
  whole) for m in ${MODELS:-nemo8b qwen30b}; do one "$m" 1024 40G auto nographs; one "$m" 1024 40G auto graphs; done ;;
  whole-timeline) for m in ${MODELS:-nemo8b qwen30b}; do one "$m" 1024 40G auto timeline; done ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
for m in "${models[@]}"; do
  scheds="auto gpu-only static dynamic layer-split"
  [ "$m" = qwen30b ] && scheds="$scheds cpu-moe"
  scheds=${SCHEDS:-$scheds}
  for c in ${CELLS:-1024:2G 1024:4G 1024:8G 4096:4G}; do for s in $scheds; do one "$m" "${c%%:*}" "${c##*:}" "$s"; done; done
done
if [ $whole -eq 1 ]; then for m in ${MODELS:-nemo8b qwen30b}; do one "$m" 1024 40G auto; done; fi
rm -f "$out/err.txt" "$out/run.json" "$out/plan.json"  # at most 8 files come back
[ -d "$out/timelines" ] && tar -C "$out" -czf "$out/timelines.tgz" timelines && rm -rf "$out/timelines"
python3 scripts/analysis/bench_summary.py "$runs"
