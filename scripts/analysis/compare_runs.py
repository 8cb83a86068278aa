#!/usr/bin/env python3
"""Checks a folder of `shardwise run --json` outputs against their CPU references and prints a table.

Files are named MODEL_CTX_cpu.json (the reference) and MODEL_CTX_BUDGET_SCHEDULE.json (device runs).
A device run passes when it produced a result and its generated ids equal the reference's; the
table gives TTFT, decode tokens/s, load time and the schedules used. Exit 1 on any failure.
usage: compare_runs.py DIR
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(folder):
    names = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".json"))
    refs = {n[: -len("_cpu")]: load(os.path.join(folder, n + ".json")) for n in names if n.endswith("_cpu")}
    failures = 0
    print("%-34s %8s %9s %8s %6s  %s" % ("run", "ttft_ms", "tok/s", "load_ms", "same", "schedules"))
    for n in names:
        r = load(os.path.join(folder, n + ".json"))
        key = "_".join(n.split("_")[:2])
        ref = refs.get(key)
        if n.endswith("_cpu"):
            ok = r is not None
            same = "ref"
        else:
            ok = r is not None and ref is not None and r.get("generated_ids") == ref.get("generated_ids")
            same = "yes" if ok else ("no" if r is not None and ref is not None else "-")
        failures += 0 if ok else 1
        if r is None:
            print("%-34s %8s %9s %8s %6s  no result" % (n, "-", "-", "-", same))
            continue
        sched = ",".join(sorted(set(r.get("schedules", {}).values()))) if "schedules" in r else "cpu"
        print("%-34s %8.1f %9.2f %8.0f %6s  %s" % (n, r["ttft_ms"], r["decode_tokens_per_s"], r["load_ms"], same, sched))
    print("%d runs, %d failed" % (len(names), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
