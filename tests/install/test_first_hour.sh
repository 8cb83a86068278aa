#!/bin/sh
# A llama.cpp user's first hour, replayed: each case a newcomer hit (finding things, llama.cpp's flags,
# silent or wrong results, output) gives the right result or one clear error line with exit 1. The GPU
# cases (a budget over the GPU's memory, the cost model picked by the GPU's name) run where a GPU is;
# install, notebooks and the quick start have tests of their own (install_prefix, python_notebooks,
# readme_quickstart).
# usage: test_first_hour.sh BUILD_DIR
set -u
build=$(cd "${1:?usage: test_first_hour.sh BUILD_DIR}" && pwd)
bin="$build/cli/shardwise"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# expect_error NAME PATTERN COMMAND...: exit 1, exactly one stderr line, starting "error:" and matching.
expect_error() {
  name=$1 pattern=$2
  shift 2
  "$@" > "$work/out" 2> "$work/err" < /dev/null
  rc=$?
  lines=$(wc -l < "$work/err")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q "^error: " "$work/err" || ! grep -qE -- "$pattern" "$work/err"; then
    echo "FAIL $name: rc=$rc, $lines stderr lines, wanted /$pattern/:"
    sed 's/^/    /' "$work/err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   $name: $(cat "$work/err")"
  fi
}

# expect_ok NAME COMMAND...: exit 0 (stdout in $work/out, stderr in $work/err).
expect_ok() {
  name=$1
  shift
  if ! "$@" > "$work/out" 2> "$work/err" < /dev/null; then
    echo "FAIL $name: exit $?"
    tail -3 "$work/err" | sed 's/^/    /'
    fails=$((fails + 1))
    return 1
  fi
  echo "ok   $name"
}

fail_case() {
  echo "FAIL $1"
  fails=$((fails + 1))
}

tiny="synthetic:tiny_llama"                                 # no vocabulary: token ids only
here=$(cd "$(dirname "$0")/../.." && pwd)
small="synthetic:$here/experiments/models/smoke_llama.yaml"  # one token per character
printf 'Hello world\n' > "$work/prompt.txt"

# --- llama.cpp's flags
expect_ok "-m -f -n -c -t -s --temp --top-k --top-p -no-cnv" "$bin" run -m "$small" -f "$work/prompt.txt" -n 4 -c 64 -t 1 \
  -s 7 --temp 0.7 --top-k 5 --top-p 0.9 -no-cnv
expect_error "-ngl is not read as -n gl" "n-gpu-layers.*vram-budget" "$bin" run -m "$tiny" -p hi -ngl 10
expect_error "a typo is named with the nearest option" "--modle.*did you mean --model" "$bin" run --modle x
expect_error "an unknown verb" "unknown verb.*did you mean run" "$bin" rnu
expect_error "a value that is no number" "--ctx" "$bin" run -m "$tiny" -p hi --ctx abc
expect_error "-f on a missing file" "cannot open|no such" "$bin" run -m "$tiny" -f "$work/missing.txt"

# --- silent or wrong results
expect_error "run -n 0" "n-predict" "$bin" run -m "$tiny" -p hi -n 0
expect_error "--ctx -1" "ctx" "$bin" run -m "$tiny" -p hi --ctx -1
expect_error "plan --kv-dtype q4_0 (nothing runs it)" "kv-dtype" "$bin" plan -m qwen30b --hw cli3 --vram-budget 4G \
  --kv-dtype q4_0
expect_error "report on a directory" "directory" "$bin" report "$work" --out "$work/report"
printf 'not a results file\n' > "$work/notes.txt"
expect_error "report on a non-results file" "result" "$bin" report "$work/notes.txt" --out "$work/report"
if expect_ok "--tokens on a model without a vocabulary" "$bin" run -m "$tiny" --tokens 1,2,3 -n 4 --greedy; then
  if tr -d '\n' < "$work/out" | od -An -c | grep -q '\\0'; then fail_case "generated text has NUL bytes"; fi
  grep -qE '^[0-9]+( [0-9]+)+' "$work/out" || fail_case "the generated ids are not printed"
