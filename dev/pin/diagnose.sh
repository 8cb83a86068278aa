#!/usr/bin/env bash
# Lab, GPU machine: why does `run` on a GGUF file stall on CUDA, and how should file weights be pinned?
# 1. the machine's kernel, memory zones and file system; 2. the stalled `run` on a small GGUF file with
# its threads' kernel stacks after 15 s; 3. pin_file_probe (this folder) on a 4 GiB file, each method
# in a child with a time limit. Needs .carry/ (pin_file_probe, peers/gen_models.py + gguf-py) and the
# bundle. Everything goes to OUT/diagnose.txt.
set -uo pipefail
out=${1:?usage: diagnose.sh OUT}
source scripts/gpu/bundle_env.sh
log="$out/diagnose.txt"
exec > >(tee "$log") 2>&1
echo "== machine"
uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -E "MemTotal|MemFree|Cached|Movable|Mlocked|Unevictable" /proc/meminfo
awk '/^Node/ {z=$4} /present/ {print "zone", z, $0}' /proc/zoneinfo
echo "tmp fs: $(stat -f -c %T /tmp)   THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
work=/tmp/pin && mkdir -p $work
echo "== stalled run (mid_moe GGUF, q4_0)"
OUT_Q4_0=1 GGUF_PY=.carry/peers/gguf-py python3 .carry/peers/gen_models.py mid_moe $work/mid_moe.gguf
SHARDWISE_LOG=debug "$bin" run --model $work/mid_moe.gguf --tokens 5,6,7,8 -n 4 --greedy --device cuda \
  --vram-budget 2G --threads 16 --json > $work/run.json 2> $work/run.err &
pid=$!
for i in $(seq 1 30); do sleep 0.5; [ -d /proc/$pid ] || break; done
if [ -d /proc/$pid ]; then
  echo "still running after 15 s; threads (state, utime) and kernel stacks:"
  for t in /proc/$pid/task/*; do
    echo "-- task ${t##*/}: $(awk '{print $3, "utime="$14, "stime="$15}' $t/stat) wchan=$(cat $t/wchan)"
    cat $t/stack
  done
  grep -E "VmRSS|VmLck|VmPin" /proc/$pid/status
  grep -E "mid_moe" /proc/$pid/maps | head -3
  kill -9 $pid
fi
wait $pid; echo "run rc=$?"; tail -c 1500 $work/run.err; head -c 600 $work/run.json; echo
echo "== pin_file_probe, 4 GiB, 16 threads"
PROBE_LIMIT_S=20 .carry/pin_file_probe $work/probe.bin 4 16 private_ro shared_ro anon_read hostalloc
echo "== again, 16 GiB (load times at a real model's size)"
PROBE_LIMIT_S=60 .carry/pin_file_probe $work/probe16.bin 16 16 shared_ro anon_read hostalloc
rm -f $work/probe16.bin
