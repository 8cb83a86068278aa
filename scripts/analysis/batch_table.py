#!/usr/bin/env python3
"""The batch table from scripts/gpu/batch_bench.sh's batch_runs.tsv (one or more files, concatenated).

Per cell (model, budget, users): each system's aggregate generated tokens/s (median and min-max of its
repeats; a peer at its best configuration by median), the TTFT p50/p99 medians, errors, and shardwise's ratio
to the best peer (median over median, with the spread of the worst and best pairing of repeats; target >=
1.5). Runs with errors or a non-zero exit are listed but not counted.
usage: batch_table.py batch_runs.tsv [...]
"""
import csv
import statistics
import sys


def cells(paths):
    out = {}
    for p in paths:
        with open(p) as f:
            for r in csv.DictReader(f, delimiter="\t"):
                key = (r["model"], r["budget"], int(r["users"]))
                out.setdefault(key, {}).setdefault((r["system"], r["config"]), []).append(r)
    return out


def summary(runs):
    good = [r for r in runs if r["rc"] == "0" and r["tokens_per_s"] and int(r["errors"] or 0) == 0]
    if not good:
        return None
    tps = [float(r["tokens_per_s"]) for r in good]
    med = lambda k: statistics.median(float(r[k]) / 1000 for r in good)
    return {"n": len(good), "bad": len(runs) - len(good), "tps": tps, "med": statistics.median(tps),
            "p50": med("ttft_p50_ms"), "p99": med("ttft_p99_ms")}


def fmt(s, cfg=""):
    if s is None:
        return "no run without errors"
    bad = f", {s['bad']} with errors" if s["bad"] else ""
    return (f"{cfg}{s['med']:.1f} ({min(s['tps']):.1f}-{max(s['tps']):.1f}), TTFT {s['p50']:.2f}/{s['p99']:.2f} s"
            f" [{s['n']} runs{bad}]")


def main(paths):
    table = cells(paths)
    print("| model | budget | users | llama-server, best offload: tok/s (min-max), TTFT p50/p99 | "
          "shardwise | shardwise / best |")
    print("|---|---|---|---|---|---|")
    order = lambda k: (k[0], float(k[1][:-1]), k[2])
    for key in sorted(table, key=order):
        systems = table[key]
        ours = summary(sum((v for (s, _), v in systems.items() if s == "shardwise"), []))
        peers = [(cfg, summary(v)) for (s, cfg), v in systems.items() if s != "shardwise"]
        peers = [(c, s) for c, s in peers if s is not None]
        best = max(peers, key=lambda p: p[1]["med"]) if peers else None
        ratio = "-"
        if ours and best:
            b = best[1]
            ratio = (f"{ours['med'] / b['med']:.2f}x ({min(ours['tps']) / max(b['tps']):.2f}-"
                     f"{max(ours['tps']) / min(b['tps']):.2f})")
        peer = fmt(best[1], f"`{best[0]}`: ") if best else "no run without errors"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {peer} | {fmt(ours)} | {ratio} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
