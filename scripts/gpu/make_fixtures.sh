#!/usr/bin/env bash
# Runs on the GPU machine: builds the HF reference fixtures into $1 and tars them.
set -euo pipefail
out=${1:?usage: make_fixtures.sh OUT_DIR}
mkdir -p "$out/hf"
PYTHONUNBUFFERED=1 python3 scripts/fixtures/make_hf_fixtures.py "$out/hf" 2>&1 | tee "$out/make_fixtures.log"
tar -C "$out" -czf "$out/hf_fixtures.tgz" hf
rm -rf "$out/hf"
