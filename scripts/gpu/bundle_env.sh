# Sourced by the GPU machine's scripts: unpacks build-gpu/bundle.tar.xz (scripts/gpu/bundle.sh) into
# /tmp/shardwise-bundle unless it is there already, and sets LD_LIBRARY_PATH, `bin` (the shardwise
# binary) and `profile` (the planner's cost model: the machine's profile, or PROFILE=FILE).
root=/tmp/shardwise-bundle
if [ ! -x "$root/bin/shardwise" ]; then
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf "${BUNDLE:-build-gpu/bundle.tar.xz}" || { echo "no build-gpu/bundle.tar.xz"; exit 2; }
fi
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
bin="$root/bin/shardwise"
profile=${PROFILE:-configs/profiles/h200-host.profile.json}
