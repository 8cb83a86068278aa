# Sourced by the GPU machine's serve scripts after bundle_env.sh.
#   start_serve STDOUT LOG ARGS...   starts `shardwise serve --port 0 ARGS...` in the background and waits
#                                    (up to 5 minutes) for the address it prints: sets `pid` and `url`
#                                    (empty when it exited or never printed one).
start_serve() {
  local stdout=$1 log=$2
  shift 2
  "$bin" serve --port 0 "$@" > "$stdout" 2> "$log" &
  pid=$!
  url=""
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://[^ ]*' "$stdout" 2> /dev/null | head -1)
    [ -n "$url" ] && return
    kill -0 $pid 2> /dev/null || return
    sleep 0.5
  done
}
