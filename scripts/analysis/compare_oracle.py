#!/usr/bin/python3
"""Side by side: the decisions two oracle result files (`shardwise sweep` JSONL) have in common — the
same model, budget, context, threads, PCIe cap and tier — with each run's pick, measured best among
the candidate schedules (gpu-only, static, dynamic), regret and predicted / measured ms of every
candidate. For re-measuring a study's decisions after a cost-model or executor change (an
experiment that re-runs a subset of another's configurations), e.g.

    /usr/bin/python3 scripts/analysis/compare_oracle.py \\
        experiments/results/planner_accuracy_v3/oracle.jsonl \\
        experiments/results/planner_accuracy_targeted_049bb79/decode16/oracle.jsonl

A pick counts as agreement when it is the measured best or has the best's plan (`plan_signature`);
no tie tolerance (the report's spread rule is `shardwise report`'s business).
"""
import json
import sys

CANDIDATES = ("gpu-only", "static", "dynamic")
KEY = ("model", "budget", "ctx", "threads", "pcie_cap", "tier")


def load(path):
    decisions = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                sys.exit(f"{path}:{n}: not a JSON line (a torn write? re-run the sweep with --resume)")
            if row.get("record") != "row":
                continue
            missing = [k for k in KEY + ("schedule", "status") if k not in row]
            if missing:
                sys.exit(f"{path}:{n}: row without {', '.join(missing)}: not a `shardwise sweep` result file")
            decisions.setdefault(tuple(row[k] for k in KEY), {})[row["schedule"]] = row
    return decisions


def judge(rows):
    """(pick, best, regret, agreed) of one decision, or None when no candidate was measured."""
    measured = {s: r for s, r in rows.items() if s in CANDIDATES and r.get("status") == "measured"}
    if not measured:
        return None
    best = min(measured, key=lambda s: measured[s]["measured_ms"])
    pick = next(iter(rows.values())).get("planner_choice")
    if pick not in measured:
        return pick, best, None, False
    regret = measured[pick]["measured_ms"] / measured[best]["measured_ms"] - 1
    same_plan = measured[pick].get("plan_signature") and measured[pick].get("plan_signature") == measured[best].get("plan_signature")
    return pick, best, regret, pick == best or bool(same_plan)


def cell(row):
    if not row or row.get("status") != "measured":
        return "-"
    return f"{row['predicted_ms']:.1f} / {row['measured_ms']:.1f}"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_oracle.py BEFORE.jsonl AFTER.jsonl")
    before, after = load(sys.argv[1]), load(sys.argv[2])
    common = sorted(set(before) & set(after), key=str)
    if not common:
        sys.exit("the two files have no decision (model, budget, ctx, threads, cap, tier) in common")
    print("| decision | before: pick / best (regret) | after: pick / best (regret) | "
          + " | ".join(f"{s} pred / meas, before → after" for s in CANDIDATES) + " |")
    print("|---|---|---|" + "---|" * len(CANDIDATES))
    agreed = [0, 0]
    for key in common:
        cols = []
        for i, runs in enumerate((before, after)):
            j = judge(runs[key])
            if j is None:
                cols.append("not measured")
                continue
            pick, best, regret, ok = j
            agreed[i] += ok
            cols.append(f"{pick} / {best}" + ("" if regret is None else f" ({regret * 100:.1f}%)") + (" ✓" if ok else ""))
        per = [f"{cell(before[key].get(s))} → {cell(after[key].get(s))}" for s in CANDIDATES]
        name = " ".join(str(k) for k in key)
        print(f"| {name} | {cols[0]} | {cols[1]} | " + " | ".join(per) + " |")
    print(f"\nagreement on the {len(common)} common decisions: before {agreed[0]}, after {agreed[1]}")


if __name__ == "__main__":
    main()
