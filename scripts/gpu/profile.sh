#!/usr/bin/env bash
# Runs on the GPU machine with the bundle from scripts/gpu/bundle.sh: the full profile of the machine
# (`shardwise profile`, threads 1 and 16, PCIe uncapped and capped at 16 GB/s), then its validation on
# cases the grid never saw (`shardwise profile --validate`). Writes into OUT: h200-host.profile.json
# (PROFILE_NAME=h100-host: h100-host.profile.json), profile.log, validation.txt, validation.json,
# validation.log (each case as it ends), machine.txt. VALIDATE=0 skips the validation.
#   profile.sh OUT
set -uo pipefail
out=${1:?usage: profile.sh OUT}
mkdir -p "$out"
root=/tmp/shardwise-bundle
if [ ! -x "$root/bin/shardwise" ]; then
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf build-gpu/bundle.tar.xz || { echo "no build-gpu/bundle.tar.xz"; exit 2; }
fi
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
bin="$root/bin/shardwise"
{
  echo "date: $(date -u +%FT%TZ)"; echo "revision: $(tr '\n' ' ' < "$root/REVISION" 2>/dev/null || echo unknown)"
  lscpu | grep -E "Model name|^CPU\(s\)|NUMA node|Hypervisor|Thread\(s\) per core"
  echo "transparent_hugepage: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "cpu time since boot (user nice system idle iowait irq softirq steal): $(head -1 /proc/stat)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
echo "== profile"
start=$(date +%s)
timeout ${PROFILE_TIMEOUT:-420} "$bin" profile --out "$out/${PROFILE_NAME:-h200-host}.profile.json" --threads 1,16 --pcie-cap none,16GB/s --device cuda \
  > "$out/profile_summary.json" 2> "$out/profile.log"
echo "rc=$? in $(( $(date +%s) - start )) s"; tail -3 "$out/profile.log"; cat "$out/profile_summary.json"
ls -la "$out/${PROFILE_NAME:-h200-host}.profile.json"
[ "${VALIDATE:-1}" = 0 ] && { echo "== validation skipped (VALIDATE=0)"; exit 0; }
echo "== validation"
start=$(date +%s)
timeout ${VALIDATE_TIMEOUT:-300} "$bin" profile --validate "$out/${PROFILE_NAME:-h200-host}.profile.json" --json-out "$out/validation.json" --no-progress \
  > "$out/validation.txt" 2> "$out/validation.log"
echo "rc=$? in $(( $(date +%s) - start )) s"
grep -v "^  \(cpu\|gpu\|contention\) " "$out/validation.txt" | head -40
