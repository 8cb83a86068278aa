#!/usr/bin/env bash
# Runs on the GPU machine with the bundle from scripts/gpu/bundle.sh: the executor's benchmarks with
# the peers' protocol (DEVICE.md): nemo8b f16 and qwen30b q4_0 (synthetic weights), 16 threads, 960- and
# 4032-token prompts, 64 generated tokens, budgets 2G/4G/8G, every schedule, the baselines and auto;
# plus the whole model on the GPU. Writes one JSON line per run (run --json + the plan's prediction)
# into OUT/executor_runs.jsonl and a summary table to stdout.
#   executor_bench.sh OUT [part]   part: all (default) | nemo8b | qwen30b | full | quick | graphs | same-plan | timelines
#   | whole-timeline | prefetch (qwen30b auto and gpu-only with and without speculative expert prefetch)
#   (CELLS="1024:2G 4096:4G" limits all/nemo8b/qwen30b to those ctx:budget cells; HOST_KV_ATTENTION=split|staged
#   plans and runs every row with that attention over host KV caches, default choose)
# graphs: the whole model on the GPU, decode kernel by kernel (--no-cuda-graphs) and as CUDA graphs (the
# default).
# timelines: auto/static/dynamic at 1K/4G with the measured timeline of their first 6 runs
# (its summary says when the host had enqueued the last device action); their TPS is not a peer row's.
set -uo pipefail
out=${1:?usage: executor_bench.sh OUT [all|nemo8b|qwen30b|full|quick|graphs|whole-timeline|same-plan|timelines|prefetch]}
part=${2:-all}
source "$(dirname "$0")/bundle_env.sh"
[ -f "$profile" ] || { echo "no profile $profile"; exit 2; }
mkdir -p "$out"
runs="$out/executor_runs.jsonl"
# Is this the machine the profile describes? (Recorded, not enforced: the runs measure the executor
# either way; the predictions beside them only hold on the profile's machine.)
"$bin" profile --check "$profile" > "$out/machine_check.json" 2> "$out/machine_check.txt" ||
  echo "WARNING: $(tail -1 "$out/machine_check.txt")"
prompt() { python3 -c "import random; random.seed($1); print(','.join(str(random.randrange(3, 32000)) for _ in range($1)))"; }
p960=$(prompt 960)
p4032=$(prompt 4032)

one() {  # model ctx budget schedule [graphs|nographs|timeline]
  local model=$1 ctx=$2 budget=$3 sched=$4 graphs=${5:-} toks
  [ "$ctx" = 1024 ] && toks=$p960 || toks=$p4032
  local res
  # Rows of the `timelines` part record the measured timeline of their first runs (prefill chunks, then
  # decode steps) next to the predicted one: timelines/*.json, tarred at the end. Only there: recording
  # slowed nemo8b's Dynamic decode steps by 25-40% (results/executor/README.md, sixth session), so the
  # peer rows run untimed.
  local tl=()
  # graphs: kernel by kernel (--no-cuda-graphs) or as graphs; timelines are never graphs
  [ "$graphs" = nographs ] && tl=(--no-cuda-graphs)
  if [ "$graphs" = timeline ]; then
    mkdir -p "$out/timelines"
    tl+=(--timeline "$out/timelines/${model}_${ctx}_${budget}_${sched}.json" --timeline-runs "${TIMELINE_RUNS:-6}")
  fi
  res=$("$bin" run --model "synthetic:$model" --tokens "$toks" -n 64 --greedy --threads 16 --ctx "$ctx" \
        --device cuda --vram-budget "$budget" --schedule "$sched" --profile "$profile" --json "${tl[@]}" \
        --host-kv-attention "${HOST_KV_ATTENTION:-choose}" ${RUN_ARGS:-} 2> "$out/err.txt")
  if [ -z "$res" ]; then
    echo "{\"model\": \"$model\", \"ctx\": $ctx, \"budget\": \"$budget\", \"schedule\": \"$sched\", \"error\": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().strip()[-300:]))' "$out/err.txt")}" >> "$runs"
    return
  fi
  printf '%s' "$res" > "$out/run.json"
  "$bin" plan --model "$model" --profile "$profile" --vram-budget "$budget" --ctx "$ctx" --threads 16 --json \
    --host-kv-attention "${HOST_KV_ATTENTION:-choose}" > "$out/plan.json" 2>/dev/null
  python3 - "$model" "$ctx" "$budget" "$sched" "$out/run.json" "$out/plan.json" "$graphs" <<'PY' >> "$runs"
import json, os, sys
model, ctx, budget, sched = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
graphs = not (len(sys.argv) > 7 and sys.argv[7] in ("nographs", "timeline"))  # graphs are run's default
r = json.load(open(sys.argv[5]))
try:
    p = json.load(open(sys.argv[6]))
except Exception:
    p = {}
pred = {}
for t in p.get("tiers", []):
    for c in t["candidates"]:
        pred.setdefault(str(t["tokens"]), {})[c["schedule"]] = c["predicted_ms"] if c["feasible"] else None
    pred.setdefault(str(t["tokens"]), {})["auto"] = pred[str(t["tokens"])].get(t["chosen"])
r.pop("generated_ids", None); r.pop("text", None)
row = {"model": model, "ctx": ctx, "budget": budget, "schedule": sched, "cuda_graphs": graphs,
       "host_kv_attention": os.environ.get("HOST_KV_ATTENTION", "choose"),
       "timeline": len(sys.argv) > 7 and sys.argv[7] == "timeline", "run_args": os.environ.get("RUN_ARGS", ""), "run": r,
       # The run's own table's prediction (a forced schedule plans a table of its own, whose layout may
       # differ from the planner's mix); the mixed table's for runs of binaries before it was recorded.
       "predicted_decode_ms": (r.get("predicted_step_ms") or {}).get("1", (pred.get("1") or {}).get(sched)),
       "predicted_decode_ms_mixed_table": (pred.get("1") or {}).get(sched),
       "predicted_prefill_512_ms": (pred.get("512") or {}).get(sched)}
print(json.dumps(row))
PY
}

