#!/usr/bin/env bash
# Diagnostic on the GPU machine (bundle from scripts/gpu/bundle.sh): does pinning the host weights
# (cudaHostRegister) change how the kernel maps them (transparent huge pages) and the CPU's read
# rate? Runs one Static configuration with and without pinning, samples the process's
# /proc/PID/smaps_rollup after loading, and keeps the measured timelines. One archive: OUT/pin.tgz.
set -uo pipefail
out=${1:?usage: pin_probe.sh OUT}
source "$(dirname "$0")/bundle_env.sh"
d="$out/pin" && mkdir -p "$d"
{ cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; grep -E "Movable|HugePages|MemFree|MemTotal" /proc/meminfo;
  awk '/^Node/ {z=$4} /present/ {print z, $0}' /proc/zoneinfo; } > "$d/machine.txt" 2>&1
toks=$(python3 -c "import random; random.seed(256); print(','.join(str(random.randrange(3, 32000)) for _ in range(256)))")
for pin in 1 0; do
  n="static_pin$pin" nopin=()
  [ "$pin" = 0 ] && nopin=(--no-pin-weights)
  "$bin" run "${nopin[@]}" --model "synthetic:nemo8b?dtype=f16&seed=1" --tokens "$toks" -n 24 --greedy --threads 16 \
    --ctx 4096 --device cuda --vram-budget 8G --pcie-cap 16GB/s --schedule static --profile "$profile" --json \
    --timeline "$d/$n.json" --timeline-runs 4 > "$d/$n.run.json" 2> "$d/$n.err" &
  pid=$!
  for i in $(seq 1 60); do sleep 0.25; [ -d /proc/$pid ] || break
    echo "t=$i $(grep -E '^(Rss|Anonymous|AnonHugePages):' /proc/$pid/smaps_rollup 2>/dev/null | tr -s ' ' | tr '\n' ' ')"; done > "$d/$n.smaps" 2>&1
  wait $pid; echo "$n rc=$? $(tail -c 250 "$d/$n.err")"
  awk 'NR % 6 == 0' "$d/$n.smaps" | tail -8
done
tar -C "$out" -czf "$out/pin.tgz" pin && rm -rf "$d"
