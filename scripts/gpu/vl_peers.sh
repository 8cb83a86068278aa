#!/usr/bin/env bash
# GPU machine: shardwise against llama.cpp's mtmd (b6097) on the very same files: a Qwen2.5-VL-7B-shaped
# language GGUF and its mmproj GGUF written by `shardwise synth --spec qwen2vl7b --mmproj`, the same
# images (vl_bench.py images) and the same prompt text, interleaved per image and budget:
#   shardwise   run -m LM --mmproj MM --image IMG --prompt TEXT --vram-budget B (encoder, then language)
#   mtmd-cpu    llama-mtmd-cli --no-mmproj-offload -ngl N: the largest N whose CUDA buffers fit B
#   mtmd-gpu    llama-mtmd-cli (projector on the GPU) -ngl N: the largest N that fits B less the projector's
#               measured peak at that image, where the projector alone fits at all
#   artifact    the paper's implementation: llama-mtmd-cli -vto-off -vto-tile (projector weights streamed,
#               its attention tiled, its buffers freed before the language model's) -pipe-shard -mva B with
#               its CPU profile (PROFILES, as peers_bench.sh keeps it)
# 16 threads, flash attention on, 64 generated tokens, greedy. Each run's wall time (the file in the page
# cache; model loading included for every system alike) and its device peak, sampled by nvidia-smi every
# 50 ms (the process's memory less the idle GPU's, CUDA context included, for every system alike).
# One line per run in OUT/vl_peer_runs.tsv (scripts/analysis/vl_peer_row.py reads each log), logs in
# OUT/vl_peer_logs.tgz.
#   vl_peers.sh OUT [BUDGETS] [RESOLUTIONS]   Env: BUNDLE, PEERS (peers_bin.tar.xz), WORK (/tmp/vlpeers),
#   REPEATS (2), DTYPE (the language GGUF's: f16), DEADLINE_S (no new round after this; 480), RUN_TIMEOUT_S
#   (each run's limit; 300)
set -uo pipefail
out=${1:?usage: vl_peers.sh OUT [BUDGETS] [RESOLUTIONS]}
budgets=${2:-4G 8G 14.5G}
resolutions=${3:-480p 720p 1080p 1440p}
t_start=$(date +%s)
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/peer_env.sh"
work=${WORK:-/tmp/vlpeers}
reps=${REPEATS:-2}
deadline=${DEADLINE_S:-480}
run_timeout=${RUN_TIMEOUT_S:-300}
logs="$out/vl_peer_logs"
mkdir -p "$work" "$logs"
machine_facts "$out/machine.txt"
elapsed() { echo $(($(date +%s) - t_start)); }
prompt="Describe this image."
ctx=8192

file="$work/lm.${DTYPE:-f16}.gguf"
mm="$work/mmproj.gguf"
[ -s "$file" ] && [ -s "$mm" ] ||
  "$bin" synth --spec qwen2vl7b --dtype "${DTYPE:-f16}" --seed 1 -o "$file" --mmproj "$mm" 2> "$logs/synth.err" ||
  { echo "synth failed: $(tail -1 "$logs/synth.err")"; exit 2; }
[ -s "$work/images/1440p.png" ] || python3 scripts/gpu/vl_bench.py images "$work" > "$logs/images.log" 2>&1 ||
  { echo "images failed: $(tail -1 "$logs/images.log")"; exit 2; }
sync
echo "files: $(du -h "$file" | cut -f1) + $(du -h "$mm" | cut -f1) at $(elapsed) s"
source "$(dirname "$0")/peer_fit.sh"  # fit_ngl on the language GGUF (llama-cli, text only)

