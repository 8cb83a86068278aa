#!/usr/bin/env bash
# Runs on the GPU machine with the bundle from scripts/gpu/bundle.sh (nothing is built there):
# the test suites (the CPU kernel suite at every ISA level the host offers, the GPU suite),
# the CPU kernel benchmarks, and CPU-only generation on the peers' models. Writes into OUT.
set -uo pipefail
out=${1:?usage: foundation.sh OUT_DIR [tests,bench,runs]}
parts=${2:-tests,bench,runs}
want() { [[ ",$parts," == *",$1,"* ]]; }
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" "$out/logs"
tar -C "$root" -xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
export SHARDWISE_FIXTURES="$PWD/tests/fixtures" SHARDWISE_BIN="$root/bin/shardwise" OPENBLAS_NUM_THREADS=1
bin="$root/bin"
rev=$(tr '\n' ' ' < "$root/REVISION" 2>/dev/null || echo unknown)
{
  echo "date: $(date -u +%FT%TZ)"; echo "revision: $rev"
  lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:/Flags (avx512*, amx*):/;' | \
    awk '/Flags/ {n=split($0,a," "); s=""; for(i=1;i<=n;i++) if (a[i] ~ /avx512|amx|f16c|fma/) s=s" "a[i]; print "flags:" s; next} {print}'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

status=0
run() {  # name, command...
  local name=$1; shift
  echo "== $name"
  if "$@" > "$out/logs/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (rc=$?)"; status=1; tail -20 "$out/logs/$name.log"; fi
}
if want tests; then
  run test_core "$bin/test_core"
  run test_executor "$bin/test_executor"
  run test_tokenizer "$bin/test_tokenizer"
  run test_cli "$bin/test_cli"
  run test_gpu "$bin/test_gpu"
  for isa in scalar avx2 avx512; do run "test_cpu_kernels_$isa" env SHARDWISE_ISA=$isa "$bin/test_cpu_kernels" -s; done
  grep -h -E "not available|not tested" "$out"/logs/test_cpu_kernels_*.log | sort | uniq -c
fi

if want bench; then
echo "== CPU kernel benchmarks (1 and 16 threads)"
"$bin/shardwise_bench_cpu" --threads=1,16 --hugepages --benchmark_format=console \
  --benchmark_out="$out/bench_cpu.json" --benchmark_out_format=json > "$out/logs/bench_cpu.log" 2>&1 || status=1
grep -E "decode|prefill|stream" "$out/logs/bench_cpu.log" | grep -v "^-" | head -40
fi

if want runs; then
echo "== CPU-only generation (the peers' protocol: 960-token prompt, 16 threads)"
prompt=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(3, 32000)) for _ in range(960)))")
for m in "synthetic:nemo8b?dtype=f16&seed=1" "synthetic:qwen30b?dtype=q4_0&seed=1"; do
  name=$(echo "$m" | sed 's/synthetic://; s/[?&=]/_/g')
  "$bin/shardwise" run --model "$m" --tokens "$prompt" -n 16 --greedy --threads 16 --json \
    > "$out/run_cpu_$name.json" 2> "$out/logs/run_cpu_$name.log" || status=1
  python3 -c "import json,sys; j=json.load(open('$out/run_cpu_$name.json')); print('$name', {k: round(j[k],1) for k in ('load_ms','ttft_ms','prompt_tokens_per_s','decode_tokens_per_s')})" || status=1
done
fi
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
exit $status
