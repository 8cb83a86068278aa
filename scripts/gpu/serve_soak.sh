#!/usr/bin/env bash
# GPU machine: a soak of `shardwise serve` on CUDA. For SECONDS, N users send mixed requests (prompts of
# PROMPT_WORDS words, default 10:150: about 45-700 tokens of a synthetic vocabulary; 8-128 tokens;
# streamed and whole) while the VRAM budget flips between A and B every FLIP_S (20) seconds. Every 5 s
# the server's resident memory and metrics are sampled. At the end no request may have failed or be left
# in flight, and the arena holds the budget it was last given.
# Writes OUT/samples.tsv (time, RSS kB, arena bytes, in flight, done, failed, the C heap's live and kept-free
# bytes: RSS that grows with flat live bytes is the allocator's retention, not a leak), OUT/loadgen_*.json,
# OUT/budget_changes.jsonl, OUT/metrics_end.txt, OUT/serve.log. DEVICE=emu runs it on the emulated device.
#   serve_soak.sh OUT MODEL A B N SLOT_CTX SECONDS
set -uo pipefail
out=${1:?usage: serve_soak.sh OUT MODEL A B N SLOT_CTX SECONDS}
model=$2 a=$3 b=$4 n=$5 slot_ctx=$6 seconds=$7
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/serve_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
start_serve "$out/serve.out" "$out/serve.log" -m "$model" --device "${DEVICE:-cuda}" --vram-budget "$a" --parallel "$n" \
  -c $((n * slot_ctx)) -t "${THREADS:-16}" --profile "$profile"
[ -n "$url" ] || { echo "the server did not start"; tail -5 "$out/serve.log"; exit 1; }
get() { awk -v m="$1" '$1 == m {print $2}' <<< "$m"; }  # a sample of the last /metrics read
t0=$(date +%s)
(  # the load: rounds of loadgen until the time is up, streamed and whole in turn
  i=0
  while [ $(( $(date +%s) - t0 )) -lt "$seconds" ]; do
    i=$((i + 1)); s=""; [ $((i % 2)) = 1 ] && s=--stream
    "$bin" loadgen --url "$url" --users "$n" --requests $((4 * n)) --prompt-tokens "${PROMPT_WORDS:-10:150}" --max-tokens 8:128 $s \
      --seed $i --json > "$out/loadgen_$i.json" 2>> "$out/loadgen.log"
    echo "round $i rc=$?" >> "$out/loadgen.log"
  done
) &
load=$!
printf "t_s\trss_kb\tarena_bytes\tin_flight\tdone\tfailed\theap_in_use\theap_free\n" > "$out/samples.tsv"
next_flip=${FLIP_S:-20} to=$b
while kill -0 $load 2> /dev/null; do
  t=$(( $(date +%s) - t0 ))
  m=$(curl -s "$url/metrics")
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$t" "$(awk '/VmRSS/ {print $2}' /proc/$pid/status)" \
    "$(get shardwise_vram_arena_bytes)" "$(get shardwise_requests_in_flight)" "$(get shardwise_requests_done_total)" \
    "$(get shardwise_requests_failed_total)" "$(get shardwise_heap_in_use_bytes)" "$(get shardwise_heap_free_bytes)" \
    >> "$out/samples.tsv"
  if [ "$t" -ge "$next_flip" ] && [ "$t" -lt "$seconds" ]; then
    curl -s "$url/admin/budget" -d "{\"vram_budget\": \"$to\"}" >> "$out/budget_changes.jsonl"; echo >> "$out/budget_changes.jsonl"
    [ "$to" = "$b" ] && to=$a || to=$b
    next_flip=$((next_flip + ${FLIP_S:-20}))
  fi
  sleep 5
done
curl -s "$url/metrics" > "$out/metrics_end.txt"
kill -INT $pid; wait $pid
echo "rounds: $(grep -c rc=0 "$out/loadgen.log") passed, $(grep -vc rc=0 "$out/loadgen.log") other lines"
python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = [json.load(open(p)) for p in sorted(glob.glob(out + "/loadgen_*.json")) if open(p).read().strip()]
print("requests", sum(r["requests"] for r in runs), "ok", sum(r["ok"] for r in runs), "errors", sum(r["errors"] for r in runs))
rows = [l.split("\t") for l in open(out + "/samples.tsv").read().split("\n")[1:] if l]
rss = [int(r[1]) for r in rows if r[1]]
print("rss kB first/min/max/last", rss[0], min(rss), max(rss), rss[-1])
heap = [int(float(r[6])) // 1024 for r in rows if len(r) > 6 and r[6]]
if heap:
    print("heap in use kB first/min/max/last", heap[0], min(heap), max(heap), heap[-1])
changes = [json.loads(l) for l in open(out + "/budget_changes.jsonl") if l.strip()]
print("budget changes", len(changes), "pause ms max", max((c.get("pause_ms", 0) for c in changes), default=0),
      "errors", sum("error" in c for c in changes))
PY
grep -E "^shardwise_(requests_(done|failed|in_flight|queued)|vram_arena_bytes|device_peak_bytes)" "$out/metrics_end.txt"
