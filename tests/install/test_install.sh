#!/bin/sh
# `cmake --install` into a temporary prefix gives a working shardwise binary and an importable
# Python package with its compiled part, and the installed `report` finds its Python package with
# no source tree or build folder in reach.
# usage: test_install.sh BUILD_DIR SMOKE_RESULTS.jsonl
set -eu
build=${1:?usage: test_install.sh BUILD_DIR SMOKE_RESULTS}
smoke=${2:?usage: test_install.sh BUILD_DIR SMOKE_RESULTS}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > "$prefix/install.log"
"$prefix/bin/shardwise" --version
pkg=$(sed -n 's/^SHARDWISE_PYTHON_INSTALL_DIR:STRING=//p' "$build/CMakeCache.txt")
test -f "$prefix/$pkg/shardwise/__init__.py"
cd "$prefix"  # away from the source tree
PYTHONPATH="$prefix/$pkg" /usr/bin/python3 -c "
import shardwise
assert shardwise.HAVE_NATIVE, 'the installed package lacks its compiled part'
assert shardwise.__file__.startswith('$prefix'), shardwise.__file__
print('import shardwise:', shardwise.__file__)
print(shardwise.parse_size('4G'))"
env -u SHARDWISE_PYTHONPATH "$prefix/bin/shardwise" report "$smoke" --out "$prefix/report" > /dev/null
test -s "$prefix/report/report.md"
echo "install: ok"
