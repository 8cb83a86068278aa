#!/usr/bin/env bash
# GPU machine: the vision-language table. A Qwen2.5-VL-7B-shaped model with random f16 weights and test
# images at 480p/720p/1080p/1440p (scripts/gpu/vl_bench.py make), then, as PARTS says:
#   hf        HF transformers with the whole model on the GPU (vl_bench.py hf): encoder and end-to-end
#             latency, torch's peak memory
#   check     the encoder on CUDA against the CPU encoder at 480p (max |difference| / max |value|)
#   encoder   `shardwise vision --device cuda` for each image and budget: the plan, encode time, peak; and
#             `shardwise plan --image-size` for the same: the planner's predicted encode time
#   e2e       `shardwise run --image` (encode + prefill + 64 tokens) for each image and budget, REPEATS
#             rounds interleaved (every image and budget once per round)
# Output: OUT/vl_bench/ (JSON per run, logs, machine.txt).
#   vl_bench.sh OUT [BUDGETS] [RESOLUTIONS]     Env: BUNDLE, WORK (/tmp/vl7b), REPEATS (1), PARTS
#   (default "hf check encoder e2e"), THREADS (16), MAKE (make, or make-vision: the tower alone, enough for
#   check and encoder)
set -uo pipefail
out=${1:?usage: vl_bench.sh OUT [BUDGETS] [RESOLUTIONS]}
budgets=${2:-4G 8G 14.5G}
resolutions=${3:-480p 720p 1080p 1440p}
source "$(dirname "$0")/bundle_env.sh"
work=${WORK:-/tmp/vl7b}
reps=${REPEATS:-1}
parts=" ${PARTS:-hf check encoder e2e} "
threads=${THREADS:-16}
dir="$out/vl_bench"
mkdir -p "$dir"
machine_facts "$dir/machine.txt"
fails=0
has() { [[ "$parts" == *" $1 "* ]]; }

if [ ! -s "$work/prompts.json" ]; then
  timeout 300 python3 scripts/gpu/vl_bench.py "${MAKE:-make}" "$work" > "$dir/make.log" 2>&1 ||
    { echo "FAILED: making the model"; tail -20 "$dir/make.log"; exit 2; }
  tail -2 "$dir/make.log"
fi
cp "$work/prompts.json" "$dir/prompts.json"
ids() { python3 -c "import json,sys; print(','.join(map(str, json.load(open('$work/prompts.json'))['$1']['shardwise'])))"; }

if has hf; then
  timeout 420 python3 scripts/gpu/vl_bench.py hf "$work" "$dir/hf.json" > "$dir/hf.log" 2>&1 ||
    { fails=$((fails + 1)); echo "hf failed:"; tail -5 "$dir/hf.log"; }
  grep -E "^(480p|720p|1080p|1440p) " "$dir/hf.log"
fi

if has check; then
  timeout 120 "$bin" vision -m "$work" --image "$work/images/480p.png" --out "$dir/enc_cpu.npy" -t "$threads" \
    > "$dir/check_cpu.log" 2>&1
  timeout 120 "$bin" vision -m "$work" --image "$work/images/480p.png" --out "$dir/enc_cuda.npy" --device cuda \
    --vram-budget 2G > "$dir/check_cuda.log" 2>&1
  python3 -c "
import numpy as np
a, b = np.load('$dir/enc_cpu.npy'), np.load('$dir/enc_cuda.npy')
print('check 480p: cuda vs cpu max|d|/max|x| = %.3g over %d values' % (np.abs(a - b).max() / np.abs(a).max(), a.size))
" | tee "$dir/check.txt" || fails=$((fails + 1))
  rm -f "$dir/enc_cpu.npy" "$dir/enc_cuda.npy"
fi

if has encoder; then
  for res in $resolutions; do
    size=$(python3 -c "import json; p=json.load(open('$work/prompts.json'))['$res']; print('%dx%d' % (p['width'], p['height']))")
    for b in $budgets 2G; do
      # The planner's prediction of the same encode (on this lease's profile where PROFILE names one).
      timeout 60 "$bin" plan -m "$work" --profile "$profile" --vram-budget "$b" --image-size "$size" --json \
        > "$dir/plan_${res}_$b.json" 2> "$dir/plan_${res}_$b.err" || true
      timeout 120 "$bin" vision -m "$work" --image "$work/images/$res.png" --device cuda --vram-budget "$b" --json \
        > "$dir/enc_${res}_$b.json" 2> "$dir/enc_${res}_$b.err" || fails=$((fails + 1))
      echo "encoder $res $b: $(tail -c 300 "$dir/enc_${res}_$b.json" | grep -o '"encode_ms":[0-9.]*' | head -1) $(grep -o 'vision encoder: [a-z-]*, [0-9]* patches, [0-9]* of [0-9]* blocks' "$dir/enc_${res}_$b.err")"
    done
  done
fi

if has e2e; then
  for rep in $(seq "$reps"); do
    for res in $resolutions; do
      for b in $budgets; do
        name="e2e_${res}_${b}_r$rep"
        t0=$(date +%s%N)
        timeout -k 5 240 "$bin" run -m "$work" --image "$work/images/$res.png" --tokens "$(ids "$res")" -n 64 \
          --greedy --ignore-eos --device cuda --vram-budget "$b" --threads "$threads" --profile "$profile" --json \
          > "$dir/$name.json" 2> "$dir/$name.err"
        rc=$?
        echo "$name rc=$rc wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a "$dir/walls.txt"
        [ $rc -eq 0 ] || { fails=$((fails + 1)); tail -c 400 "$dir/$name.err"; }
      done
    done
  done
fi
echo "fails=$fails"
exit $(( fails > 0 ))
