#!/bin/bash
# The paper artifact's two profilers (`concurrent_profiler --cold --fast --threads 16`, `gpu_profiler --cold
# --fast`), whose output its `-pipe-shard` planner reads. They run for minutes, so each may get a device call
# of its own; the results are kept (results/peers/profiles/) and carried into later benchmark calls.
# Their output is line-buffered, so a run cut off by the limit still shows how far it got.
# usage: scripts/gpu/peer_profiles.sh OUT [concurrent|gpu|both] [TIMEOUT_S]
set -u
out=${1:?usage: peer_profiles.sh OUT [concurrent|gpu|both] [TIMEOUT_S]}
which=${2:-both}
limit=${3:-540}
here=$(pwd)
. scripts/gpu/peer_env.sh
mkdir -p "$out" /tmp/shardwise-peers-run
cd /tmp/shardwise-peers-run || exit 2
export GGML_CUDA_PIPELINE_SHARDING=1 GGML_CUDA_REGISTER_HOST=1
{ date -u +%FT%TZ; lscpu | grep -E "Model name|^CPU\(s\)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } > "$out/machine.txt"
profile() { # name binary args...
  local name=$1 t0=$(date +%s); shift
  timeout "$limit" stdbuf -oL "$peerbin/$@" > "$out/$name.log" 2>&1
  echo "$name: rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$out/machine.txt"
  cp -f "${name}_results.txt" "$out/" 2>/dev/null
}
case $which in
  concurrent|both) profile concurrent concurrent_profiler --cold --fast --threads 16 ;;
esac
case $which in
  gpu|both) profile gpu gpu_profiler --cold --fast ;;
esac
cd "$here" && ls -la "$out"