# peak_run LOG CMD...: runs CMD with nvidia-smi sampling GPU 0's used memory every 50 ms; prints the peak
# MiB above the idle GPU's.
idle_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
peak_run() {
  local log=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 50 > "$log.mem" 2>/dev/null &
  local smi=$!
  "$@" > "$log" 2>&1
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "rc=$rc peak_mib=$(sort -n "$log.mem" | tail -1 | awk -v i="$idle_mib" '{print $1 - i}')" >> "$log"
  rm -f "$log.mem"
  return $rc
}
mtmd() {  # LOG IMG ENV ARGS...
  local log=$1 img=$2 envs=$3; shift 3
  peak_run "$log" env $envs timeout -k 5 "$run_timeout" "$peerbin/llama-mtmd-cli" -m "$file" --mmproj "$mm" --image "$img" \
    -p "$prompt" -n 64 --temp 0 --ignore-eos -c $ctx -t 16 -fa "$@"
}
prof="$work/profiles"
mkdir -p "$prof"
cp -f "${PROFILES:-results/peers/profiles}"/*_results.txt "$prof/" 2>/dev/null
artifact_env="GGML_CUDA_PIPELINE_SHARDING=1 GGML_CUDA_REGISTER_HOST=1"
artifact_profiles="--cpu-profile $prof/concurrent_results.txt"
[ -s "$prof/gpu_results.txt" ] && artifact_profiles="$artifact_profiles --gpu-profile $prof/gpu_results.txt"
sw() {  # LOG IMG BUDGET
  peak_run "$1" timeout -k 5 "$run_timeout" "$bin" run -m "$file" --mmproj "$mm" --image "$2" --prompt "$prompt" -n 64 --greedy \
    --ignore-eos --ctx-size $ctx --device cuda --vram-budget "$3" --threads 16 --profile "$profile" --json
}
mib() { python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)G','$1'); print(int(float(m.group(1))*1024))"; }

tsv="$out/vl_peer_runs.tsv"
[ -s "$tsv" ] || printf "image\tbudget\tsystem\tconfig\trepeat\trc\twall_ms\tprompt_tokens\tencode_ms\tprefill_ms\tdecode_tps\tpeak_mib\n" > "$tsv"
record() {  # IMAGE BUDGET SYSTEM CONFIG REPEAT LOG WALL_MS
  python3 scripts/analysis/vl_peer_row.py "$@" | tee -a "$tsv"
}
timed() {  # runs "$@", sets wall (ms)
  local t0=$(date +%s%N)
  "$@"
  wall=$((($(date +%s%N) - t0) / 1000000))
}
# The projector's own peak per image (mmproj on the GPU, no language layers there), once.
declare -A proj_mib
for res in $resolutions; do
  mtmd "$logs/proj_$res.log" "$work/images/$res.png" "" -ngl 0
  proj_mib[$res]=$(grep -oP 'peak_mib=\K-?[0-9]+' "$logs/proj_$res.log" || echo 999999)
  echo "projector on the GPU at $res: ${proj_mib[$res]} MiB at $(elapsed) s"
done
declare -A ngl_cpu
for b in $budgets; do ngl_cpu[$b]=$(fit_ngl $ctx "$(mib "$b")"); echo "budget $b: -ngl ${ngl_cpu[$b]} (projector on the CPU)"; done

for rep in $(seq "$reps"); do
  [ "$(elapsed)" -gt "$deadline" ] && { echo "deadline: stopped before round $rep"; break; }
  for res in $resolutions; do
    img="$work/images/$res.png"
    for b in $budgets; do
      n="${res}_${b}_r$rep"
      timed sw "$logs/sw_$n.log" "$img" "$b"
      record "$res" "$b" shardwise auto "$rep" "$logs/sw_$n.log" $wall
      timed mtmd "$logs/cpu_$n.log" "$img" "" -ngl "${ngl_cpu[$b]}" --no-mmproj-offload
      record "$res" "$b" mtmd "cpu-mmproj -ngl ${ngl_cpu[$b]}" "$rep" "$logs/cpu_$n.log" $wall
      left=$(($(mib "$b") - ${proj_mib[$res]}))
      if [ $left -gt 0 ]; then
        ngl=$(fit_ngl $ctx $left)
        timed mtmd "$logs/gpu_$n.log" "$img" "" -ngl "$ngl"
        record "$res" "$b" mtmd "gpu-mmproj -ngl $ngl" "$rep" "$logs/gpu_$n.log" $wall
      fi
      timed mtmd "$logs/art_$n.log" "$img" "$artifact_env" -vto-off -vto-tile -pipe-shard -mva "$(mib "$b")" $artifact_profiles
      record "$res" "$b" artifact "-vto-off -vto-tile -pipe-shard -mva $(mib "$b")" "$rep" "$logs/art_$n.log" $wall
    done
  done
  echo "round $rep done at $(elapsed) s"
done
tar -C "$out" -czf "$out/vl_peer_logs.tgz" vl_peer_logs && rm -rf "$logs"
