#!/usr/bin/env bash
# GPU machine (torch and transformers are there): the HF reference fixtures of tests/fixtures/hf, made
# by scripts/fixtures/make_hf_fixtures.py, into OUT/hf_fixtures.tgz.
set -euo pipefail
out=${1:?usage: fixtures.sh OUT_DIR [MODEL...]}
mkdir -p "$out/hf"
PYTHONUNBUFFERED=1 python3 scripts/fixtures/make_hf_fixtures.py "$out/hf" "${@:2}" 2>&1 | tee "$out/make_fixtures.log"
tar -C "$out" -czf "$out/hf_fixtures.tgz" hf
rm -rf "$out/hf"
