#!/usr/bin/python3
"""The lease-to-lease spread of an oracle study's rows next to its regret: a sample of a study's
decisions measured again on another lease (`shardwise sweep` of an experiment that re-runs some of the
study's configurations, e.g. experiments/planner_accuracy_resample.yaml), against the study.

    /usr/bin/python3 scripts/analysis/resample_spread.py STUDY.jsonl RESAMPLE.jsonl

For every decision (model, budget, ctx, threads, PCIe cap, tier) both files measured: each candidate
schedule's measured ms in both and their ratio (resample / study), the pick and the measured best in
each (by schedule name, or the same plan under another name: `plan_signature`), and the regret. Then
the spread of the ratios (median and p90 of |ratio - 1|, and the ratios' range), how often the measured
best is the same in both, and each study's regret against that spread. Decisions only the resample has
(another model, e.g. load-balanced routing) are listed with their pick, best and regret.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_oracle import CANDIDATES, load  # noqa: E402  (the study files' reader, one for both scripts)


def measured(rows):
    return {s: r for s, r in rows.items() if s in CANDIDATES and r.get("status") == "measured"}


def judge(rows):
    """(pick, best, regret, best's plan_signature) or None."""
    m = measured(rows)
    if not m:
        return None
    best = min(m, key=lambda s: m[s]["measured_ms"])
    pick = next(iter(rows.values())).get("planner_choice")
    regret = m[pick]["measured_ms"] / m[best]["measured_ms"] - 1 if pick in m else None
    return pick, best, regret, m[best].get("plan_signature")


def fmt_regret(r):
    return "-" if r is None else f"{100 * r:.1f}%"


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))] if v else float("nan")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: resample_spread.py STUDY.jsonl RESAMPLE.jsonl")
    study, again = load(sys.argv[1]), load(sys.argv[2])
    common = sorted(set(study) & set(again), key=str)
    only = sorted(set(again) - set(study), key=str)
    if not common and not only:
        sys.exit("the resample has no decisions")
    ratios, same_best, regrets = [], 0, []
    if common:
        print("| decision | " + " | ".join(f"{s} ms, study → again (ratio)" for s in CANDIDATES)
              + " | study: pick / best (regret) | again: pick / best (regret) |")
        print("|---|" + "---|" * (len(CANDIDATES) + 2))
    for key in common:
        a, b = measured(study[key]), measured(again[key])
        cells = []
        for s in CANDIDATES:
            if s in a and s in b:
                r = b[s]["measured_ms"] / a[s]["measured_ms"]
                ratios.append(r)
                cells.append(f"{a[s]['measured_ms']:.1f} → {b[s]['measured_ms']:.1f} ({r:.2f})")
            else:
                cells.append("-")
        ja, jb = judge(study[key]), judge(again[key])
        if ja and jb:
            same_best += ja[1] == jb[1] or (ja[3] is not None and ja[3] == jb[3])
            regrets.append((ja[2], jb[2]))
        desc = [f"{j[0]} / {j[1]} ({fmt_regret(j[2])})" if j else "not measured" for j in (ja, jb)]
        print(f"| {' '.join(str(k) for k in key)} | " + " | ".join(cells) + f" | {desc[0]} | {desc[1]} |")
    if ratios:
        dev = [abs(r - 1) for r in ratios]
        print(f"\n{len(common)} decisions in both, {len(ratios)} rows measured in both: ratio again / study median "
              f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}; |ratio - 1| median "
              f"{100 * statistics.median(dev):.1f}%, p90 {100 * pct(dev, 0.9):.1f}%")
        print(f"the measured best the same schedule or plan in both: {same_best} of {len(regrets)}")
        for i, name in enumerate(("study", "again")):
            r = [x[i] for x in regrets if x[i] is not None]
            if r:
                print(f"regret, {name}: max {100 * max(r):.1f}%, mean {100 * statistics.mean(r):.2f}%, "
                      f"above 5%: {sum(x > 0.05 for x in r)}")
    if only:
        print("\n| decision only in the resample | pick / best (regret) | " + " | ".join(
            f"{s} predicted / measured ms" for s in CANDIDATES) + " |")
        print("|---|---|" + "---|" * len(CANDIDATES))
        for key in only:
            j = judge(again[key])
            cells = []
            for s in CANDIDATES:
                row = again[key].get(s)
                ok = row and row.get("status") == "measured"
                cells.append(f"{row['predicted_ms']:.1f} / {row['measured_ms']:.1f}" if ok else "-")
            desc = f"{j[0]} / {j[1]} ({fmt_regret(j[2])})" if j else "not measured"
            print(f"| {' '.join(str(k) for k in key)} | {desc} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
