#!/usr/bin/env bash
# Fails when a C++/CUDA source differs from the committed .clang-format (make test runs it). Lists the
# files; `clang-format -i FILE` fixes one. Test fixtures (third-party text) are not checked.
set -uo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  files=$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fixtures/')
else
  files=$(find . -path ./tests/fixtures -prune -o -path './build*' -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
bad=0
for f in $files; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then
    echo "not formatted: $f"
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "format: $(echo "$files" | wc -l) files match .clang-format"
exit $bad
