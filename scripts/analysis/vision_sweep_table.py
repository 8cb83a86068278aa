#!/usr/bin/env python3
"""The vision encoder's oracle as a table: per budget and image size, each schedule's predicted and
measured encode (ms), resident blocks and the device's peak against the budget; the planner's choice
against the measured best (regret = choice / best - 1), and the prediction's error over measured rows.

    vision_sweep_table.py RESULTS.jsonl [PREDICTIONS.jsonl]

RESULTS: a results file of `shardwise sweep` of a vision experiment. PREDICTIONS (optional): the same
experiment's rows predicted again (`shardwise sweep --predict --out P.jsonl`, e.g. with another profile):
their predicted_ms stand in for the rows' own.
"""
import json
import statistics
import sys


def load(path, record="row"):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if j.get("record") == record and j.get("part") == "vision":
                rows.append(j)
    return rows


def cell(r):
    if r["status"] != "measured":
        return "—"
    gib = r["device_peak_bytes"] / 2**30
    flag = "" if r["within_budget"] else " **over**"
    return f"{r['predicted_ms']:.0f} / {r['measured_ms']:.0f} ({r['resident_blocks']}r, {gib:.2f} GiB{flag})"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    if not rows:
        sys.exit(f"{sys.argv[1]}: no vision rows")
    if len(sys.argv) == 3:
        again = {(p["config_id"], p["schedule"]): p for p in load(sys.argv[2], "prediction")}
        for r in rows:
            p = again.get((r["config_id"], r["schedule"]))
            if p is None:
                sys.exit(f"{sys.argv[2]}: no prediction of {r['config_id']} {r['schedule']}")
            r["predicted_ms"] = p["predicted_ms"]
    schedules = ["gpu-only", "partial", "streamed"]
    configs = {}
    for r in rows:
        configs.setdefault((r["model"], r["budget_bytes"], r["tier"]), {})[r["schedule"]] = r
    print("| model | budget | image | patches | " + " | ".join(schedules) + " | choice | best | regret |")
    print("|---|---|---|---|" + "---|" * (len(schedules) + 3))
    errors, regrets, peaks_ok, measured = [], [], 0, 0
    for key in sorted(configs):
        by = configs[key]
        any_row = next(iter(by.values()))
        done = {s: r for s, r in by.items() if r["status"] == "measured"}
        for r in done.values():
            errors.append(r["predicted_ms"] / r["measured_ms"] - 1)
            measured += 1
            peaks_ok += bool(r["within_budget"])
        choice = next((s for s, r in by.items() if r["chosen"]), None)
        best = min(done, key=lambda s: done[s]["measured_ms"]) if done else None
        regret = ""
        if choice in done and best:
            reg = done[choice]["measured_ms"] / done[best]["measured_ms"] - 1
            regrets.append(reg)
            regret = f"{reg * 100:.1f}%"
        print(f"| {key[0]} | {any_row['budget']} | {any_row['image']} | {key[2]} | "
              + " | ".join(cell(by[s]) if s in by else "" for s in schedules)
              + f" | {choice or '—'} | {best or '—'} | {regret} |")
    print()
    print("Cells: predicted / measured encode ms (resident blocks, the device's measured peak).")
    if errors:
        abs_err = sorted(abs(e) for e in errors)
        print(f"Measured rows: {measured}; peak within the budget in {peaks_ok} of {measured}. "
              f"Prediction error (predicted / measured - 1): median {statistics.median(errors) * 100:+.1f}%, "
              f"median |error| {statistics.median(abs_err) * 100:.1f}%, max |error| {abs_err[-1] * 100:.1f}%.")
    if regrets:
        print(f"Planner's choice is the measured best in {sum(r <= 0 for r in regrets)} of {len(regrets)} "
              f"configurations; regret median {statistics.median(regrets) * 100:.1f}%, max {max(regrets) * 100:.1f}%.")


if __name__ == "__main__":
    main()