models=()
case $part in
  all) models=(nemo8b qwen30b) ;;
  nemo8b|qwen30b) models=($part) ;;
  full) models=() ;;
  graphs)
    for m in nemo8b qwen30b; do
      one "$m" 1024 40G auto nographs; one "$m" 1024 40G auto graphs
    done ;;
  same-plan)  # qwen30b 1K/2G: auto decoded with Static at 23.8 ms per token where --schedule static ran the
              # same plan at 20.9 (seventh session): each twice, alternating, then both with timelines
    for rep in 1 2; do one qwen30b 1024 2G auto; one qwen30b 1024 2G static; done
    one qwen30b 1024 2G auto timeline; one qwen30b 1024 2G static timeline ;;
  whole-timeline)  # the whole model at 1K on a 40G budget with its measured timeline (host time around the device's)
    for m in ${QUICK_MODELS:-nemo8b qwen30b}; do TIMELINE_RUNS=${TIMELINE_RUNS:-30:36} one "$m" 1024 40G auto timeline; done ;;
  timelines)  # the measured timelines of auto, static and dynamic at 1K/4G (these rows' TPS are perturbed)
    for m in ${QUICK_MODELS:-nemo8b qwen30b}; do for s in auto static dynamic; do one "$m" 1024 4G "$s" timeline; done; done ;;
  prefetch)  # speculative expert prefetch (run --next-layer-hits auto, the default) against none (off): qwen30b's
             # cells, auto and gpu-only each way, alternating; the 1K/2G cell three times
    for c in ${PREFETCH_CELLS:-1024:2G 1024:4G 1024:8G 4096:4G 1024:2G 1024:2G}; do
      for s in auto gpu-only; do
        one qwen30b "${c%%:*}" "${c##*:}" "$s"; RUN_ARGS="--next-layer-hits off" one qwen30b "${c%%:*}" "${c##*:}" "$s"
      done
    done ;;
  quick)  # one budget, the main schedules and the llama.cpp-style baseline, plus the whole model on the GPU
    for m in ${QUICK_MODELS:-nemo8b qwen30b}; do for s in auto gpu-only static dynamic layer-split; do one "$m" 1024 4G "$s"; done; done ;;
esac
# CELLS="ctx:budget ..." picks cells of the protocol (default: all four), e.g. to split a model's rows
# over two calls of the device's 10-minute limit; rows are appended as they finish either way.
cells=${CELLS:-1024:2G 1024:4G 1024:8G 4096:4G}
for m in "${models[@]}"; do
  scheds="auto gpu-only static dynamic layer-split"
  [ "$m" = qwen30b ] && scheds="$scheds cpu-moe"
  for c in $cells; do for s in $scheds; do one "$m" "${c%%:*}" "${c##*:}" "$s"; done; done
