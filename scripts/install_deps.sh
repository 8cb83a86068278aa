#!/usr/bin/env bash
# Installs the Debian packages shardwise builds and tests with. Idempotent: apt runs only when a
# package is missing. Works as root or through sudo.
set -euo pipefail

PKGS=(
  build-essential cmake make git pkg-config ccache clang-format
  libeigen3-dev libopenblas-dev libyaml-cpp-dev catch2 libbenchmark-dev nlohmann-json3-dev libcli11-dev
  libgfortran-12-dev
  libpcre2-dev libutf8proc-dev libboost-dev libjpeg62-turbo-dev libpng-dev
  pybind11-dev python3-pybind11 python3-dev python3-numpy python3-matplotlib python3-pandas
  python3-yaml python3-pytest jupyter-nbconvert python3-nbclient python3-ipykernel
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
log=${TMPDIR:-/tmp}/shardwise-install-deps.log
echo "install_deps: installing ${#missing[@]} Debian packages (${missing[*]}); log: $log"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
start=$(date +%s)
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } > "$log" 2>&1; then
  tail -20 "$log"
  echo "install_deps: apt-get failed (log: $log)"
  exit 1
fi
echo "install_deps: done in $(( $(date +%s) - start )) s"
