#!/usr/bin/env bash
# Runs on the GPU machine: the same `shardwise run` commands with this bundle's binary (A) and an older
# one (B: a stripped `shardwise`, xz-compressed, carried as build-gpu/shardwise_<rev>.xz; make it with
# scripts/gpu/old_binary.sh REV), alternating A B A B, to tell a change of the binaries from a change of
# the machine between leases. One JSON line per run -> OUT/ab.jsonl, a summary on stdout.
#   ab_binaries.sh OUT build-gpu/shardwise_<rev>.xz "RUN ARGS" ...
# RUN ARGS are `shardwise run` options after the prompt (the prompt is PROMPT=N seeded tokens, 1024).
set -uo pipefail
set -f  # RUN ARGS are split into words, never globbed (synthetic:qwen30b?dtype=...)
out=${1:?usage: ab_binaries.sh OUT OLD_BINARY.xz "RUN ARGS" ...}
old_xz=${2:?usage: ab_binaries.sh OUT OLD_BINARY.xz "RUN ARGS" ...}
shift 2
source "$(dirname "$0")/bundle_env.sh"
mkdir -p "$out"
old=/tmp/shardwise-old
xz -dc "$old_xz" > "$old" && chmod +x "$old" || { echo "cannot unpack $old_xz"; exit 2; }
toks=$(python3 -c "import random; random.seed(256); print(','.join(str(random.randrange(3, 32000)) for _ in range(${PROMPT:-1024})))")
: > "$out/ab.jsonl"
for args in "$@"; do
  for round in 1 2; do
    for which in A B; do
      b=$bin
      [ "$which" = B ] && b=$old
      # shellcheck disable=SC2086
      r=$(timeout 150 "$b" run --tokens "$toks" -n 8 --greedy --device cuda --profile "$profile" --json $args 2> "$out/err_${which}.txt")
      rc=$?
      python3 - "$which" "$round" "$args" "$rc" "$r" >> "$out/ab.jsonl" <<'PY'
import json, sys
which, rnd, args, rc, text = sys.argv[1:6]
try:
    run = json.loads(text)
except ValueError:
    run = None
print(json.dumps({"binary": which, "round": int(rnd), "args": args, "rc": int(rc),
                  "prefill_ms": run and run.get("prefill_ms"), "decode_tokens_per_s": run and run.get("decode_tokens_per_s"),
                  "schedules": run and run.get("schedules"), "steps": run and run.get("steps")}))
PY
      echo "$which round $round rc=$rc $args: $(python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1])][-1]; print("prefill", l["prefill_ms"], "ms, decode", l["decode_tokens_per_s"], "TPS")' "$out/ab.jsonl")"
    done
  done
done