done
if [ "$part" = all ] || [ "$part" = full ] || [ "$part" = quick ]; then
  for m in ${QUICK_MODELS:-nemo8b qwen30b}; do one "$m" 1024 40G auto; done
fi
rm -f "$out/err.txt" "$out/run.json" "$out/plan.json"  # scratch of one run each; at most 8 files come back
[ -d "$out/timelines" ] && tar -C "$out" -czf "$out/timelines.tgz" timelines && rm -rf "$out/timelines"
python3 - "$runs" <<'PY'
import json, sys
# The peers on this machine (DEVICE.md, "Peers measured on this machine"): (TTFT s, TPS) of llama.cpp's
# best -ngl, the paper's artifact, and llama.cpp --cpu-moe where measured; whole model: llama.cpp.
PEERS = {("nemo8b", 1024, "2G"): [(2.45, 5.38), (0.40, 3.63)], ("nemo8b", 1024, "4G"): [(1.86, 6.28), (0.35, 4.49)],
         ("nemo8b", 1024, "8G"): [(1.43, 8.13), (0.32, 6.67)], ("nemo8b", 4096, "4G"): [(7.65, 4.58), (1.16, 4.02)],
         ("qwen30b", 1024, "2G"): [(2.73, 16.79), (0.43, 30.31), (2.27, 32.12)], ("qwen30b", 1024, "4G"): [(2.30, 19.89), (0.64, 34.54)],
         ("qwen30b", 1024, "8G"): [(1.96, 25.10), (0.59, 44.00)], ("qwen30b", 4096, "4G"): [(8.99, 11.10), (2.45, 32.73), (10.55, 28.97)],
         ("nemo8b", 1024, "40G"): [(0.18, 156.9)], ("qwen30b", 1024, "40G"): [(0.38, 164.9)]}
# TPS counts every decode step, so a burst of slow steps (the host's other tenants) moves it; "med TPS"
# is 1000 / the median decode step, the plan's rate, and meas/pred compares that median step.
def median(v):
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2 if v else 0.0
print(f"{'model':8} {'ctx':>5} {'budget':>6} {'schedule':12} {'TTFT s':>8} {'TPS':>8} {'med TPS':>8} {'arena':>8} {'dev peak':>9}"
      f" {'meas/pred decode':>16} {'TPS/best peer':>13} {'TTFT vs best':>12}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "error" in r:
        print(f"{r['model']:8} {r['ctx']:>5} {r['budget']:>6} {r['schedule']:12} ERROR {r['error'][-80:]}")
        continue
    x = r["run"]
    tps = x.get("decode_tokens_per_s", 0)
    # Decode steps: every step after the prefill's (one step per generated token but the first).
    steps = [s["ms"] for s in x.get("steps", [])[1:] if s.get("tokens", 1) == 1]
    med_ms = median(steps)
    med_tps = 1000.0 / med_ms if med_ms > 0 else 0.0
    ratio = ""
    if r.get("predicted_decode_ms") and med_ms > 0:
        ratio = f"{med_ms / r['predicted_decode_ms']:.2f}"
    peers = PEERS.get((r["model"], r["ctx"], r["budget"]), [])
    vs_tps = f"{tps / max(p[1] for p in peers):.2f}x" if peers and tps else ""
    vs_ttft = ("ahead" if x["ttft_ms"] / 1000 <= min(p[0] for p in peers) else "behind") if peers else ""
    sched = r['schedule'] + ("" if r.get("cuda_graphs", True) else "-graphs") \
        + ("-nopf" if "--next-layer-hits off" in r.get("run_args", "") else "")
    print(f"{r['model']:8} {r['ctx']:>5} {r['budget']:>6} {sched:12} {x['ttft_ms']/1000:8.2f} {tps:8.2f} {med_tps:8.2f} "
          f"{x.get('arena_peak_bytes',0)/2**30:7.2f}G {x.get('device_peak_bytes',0)/2**30:8.2f}G {ratio:>16} {vs_tps:>13} {vs_ttft:>12}"
          + (f"  guessed {x.get('guess_hits', 0)}/{x.get('guessed_experts', 0)} (hits {x.get('next_layer_hits', 0):.2f})"
             if x.get("guessed_experts") else ""))
PY
