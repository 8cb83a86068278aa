#!/usr/bin/env python3
"""A study's measurements against another cost model's predictions (issue 6, offline).

    shardwise sweep EXPERIMENT.yaml --predict --device cuda --routing-from STUDY/oracle.jsonl --out PRED.jsonl
    /usr/bin/python3 scripts/analysis/repredict.py STUDY/oracle.jsonl PRED.jsonl

PRED.jsonl holds this binary's prediction of every row of the same experiment (planned with the routing the
study recorded). A measurement only describes a plan that did not change: rows whose `plan_signature` differs
from the measured one are counted and left out; a decision is re-scored only if the new pick's plan was
measured (under any schedule name: one signature is one computation). This estimates what a changed cost
model would have picked; it does not replace re-running the study (rows' git_rev stays the study's).
Prints Markdown: per-schedule prediction error before / after, top-1 and regret before / after, every
decision whose pick changed, and the decisions the new picks still miss.
"""
import json
import statistics
import sys


def read(path, record):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e.msg}): give a results file of `shardwise sweep`")
            if j.get("record") != record:
                continue
            for k in ("config_id", "tier", "schedule"):
                if k not in j:
                    sys.exit(f"{path}:{n}: '{k}' is missing from a '{record}' record: not a file of `shardwise sweep`")
            rows.append(j)
    if not rows:
        sys.exit(f"{path}: no '{record}' records: give "
                 + ("a study's oracle.jsonl" if record == "row" else "the --out file of `shardwise sweep --predict`"))
    return rows


def key(r):
    return (r["config_id"], r["tier"], r["schedule"])


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: repredict.py STUDY/oracle.jsonl PRED.jsonl")
    study, pred = read(argv[1], "row"), read(argv[2], "prediction")
    new = {key(p): p for p in pred}
    missing = [k for k in map(key, study) if k not in new]
    if len(missing) == len(study):
        sys.exit(f"{argv[2]}: none of the study's rows are predicted there: was it planned from the same experiment?")

    measured = [r for r in study if r.get("status") == "measured" and r.get("measured_ms")]
    same = [r for r in measured if key(r) in new and new[key(r)].get("plan_signature") == r.get("plan_signature")]
    changed = [r for r in measured if key(r) in new and new[key(r)].get("plan_signature") != r.get("plan_signature")]

    print(f"# Re-prediction of {argv[1]} by {argv[2]}\n")
    revs = sorted({p.get("git_rev", "?") for p in pred})
    print(f"Measured by {sorted({r.get('git_rev', '?') for r in study})}; re-predicted by {revs}. "
          f"{len(measured)} measured rows: {len(same)} plans unchanged, {len(changed)} changed "
          f"(their measurements describe another plan: left out), {len(missing)} rows not predicted.\n")

    print("| schedule | rows | median error before | after | median signed before | after |")
    print("|---|---|---|---|---|---|")
    for s in sorted({r["schedule"] for r in same}):
        rs = [r for r in same if r["schedule"] == s]
        before = [r["predicted_ms"] / r["measured_ms"] - 1 for r in rs]
        after = [new[key(r)]["predicted_ms"] / r["measured_ms"] - 1 for r in rs]
        print(f"| {s} | {len(rs)} | {pct(statistics.median(map(abs, before)))} | {pct(statistics.median(map(abs, after)))} "
              f"| {pct(statistics.median(before))} | {pct(statistics.median(after))} |")

    # Decisions: the candidates measured (by signature), the best of them, the pick before and after.
    decisions = {}
    for r in measured:
        if r.get("candidate"):
            decisions.setdefault((r["config_id"], r["tier"]), []).append(r)
    old_ok = new_ok = scored = 0
    regrets_old, regrets_new, moved, missed = [], [], [], []
    for (cid, tier), rs in sorted(decisions.items()):
        best = min(rs, key=lambda r: r["measured_ms"])
        by_sig = {}
        for r in rs:
            by_sig.setdefault(r.get("plan_signature"), []).append(r["measured_ms"])
        old_pick = rs[0].get("planner_choice")
        new_pick = next((p.get("planner_choice") for p in pred if p["config_id"] == cid and p["tier"] == tier), None)
        old_sig = next((r.get("plan_signature") for r in study
                        if r["config_id"] == cid and r["tier"] == tier and r["schedule"] == old_pick), None)
        new_sig = new.get((cid, tier, new_pick), {}).get("plan_signature")
        if old_sig not in by_sig or new_sig not in by_sig:
            continue
        scored += 1
        t_old, t_new = min(by_sig[old_sig]), min(by_sig[new_sig])
        regrets_old.append(t_old / best["measured_ms"] - 1)
        regrets_new.append(t_new / best["measured_ms"] - 1)
        old_ok += t_old == best["measured_ms"]
        new_ok += t_new == best["measured_ms"]
        r0 = rs[0]
        where = f"{r0['model']} {r0['budget']} {r0['ctx']} {r0['threads']} {r0['pcie_cap']} {tier}"
        if t_new != best["measured_ms"]:
            missed.append((regrets_new[-1], f"| {where} | {new_pick} ({pct(regrets_new[-1])}) | {best['schedule']} |"))
        if new_pick != old_pick:
            moved.append(f"| {where} | {old_pick} ({pct(regrets_old[-1])}) | {new_pick} ({pct(regrets_new[-1])}) | {best['schedule']} |")
    print(f"\nDecisions whose old and new picks were both measured: {scored} of {len(decisions)}.\n")
    print("| | before | after |")
    print("|---|---|---|")
    if scored:
        print(f"| top-1 (the pick measured best) | {old_ok} ({pct(old_ok / scored)}) | {new_ok} ({pct(new_ok / scored)}) |")
        print(f"| regret mean | {pct(statistics.mean(regrets_old))} | {pct(statistics.mean(regrets_new))} |")
        print(f"| regret max | {pct(max(regrets_old))} | {pct(max(regrets_new))} |")
    if moved:
        print("\nPicks that changed (regret in brackets):\n")
        print("| decision (model budget ctx threads cap tier) | before | after | measured best |")
        print("|---|---|---|---|")
        print("\n".join(moved))
    if missed:
        print("\nDecisions the new picks still miss, by regret:\n")
        print("| decision (model budget ctx threads cap tier) | pick (regret) | measured best |")
        print("|---|---|---|")
        print("\n".join(line for _, line in sorted(missed, key=lambda m: -m[0])))


if __name__ == "__main__":
    main(sys.argv)
