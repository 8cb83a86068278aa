#!/usr/bin/env python3
"""The vision-language table from scripts/gpu/vl_bench.sh's output folder (vl_bench/):

    vl_table.py DIR [HF.json ...]
                           prints markdown: per image and budget, shardwise's encoder plan, encode time and
                           measured peak, the language model's peak, end to end (encode + TTFT + 64 tokens,
                           median and min-max over the rounds) and the budget kept or not; then HF's
                           whole-model-on-GPU baseline per image (encoder and end to end, the first run of a
                           session apart from the later ones; torch's peak) from DIR/hf.json or the
                           sessions' files given.
"""
import glob
import json
import os
import re
import statistics
import sys

GIB = 1 << 30


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def spread(values, fmt="%.2f"):
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt % med
    return (fmt % med) + " (" + (fmt % min(values)) + "-" + (fmt % max(values)) + ")"


def gib(b):
    return "%.2f" % (b / GIB)


def budget_bytes(text):
    m = re.fullmatch(r"([0-9.]+)G", text)
    return float(m.group(1)) * GIB if m else None


def encoder_rows(d, prompts):
    rows = []
    for path in sorted(glob.glob(os.path.join(d, "enc_*.json"))):
        res, b = re.fullmatch(r"enc_(.+)_([0-9.]+G)\.json", os.path.basename(path)).groups()
        j = load(path)
        if not j:
            err = open(path[:-5] + ".err").read().strip().splitlines()
            rows.append((res, b, "fails: " + (err[-1] if err else "no output")))
            continue
        e = j["encoder"]
        ok = e["device_peak_bytes"] <= e["budget_bytes"]
        plan = load(os.path.join(d, "plan_%s_%s.json" % (res, b)))
        predicted = "%.0f" % plan["vision"]["predicted_ms"] if plan and "vision" in plan else "-"
        rows.append((res, b, "%s, %d/%d blocks resident | %.0f | %s | %s | %s" % (
            e["schedule"], e["resident_blocks"], e["blocks"], j["encode_ms"], predicted, gib(e["arena_bytes"]),
            gib(e["device_peak_bytes"]) + ("" if ok else " (over)"))))
    print("| image | patches | budget | encoder plan | encode ms | predicted ms | arena GiB | measured peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    order = {r: i for i, r in enumerate(prompts)}
    for res, b, text in sorted(rows, key=lambda r: (order.get(r[0], 99), budget_bytes(r[1]) or 0)):
        print("| %s | %s | %s | %s |" % (res, prompts.get(res, {}).get("patches", "?"), b, text))


def e2e_rows(d, prompts):
    cells = {}
    for path in glob.glob(os.path.join(d, "e2e_*.json")):
        res, b = re.fullmatch(r"e2e_(.+)_([0-9.]+G)_r[0-9]+\.json", os.path.basename(path)).groups()
        j = load(path)
        c = cells.setdefault((res, b), {"e2e": [], "enc": [], "ttft": [], "tps": [], "vpeak": 0, "lpeak": 0,
                                          "fails": 0})
        if not j:
            c["fails"] += 1
            continue
        v = j["vision"]
        c["enc"].append(v["encode_ms"] / 1000)
        c["ttft"].append(j["ttft_ms"] / 1000)
        c["tps"].append(j["decode_tokens_per_s"])
        c["e2e"].append((v["encode_ms"] + j["ttft_ms"] + j["decode_ms"]) / 1000)
        c["vpeak"] = max(c["vpeak"], v["device_peak_bytes"])
        c["lpeak"] = max(c["lpeak"], j["device_peak_bytes"])
        c["budget"] = j["budget_bytes"]
    print("| image | budget | encode s | TTFT s | decode tok/s | end to end s | encoder peak GiB | LM peak GiB | within budget |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {r: i for i, r in enumerate(prompts)}
    for (res, b), c in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), budget_bytes(kv[0][1]) or 0)):
        within = "budget" in c and max(c["vpeak"], c["lpeak"]) <= c["budget"]
        fails = " (%d failed)" % c["fails"] if c["fails"] else ""
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s%s |" % (
            res, b, spread(c["enc"]), spread(c["ttft"]), spread(c["tps"], "%.1f"), spread(c["e2e"]),
            gib(c["vpeak"]), gib(c["lpeak"]), "yes" if within else "NO", fails))


def hf_rows(paths):
    """HF's runs from one or more sessions (vl_bench.py hf, each a process that loads the model once): the
    first run of an image in a session (CUDA and kernel set-up included) apart from the later ones."""
    runs = [j for j in (load(p) for p in paths) if j]
    if not runs:
        print("(no HF baseline)")
        return
    j = runs[0]
    print("HF transformers, whole model on the GPU (attention: %s; weights %s GiB), %d session(s); first run"
          " of a session, then the later ones:" % (j.get("attn_implementation"), gib(j.get("weights_bytes", 0)),
                                                  len(runs)))
    print()
    print("| image | encoder s, first | encoder s, later | end to end s, first | end to end s, later | torch peak GiB |")
    print("|---|---|---|---|---|---|")
    for res in j["images"]:
        rs = [r["images"][res] for r in runs if res in r["images"]]
        if any("oom" in r for r in rs):
            print("| %s | out of memory | - | - | - | %s |" % (res, gib(max(r["peak_bytes"] for r in rs))))
            continue
        first = lambda k: [r[k][0] for r in rs]
        later = lambda k: [x for r in rs for x in r[k][1:]]
        print("| %s | %s | %s | %s | %s | %s |" % (res, spread(first("encode_s")), spread(later("encode_s")),
                                                   spread(first("e2e_s")), spread(later("e2e_s")),
                                                   gib(max(r["peak_bytes"] for r in rs))))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    prompts = load(os.path.join(d, "prompts.json")) or {}
    encoder_rows(d, prompts)
    print()
    e2e_rows(d, prompts)
    print()
    hf_rows(sys.argv[2:] or [os.path.join(d, "hf.json")])


if __name__ == "__main__":
    main()
