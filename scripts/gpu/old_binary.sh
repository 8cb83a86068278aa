#!/usr/bin/env bash
# Builds `shardwise` of an older revision for the GPU machine (a git worktree, the same CUDA build as
# scripts/gpu/bundle.sh) and writes it stripped and xz-compressed to build-gpu/shardwise_<rev>.xz, for
# scripts/gpu/ab_binaries.sh (carry it beside the bundle). Takes as long as a full CUDA build.
#   old_binary.sh REV
set -euo pipefail
rev=${1:?usage: old_binary.sh REV}
cd "$(dirname "$0")/../.."
short=$(git rev-parse --short "$rev")
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"' EXIT
git worktree add --detach "$wt" "$short" >/dev/null
(cd "$wt" && make gpu-build >/dev/null)
mkdir -p build-gpu
strip -o "build-gpu/shardwise_$short" "$wt/build-gpu/cli/shardwise"
xz -9 -T2 -f "build-gpu/shardwise_$short"
ls -la "build-gpu/shardwise_$short.xz"
