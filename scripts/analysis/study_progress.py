#!/usr/bin/env python3
"""How far a planner-accuracy sweep has come: rows by status, and every error row.
usage: study_progress.py ORACLE.jsonl"""
import collections
import json
import sys


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip().startswith("{") and '"record":"row"' in line:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a torn last line of an interrupted call
    counts = collections.Counter(r.get("status", "?") for r in rows)
    print("%d rows so far: %s" % (len(rows), ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    for r in rows:
        if r.get("status") == "error":
            print("ERROR", r["model"], r["budget"], r["ctx"], r["threads"], r["pcie_cap"], r["tier"], r["schedule"],
                  str(r.get("reason", ""))[:200])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
