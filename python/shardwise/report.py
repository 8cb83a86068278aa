"""``python3 -m shardwise.report RESULTS --out DIR``: the planner-accuracy report (DIR/report.md and
PNGs) of an oracle results file; ``shardwise report`` runs this. Definitions are in metrics.py."""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only; before pyplot is imported by plots
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import metrics, plots  # noqa: E402
from .results import CANDIDATES, is_emulated, load_results  # noqa: E402

EMU_WARNING = ("> **Emulated device.** These rows were measured on the host-emulated device (`--device emu`): "
               "it runs the plans on the CPU, so its timings are **not GPU numbers** and say nothing about the "
               "planner's accuracy on a real machine. They exercise the pipeline only.")


def _pct(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _num(x, fmt="{:.3g}"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _table(df, floatfmt="{:.3g}"):
    """A DataFrame as a Markdown table (no tabulate dependency)."""
    if df is None or len(df) == 0:
        return "(none)\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, (float, np.floating)):
                cells.append("" if np.isnan(v) else floatfmt.format(v))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _config_label(r):
    return (f"{r['model']} budget {_bytes(r['budget_bytes'])}, ctx {r['ctx']}, {r['threads']} threads, "
            f"cap {r['pcie_cap']}, tier {r['tier']}")


def _why(d):
    """Which of the two schedules that traded places (the pick and the measured best) had the prediction
    most off: the cause of the inversion."""
    ratios = {}
    for s in {d.get("pick"), d.get("best")} & set(CANDIDATES):
        p, m = d.get(f"predicted_{s}"), d.get(f"measured_{s}")
        if p is not None and m is not None and np.isfinite(p) and np.isfinite(m) and m > 0:
            ratios[s] = p / m
    if not ratios:
        return ""
    worst = max(ratios, key=lambda s: abs(math.log(ratios[s])))
    r = ratios[worst]
    direction = "under" if r < 1 else "over"
    return f"{worst} {direction}-predicted ({100 * (r - 1):+.0f}%)"


def _decision_rows(dec):
    rows = []
    for _, d in dec.iterrows():
        row = {"configuration": _config_label(d), "pick": d["pick"], "best": d["best"],
               "regret": _pct(d["regret"])}
        for s in CANDIDATES:
            p, m = d.get(f"predicted_{s}"), d.get(f"measured_{s}")
            row[s] = f"{_num(p, '{:.1f}')} / {_num(m, '{:.1f}')}"
        row["why"] = _why(d)
        slow = d.get("machine_slowdown")
        if slow is not None and np.isfinite(slow):
            row["machine"] = f"{slow:.2f}x"
        rows.append(row)
    return pd.DataFrame(rows)


def _machine_lines(sweeps):
    """Per sweep call, whether it ran on the machine its profile describes (`sweep --device cuda` checks
    a few of the profile's rows first and records it; calls of older binaries made no check)."""
    lines = []
    for i, sw in enumerate(sweeps):
        if sw.get("device") not in (None, "cuda"):
            continue
        mc = sw.get("machine_check")
        when = sw.get("started", "?")
        if not isinstance(mc, dict):
            lines.append(f"- call {i + 1} ({when}): **no machine check** — its rows may come from a machine the "
                         "profile does not describe")
            continue
        same = bool(mc.get("same_machine"))
        lines.append(f"- call {i + 1} ({when}): machine check {'passed' if same else '**failed**'} — "
                     f"{_num(mc.get('min_slowdown'))}x to {_num(mc.get('max_slowdown'))}x the profile's times "
                     f"(tolerance {_pct(mc.get('tolerance', 0))})")
    return lines


def _outcome_lines(df, dec):
    """The "Strict agreement, ties and contests" section: each evaluable decision's outcome
    (metrics.decision_outcomes) and how clear it was, as Markdown lines."""
    out = metrics.decision_outcomes(df, dec)
    o = metrics.outcome_summary(out)
    n, pct = o["decisions"], int(metrics.CLOSE * 100)
    L = ["## Strict agreement, ties and contests\n"]
    if n == 0:
        return L + ["No evaluable decision had a measured best.\n"]
    share = lambda k: _pct(o[k] / n)  # noqa: E731
    L.append(f"Strict top-1 (the pick's schedule name is the measured fastest's): **{o['strict']} of {n} "
             f"({_pct(o['strict_top1'])})**. Each evaluable decision is in exactly one row:\n")
    L.append(_table(pd.DataFrame([
        {"outcome": "strict top-1: same schedule name", "decisions": o["strict"], "share": share("strict")},
        {"outcome": "same plan under another name (same `plan_signature`)", "decisions": o["same_plan"], "share": share("same_plan")},
        {"outcome": f"tie: another plan, ≤ {pct}% slower than the best", "decisions": o["tie"], "share": share("tie")},
        {"outcome": f"miss: > {pct}% slower than the best", "decisions": o["miss"], "share": share("miss")}])))
    if not out["plan_known"].any():
        L.append("These rows carry no `plan_signature`, so whether a differently named pick ran the best's plan cannot be "
                 "told: such decisions are counted as ties or misses by their times.\n")
    elif o["plans_unknown"]:
        L.append(f"{o['plans_unknown']} of the ties and misses lack a `plan_signature` on the pick or the best: whether "
                 "they ran the same plan cannot be told.\n")
    L.append(f"How clear each decision was: the runner-up is the fastest measured candidate with another plan than the "
             f"best's (a second name of the best's plan is no alternative); clear: it is more than {pct}% slower, "
             f"close: within {pct}%, uncontested: no other plan was measured (the others infeasible or skipped as too slow).\n")
    by_name = int(dec[dec["evaluable"]]["close"].sum())
    L.append(f"(\"Close contests\" below takes the next-fastest schedule name whatever its plan: {by_name} close that way.)\n")
    L.append(_table(pd.DataFrame([
        {"contest": c, "decisions": o[c], "strict top-1": _pct(o[f"strict_top1_{c}"]),
         "top-1 counting same plan": _pct(o[f"plan_top1_{c}"])} for c in metrics.CONTESTS])))
    return L


def build_report(df, out_dir, title=None):
    """Writes out_dir/report.md and the PNGs; returns the path of report.md."""
    os.makedirs(out_dir, exist_ok=True)
    s = metrics.summarize(df)
    dec = metrics.decisions(df)
    ev = dec[dec["evaluable"]]
    errs = metrics.error_summary(df)
    shares = metrics.winner_shares(dec)
    sp = metrics.baseline_speedups(df, dec)
    sps = metrics.speedup_summary(sp)
    sweeps = df.attrs.get("sweeps", [])
    name = title or (sweeps[0].get("experiment") if sweeps else None) or os.path.basename(df.attrs.get("path", "results"))
    emu = is_emulated(df)

    pngs = {
        "scatter": plots.scatter_predicted_vs_measured(df, os.path.join(out_dir, "predicted_vs_measured.png"),
                                                       "emulated device: not GPU numbers" if emu else ""),
        "winners": plots.winner_shares_plot(shares, os.path.join(out_dir, "winner_shares.png")),
        "regret": plots.regret_plot(dec, os.path.join(out_dir, "regret.png")),
        "errors": plots.error_plot(df, os.path.join(out_dir, "prediction_error.png")),
        "speedups": plots.speedups_plot(sps, os.path.join(out_dir, "baseline_speedups.png")),
    }
    if len(metrics.machine_drift(df)):
        pngs["drift"] = plots.drift_plot(df, os.path.join(out_dir, "machine_drift.png"))
    rel = {k: os.path.basename(v) for k, v in pngs.items()}

    L = []
    w = L.append
    w(f"# Planner accuracy: {name}\n")
    if emu:
        w(EMU_WARNING + "\n")
    w(f"Source: `{df.attrs.get('path', '?')}` — {s['rows']} rows over {s['configurations']} configurations "
      f"({s['rows_measured']} measured, {s['rows_infeasible']} infeasible, {s['rows_skipped']} skipped as too slow, "
      f"{s['rows_error']} errors); {s['decisions']} decisions (configuration × tier), {s['evaluable']} evaluable.\n")
    def uniq(col):
        return ", ".join(f"`{v}`" for v in sorted(df[col].dropna().astype(str).unique())) if len(df) else "-"
    w(f"- device: {uniq('device')}; machine: {uniq('machine')}")
    if "hardware" in df.columns:
        w(f"- cost model: {uniq('hardware')}; profile hash: {uniq('profile_hash')}")
    w(f"- git revision: {uniq('git_rev')}")
    if "rounds" in df.columns and (df["rounds"].dropna() > 1).any():
        many = df[df["rounds"] > 1]
        w(f"- measured in rounds: {len(many)} candidate rows in {int(many['rounds'].max())} rounds each (a configuration's "
          "candidates one after the other, then again; each row's figures over all its rounds), the others once")
    if df.attrs.get("bad_lines") or df.attrs.get("duplicates"):
        w(f"- {df.attrs.get('bad_lines', 0)} torn/unparsable line(s) skipped, {df.attrs.get('duplicates', 0)} duplicate row(s) dropped")
    if sweeps:
        w(f"- {len(sweeps)} sweep call(s); experiment hash `{sweeps[-1].get('experiment_hash', '?')}`")
    if not emu:
        for line in _machine_lines(sweeps):
            w(line)
    w("")

    # Targets.
    t = s["targets"]
    w("## Targets\n")
    trows = pd.DataFrame([
        {"metric": "top-1 agreement", "value": _pct(t["top1"]["value"]), "target": "≥ 95%", "met": "yes" if t["top1"]["met"] else "**no**"},
        {"metric": "median per-schedule error (worst candidate)", "value": _pct(t["median_error"]["value"]), "target": "≤ 10%",
         "met": "yes" if t["median_error"]["met"] else "**no**"},
        {"metric": "max regret", "value": _pct(t["max_regret"]["value"]), "target": "≤ 5%", "met": "yes" if t["max_regret"]["met"] else "**no**"},
    ])
    w(_table(trows))
    missed = [k for k, v in t.items() if not v["met"]]
    at_probe = metrics.error_at_probe_summary(df)
    if "median_error" in missed and len(at_probe):
        worst = at_probe.sort_values("median_error_at_probe").iloc[-1]
        w(f"With each configuration's machine-probe factor (the machine as it ran, `predicted_ms_at_probe`; "
          f"\"Machine drift\") the worst candidate's median error is {_pct(worst['median_error_at_probe'])} "
          f"({worst['schedule']}, {int(worst['rows'])} rows).\n")
    if emu and missed:
        w("_Targets are judged on emulated timings here, which the cost model does not describe; misses are expected._\n")

    for line in _outcome_lines(df, dec):
        w(line)

    # Top-1.
    w("## Top-1 agreement\n")
    w(f"The planner's pick was the measured-best candidate in **{s['agree']} of {s['evaluable']}** evaluable decisions "
      f"({_pct(s['top1'])}). {s['ties']} more were ties within the measured spread (interquartile range of the repeats) — "
      f"{_pct(s['top1_with_ties'])} counting them. Contested decisions (≥ 2 candidates measured): {s['contested']}, "
      f"top-1 {_pct(s['top1_contested'])}.\n")
    same = ev[ev["same_plan"]]
    if len(same):
        w(f"Of the agreements, {len(same)} picked a schedule whose plan is the measured best's plan (the same "
          "`plan_signature`: one computation under two names, measured twice):\n")
        w(_table(_decision_rows(same)))
    ties = ev[ev["tie"]]
    if len(ties):
        w("Ties (pick within the spread of the best):\n")
        w(_table(_decision_rows(ties)))
    wrong = ev[~ev["agree"] & ~ev["tie"]]
    if len(wrong):
        w("Disagreements (predicted / measured ms per candidate; *why* names the schedule whose prediction was most off):\n")
        w(_table(_decision_rows(wrong)))
    w("## Close contests\n")
    w(f"Decisions whose best two candidates were within {int(metrics.CLOSE * 100)}% of each other: **{s['close']}**; "
      f"the planner picked the best in {_pct(s['top1_close'])} of them.\n")
    rep = metrics.repeatability(df)
    w("## Measurement resolution\n")
    if len(rep):
        q = rep["spread"].quantile([0.5, 0.9]).tolist()
        w(f"{len(rep)} plans were measured twice or more under different schedule names (the same `plan_signature`: "
          f"one computation). Their measured times differ by median **{_pct(q[0])}**, p90 **{_pct(q[1])}**, max "
          f"**{_pct(rep['spread'].max())}**: differences between candidates below about the p90 are within what these "
          "measurements resolve. The largest:\n")
        top = rep.sort_values("spread", ascending=False).head(5).copy()
        top.insert(0, "configuration", [_config_label(r) for _, r in top.iterrows()])
        top["spread"] = top["spread"].map(_pct)
        w(_table(top[["configuration", "schedules", "measured_ms", "spread"]]))
    else:
        w("No plan was measured under two schedule names, so the measurements' repeatability is not known from these rows.\n")
    w("## Machine drift\n")
    drift = metrics.machine_drift(df)
    if len(drift):
        sl = drift["machine_slowdown"]
        by_t = ", ".join(f"{int(t)} threads {_num(g.median())}x ({_num(g.min())}-{_num(g.max())}x)"
                         for t, g in drift.groupby("threads")["machine_slowdown"])
        w(f"{len(drift)} configurations were probed just before their rows were measured (`sweep --machine-probe`: the "
          f"profile's DRAM and matmul check rows at the configuration's thread count): the machine took median "
          f"**{_num(sl.median())}x** the profile's times (min {_num(sl.min())}x, max {_num(sl.max())}x); by thread count: "
          f"{by_t}. The decision tables' *machine* column is that factor.\n")
        waited = drift[drift["probes"] > 1]
        if len(waited):
            w(f"{len(waited)} configurations found the machine slow and waited for it to calm before their rows were "
              f"measured (`sweep --calm`: a pause, then probed again; {int((waited['probes'] - 1).sum())} waits in all); "
              f"their last probes, the factor they were measured at: "
              + ", ".join(f"{_num(x)}x" for x in waited["machine_slowdown"]) + ".\n")
        probed = ev[ev["machine_slowdown"].notna()] if "machine_slowdown" in ev.columns else ev.iloc[0:0]
        off = probed[(probed["machine_slowdown"] > 1.1) | (probed["machine_slowdown"] < 1 / 1.1)]
        wrong_probed = probed[~probed["agree"] & ~probed["tie"]]
        wrong_off = wrong_probed[wrong_probed.index.isin(off.index)]
        w(f"{len(off)} of {len(probed)} probed decisions were measured while the machine was more than 10% off its "
          f"profile, {len(wrong_off)} of the {len(wrong_probed)} probed disagreements among them: there the miss may be "
          "the machine's rather than the planner's.\n")
        cal = probed[probed["agree_at_probe"].notna()] if "agree_at_probe" in probed.columns else probed.iloc[0:0]
        if len(cal):
            n_cal = int(cal["agree_at_probe"].astype(bool).sum())
            n_now = int(cal["agree"].astype(bool).sum())
            w(f"Each measured plan was also predicted again with its configuration's CPU factor "
              f"(`predicted_ms_at_probe`; not the candidates skipped as too slow, which have no re-prediction): with those "
              f"predictions the planner would have picked the measured best in **{n_cal} of the {len(cal)}** decisions "
              f"whose every feasible candidate was re-predicted ({_pct(n_cal / len(cal))}), against {n_now} of them with the "
              "profile as it is — the difference is what the machine's drift cost, the rest is the cost model's.\n")
            e = metrics.prediction_errors(df)
            e = e[e["schedule"].isin(CANDIDATES)]
            again = pd.to_numeric(e["predicted_ms_at_probe"], errors="coerce") if "predicted_ms_at_probe" in e.columns else None
            if again is not None and again.notna().any():
                e = e[again.notna()]
                err_at = (pd.to_numeric(e["predicted_ms_at_probe"]) / e["measured_ms"] - 1).abs()
                w(f"Median prediction error of those rows: {_pct(e['error'].median())} with the profile, "
                  f"{_pct(err_at.median())} with the probe's factor. By schedule:\n")
                tab = at_probe.copy()
                tab["median_error"] = tab["median_error"].map(_pct)
                tab["median_error_at_probe"] = tab["median_error_at_probe"].map(_pct)
                w(_table(tab))
        w(f"![drift]({rel['drift']})\n")
    else:
        w("The configurations were not probed (`sweep --machine-probe`), so how far the machine drifted from its profile "
          "while these rows were measured is not known from them.\n")
    w("## Regret\n")
    text = (f"Measured time of the pick / best measured − 1 over evaluable decisions: mean **{_pct(s['mean_regret'])}**, "
            f"max **{_pct(s['max_regret'])}**.")
    same = ev[ev["same_plan"]]
    if len(same):
        raw = (same["pick_ms"] / same["best_ms"] - 1).max()
        text += (f" A pick whose plan is the measured best's plan (one computation under two names, {len(same)} decisions) "
                 f"has no regret: its two measurements differ by the measurement's resolution (\"Measurement resolution\"), "
                 f"up to {_pct(raw)} here.")
    w(text + "\n")
    # Next to regret, how much one row's own repeats vary: a regret below it is within the measurements' noise.
    rr = metrics.run_to_run_spread(df)
    if len(rr):
        q = rr["spread"].quantile([0.5, 0.9]).tolist()
        spread = (f"median **{_pct(q[0])}** (p90 {_pct(q[1])}) over {len(rr)} candidate rows measured "
                  f"{int(rr['repeats'].min())}-{int(rr['repeats'].max())} times")
    else:
        spread = "not measured (no candidate row was measured more than once)"
    w(_table(pd.DataFrame([{"figure": "regret, mean / max", "value": f"{_pct(s['mean_regret'])} / {_pct(s['max_regret'])}"},
                           {"figure": "run-to-run spread: (max − min) / median of a row's repeats", "value": spread}])))
    w(f"![regret]({rel['regret']})\n")
    w("## Rank correlation\n")
    w(f"Predicted vs measured step times, pooled over all measured rows: Spearman **{_num(s['spearman'])}**, "
      f"Kendall τ-b **{_num(s['kendall'])}**; Kendall per decision over every measured schedule (baselines included), "
      f"mean **{_num(s['mean_decision_kendall'])}**.\n")
    w("## Per-schedule prediction error\n")
    w("|predicted − measured| / measured over measured rows; signed = predicted / measured − 1.\n")
    e_tab = errs.copy()
    for c in ("median_error", "p90_error", "median_signed_error"):
        e_tab[c] = e_tab[c].map(_pct)
    w(_table(e_tab))
    w(f"![errors]({rel['errors']})\n")
    w(f"![scatter]({rel['scatter']})\n")
    for by in ("threads", "pcie_cap", "ctx", "tier", "model"):
        bd = metrics.error_breakdown(df, by)
        if len(bd) > 1:
            w(f"Median error by {by}:\n")
            w(_table(bd.reset_index().applymap(lambda v: _pct(v) if isinstance(v, float) else v)))
    w("## Winner shares\n")
    sh = shares.reset_index().rename(columns={"index": "schedule"})
    w(_table(sh.assign(measured_best=sh["measured_best"].map(_pct), planner_pick=sh["planner_pick"].map(_pct))))
    w("(the paper: Static ~72%, Dynamic ~18%, GPU-only ~10%)\n")
    w(f"![winners]({rel['winners']})\n")
    w("## Baseline speedups\n")
    w("Measured time of the baseline / measured time of the planner's pick: at tier 1 the decode tokens/s ratio (TPS), "
      "at the prefill tier the step-time ratio that scales TTFT.\n")
    w(_table(sps))
    w(f"![speedups]({rel['speedups']})\n")

    # Not measured.
    w("## Rows not measured\n")
    nm = df[df["status"] != "measured"]
    if len(nm):
        cnt = nm.groupby(["status", "schedule"]).size().reset_index(name="rows")
        w(_table(cnt))
        errors = nm[nm["status"] == "error"]
        if len(errors):
            w("Errors (the executor failed; these rows need a fix and a re-run):\n")
            w(_table(errors.assign(configuration=errors.apply(_config_label, axis=1))[["configuration", "schedule", "reason"]]))
    else:
        w("(all rows measured)\n")
    ne = dec[~dec["evaluable"]]
    if len(ne):
        w(f"Decisions not evaluable ({len(ne)}): a candidate could not be compared.\n")
        w(_table(ne.assign(configuration=ne.apply(_config_label, axis=1))[["configuration", "pick", "not_evaluable_reason"]]))

    # Where the targets are missed, and why.
    w("## Where targets are missed\n")
    if not missed:
        w("Every target is met.\n")
    if "top1" in missed:
        w(f"- **Top-1 agreement** {_pct(s['top1'])} < 95%: {len(wrong)} wrong decision(s) and {s['ties']} tie(s), listed above.")
        causes = pd.Series([_why(d).split(" ")[0] + " " + _why(d).split(" ")[1] for _, d in wrong.iterrows() if _why(d)])
        if len(causes):
            w("  Most frequent cause: " + "; ".join(f"{k} ({v}×)" for k, v in causes.value_counts().items()) + ".")
    if "median_error" in missed:
        for sch in t["median_error"]["missed_by"]:
            r = errs[errs["schedule"] == sch].iloc[0]
            e = metrics.prediction_errors(df)
            e = e[e["schedule"] == sch]
            worst_by = []
            for by in ("threads", "pcie_cap", "ctx", "tier", "model"):
                g = e.groupby(by)["error"].median()
                if len(g) > 1:
                    worst_by.append(f"{by}={g.idxmax()} ({_pct(g.max())})")
            bias = "over-predicts" if r["median_signed_error"] > 0 else "under-predicts"
            w(f"- **{sch}** median error {_pct(r['median_error'])} > 10%: the cost model {bias} it "
              f"(median signed error {_pct(r['median_signed_error'])}); worst groups: {', '.join(worst_by) or 'n/a'}.")
    if "max_regret" in missed:
        worst = ev.sort_values("regret", ascending=False).head(5)
        w(f"- **Max regret** {_pct(s['max_regret'])} > 5%: worst decisions:")
        w("")
        w(_table(_decision_rows(worst)))
    if missed:
        w("\nFix the cost model (never tune it to these rows) and re-run the sweep into a new file.\n")
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L) + "\n")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(prog="shardwise report", description=__doc__)
    ap.add_argument("results", help="oracle results (JSON lines from `shardwise sweep`)")
    ap.add_argument("--out", required=True, help="output folder for report.md and PNGs")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    df = load_results(a.results)
    path = build_report(df, a.out, a.title)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
