#!/bin/sh
# Executes every notebook headless into a temporary folder (nothing in the repository changes), with
# /usr/bin/python3, the Python the compiled module is built for. The kernel runs in the notebooks'
# folder, so relative PYTHONPATH entries are made absolute first (from the folder this is run in):
#   PYTHONPATH=build/python sh tests/python/run_notebooks.sh       (from the repository, after `make`)
# usage: run_notebooks.sh [NOTEBOOK_DIR]   (default: the repository's notebooks/)
set -eu
export PYDEVD_DISABLE_FILE_VALIDATION=1
dir=${1:-$(dirname "$0")/../../notebooks}
abs=""
set -f
old_ifs=$IFS
IFS=:
for p in ${PYTHONPATH:-}; do
  case $p in
    /*) ;;
    *) p="$PWD/$p" ;;
  esac
  abs="${abs:+$abs:}$p"
done
IFS=$old_ifs
set +f
[ -z "$abs" ] || export PYTHONPATH="$abs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for nb in "$dir"/*.ipynb; do
  t0=$(date +%s)
  echo "== $(basename "$nb")"
  /usr/bin/python3 -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=300 \
    --ExecutePreprocessor.kernel_name=python3 --output-dir "$tmp" "$nb"
  echo "   executed in $(( $(date +%s) - t0 )) s"
done
