# Sourced by the GPU machine's peer scripts after peer_env.sh: llama.cpp's runs and the fitting of its
# offload to a VRAM budget. Needs `file` (the GGUF file), `work` (llama-cli's working folder), `logs`
# (probe logs) and `peerbin`; sets `layers` (the file's layer count).
#   llama LOG CTX PROMPT_FILE N_PREDICT ENV ARGS...   a llama-cli run
#   cuda_mib LOG                                     its CUDA buffers (model + KV + compute), MiB
#   fit_ngl CTX BUDGET_MIB                           the largest -ngl that fits
#   fit_ncmoe CTX BUDGET_MIB                         MoE: the smallest --n-cpu-moe N (with -ngl 99) that fits, or none
# PROBE_ARGS (env) are added to every probe.
# llama-cli ARGS... > log; the common arguments of every peer run.
llama() {  # LOG CTX PROMPT_FILE N_PREDICT ENV ARGS...
  local log=$1 ctx=$2 pf=$3 n=$4 envs=$5; shift 5
  (cd "$work" && env $envs timeout -k 5 150 "$peerbin/llama-cli" -m "$file" -c "$ctx" -f "$pf" -n "$n" --temp 0 \
    --ignore-eos -no-cnv --no-display-prompt -ub 1024 -t 16 -fa "$@" < /dev/null) > "$log" 2>&1
}
cuda_mib() { grep -oP "CUDA\d+ (model|KV|compute) buffer size\s*=\s*\K[\d.]+" "$1" | awk '{s+=$1} END {printf "%.0f", s}'; }
probe() {  # CTX ARGS... -> the CUDA MiB of that configuration (a one-token run; PROBE_ARGS added)
  local ctx=$1; shift
  local log="$logs/probe_${ctx}_$(echo "${PROBE_ARGS:-} $*" | tr -c 'a-zA-Z0-9' '_').log"
  # The same configuration probed once per call: fits for several budgets share their probes.
  [ -s "$log.mib" ] && { cat "$log.mib"; return; }
  (cd "$work" && timeout -k 5 120 "$peerbin/llama-cli" -m "$file" -c "$ctx" -p hi -n 1 --temp 0 -no-cnv --no-warmup \
    -ub 1024 -t 16 -fa ${PROBE_ARGS:-} "$@" < /dev/null) > "$log" 2>&1
  local m=$(cuda_mib "$log")
  echo "${m:-999999}" | tee "$log.mib"
}
layers=$("$bin" info --json "$file" | python3 -c "import json,sys; print(json.load(sys.stdin)['num_hidden_layers'])")
fit_ngl() {  # CTX BUDGET_MIB -> the largest -ngl whose buffers fit (0..layers+1)
  local ctx=$1 bud=$2 lo=0 hi=$((layers + 1))
  [ "$(probe "$ctx" -ngl $hi)" -le "$bud" ] && { echo $hi; return; }
  while [ $((hi - lo)) -gt 1 ]; do  # lo fits (or is 0), hi does not
    local mid=$(((lo + hi) / 2))
    if [ "$(probe "$ctx" -ngl $mid)" -le "$bud" ]; then lo=$mid; else hi=$mid; fi
  done
  echo $lo
}
fit_ncmoe() {  # CTX BUDGET_MIB -> the smallest --n-cpu-moe N with -ngl 99 that fits, or "none"
  local ctx=$1 bud=$2 lo=0 hi=$layers
  [ "$(probe "$ctx" -ngl 99 --n-cpu-moe $hi)" -le "$bud" ] || { echo none; return; }
  [ "$(probe "$ctx" -ngl 99 --n-cpu-moe 0)" -le "$bud" ] && { echo 0; return; }
  while [ $((hi - lo)) -gt 1 ]; do  # hi fits, lo does not
    local mid=$(((lo + hi) / 2))
    if [ "$(probe "$ctx" -ngl 99 --n-cpu-moe $mid)" -le "$bud" ]; then hi=$mid; else lo=$mid; fi
  done
  echo $hi
}
