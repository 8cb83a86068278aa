#!/usr/bin/env bash
# Runs on the GPU machine: where a step's GPU time goes, kernel by kernel — Nsight Compute's duration of
# every kernel of chosen plan runs (`run --profiler-runs A:B`, kernels serialised, so no overlap between
# them) — and qwen30b's 512-token GPU-only step run from this binary's plan table and from an older
# binary's (build-gpu/shardwise_<rev>.xz, carried), which differ only in their scratch region's size.
# One archive back: OUT/kprof.tgz, a NAME.kernels.csv per profiled run (id, kernel, grid, block, duration_us;
# as in experiments/results/executor/kprof_feb1d50/), which scripts/analysis/kernel_summary.py tabulates.
#   kernel_profile.sh OUT
set -uo pipefail
out=${1:?usage: kernel_profile.sh OUT}
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out/kprof"
ncu=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 2; }
toks() { python3 -c "import random; random.seed($1); print(','.join(str(random.randrange(3, 32000)) for _ in range($1)))"; }
p1024=$(toks 1024); p960=$(toks 960)
q=(--model "synthetic:qwen30b?dtype=q4_0&seed=1" --threads 16 --vram-budget 4G --ctx 4096 --profile "$profile")
r=(--device cuda --schedule gpu-only --batch 512 --tokens "$p1024" -n 2 --greedy --json)
"$bin" plan "${q[@]}" --save /tmp/plan_new.json > /dev/null 2> "$out/kprof/plan_new.err"
old=$(ls build-gpu/shardwise_*.xz 2>/dev/null | head -1)
if [ -n "$old" ]; then
  xz -dc "$old" > /tmp/shardwise-old && chmod +x /tmp/shardwise-old
  /tmp/shardwise-old plan "${q[@]}" --save /tmp/plan_old.json > /dev/null 2> "$out/kprof/plan_old.err"
fi
echo "== qwen30b 512-token GPU-only steps, this binary, each plan table, alternating"
rounds="1 2"; [ -f /tmp/plan_old.json ] || rounds=1  # nothing to alternate with
for round in $rounds; do
  for p in new old; do
    [ -f /tmp/plan_$p.json ] || continue
    timeout 120 "$bin" run "${q[@]}" "${r[@]}" --plan /tmp/plan_$p.json > "$out/kprof/run_${p}_$round.json" 2> "$out/kprof/run_$p.err"
    echo "plan $p round $round rc=$? steps ms: $(python3 -c 'import json,sys; print([round(s["ms"],1) for s in json.load(open(sys.argv[1]))["steps"]])' "$out/kprof/run_${p}_$round.json" 2>&1 | tail -c 200)"
  done
done
kern() {  # name run-args... (plan runs chosen with --profiler-runs inside them)
  local name=$1; shift
  timeout 240 "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv --cache-control none \
    --clock-control none "$bin" run "$@" > "$out/kprof/$name.csv" 2> "$out/kprof/$name.err"
  echo "$name rc=$? $(grep -c gpu__time_duration "$out/kprof/$name.csv") kernels"
  # ncu's long format (one row per metric, with the command line) -> one row per launch
  python3 - "$out/kprof/$name.csv" "$out/kprof/$name.kernels.csv" <<'PY' && rm -f "$out/kprof/$name.csv"
import csv, re, sys
src, dst = sys.argv[1:3]
rows = csv.DictReader(l for l in open(src) if l.startswith('"'))
with open(dst, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "kernel", "grid", "block", "duration_us"])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        w.writerow([r["ID"], re.sub(r"\(.*", "", r["Kernel Name"]), r["Grid Size"], r["Block Size"], f"{v * scale:.3f}"])
PY
}
echo "== kernels"
kern qwen30b_step512_newplan "${q[@]}" "${r[@]}" --plan /tmp/plan_new.json --profiler-runs 1:2
[ -f /tmp/plan_old.json ] && kern qwen30b_step512_oldplan "${q[@]}" "${r[@]}" --plan /tmp/plan_old.json --profiler-runs 1:2
kern nemo8b_decode --model "synthetic:nemo8b?dtype=f16&seed=1" --threads 16 --device cuda --vram-budget 40G --ctx 1024 \
  --no-cuda-graphs --tokens "$p960" -n 6 --greedy --profile "$profile" --json --profiler-runs 3:5
tar -C "$out" -czf "$out/kprof.tgz" kprof
