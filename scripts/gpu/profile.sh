#!/usr/bin/env bash
# GPU machine: the full profile of the machine
# (`shardwise profile`, threads 1 and 16, PCIe uncapped and capped at 16 GB/s), then its validation on
# cases the grid never saw (`shardwise profile --validate`). Writes into OUT: CARD.profile.json (h100-host or
# h200-host by the card found; PROFILE_NAME=NAME: NAME.profile.json), profile.log, validation.txt, validation.json,
# validation.log (each case as it ends), machine.txt. VALIDATE=0 skips the validation.
#   profile.sh OUT
set -uo pipefail
out=${1:?usage: profile.sh OUT}
mkdir -p "$out"
source "$(dirname "$0")/bundle_env.sh"
machine_facts "$out/machine.txt"
{ echo "transparent_hugepage: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "cpu time since boot (user nice system idle iowait irq softirq steal): $(head -1 /proc/stat)"; } >> "$out/machine.txt"
cat "$out/machine.txt"
echo "== profile"
start=$(date +%s)
timeout ${PROFILE_TIMEOUT:-420} "$bin" profile --out "$out/${PROFILE_NAME:-$card}.profile.json" --threads 1,16 --pcie-cap none,16GB/s --device cuda \
  > "$out/profile_summary.json" 2> "$out/profile.log"
echo "rc=$? in $(( $(date +%s) - start )) s"; tail -3 "$out/profile.log"; cat "$out/profile_summary.json"
ls -la "$out/${PROFILE_NAME:-$card}.profile.json"
[ "${VALIDATE:-1}" = 0 ] && { echo "== validation skipped (VALIDATE=0)"; exit 0; }
echo "== validation"
start=$(date +%s)
timeout ${VALIDATE_TIMEOUT:-300} "$bin" profile --validate "$out/${PROFILE_NAME:-$card}.profile.json" --json-out "$out/validation.json" --no-progress \
  > "$out/validation.txt" 2> "$out/validation.log"
echo "rc=$? in $(( $(date +%s) - start )) s"
grep -v "^  \(cpu\|gpu\|contention\) " "$out/validation.txt" | head -40
