#!/usr/bin/env bash
# One device call of a GPU session, by stage, each within a 10-minute call (bundle from
# scripts/gpu/bundle.sh carried as build-gpu/bundle.tar.xz). Writes into OUT; copy what comes back into
# experiments/results/ (the stage says where).
#   session.sh OUT check     GPU suite (kernels, device, runtime incl. first-step device peak), ~1-2 min,
#                            then the profile and its validation (scripts/gpu/profile.sh)
#                            -> experiments/results/profile/, executor test logs; then the first minutes
#                            of the planner-accuracy study planned from that profile (OUT/study/)
#   session.sh OUT fast      GPU suite, then `profile --check` of the committed profile: on the machine it
#                            describes, the planner-accuracy study starts at once with it (OUT/study/);
#                            on another machine, as `check` (re-profile, then the study's first minutes)
#   session.sh OUT machine-study [PREVIOUS.jsonl]
#                            whichever GPU the call landed on (H100 or H200 hosts are lent alike): the GPU
#                            suite, then `profile --check` of this GPU kind's committed profile
#                            (experiments/results/profile/<kind>-host.profile.json; the check compares the GPU
#                            by name too): where it describes this machine the planner-accuracy study starts
#                            with it (with PREVIOUS: continues it, no check but the sweep's own); with no
#                            profile of this kind, or one that fails the check, this machine is profiled (no validation), the
#                            profile put at that path, and a new study starts with the minutes left. The
#                            study is planned from that file (`sweep --profile`; the yaml's own for the H200).
#                            -> OUT/profile/ (when profiled), OUT/study/; commit the profile at that path.
#                            SUITE=0 skips the suite (later calls of one study).
#   session.sh OUT profile   the profile and its validation only, then executor_bench.sh quick with
#                            the new profile for the minutes left
#   session.sh OUT study [PREVIOUS.jsonl]
#                            the planner-accuracy sweep for the call's remaining minutes (resumable)
#                            -> a new experiments/results/planner_accuracy_<date>/ folder
#   session.sh OUT bench     the executor's peer protocol (scripts/gpu/executor_bench.sh all)
#   session.sh OUT graphs    the whole model decoding kernel by kernel and as CUDA graphs, ~1 min
#                            (executor_bench.sh graphs), then the CUDA kernel benchmarks -> graphs.tgz
#   session.sh OUT kernels   GPU suite, then the graphs stage (after a change to the CUDA kernels), ~5 min
#   session.sh OUT targeted  experiments/planner_accuracy_decode16.yaml and _cpu_attention.yaml, the
#                            study's most-missed decisions re-measured (~3.5 min) -> targeted.tgz
#   session.sh OUT peers MODEL...  the peer protocol of each MODEL (executor_bench.sh MODEL) -> protocol.tgz
#   session.sh OUT peers-study MODEL PREVIOUS.jsonl
#                            the peer protocol of MODEL (executor_bench.sh MODEL -> protocol.tgz), then the
#                            planner-accuracy study continued from PREVIOUS for the call's remaining minutes
#   session.sh OUT fast-prefetch  the GPU suite, the prefetch rows below, then a new study for the minutes left
#   session.sh OUT prefetch-study PREVIOUS.jsonl
#                            qwen30b's peer cells, auto and gpu-only with and without speculative expert
#                            prefetch (executor_bench.sh prefetch -> prefetch.tgz), then the study continued
#   session.sh OUT probes    measured timelines beside the simulated ones (timeline_probe.sh) of the split decode
#                            steps study v11 under-predicted and of qwen30b's 512-token GPU-only step, ~4 min
#                            -> probe.tgz (experiments/results/executor/timelines_probe_<rev>/)
#   session.sh OUT split-probes  steady decode steps of Dynamic's uncapped split layers in the protocol's 1K
#                            cells, measured beside the simulated ones, with and without the prefetch, ~3 min
#   session.sh OUT ctx-probes  the study's CPU-heavy rows (Static, Dynamic) at their 4K and 16K contexts, decode
#                            steps measured beside the simulated ones after a prompt that fills the cache, ~5 min
#   session.sh OUT sweep-timelines  GPU suite, then experiments/static_timelines.yaml (Static, GPU-only, Dynamic
#                            decode, both models, 4G/12G, 4K/16K, 1/16 threads, 16 GB/s and none) swept with
#                            every row's step recorded (`sweep --timelines`), then one of its cells run alone
#                            (nemo8b 12G/4K 16 GB/s Static, timeline_probe.sh), ~8 min -> sweep_timelines.tgz
#   session.sh OUT reprofile-static  the profile and its validation (profile.sh, ~5 min), then
#                            static_timelines.yaml's qwen30b rows planned from that profile, with their traces
#                            -> profile.tgz, sweep_timelines.tgz
#   session.sh OUT static-probes  Static's steady decode steps measured beside the simulated ones (nemo8b 8G at 16
#                            and 1 threads, qwen30b 2G at 16), ~3 min -> probe_static.tgz
#   session.sh OUT ab        this bundle's shardwise against an older one (build-gpu/shardwise_<rev>.xz from
#                            scripts/gpu/old_binary.sh REV, carried too), alternating: qwen30b's 512-token
#                            GPU-only prefill and the 1K/4G decode, ~3 min -> ab.tgz
#   session.sh OUT diagnose  probes, then ab in the minutes left
#   session.sh OUT kprof     per-kernel GPU time (Nsight Compute) of qwen30b's 512-token GPU-only step under this
#                            binary's plan table and an older binary's, and of nemo8b's whole-model decode, ~5 min
#                            -> kprof.tgz (kernel_profile.sh)
#   session.sh OUT cpu       the CPU decode GEMVs and MoE block (shardwise_bench_cpu, 1 and 16 threads) at
#                            each weight prefetch distance (--gemv-prefetch), ~2 min, then the GPU
#                            suite -> cpu_prefetch.tgz
set -uo pipefail
out=${1:?usage: session.sh OUT check|fast|machine-study|profile|study|bench|kernels|graphs|targeted|cpu|probes|ab|diagnose|kprof|peers|peers-study|fast-prefetch|prefetch-study|split-probes|static-probes|sweep-timelines|reprofile-static|ctx-probes [MODEL] [PREVIOUS.jsonl]}
stage=${2:?usage: session.sh OUT check|fast|machine-study|profile|study|bench|kernels|graphs|targeted|cpu|probes|ab|diagnose|kprof|peers|peers-study|fast-prefetch|prefetch-study|split-probes|static-probes|sweep-timelines|reprofile-static|ctx-probes [MODEL] [PREVIOUS.jsonl]}
mkdir -p "$out"
root=/tmp/shardwise-bundle
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf build-gpu/bundle.tar.xz || { echo "no build-gpu/bundle.tar.xz"; exit 2; }
export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}" SHARDWISE_FIXTURES="$PWD/tests/fixtures" SHARDWISE_BIN="$root/bin/shardwise"
t0=$(date +%s)
# The profile and its validation, then the planner-accuracy study's first minutes with that profile: a
# copy of the experiment whose `profile:` (results/profile/h200-host.profile.json, unchanged text, so the
# same experiment hash) resolves next to the copy, to the profile just measured. Continue it with
# `session.sh OUT study OUT/study/oracle.jsonl` once that profile is committed in its place.
gpu_suite() {  # kernels, device, runtime incl. first-step device peak (~1 min; SUITE=0 skips it)
  [ "${SUITE:-1}" = 0 ] && { echo "== GPU suite skipped (SUITE=0)"; return; }
  echo "== GPU suite"
  timeout 200 "$root/bin/test_gpu" "~[bench]" > "$out/test_gpu.log" 2>&1; echo "rc=$?"; tail -3 "$out/test_gpu.log"
  grep -B2 -A8 "FAILED" "$out/test_gpu.log" | head -40
}
profile_then_study() {
  PROFILE_TIMEOUT=260 VALIDATE_TIMEOUT=170 bash scripts/gpu/profile.sh "$out/profile"
  local left=$(( 560 - ($(date +%s) - t0) ))
  if [ "$left" -gt 120 ] && [ -f "$out/profile/h200-host.profile.json" ]; then
    local exp=/tmp/shardwise-study && rm -rf "$exp" && mkdir -p "$exp/results/profile"
    cp experiments/planner_accuracy.yaml "$exp/" && cp "$out/profile/h200-host.profile.json" "$exp/results/profile/"
    bash scripts/gpu/oracle_study.sh "$out/study" none "$(awk "BEGIN {print ($left - 50) / 60}")" "$exp/planner_accuracy.yaml"
  fi
}
case $stage in
  check)
    gpu_suite
    profile_then_study
    ;;
  machine-study)
    gpu_suite
    kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9][0-9][0-9]' | head -1 | tr 'A-Z' 'a-z')
    kind=${kind:-gpu}
    prof=experiments/results/profile/$kind-host.profile.json
    prev=${3:-none}
    # The experiment's own profile is the H200 host's (same path, same experiment hash); others by --profile.
    [ "$kind" = h200 ] && study_args="" || study_args="--profile $prof"
    if [ -f "$prof" ] && [ "$prev" != none ]; then
      echo "== continuing $prev with $prof (the sweep's machine check defers or refuses)"
    elif [ -f "$prof" ] && "$root/bin/shardwise" profile --check "$prof" > "$out/machine_check.json" 2> "$out/machine_check.txt"; then
      echo "== $prof describes this machine: $(head -3 "$out/machine_check.txt" | tr '\n' ' ')"
    else
      echo "== no profile of this machine ($kind): $(tail -1 "$out/machine_check.txt" 2>/dev/null); profiling it"
      PROFILE_NAME=$kind-host VALIDATE=0 PROFILE_TIMEOUT=300 bash scripts/gpu/profile.sh "$out/profile"
      [ -f "$out/profile/$kind-host.profile.json" ] || { echo "no profile: no study"; exit 1; }
      mkdir -p experiments/results/profile && cp "$out/profile/$kind-host.profile.json" "$prof"
      prev=none  # a new profile is a new study
    fi
    left=$(( 575 - ($(date +%s) - t0) ))
    if [ "$left" -gt 90 ]; then
      SWEEP_ARGS="$study_args ${SWEEP_ARGS:-}" bash scripts/gpu/oracle_study.sh "$out/study" "$prev" "$(awk "BEGIN {print ($left - 35) / 60}")"
    else
      echo "no time left for the study"
    fi
    # At most 8 files come back: the results and the profile as they are, every log in one archive.
    (cd "$out" && find . -type f ! -name '*.jsonl' ! -name '*.profile.json' ! -name '*.tgz' | sed 's|^\./||' > /tmp/logs.txt &&
      tar -czf logs.tgz -T /tmp/logs.txt && xargs rm -f < /tmp/logs.txt)
    ;;
  fast)
    gpu_suite
    committed=experiments/results/profile/h200-host.profile.json
    if "$root/bin/shardwise" profile --check "$committed" > "$out/machine_check.json" 2> "$out/machine_check.txt"; then
      echo "== the committed profile describes this machine: $(tail -1 "$out/machine_check.txt")"
      left=$(( 560 - ($(date +%s) - t0) ))
      bash scripts/gpu/oracle_study.sh "$out/study" none "$(awk "BEGIN {print ($left - 30) / 60}")"
    else
      echo "== another machine: $(tail -1 "$out/machine_check.txt"); re-profiling"
      profile_then_study
    fi
    ;;
  profile)  # re-profile and validate (no GPU suite), then the quick peer rows with the time left
    PROFILE_TIMEOUT=240 VALIDATE_TIMEOUT=150 bash scripts/gpu/profile.sh "$out/profile"
    left=$(( 560 - ($(date +%s) - t0) ))
    if [ "$left" -gt 60 ] && [ -f "$out/profile/h200-host.profile.json" ]; then
      PROFILE="$out/profile/h200-host.profile.json" timeout "$left" bash scripts/gpu/executor_bench.sh "$out" quick
    fi
    ;;
  study)
    bash scripts/gpu/oracle_study.sh "$out" "${3:-none}" 9
    ;;
  bench)
    timeout 560 bash scripts/gpu/executor_bench.sh "$out" all
    ;;
  kernels)  # after a change to the CUDA kernels: the GPU suite, then the graphs stage below
    gpu_suite
    timeout 300 bash scripts/gpu/executor_bench.sh "$out/graphs" graphs
    timeout 180 "$root/bin/test_gpu" "[bench]" > "$out/graphs/kernel_bench.log" 2>&1; echo "kernel bench rc=$?"
    grep -E "attention decode|GEMV" "$out/graphs/kernel_bench.log" | head -40
    tar -C "$out" -czf "$out/graphs.tgz" graphs && rm -rf "$out/graphs"
    ;;
  graphs)  # + the CUDA kernel benchmarks (test_gpu [bench]: GEMV rates, decode attention by keys per warp)
    timeout 300 bash scripts/gpu/executor_bench.sh "$out/graphs" graphs
    timeout 180 "$root/bin/test_gpu" "[bench]" > "$out/graphs/kernel_bench.log" 2>&1; echo "kernel bench rc=$?"
    grep -E "attention decode|GEMV" "$out/graphs/kernel_bench.log" | head -40
    tar -C "$out" -czf "$out/graphs.tgz" graphs && rm -rf "$out/graphs"
    ;;
  targeted)  # the targeted re-runs of the study's most-missed decisions, ~3.5 min; one archive back
    bash scripts/gpu/oracle_study.sh "$out/targeted/decode16" none 1.7 experiments/planner_accuracy_decode16.yaml
    bash scripts/gpu/oracle_study.sh "$out/targeted/cpu_attention" none 0.6 experiments/planner_accuracy_cpu_attention.yaml
    tar -C "$out" -czf "$out/targeted.tgz" targeted && rm -rf "$out/targeted"
    ;;
  peers)  # the peer protocol of each MODEL in turn (NEMO_CELLS="ctx:budget ..." limits nemo8b's cells), ~3.5 min
          # for qwen30b's four cells -> protocol.tgz
    shift 2
    for m in "$@"; do
      cells=${CELLS:-}; [ "$m" = nemo8b ] && cells=${NEMO_CELLS:-$cells}
      CELLS=$cells timeout $(( 580 - ($(date +%s) - t0) )) bash scripts/gpu/executor_bench.sh "$out/protocol" "$m"
    done
    tar -C "$out" -czf "$out/protocol.tgz" protocol && rm -rf "$out/protocol"
    ;;
  peers-study)
    timeout 300 bash scripts/gpu/executor_bench.sh "$out/protocol" "${3:?model}"
    tar -C "$out" -czf "$out/protocol.tgz" protocol && rm -rf "$out/protocol"
    left=$(( 570 - ($(date +%s) - t0) ))
    [ "$left" -gt 90 ] && bash scripts/gpu/oracle_study.sh "$out/study" "${4:?previous rows}" "$(awk "BEGIN {print ($left - 40) / 60}")"
    ;;
  fast-prefetch)  # the GPU suite, the prefetch rows (executor_bench.sh prefetch, PREFETCH_S, ~3.5 min -> prefetch.tgz),
                  # then, on the profile's machine, a new planner-accuracy study for the minutes left (OUT/study/)
    gpu_suite
    timeout "${PREFETCH_S:-210}" bash scripts/gpu/executor_bench.sh "$out/prefetch" prefetch
    tar -C "$out" -czf "$out/prefetch.tgz" prefetch && rm -rf "$out/prefetch"
    left=$(( 570 - ($(date +%s) - t0) ))
    [ "$left" -gt 90 ] && bash scripts/gpu/oracle_study.sh "$out/study" none "$(awk "BEGIN {print ($left - 40) / 60}")"
    ;;
  prefetch-study)  # qwen30b auto and gpu-only with and without speculative expert prefetch (executor_bench.sh
                   # prefetch, ~3.5 min -> prefetch.tgz), then the planner-accuracy study continued from PREVIOUS
    timeout "${PREFETCH_S:-270}" bash scripts/gpu/executor_bench.sh "$out/prefetch" prefetch
    tar -C "$out" -czf "$out/prefetch.tgz" prefetch && rm -rf "$out/prefetch"
    left=$(( 570 - ($(date +%s) - t0) ))
    [ "$left" -gt 90 ] && bash scripts/gpu/oracle_study.sh "$out/study" "${3:?previous rows}" "$(awk "BEGIN {print ($left - 40) / 60}")"
    ;;
  probes)  # study v11's split decode rows (Dynamic under-predicted 11-20%: c = 7 of 8 under a 16 GB/s cap,
            # c = 1 with one thread, the 1K/4G peer cell) and the qwen30b 512-token GPU-only step (15-21% slower
            # than in v10 at the same prediction): measured timelines next to the simulated ones
    q="synthetic:qwen30b?dtype=q4_0&seed=1"
    timeout 250 bash scripts/gpu/timeline_probe.sh "$out" "$q 2G 4096 16 16GB/s dynamic" "$q 2G 4096 1 none dynamic" \
      "$q 4G 1024 16 none dynamic" "$q 4G 1024 16 none static"
    mv "$out/probe.tgz" "$out/probe_split.tgz"
    BATCH=512 PROMPT=1024 timeout 150 bash scripts/gpu/timeline_probe.sh "$out" "$q 4G 4096 16 none gpu-only"
    mv "$out/probe.tgz" "$out/probe_prefill.tgz"
    ;;
  split-probes)  # Dynamic's split decode, uncapped, where studies v12/v13 and the protocol measured 60-110 us per split
                 # layer more than predicted: the protocol's 1K cells (a 960-token prompt fills the cache as the
                 # prediction assumes), steady decode steps (runs 6-11 of 14 tokens) recorded beside the simulated
                 # ones, without the prefetch (1 and 16 threads, 4G and 8G, and under a 16 GB/s cap where the model
                 # is right), then with it (Dynamic, and GPU-only at 2G), ~3 min -> probe_split_steady.tgz
                 # (scripts/analysis/timeline_gap.py reads them)
    q="synthetic:qwen30b?dtype=q4_0&seed=1"
    PROMPT=960 N=14 RUNS=6:12 NAME_SUFFIX=_nopf RUN_ARGS="--next-layer-hits off" timeout 250 bash scripts/gpu/timeline_probe.sh \
      "$out/nopf" "$q 4G 1024 16 none dynamic" "$q 4G 1024 1 none dynamic" "$q 8G 1024 16 none dynamic" "$q 4G 1024 16 16GB/s dynamic"
    PROMPT=960 N=14 RUNS=6:12 timeout 150 bash scripts/gpu/timeline_probe.sh "$out/pf" "$q 4G 1024 16 none dynamic" \
      "$q 2G 1024 16 none gpu-only"
    mkdir -p "$out/split" && tar -C "$out/split" -xzf "$out/nopf/probe.tgz" && tar -C "$out/split" -xzf "$out/pf/probe.tgz"
    tar -C "$out" -czf "$out/probe_split_steady.tgz" split && rm -rf "$out/split" "$out/nopf" "$out/pf"
    ;;
  sweep-timelines)  # Static's decode inside the sweep's process: study v14 under-predicted it by a median 13.7% where
                    # the same cells run alone matched (static_probes_2806f34, ctx_probes_2806f34); every row of
                    # experiments/static_timelines.yaml with its step's trace, then nemo8b 12G/4K 16 GB/s Static alone
                    # on the same lease (ctx-probes' row: study 1.32x, alone 1.0x), ~8 min -> sweep_timelines.tgz
    gpu_suite
    mkdir -p "$out/sweep_timelines"
    left=$(( 450 - ($(date +%s) - t0) ))
    SWEEP_ARGS="--timelines $out/sweep_timelines/timelines" bash scripts/gpu/oracle_study.sh "$out/sweep_timelines" none \
      "$(awk "BEGIN {print $left / 60}")" experiments/static_timelines.yaml
    left=$(( 585 - ($(date +%s) - t0) ))
    if [ "$left" -gt 60 ]; then
      n="synthetic:nemo8b?dtype=f16&seed=1"
      BATCH=512 PROMPT=4000 N=8 RUNS=9:15 timeout "$left" bash scripts/gpu/timeline_probe.sh "$out/alone" "$n 12G 4096 16 16GB/s static"
      [ -f "$out/alone/probe.tgz" ] && tar -C "$out/sweep_timelines" -xzf "$out/alone/probe.tgz"; rm -rf "$out/alone"
    fi
    mv "$out/test_gpu.log" "$out/sweep_timelines/" 2>/dev/null
    tar -C "$out" -czf "$out/sweep_timelines.tgz" sweep_timelines && rm -rf "$out/sweep_timelines"
    ;;
  reprofile-static)  # after a change to how the profile measures (e.g. the CPU MoE block's experts from DRAM): the
                     # profile and its validation, then the qwen30b rows of experiments/static_timelines.yaml planned
                     # from that profile (a copy of the experiment beside it), each with its trace, ~9 min (STAGE_S:
                     # the seconds the stage may take, 570; STATIC_THREADS: the thread counts, "1, 16")
    PROFILE_TIMEOUT=260 VALIDATE_TIMEOUT=${VALIDATE_TIMEOUT:-130} bash scripts/gpu/profile.sh "$out/profile"
    if [ -f "$out/profile/h200-host.profile.json" ]; then
      exp=/tmp/shardwise-static && rm -rf "$exp" && mkdir -p "$exp/results/profile"
      sed -e '/- name: nemo8b/,+1d' -e "s/^threads: .*/threads: [${STATIC_THREADS:-1, 16}]/" experiments/static_timelines.yaml \
        > "$exp/static_timelines.yaml"
      cp "$out/profile/h200-host.profile.json" "$exp/results/profile/"
      mkdir -p "$out/sweep_timelines"
      left=$(( ${STAGE_S:-570} - ($(date +%s) - t0) ))
      [ "$left" -gt 40 ] && SWEEP_ARGS="--timelines $out/sweep_timelines/timelines" bash scripts/gpu/oracle_study.sh \
        "$out/sweep_timelines" none "$(awk "BEGIN {print $left / 60}")" "$exp/static_timelines.yaml"
      tar -C "$out" -czf "$out/sweep_timelines.tgz" sweep_timelines && rm -rf "$out/sweep_timelines"
    fi
    ;;
  static-probes)  # Static's decode, under-predicted by a median 13.7% in study v14 (both thread counts, both models):
                  # steady decode steps measured beside the simulated ones, nemo8b 8G and qwen30b 2G at 16 threads (a
                  # 960-token prompt in a 1K cache, as the study's rows) and nemo8b 8G at one thread (a 48-token prompt:
                  # a one-thread prefill of 960 would take minutes), ~3 min -> probe_static.tgz (timeline_gap.py)
    n="synthetic:nemo8b?dtype=f16&seed=1" q="synthetic:qwen30b?dtype=q4_0&seed=1"
    PROMPT=960 N=8 RUNS=3:8 timeout 200 bash scripts/gpu/timeline_probe.sh "$out/s16" "$n 8G 1024 16 none static" \
      "$q 2G 1024 16 none static"
    PROMPT=48 N=5 RUNS=2:5 timeout 100 bash scripts/gpu/timeline_probe.sh "$out/s1" "$n 8G 64 1 none static"
    mkdir -p "$out/static" && tar -C "$out/static" -xzf "$out/s16/probe.tgz" && tar -C "$out/static" -xzf "$out/s1/probe.tgz"
    tar -C "$out" -czf "$out/probe_static.tgz" static && rm -rf "$out/static" "$out/s16" "$out/s1"
    ;;
  ctx-probes)  # the study's CPU-heavy rows at their own contexts, where static-probes' 1K rows were right (0.97-1.08x)
               # and study v14 was not: Static nemo8b 8G and 12G (16 GB/s) and qwen30b 2G at 4K (1.16-1.32x), Dynamic
               # nemo8b 4G at 4K (1.22x) and qwen30b 2G at 16K (1.34x), 16 threads; the prompt fills the cache in
               # 512-token steps (runs 0-7, 0-31), then decode steps recorded, ~5 min -> probe_ctx.tgz
    n="synthetic:nemo8b?dtype=f16&seed=1" q="synthetic:qwen30b?dtype=q4_0&seed=1"
    BATCH=512 PROMPT=4000 N=8 RUNS=9:15 timeout 300 bash scripts/gpu/timeline_probe.sh "$out/c4" "$n 8G 4096 16 none static" \
      "$q 2G 4096 16 none static" "$n 4G 4096 16 none dynamic" "$n 12G 4096 16 16GB/s static"
    BATCH=512 PROMPT=16000 N=8 RUNS=33:39 timeout 150 bash scripts/gpu/timeline_probe.sh "$out/c16" "$q 2G 16384 16 none dynamic"
    mkdir -p "$out/ctx" && for d in c4 c16; do [ -f "$out/$d/probe.tgz" ] && tar -C "$out/ctx" -xzf "$out/$d/probe.tgz"; done
    tar -C "$out" -czf "$out/probe_ctx.tgz" ctx && rm -rf "$out/ctx" "$out/c4" "$out/c16"
    ;;
  diagnose)  # probes, then ab with the minutes left (one call instead of two)
    bash "$0" "$out" probes
    left=$(( 570 - ($(date +%s) - t0) ))
    if [ "$left" -gt 150 ]; then timeout "$left" bash "$0" "$out" ab; else echo "== ab skipped: ${left} s left"; fi
    ;;
  ab)  # is qwen30b's 512-token GPU-only step slower with these binaries than with the older ones (study v11)?
    old=$(ls build-gpu/shardwise_*.xz 2>/dev/null | head -1)
    [ -n "$old" ] || { echo "no build-gpu/shardwise_<rev>.xz: scripts/gpu/old_binary.sh REV, then carry it"; exit 2; }
    q="--model synthetic:qwen30b?dtype=q4_0&seed=1 --threads 16"
    # Both plan from one profile the older binary can read (run_9c7d304's: no copy-issue fields).
    PROFILE=experiments/results/profile/run_9c7d304/h200-host.profile.json timeout 520 bash scripts/gpu/ab_binaries.sh "$out/ab" "$old" \
      "$q --vram-budget 4G --ctx 4096 --schedule gpu-only --batch 512" "$q --vram-budget 4G --ctx 2048"
    tar -C "$out" -czf "$out/ab.tgz" ab && rm -rf "$out/ab"
    ;;
  kprof)  # per-kernel GPU time under Nsight Compute (kernel_profile.sh)
    bash scripts/gpu/kernel_profile.sh "$out"
    ;;
  cpu)  # weight prefetch distance of the CPU GEMV kernels (kernels_avx2.cpp): decode GEMVs from DRAM and the
        # MoE decode block at 1 and 16 threads, each distance in its own process (0 = no software prefetch)
    mkdir -p "$out/cpu_prefetch"
    for d in 0 1024 2048 4096 8192 16384 32768; do
      timeout 100 "$root/bin/shardwise_bench_cpu" --gemv-prefetch=$d --threads=1,16 --hugepages --benchmark_filter='moe_decode|decode_gemv/(q4_0|q8_0|f16|bf16)/.*tokens:1/|roofline' \
        --benchmark_min_time=0.2 --benchmark_out="$out/cpu_prefetch/bench_$d.json" --benchmark_out_format=json \
        > "$out/cpu_prefetch/bench_$d.log" 2>&1
      echo "== prefetch $d bytes (rc=$?)"; grep -E "^(moe|decode|roofline)" "$out/cpu_prefetch/bench_$d.log" | awk '{print $1, $2, $3, $8}'
    done
    gpu_suite
    mv "$out/test_gpu.log" "$out/cpu_prefetch/" 2>/dev/null
    tar -C "$out" -czf "$out/cpu_prefetch.tgz" cpu_prefetch && rm -rf "$out/cpu_prefetch"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
# At most 8 files come back from a device call: the profile folder travels as one archive.
if [ -d "$out/profile" ]; then
  tar -C "$out" -czf "$out/profile.tgz" profile && rm -rf "$out/profile"
  echo "profile folder -> profile.tgz"
fi
