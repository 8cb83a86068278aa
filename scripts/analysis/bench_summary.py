#!/usr/bin/env python3
"""The table of scripts/gpu/bench.sh's rows: TTFT, tokens/s, the median decode step's rate, memory, and
the median decode step against the plan's prediction. TPS counts every decode step, so a burst of slow
steps moves it; "med TPS" is 1000 / the median decode step, the plan's rate.
usage: bench_summary.py executor_runs.jsonl"""
import json
import statistics
import sys


def main(path):
    print("%-8s %5s %6s %-12s %8s %8s %8s %8s %9s %16s" % (
        "model", "ctx", "budget", "schedule", "TTFT s", "TPS", "med TPS", "arena", "dev peak", "meas/pred decode"))
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            head = "%-8s %5d %6s %-12s" % (r["model"], r["ctx"], r["budget"], r["schedule"] + ("" if r.get("cuda_graphs", True) else "-nographs"))
            if "error" in r:
                print(head, "ERROR", r["error"][-80:])
                continue
            x = r["run"]
            steps = [s["ms"] for s in x.get("steps", [])[1:] if s.get("tokens", 1) == 1]
            med = statistics.median(steps) if steps else 0.0
            ratio = "%.2f" % (med / r["predicted_decode_ms"]) if r.get("predicted_decode_ms") and med > 0 else ""
            print(head, "%8.2f %8.2f %8.2f %7.2fG %8.2fG %16s" % (
                x["ttft_ms"] / 1000, x.get("decode_tokens_per_s", 0), 1000.0 / med if med > 0 else 0.0,
                x.get("arena_peak_bytes", 0) / 2**30, x.get("device_peak_bytes", 0) / 2**30, ratio))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
