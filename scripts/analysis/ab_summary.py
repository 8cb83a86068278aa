#!/usr/bin/env python3
"""Compares two sides of scripts/gpu/ab.sh: for every bench row (model, ctx, budget, schedule, graphs)
the median, min and max TTFT and decode tokens/s of each side over its rounds and the B/A ratios of
the medians. Tokens are not compared here (bench rows keep no ids; the GPU suite checks them). Rows
that failed on a side are listed with their error.
usage: ab_summary.py DIR_A DIR_B   (each holds r*/executor_runs.jsonl)"""
import glob
import json
import os
import statistics
import sys


def rows(folder):
    by = {}
    for path in sorted(glob.glob(os.path.join(folder, "r*", "executor_runs.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                key = (r["model"], r["ctx"], r["budget"], r["schedule"], "graphs" if r.get("cuda_graphs") else "nographs")
                by.setdefault(key, []).append(r)
    return by


def stat(runs, field):
    vals = [r["run"][field] for r in runs if "run" in r and r["run"].get(field) is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals), len(vals)


def fmt(s, digits):
    if s is None:
        return "-"
    med, lo, hi, n = s
    return "%.*f [%.*f-%.*f] n=%d" % (digits, med, digits, lo, digits, hi, n)


def ratio(b, a):
    return "%.3f" % (b[0] / a[0]) if a and b and a[0] else "-"


def main(dir_a, dir_b):
    a, b = rows(dir_a), rows(dir_b)
    print("%-42s %-30s %-30s %7s %-30s %-30s %7s" % ("row", "A ttft_ms", "B ttft_ms", "B/A", "A tok/s", "B tok/s", "B/A"))
    for key in sorted(set(a) | set(b)):
        ra, rb = a.get(key, []), b.get(key, [])
        ta, tb = stat(ra, "ttft_ms"), stat(rb, "ttft_ms")
        da, db = stat(ra, "decode_tokens_per_s"), stat(rb, "decode_tokens_per_s")
        print("%-42s %-30s %-30s %7s %-30s %-30s %7s" % (" ".join(map(str, key)), fmt(ta, 1), fmt(tb, 1), ratio(tb, ta),
                                                        fmt(da, 2), fmt(db, 2), ratio(db, da)))
        for side, runs in (("A", ra), ("B", rb)):
            for r in runs:
                if "error" in r:
                    print("  %s error: %s" % (side, r["error"][-160:].replace("\n", " ")))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
