#!/usr/bin/env bash
# Builds lab benches, dev/NAME/bench.cpp, against the product's libraries of a CUDA build
# (`make gpu-build`): compiled with the CLI's flags and linked with the CLI's link line, each bench's object
# in place of the CLI's own. Output: build-gpu/dev/NAME (BUILD=folder for another build).
#   dev/build.sh NAME...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
cli=$build/cli/CMakeFiles/shardwise.dir
[ -f "$cli/link.txt" ] || { echo "dev/build.sh: no $cli/link.txt (run make gpu-build first)"; exit 2; }
[ $# -gt 0 ] || { echo "usage: dev/build.sh NAME... (folders of dev/ with a bench.cpp)"; exit 2; }
cmake --build "$build" -j "${JOBS:-2}" --target shardwise
flags() { sed -n "s/^CXX_$1 = //p" "$cli/flags.make"; }
mkdir -p "$build/dev"
for name in "$@"; do
  src=dev/$name/bench.cpp
  [ -f "$src" ] || { echo "dev/build.sh: no $src"; exit 2; }
  obj=$PWD/$build/dev/$name.o
  # shellcheck disable=SC2046  # the flags are words
  c++ $(flags DEFINES) $(flags INCLUDES) $(flags FLAGS) -c "$src" -o "$obj"
  link=$(sed -e 's#CMakeFiles/shardwise\.dir/[a-z_]*\.cpp\.o##g' -e "s#-o shardwise #$obj -o ../dev/$name #" \
    "$cli/link.txt")
  (cd "$build/cli" && eval "$link")
  echo "$build/dev/$name"
done
