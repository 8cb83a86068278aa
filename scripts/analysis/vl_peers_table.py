#!/usr/bin/python3
"""The vision-language comparison's table from scripts/gpu/vl_peers.sh output (OUT/vl_peer_runs.tsv).

Per image and budget: each system's configuration with the median (min-max) over its repeats of the
end-to-end wall time (load, encode, prefill and 64 tokens; one process per run), the work itself (encode + prefill + 64 tokens at the decode
rate: the wall time less loading and set-up), the image encode, the prefill, decode tokens/s and the device peak (nvidia-smi, MiB above the idle GPU, CUDA context
included for every system); failed runs are counted. Then shardwise's wall time against the fastest
peer configuration that ran, end to end and in the work itself (ratio = peer / shardwise: how many
times faster shardwise is), with the range over the pairings of their repeats.
usage: vl_peers_table.py OUT/vl_peer_runs.tsv
"""
import csv
import statistics
import sys


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def stat(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    return statistics.median(v), min(v), max(v)


def fmt(s, scale=1.0, digits=2):
    if s is None:
        return "-"
    m, lo, hi = (x * scale for x in s)
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def work_s(r):
    e, p, t = num(r["encode_ms"]), num(r["prefill_ms"]), num(r["decode_tps"])
    return None if None in (e, p, t) or t <= 0 else (e + p) / 1e3 + 64 / t


def ratio(peer, sw):
    return peer[0] / sw[0], peer[1] / sw[2], peer[2] / sw[1]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: vl_peers_table.py OUT/vl_peer_runs.tsv")
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no runs")
    cells = {}
    for r in rows:
        cells.setdefault((r["image"], r["budget"]), {}).setdefault((r["system"], r["config"]), []).append(r)
    print("| image | budget | system | config | ok / runs | prompt tokens | end to end s | work s | encode s "
          "| prefill s | decode tok/s | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for (image, budget), systems in cells.items():
        best_peer, sw = None, None
        for (system, config), runs in systems.items():
            ok = [r for r in runs if r["rc"] == "0"]
            wall, work = stat([num(r["wall_ms"]) for r in ok]), stat([work_s(r) for r in ok])
            print(f"| {image} | {budget} | {system} | {config} | {len(ok)} / {len(runs)} | "
                  f"{fmt(stat([num(r['prompt_tokens']) for r in ok]), digits=0)} | {fmt(wall, 1e-3)} | {fmt(work)} | "
                  f"{fmt(stat([num(r['encode_ms']) for r in ok]), 1e-3)} | "
                  f"{fmt(stat([num(r['prefill_ms']) for r in ok]), 1e-3)} | "
                  f"{fmt(stat([num(r['decode_tps']) for r in ok]), digits=1)} | "
                  f"{fmt(stat([num(r['peak_mib']) for r in runs]), digits=0)} |")
            if wall is None:
                continue
            if system == "shardwise":
                sw = (wall, work)
            elif best_peer is None or wall[0] < best_peer[1][0]:
                best_peer = ((system, config), wall, work)
        if sw and best_peer:
            ratios.append((image, budget, best_peer[0], ratio(best_peer[1], sw[0]),
                           ratio(best_peer[2], sw[1]) if best_peer[2] and sw[1] else None))
    if ratios:
        print("\n| image | budget | fastest peer that ran (end to end) | end to end, peer / shardwise | work, peer / shardwise |")
        print("|---|---|---|---|---|")
        for image, budget, (system, config), e2e, work in ratios:
            w = "-" if work is None else "%.2fx (%.2f-%.2f)" % work
            print(f"| {image} | {budget} | {system} `{config}` | %.2fx (%.2f-%.2f) | {w} |" % e2e)


if __name__ == "__main__":
    main()