fi
"$bin" plan -m tiny_llama --hw cli3 --vram-budget 1G --ctx 256 --save "$work/plan.json" > /dev/null 2>&1 ||
  fail_case "plan --save"
expect_error "--plan with a different --vram-budget" "differs" "$bin" run -m "$tiny" --tokens 1,2 -n 2 --device emu \
  --plan "$work/plan.json" --vram-budget 2G
cat > "$work/drop.yaml" << 'EOF'
name: all_dropped
models:
  - name: tiny
    weights: "synthetic:tiny_llama"
hardware: cli3
budgets: [1K]
ctx: [256]
threads: [1]
pcie_caps: [none]
tiers: [1]
schedules: [static]
EOF
expect_error "a sweep whose configurations are all dropped" "dropped|nothing to measure" "$bin" sweep "$work/drop.yaml" \
  --out "$work/drop.jsonl" --device emu --no-progress
[ -e "$work/drop.jsonl" ] && fail_case "the dropped sweep wrote a results file"
for i in 1 2; do
  "$bin" run -m "$tiny" --tokens 1,2,3 -n 8 --temp 1.0 --json > "$work/seed$i.json" 2> /dev/null ||
    fail_case "sampled run $i"
done
s1=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seed'])" "$work/seed1.json" 2> /dev/null)
s2=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seed'])" "$work/seed2.json" 2> /dev/null)
if [ -z "$s1" ] || [ "$s1" = "$s2" ]; then fail_case "without --seed, two runs draw different seeds ($s1, $s2)"; else
  echo "ok   seeds drawn and recorded ($s1, $s2)"; fi

# --- output
expect_ok "run --json records what repeats the run" "$bin" run -m "$tiny" --tokens 1,2,3 -n 4 --temp 0.8 --json \
  --device emu --vram-budget 64M
for key in sampling seed cost_model schedules revision; do
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if sys.argv[2] in j else 1)" "$work/out" "$key" ||
    fail_case "run --json lacks $key"
done
expect_ok "plan --explain" "$bin" plan -m qwen30b --hw cli3 --vram-budget 4G --ctx 4096 --explain
rows=$(grep -cE '^  L[0-9]' "$work/out")
[ "$rows" -lt 20 ] || fail_case "plan --explain prints $rows layer rows (identical layers are not grouped)"
expect_ok "run explains its schedules" "$bin" run -m "$tiny" --tokens 1,2,3,4,5,6,7,8,9 -n 4 --greedy --device emu \
  --vram-budget 64M
grep -q "measured ms  predicted ms" "$work/err" || fail_case "run prints no measured-vs-predicted step table"
expect_ok "--quiet before the verb" "$bin" --quiet run -m "$tiny" --tokens 1,2,3 -n 2 --greedy
[ -s "$work/err" ] && fail_case "--quiet still prints on stderr"
if "$bin" profile --help 2> /dev/null | grep -q -- "--log-level"; then echo "ok   --log-level on profile"; else
  fail_case "profile has no --log-level"; fi

# --- GPUs users have
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi > /dev/null 2>&1; then
  expect_error "a budget over the GPU's memory" "more than the memory of the GPU" "$bin" run -m "$tiny" -p hi \
    --device cuda --vram-budget 4T
  expect_ok "run on CUDA without --profile records its cost model" "$bin" run -m "$tiny" --tokens 1,2,3 -n 2 \
    --greedy --device cuda --json
  grep -q '"chosen"' "$work/out" || fail_case "run --json does not say how the cost model was chosen"
else
  echo "skip GPU cases (no GPU here)"
fi

[ "$fails" -eq 0 ] && echo "first hour: every case passed" || echo "first hour: $fails case(s) failed"
[ "$fails" -eq 0 ]
