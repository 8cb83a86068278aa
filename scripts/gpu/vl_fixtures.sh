#!/usr/bin/env bash
# GPU machine (torch, transformers and Pillow are there; the script itself runs on the CPU): the
# Qwen2.5-VL reference fixtures of tests/fixtures/vl, made by scripts/fixtures/make_vl_fixtures.py, into
# OUT/vl_fixtures.tgz (unpack with `tar -C tests/fixtures -xzf vl_fixtures.tgz`) and OUT/make_vl_fixtures.log.
# The archive is written even when a check fails; the exit status is the script's.
#   vl_fixtures.sh OUT
set -uo pipefail
out=${1:?usage: vl_fixtures.sh OUT_DIR}
mkdir -p "$out/vl"
PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES= timeout 280 python3 scripts/fixtures/make_vl_fixtures.py "$out/vl" 2>&1 |
  tee "$out/make_vl_fixtures.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "FAILED: make_vl_fixtures.py ran past 280 s" | tee -a "$out/make_vl_fixtures.log"
tar -C "$out" -czf "$out/vl_fixtures.tgz" vl
rm -rf "$out/vl"
echo "rc=$rc"
exit "$rc"
