#!/usr/bin/env python3
"""The peer comparison's table from one or more scripts/gpu/peers_bench.sh output folders.

Per cell (model, context, budget): each system's TTFT and decode tokens/s as the median and min-max of its
repeats, each peer at its best configuration per metric, and shardwise's ratio to the best peer per
metric (TPS: shardwise / best, the target >= 1.5; TTFT: shardwise / best, the target <= 1), with the ratio's
spread (the worst and best pairing of repeats). The prompt token counts of every system are listed: they
must agree (the same file and prompt). Below, the lease's host check (the rates of `profile --check`).
usage: peers_table.py OUT [OUT...]
"""
import csv
import json
import os
import statistics
import sys


def load_rows(folders):
    rows = []
    for folder in folders:
        with open(os.path.join(folder, "peer_runs.tsv")) as f:
            for r in csv.DictReader(f, delimiter="\t"):
                r["lease"] = os.path.basename(os.path.normpath(folder))
                rows.append(r)
    return rows


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def summarise(runs, key):
    v = [num(r[key]) for r in runs if r["rc"] == "0" and num(r[key]) is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def best(configs, key, higher):
    """The configuration whose median is best on `key`: (config, summary)."""
    have = [(c, s[key]) for c, s in configs.items() if s[key]]
    if not have:
        return None, None
    return (max if higher else min)(have, key=lambda cs: cs[1]["median"])


def fmt(s, digits):
    if not s:
        return "failed"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def ratio(sw, peer, higher):
    if not sw or not peer:
        return "-"
    med = sw["median"] / peer["median"]
    lo, hi = sw["min"] / peer["max"], sw["max"] / peer["min"]
    return f"{med:.2f}x ({lo:.2f}-{hi:.2f})"


def cell_table(model, cell, runs):
    by = {}
    for r in runs:
        by.setdefault(r["system"], {}).setdefault(r["config"], []).append(r)
    summ = {sys_: {c: {"ttft": summarise(rs, "ttft_ms"), "tps": summarise(rs, "decode_tps")} for c, rs in cs.items()}
            for sys_, cs in by.items()}
    tokens = sorted({r["prompt_tokens"] for r in runs if r["prompt_tokens"]})
    out = [f"### {model} {cell} (prompt tokens: {', '.join(tokens) or '?'})", "",
           "| system | configuration | TTFT ms median (min-max) | tokens/s median (min-max) | runs |",
           "|---|---|---|---|---|"]
    for sys_ in sorted(summ, key=lambda s: (s == "shardwise", s)):
        for c, s in summ[sys_].items():
            n = len(by[sys_][c])
            out.append(f"| {sys_} | {c} | {fmt(s['ttft'], 0)} | {fmt(s['tps'], 1)} | {n} |")
    sw = next(iter(summ.get("shardwise", {}).values()), None)
    peers = {f"{s} {c}": v for s, cs in summ.items() if s != "shardwise" for c, v in cs.items()}
    if sw and peers:
        tps_c, tps_b = best(peers, "tps", True)
        ttft_c, ttft_b = best(peers, "ttft", False)
        out += ["", f"- tokens/s: shardwise / best peer ({tps_c}) = {ratio(sw['tps'], tps_b, True)}"
                    + ("" if not sw["tps"] or not tps_b or sw["tps"]["median"] >= 1.5 * tps_b["median"]
                       else " — below the 1.5x target"),
                f"- TTFT: shardwise / best peer ({ttft_c}) = {ratio(sw['ttft'], ttft_b, False)}"
                    + ("" if not sw["ttft"] or not ttft_b or sw["ttft"]["median"] <= ttft_b["median"]
                       else " — behind the best peer")]
    return out


def host_profile_rates(folder):
    """DRAM read (1 and 16 threads, alone) and pinned H2D at the largest size of a quick host profile."""
    try:
        j = json.load(open(os.path.join(folder, "host_profile.json")))
    except (OSError, ValueError):
        return None
    rates = [f"DRAM read ({d['threads']} threads) {d['gbps']:.1f} GB/s" for d in j.get("dram", [])
             if not d.get("contention") and d.get("threads") in (1, 16)]
    for t in j.get("transfers", []):
        if t.get("dir") == "h2d" and t.get("pinned") and not t.get("cap_gbps") and t.get("points"):
            size, ms = t["points"][-1][0], t["points"][-1][1]
            rates.append(f"pinned H2D {size / ms / 1e6:.1f} GB/s at {size >> 20} MiB")
    return rates


def host_check(folder):
    path = os.path.join(folder, "machine_check.json")
    name = os.path.basename(os.path.normpath(folder))
    try:
        j = json.load(open(path))
    except (OSError, ValueError):
        rates = host_profile_rates(folder)
        return [f"- {name}: " + ("; ".join(rates) + " (quick profile)" if rates else "no host check")]
    rates = [f"{r['what']} ({r['threads']} threads) {r['here']:.1f} GB/s" for r in j.get("rows", [])
             if r.get("unit") == "GB/s" and r.get("threads") in (1, 16)]
    return [f"- {name}: " + "; ".join(rates)]


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    folders = argv[1:]
    rows = load_rows(folders)
    cells = {}
    for r in rows:
        cells.setdefault((r["model"], r["cell"]), []).append(r)
    out = []
    for (model, cell), runs in cells.items():
        out += cell_table(model, cell, runs) + [""]
    out += ["Host check of each lease (`shardwise profile --check`):", ""]
    for f in folders:
        out += host_check(f)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
