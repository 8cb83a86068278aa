#!/usr/bin/env bash
# GPU machine: where a quantised model's prefill spends its GPU time, and how the quantised GEMM kernel
# uses the SM. For each block type: (1) every kernel of nemo8b's 960-token prefill with the whole model on the
# GPU, timed one by one under Nsight Compute (OUT/prefill_TYPE.kernels.csv, summary in OUT/summary.md);
# (2) Nsight Compute's full section set for two of the prefill's quant_gemm launches (OUT/detail_TYPE.csv);
# (3) for the same launches, why warps wait (stall reasons per issued instruction) and how busy the tensor,
# FMA and shared-memory pipes are (OUT/stalls_TYPE.csv, printed).
#   dev/quant_gemm/profile.sh OUT [TYPES...]     (default q4_K q6_K)    Env: BUNDLE
set -uo pipefail
out=${1:?usage: profile.sh OUT [TYPES...]}
shift
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_K q6_K)
source "$(dirname "$0")/../../scripts/gpu/bundle_env.sh"
mkdir -p "$out"
machine_facts "$out/machine.txt"
ncu=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 2; }
ids=$(python3 scripts/analysis/random_tokens.py 960 960 32000)
for t in "${types[@]}"; do
  args=(run --model "synthetic:nemo8b?dtype=$t&seed=1" --tokens "$ids" -n 2 --greedy --threads 16 --ctx 1024
        --device cuda --vram-budget 40G --profile "$profile" --json --profiler-runs 0:1)
  timeout 200 "$ncu" --profile-from-start off --metrics gpu__time_duration.sum --csv --cache-control none \
    --clock-control none "$bin" "${args[@]}" > "$out/prefill_$t.csv" 2> "$out/prefill_$t.err"
  python3 scripts/analysis/ncu_kernels.py "$out/prefill_$t.csv" "$out/prefill_$t.kernels.csv" && rm -f "$out/prefill_$t.csv"
  { echo "## $t"; python3 scripts/analysis/kernel_summary.py "$out/prefill_$t.kernels.csv" --by-grid --top 12; } >> "$out/summary.md"
  timeout 200 "$ncu" --profile-from-start off --kernel-name regex:quant_gemm_kernel --launch-skip 6 --launch-count 2 \
    --set full --csv --page details "$bin" "${args[@]}" > "$out/detail_$t.csv" 2> "$out/detail_$t.err"
  rc=$?
  echo "$t: $(wc -l < "$out/prefill_$t.kernels.csv") kernels, detail rc=$rc"
  stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier short_scoreboard \
    long_scoreboard mio_throttle math_pipe_throttle wait not_selected lg_throttle dispatch_stall no_instruction \
    selected)
  timeout 200 "$ncu" --profile-from-start off --kernel-name regex:quant_gemm_kernel --launch-skip 6 --launch-count 2 \
    --metrics "${stalls}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed" \
    --csv "$bin" "${args[@]}" > "$out/stalls_$t.csv" 2> "$out/stalls_$t.err"
  grep '^"' "$out/stalls_$t.csv" | python3 -c "
import csv, sys
for r in csv.DictReader(sys.stdin):
    print('$t', r['ID'], r['Metric Name'].replace('smsp__average_warps_issue_stalled_', 'stall ').replace('_per_issue_active.ratio', ''), r['Metric Value'])"
done
cat "$out/summary.md"
