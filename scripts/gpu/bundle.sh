#!/usr/bin/env bash
# Builds the portable binaries for the GPU machine (docs/GPU_MACHINE.md) and packs them, stripped, into
# build-gpu/bundle.tar.xz (xz shares the statically linked OpenBLAS between binaries, so the
# bundle stays a few MB). Pass the bundle to the device call's `carry`. BINS="cli/shardwise ..." packs
# only those binaries (a smaller bundle for calls that need no tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
make gpu-build
stage=build-gpu/stage
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
for b in ${BINS:-cli/shardwise tests/test_core tests/test_executor tests/test_cpu_kernels tests/test_cli tests/test_gpu tests/test_tokenizer \
         microbench/shardwise_bench_cpu}; do
  [ -f "build-gpu/$b" ] && strip -o "$stage/bin/$(basename "$b")" "build-gpu/$b"
done
# Google Benchmark exists only as a shared library here; ship it next to the binaries.
bm=""
[ -f "$stage/bin/shardwise_bench_cpu" ] && bm=$(ldd "$stage/bin/shardwise_bench_cpu" 2>/dev/null | awk '/libbenchmark/ {print $3}')
if [ -n "$bm" ]; then cp "$bm" "$stage/lib/"; fi
# The device machine gets the working tree without git: record the revision the binaries come from.
{ git rev-parse HEAD; git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)"; } > "$stage/REVISION" || true
tar -C "$stage" -cf - bin lib REVISION | xz -9 -T2 > build-gpu/bundle.tar.xz
rm -rf "$stage"
ls -la build-gpu/bundle.tar.xz
