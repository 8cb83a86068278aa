#!/bin/sh
# Executes every notebook headless into a temporary folder (nothing in the repository changes).
set -eu
export PYDEVD_DISABLE_FILE_VALIDATION=1
dir=${1:?usage: run_notebooks.sh NOTEBOOK_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for nb in "$dir"/*.ipynb; do
  echo "== $(basename "$nb")"
  /usr/bin/python3 -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=300 \
    --ExecutePreprocessor.kernel_name=python3 --output-dir "$tmp" "$nb"
done
