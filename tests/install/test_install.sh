#!/bin/sh
# `cmake --install` into a temporary prefix gives a working shardwise binary and an importable
# Python package with its compiled part; the commands it prints (the binary's --help, the Python
# line with what to set) work as printed, away from the source tree; and the installed `report` finds
# its Python package with no source tree or build folder in reach.
# usage: test_install.sh BUILD_DIR SMOKE_RESULTS.jsonl
set -eu
build=$(cd "${1:?usage: test_install.sh BUILD_DIR SMOKE_RESULTS}" && pwd)
smoke=$(cd "$(dirname "${2:?usage: test_install.sh BUILD_DIR SMOKE_RESULTS}")" && pwd)/$(basename "$2")
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > "$prefix/install.log" 2>&1 || { cat "$prefix/install.log"; exit 1; }
cd "$prefix"  # away from the source tree
"$prefix/bin/shardwise" --version
"$prefix/bin/shardwise" --help > /dev/null
pkg=$(sed -n 's/^SHARDWISE_PYTHON_INSTALL_DIR:STRING=//p' "$build/CMakeCache.txt")
test -f "$prefix/$pkg/shardwise/__init__.py"

# What the install printed: the binary, and the Python line to copy.
sed -n '/^shardwise installed under/,$p' "$prefix/install.log" > "$prefix/printed.txt"
cat "$prefix/printed.txt"
grep -qF "binary:  $prefix/bin/shardwise" "$prefix/printed.txt" || { echo "the binary's path was not printed"; exit 1; }
try=$(sed -n 's/^  binary: .*(try: \(.*\))$/\1/p' "$prefix/printed.txt")
sh -c "$try" > /dev/null || { echo "the printed command failed: $try"; exit 1; }
py=$(sed -n 's/^  Python:  //p' "$prefix/printed.txt" | sed 's/    (.*//')
case $py in
  *"import shardwise"*) ;;
  *) echo "no Python line printed"; exit 1 ;;
esac
# Run as printed (PYTHONPATH unset first), with checks appended to its -c program.
check="; assert shardwise.HAVE_NATIVE, 'the installed package lacks its compiled part'"
check="$check; assert shardwise.__file__.startswith('$prefix/'), shardwise.__file__"
check="$check; print('import shardwise:', shardwise.__file__, shardwise.parse_size('4G'))"
cmd=$(printf '%s\n' "$py" | sed "s|\"import shardwise\"|\"import shardwise$check\"|")
env -u PYTHONPATH sh -c "$cmd" || { echo "the printed Python line failed: $py"; exit 1; }

env -u SHARDWISE_PYTHONPATH "$prefix/bin/shardwise" report "$smoke" --out "$prefix/report" > "$prefix/report.log" 2>&1 \
  || { cat "$prefix/report.log"; exit 1; }
test -s "$prefix/report/report.md"
echo "install: ok"
