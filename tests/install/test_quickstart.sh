#!/bin/sh
# README.md's quick start works by copy-paste: each command of its first code block runs as written
# from a folder whose build/ is BUILD_DIR (a link), except `make ...` (the build itself, done) and the
# notebooks (CTest's python_notebooks runs that line from the repository).
# usage: test_quickstart.sh README.md BUILD_DIR
set -eu
readme=${1:?usage: test_quickstart.sh README.md BUILD_DIR}
build=$(cd "${2:?usage: test_quickstart.sh README.md BUILD_DIR}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"
# The first code block after the "## Quick start" heading.
awk '/^## Quick start/ {on = 1; next} on && /^```/ {if (inblock) exit; inblock = 1; next} inblock' "$readme" \
  > "$work/commands.txt"
test -s "$work/commands.txt" || { echo "no Quick start code block in $readme"; exit 1; }
cd "$work"
n=0
while IFS= read -r line; do
  cmd=$(printf '%s\n' "$line" | sed 's/[[:space:]][[:space:]]*#[[:space:]].*$//')  # a trailing "# comment"
  case $cmd in
    "" | make | "make "* | *run_notebooks.sh*) continue ;;
  esac
  echo "\$ $cmd"
  sh -c "$cmd" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; echo "quick start: this command failed: $cmd"; exit 1; }
  n=$((n + 1))
done < "$work/commands.txt"
test "$n" -ge 4 || { echo "quick start: only $n commands ran"; exit 1; }
echo "quick start: $n commands ok"
