# Sourced by the GPU machine's peer scripts: unpacks the peers' binaries (llama.cpp as forked by the paper's
# artifact; PEERS=folder holding peers_bin.tar.xz, default .carry/peers) into /tmp/shardwise-peers and sets
# LD_LIBRARY_PATH and `peerbin`. Where the CPU lacks the instructions the prebuilt CPU backend needs, the
# archive's AVX2 fallback backend is used and said so.
peers=${PEERS:-.carry/peers}
peerbin=/tmp/shardwise-peers
if [ ! -x "$peerbin/llama-cli" ]; then
  mkdir -p "$peerbin" && tar -C "$peerbin" -xJf "$peers/peers_bin.tar.xz" ||
    { echo "no peers_bin.tar.xz in $peers: copy it there and carry that folder"; exit 2; }
  missing=""
  for f in avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8; do
    grep -q -w "$f" /proc/cpuinfo || missing="$missing $f"
  done
  if [ -n "$missing" ] && [ -f "$peerbin/fallback/libggml-cpu.so" ]; then
    echo "CPU lacks$missing: the peers use their AVX2 CPU backend"
    cp -f "$peerbin/fallback/libggml-cpu.so" "$peerbin/libggml-cpu.so"
  fi
fi
export LD_LIBRARY_PATH="$peerbin:${LD_LIBRARY_PATH:-}"
