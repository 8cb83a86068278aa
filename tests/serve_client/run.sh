#!/bin/sh
# tests/serve_client/run.sh BIN WORK — the official openai npm client against `shardwise serve BIN`
# (CTest runs it in `make test`). Installs the client pinned in package-lock.json with `npm ci` into
# WORK (a build folder: nothing lands in the source tree), then runs test_openai_client.mjs. Without
# node (18 or later) and npm, or when npm cannot install the client (no registry), it prints why and
# exits 77, which CTest reports as skipped.
set -eu
bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
skip() {
  echo "serve_client: skipped: $*"
  exit 77
}
command -v node > /dev/null 2>&1 && command -v npm > /dev/null 2>&1 ||
  skip "node and npm are not both installed (the openai client test needs them)"
node -e 'process.exit(parseInt(process.versions.node, 10) >= 18 ? 0 : 1)' ||
  skip "node $(node --version) is older than 18, the oldest the openai client supports"
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/test_openai_client.mjs" "$work/"
# npm ci once per lock file: the copy beside node_modules says what is installed.
if ! cmp -s "$work/package-lock.json" "$work/installed-lock.json" 2> /dev/null || [ ! -d "$work/node_modules/openai" ]; then
  (cd "$work" && npm ci --no-audit --no-fund --ignore-scripts > npm-ci.log 2>&1) ||
    skip "npm ci could not install the pinned openai client (no registry?); log: $work/npm-ci.log"
  cp "$work/package-lock.json" "$work/installed-lock.json"
fi
cd "$work"
exec node test_openai_client.mjs "$bin"
