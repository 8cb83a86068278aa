# Sourced by the GPU machine's scripts: unpacks the bundle (scripts/gpu/bundle.sh; BUNDLE=path, default
# build-gpu/bundle.tar.xz) into /tmp/shardwise-bundle, always anew (a warm machine may hold an older
# one), and sets LD_LIBRARY_PATH, `bin` (the shardwise binary), `bindir` and `profile` (the planner's
# cost model: PROFILE=FILE, default the committed profile of the card found: H100 or H200 host).
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf "${BUNDLE:-build-gpu/bundle.tar.xz}" ||
  { echo "no bundle at ${BUNDLE:-build-gpu/bundle.tar.xz}: run scripts/gpu/bundle.sh and carry it"; exit 2; }
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
bindir="$root/bin"
bin="$bindir/shardwise"
# The profile of this lease's card (H100 or H200 hosts), unless PROFILE names one.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H100*) card=h100-host ;;
  *) card=h200-host ;;
esac
profile=${PROFILE:-configs/profiles/$card.profile.json}
# machine_facts FILE: what ran where (revision, CPU, GPU, kernel, date), beside every result.
machine_facts() {
  { echo "date: $(date -u +%FT%TZ)"; echo "revision: $(tr '\n' ' ' < "$root/REVISION" 2>/dev/null || echo unknown)"
    lscpu | grep -E "Model name|^CPU\(s\)"; uname -r
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$1" 2>&1
}
