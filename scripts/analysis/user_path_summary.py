#!/usr/bin/env python3
"""Summarises scripts/gpu/user_path.sh: (1) each model's CUDA run against its CPU run (same tokens?,
TTFT, tokens/s, load time); (2) synth's GGUF file against the in-memory synthetic source over the
repeats: medians and min-max of TTFT and tokens/s, the file's ratio to memory, same tokens.
usage: user_path_summary.py DIR"""
import json
import os
import statistics
import sys


def load(folder, name):
    try:
        with open(os.path.join(folder, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def spread(values):
    return "%.2f (%.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def main(folder):
    names = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".json"))
    bad = 0
    print("(1) the peers' GGUF files: CUDA 4096M against the CPU path, p1k.txt, 64 tokens")
    for m in sorted({n.split("_")[0] for n in names if n.endswith("_1024_cpu")}):
        g, c = load(folder, m + "_1024_4G_auto"), load(folder, m + "_1024_cpu")
        if g is None or c is None:
            print("  %s: missing result" % m)
            bad += 1
            continue
        same = g["generated_ids"] == c["generated_ids"]
        bad += 0 if same else 1
        print("  %-8s cuda: TTFT %.0f ms, %.2f tok/s, load %.0f ms, schedules %s | cpu: TTFT %.0f ms, %.2f tok/s | same tokens: %s"
              % (m, g["ttft_ms"], g["decode_tokens_per_s"], g["load_ms"], ",".join(sorted(set(g["schedules"].values()))),
                 c["ttft_ms"], c["decode_tokens_per_s"], same))
    print("(2) synth's GGUF file against synthetic: in memory (same weights), median (min-max) over repeats")
    for m in sorted({n.split("_")[0] for n in names if "_synth_" in n}):
        rows = {}
        for src in ("file", "memory"):
            rows[src] = [r for r in (load(folder, n) for n in names if n.startswith(m + "_synth_" + src + "_")) if r]
        if not rows["file"] or not rows["memory"]:
            print("  %s: missing results" % m)
            bad += 1
            continue
        for key, label in (("ttft_ms", "TTFT ms"), ("decode_tokens_per_s", "tok/s"), ("load_ms", "load ms")):
            f = [r[key] for r in rows["file"]]
            mem = [r[key] for r in rows["memory"]]
            print("  %-8s %-8s file %s  memory %s  file/memory %.3f"
                  % (m, label, spread(f), spread(mem), statistics.median(f) / statistics.median(mem)))
        same = all(r["generated_ids"] == rows["memory"][0]["generated_ids"] for r in rows["file"] + rows["memory"])
        bad += 0 if same else 1
        print("  %-8s same tokens in every run: %s" % (m, same))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
