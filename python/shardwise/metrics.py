"""Planner-accuracy metrics over oracle rows (a DataFrame from ``results.load_results``).

A *decision* is one (configuration, tier): the planner picks one of the three candidate schedules
(gpu-only, static, dynamic); the oracle measured each of them. Definitions:

- pick: the candidate row with ``chosen``; best: the measured candidate with the lowest
  ``measured_ms``; second: the next one.
- evaluable: the pick was measured and every feasible candidate was measured, or was not run
  (``skipped``: predicted above the sweep's max_step_ms) with a prediction at least
  ``SKIP_MARGIN`` x the best measured time (so only a prediction off by that factor could flip it).
- agree: pick == best, or the pick's plan is the best's plan (the same ``plan_signature``: e.g.
  Dynamic with nothing worth running on the CPU is GPU-only; their measured times differ only by
  noise) — these are counted as ``same_plan`` and listed separately. tie: not agree, but
  measured(pick) - measured(best) <= max(spread(pick), spread(best)), the spreads being the
  interquartile ranges of the repeats — counted separately.
- top-1 agreement: agree / evaluable (ties are not counted as agreement; "top-1 with ties" is shown).
- close contest: at least two candidates measured and second / best - 1 <= CLOSE (5%).
- regret: measured(pick) / measured(best) - 1; 0 where the pick's plan is the best's (same_plan: what
  the two measurements of one computation differ by is the measurement's resolution, reported by
  ``repeatability``, not a cost of the planner's choice — consistent with counting it as agreement).
- prediction error of a row: |predicted - measured| / measured (signed: predicted / measured - 1).
- rank correlation: Spearman and Kendall (tau-b) between predicted and measured times, pooled over
  all measured rows, and Kendall per decision over every measured schedule (baselines included).
- baseline speedup: measured(baseline) / measured(pick) at a tier: at tier 1 the decode
  tokens/s ratio (TPS), at larger tiers the prefill step time ratio (TTFT).
"""
import numpy as np
import pandas as pd

from .results import BASELINES, CANDIDATES

TARGETS = {"top1": 0.95, "median_error": 0.10, "max_regret": 0.05}
CLOSE = 0.05
SKIP_MARGIN = 2.0
CONFIG_COLS = ["config_id", "model", "budget_bytes", "ctx", "threads", "pcie_cap"]


# --- rank statistics (no scipy needed) ---------------------------------------------------------
def _ranks(x):
    return pd.Series(np.asarray(x, dtype=float)).rank(method="average").to_numpy()


def spearman(x, y):
    """Spearman's rho (Pearson correlation of average ranks); nan with fewer than 2 points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def kendall(x, y):
    """Kendall's tau-b (ties in either variable handled); nan with fewer than 2 points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 2:
        return float("nan")
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    iu = np.triu_indices(n, 1)
    s = (dx * dy)[iu].sum()
    n0 = len(iu[0])
    tx = (dx[iu] == 0).sum()
    ty = (dy[iu] == 0).sum()
    denom = np.sqrt((n0 - tx) * (n0 - ty))
    return float(s / denom) if denom > 0 else float("nan")


# --- decisions ---------------------------------------------------------------------------------
def measured(df):
    return df[(df["status"] == "measured") & df["measured_ms"].notna()]


def decisions(df):
    """One row per (configuration, tier) where some candidate is feasible: pick, best, agreement,
    tie, close contest, regret, and why a decision is not evaluable."""
    out = []
    cand = df[df["schedule"].isin(CANDIDATES)]
    for (cid, tier), g in cand.groupby(["config_id", "tier"], sort=False):
        first = g.iloc[0]
        d = {c: first[c] for c in CONFIG_COLS}
        d["tier"] = int(tier)
        picks = g[g["chosen"]]
        feasible = g[g["status"] != "infeasible"]
        if len(picks) == 0 or len(feasible) == 0:
            continue  # no candidate fits: nothing was decided
        pick = picks.iloc[0]
        m = measured(g).sort_values("measured_ms")
        d.update(pick=pick["schedule"], n_feasible=len(feasible), n_measured=len(m), pick_predicted_ms=pick["predicted_ms"])
        probed = pd.to_numeric(g["machine_slowdown"], errors="coerce") if "machine_slowdown" in g.columns else pd.Series(dtype=float)
        probed = probed[probed > 0]
        d["machine_slowdown"] = float(probed.iloc[0]) if len(probed) else np.nan
        # The pick had the planner known the machine's state (every feasible candidate predicted again
        # with the probe's CPU factor; None where one was not).
        again = pd.to_numeric(feasible["predicted_ms_at_probe"], errors="coerce") if "predicted_ms_at_probe" in feasible.columns \
            else pd.Series(np.nan, index=feasible.index)
        d["pick_at_probe"] = feasible.loc[again.idxmin(), "schedule"] if len(again) and again.notna().all() else None
        for s in CANDIDATES:
            r = g[g["schedule"] == s]
            d[f"predicted_{s}"] = r["predicted_ms"].iloc[0] if len(r) else np.nan
            d[f"measured_{s}"] = r["measured_ms"].iloc[0] if len(r) else np.nan
        d["predicted_order"] = " < ".join(feasible.sort_values("predicted_ms")["schedule"])
        d["measured_order"] = " < ".join(m["schedule"])
        not_run = feasible[~feasible.index.isin(m.index)]
        why = ""
        if pick["status"] != "measured":
            why = f"the pick ({pick['schedule']}) was not measured ({pick['status']}: {pick.get('reason', '')})"
        elif len(m) == 0:
            why = "no candidate was measured"
        else:
            best_ms = m["measured_ms"].iloc[0]
            for _, r in not_run.iterrows():
                if r["status"] == "skipped" and r["predicted_ms"] >= SKIP_MARGIN * best_ms:
                    continue
                why = f"{r['schedule']} was not measured ({r['status']}: {r.get('reason', '')})"
                break
        d["evaluable"] = why == ""
        d["not_evaluable_reason"] = why
        if len(m):
            best = m.iloc[0]
            d["best"] = best["schedule"]
            d["best_ms"] = best["measured_ms"]
            d["pick_ms"] = pick["measured_ms"] if pick["status"] == "measured" else np.nan
            d["second_ms"] = m["measured_ms"].iloc[1] if len(m) > 1 else np.nan
            sig_pick, sig_best = pick.get("plan_signature"), best.get("plan_signature")
            d["same_plan"] = bool(d["best"] != d["pick"] and isinstance(sig_pick, str) and sig_pick == sig_best)
            d["agree"] = d["best"] == d["pick"] or d["same_plan"]
            if d["pick_at_probe"] is not None:
                sig_p = g[g["schedule"] == d["pick_at_probe"]]["plan_signature"].iloc[0] if "plan_signature" in g.columns else None
                d["agree_at_probe"] = bool(d["pick_at_probe"] == d["best"] or (isinstance(sig_p, str) and sig_p == sig_best))
            else:
                d["agree_at_probe"] = None
            spread = max(best["measured_spread_ms"] or 0.0, pick["measured_spread_ms"] if pick["status"] == "measured" else 0.0)
            d["tie"] = (not d["agree"]) and bool(d["pick_ms"] - d["best_ms"] <= spread)
            d["contested"] = len(m) >= 2
            d["close"] = bool(len(m) >= 2 and d["second_ms"] / d["best_ms"] - 1 <= CLOSE)
            d["regret"] = 0.0 if d["same_plan"] else d["pick_ms"] / d["best_ms"] - 1
            all_m = measured(df[(df["config_id"] == cid) & (df["tier"] == tier)])
            d["kendall"] = kendall(all_m["predicted_ms"], all_m["measured_ms"]) if len(all_m) >= 3 else np.nan
        else:
            d.update(best=None, best_ms=np.nan, pick_ms=np.nan, second_ms=np.nan, agree=False, same_plan=False, tie=False,
                     contested=False, close=False, regret=np.nan, kendall=np.nan, agree_at_probe=None)
        out.append(d)
    cols = CONFIG_COLS + ["tier", "pick", "best", "agree", "same_plan", "tie", "contested", "close", "regret", "evaluable",
                          "not_evaluable_reason", "n_feasible", "n_measured", "pick_ms", "best_ms", "second_ms",
                          "pick_predicted_ms", "kendall", "predicted_order", "measured_order"]
    res = pd.DataFrame(out)
    if res.empty:
        return pd.DataFrame(columns=cols)
    return res[cols + [c for c in res.columns if c not in cols]]


def repeatability(df):
    """The oracle's resolution: candidates of one decision whose plans are the same computation (the same
    plan_signature under two schedule names, each measured in its own runs). One row per such group:
    configuration, tier, the schedules and their measured times, and `spread` = slowest / fastest - 1."""
    cols = CONFIG_COLS + ["tier", "schedules", "measured_ms", "spread"]
    if "plan_signature" not in df.columns:
        return pd.DataFrame(columns=cols)
    m = measured(df)
    m = m[m["plan_signature"].apply(lambda v: isinstance(v, str) and v != "")]
    out = []
    for (cid, tier, sig), g in m.groupby(["config_id", "tier", "plan_signature"], sort=False):
        if len(g) < 2:
            continue
        first = g.iloc[0]
        d = {c: first[c] for c in CONFIG_COLS}
        d.update(tier=int(tier), schedules=" = ".join(g["schedule"]), measured_ms=" / ".join(f"{v:.4g}" for v in g["measured_ms"]),
                 spread=float(g["measured_ms"].max() / g["measured_ms"].min() - 1))
        out.append(d)
    res = pd.DataFrame(out)
    return res[cols] if len(res) else pd.DataFrame(columns=cols)


def machine_drift(df):
    """The machine's state when each configuration was measured (``sweep --machine-probe``: how much slower
    than the profile, at the configuration's thread count, just before its rows). One row per probed
    configuration: CONFIG_COLS + ``machine_slowdown`` (the last probe's) + ``probes`` (how many times it was
    probed: more than once where the sweep waited for a slow machine to calm, ``sweep --calm``; rows of
    sweeps before it record one); empty when nothing was probed."""
    cols = CONFIG_COLS + ["machine_slowdown", "probes"]
    if "machine_slowdown" not in df.columns:
        return pd.DataFrame(columns=cols)
    m = df[pd.to_numeric(df["machine_slowdown"], errors="coerce") > 0]
    out = []
    for cid, g in m.groupby("config_id", sort=False):
        first = g.iloc[0]
        d = {c: first[c] for c in CONFIG_COLS}
        d["machine_slowdown"] = float(first["machine_slowdown"])
        p = first["machine_probes"] if "machine_probes" in g.columns else None
        d["probes"] = len(p) if isinstance(p, (list, tuple)) and len(p) else 1
        out.append(d)
    res = pd.DataFrame(out)
    return res[cols] if len(res) else pd.DataFrame(columns=cols)


def prediction_errors(df):
    """Measured rows with ``error`` = |pred - meas| / meas and ``signed_error`` = pred / meas - 1."""
    m = measured(df).copy()
    m = m[m["predicted_ms"].notna() & (m["measured_ms"] > 0)]
    m["signed_error"] = m["predicted_ms"] / m["measured_ms"] - 1
    m["error"] = m["signed_error"].abs()
    return m


def error_at_probe_summary(df):
    """Per candidate schedule, over the measured rows that were also predicted with their configuration's
    machine-probe factor (``predicted_ms_at_probe``): rows, median error with the profile as it is and
    with the probe's factor. Empty where the sweep did not probe."""
    cols = ["schedule", "rows", "median_error", "median_error_at_probe"]
    e = prediction_errors(df)
    if "predicted_ms_at_probe" not in e.columns:
        return pd.DataFrame(columns=cols)
    again = pd.to_numeric(e["predicted_ms_at_probe"], errors="coerce")
    e = e[again.notna() & (again > 0)].copy()
    e["error_at_probe"] = (pd.to_numeric(e["predicted_ms_at_probe"]) / e["measured_ms"] - 1).abs()
    rows = []
    for s in CANDIDATES:
        g = e[e["schedule"] == s]
        if len(g):
            rows.append({"schedule": s, "rows": len(g), "median_error": g["error"].median(),
                         "median_error_at_probe": g["error_at_probe"].median()})
    return pd.DataFrame(rows, columns=cols)


def error_summary(df):
    """Per schedule: rows, median and p90 of the error, median signed error (bias), and whether the
    median meets the target (candidates only)."""
    e = prediction_errors(df)
    rows = []
    for s in list(CANDIDATES) + list(BASELINES):
        g = e[e["schedule"] == s]
        if len(g) == 0:
            continue
        rows.append({"schedule": s, "rows": len(g), "median_error": g["error"].median(),
                     "p90_error": g["error"].quantile(0.9), "median_signed_error": g["signed_error"].median(),
                     "candidate": s in CANDIDATES,
                     "meets_target": bool(g["error"].median() <= TARGETS["median_error"])})
    return pd.DataFrame(rows, columns=["schedule", "rows", "median_error", "p90_error", "median_signed_error",
                                       "candidate", "meets_target"])


def error_breakdown(df, by):
    """Median error per schedule and value of a configuration field (where errors concentrate)."""
    e = prediction_errors(df)
    if e.empty:
        return pd.DataFrame()
    return e.pivot_table(index=by, columns="schedule", values="error", aggfunc="median")


def winner_shares(dec):
    """Share of evaluable decisions each candidate wins (measured) and is picked (planner)."""
    d = dec[dec["evaluable"]]
    n = max(len(d), 1)
    return pd.DataFrame({"measured_best": [(d["best"] == s).sum() / n for s in CANDIDATES],
                         "planner_pick": [(d["pick"] == s).sum() / n for s in CANDIDATES]}, index=list(CANDIDATES))


def baseline_speedups(df, dec):
    """Per decision and baseline: measured(baseline) / measured(pick); metric TPS at tier 1, TTFT above."""
    m = measured(df)
    rows = []
    for _, d in dec.iterrows():
        if not np.isfinite(d["pick_ms"]):
            continue
        for b in BASELINES:
            r = m[(m["config_id"] == d["config_id"]) & (m["tier"] == d["tier"]) & (m["schedule"] == b)]
            if len(r):
                rows.append({**{c: d[c] for c in CONFIG_COLS}, "tier": d["tier"], "baseline": b,
                             "metric": "TPS" if d["tier"] == 1 else "TTFT", "pick": d["pick"],
                             "speedup": r["measured_ms"].iloc[0] / d["pick_ms"]})
    return pd.DataFrame(rows, columns=CONFIG_COLS + ["tier", "baseline", "metric", "pick", "speedup"])


def speedup_summary(sp):
    """Geometric mean, min and max speedup per model, baseline and tier."""
    if sp.empty:
        return pd.DataFrame(columns=["model", "baseline", "metric", "tier", "decisions", "geomean", "min", "max"])
    g = sp.groupby(["model", "baseline", "metric", "tier"])["speedup"]
    return pd.DataFrame({"decisions": g.size(), "geomean": g.apply(lambda s: float(np.exp(np.log(s).mean()))),
                         "min": g.min(), "max": g.max()}).reset_index()


def summarize(df):
    """The headline numbers and the target checks, as a dict."""
    dec = decisions(df)
    ev = dec[dec["evaluable"]]
    n = len(ev)
    e = prediction_errors(df)
    errs = error_summary(df)
    cand_errs = errs[errs["candidate"]] if len(errs) else errs
    s = {
        "rows": len(df),
        "configurations": df["config_id"].nunique() if len(df) else 0,
        "rows_measured": int((df["status"] == "measured").sum()) if len(df) else 0,
        "rows_infeasible": int((df["status"] == "infeasible").sum()) if len(df) else 0,
        "rows_skipped": int((df["status"] == "skipped").sum()) if len(df) else 0,
        "rows_error": int((df["status"] == "error").sum()) if len(df) else 0,
        "decisions": len(dec),
        "evaluable": n,
        "agree": int(ev["agree"].sum()),
        "same_plan": int(ev["same_plan"].sum()),
        "ties": int(ev["tie"].sum()),
        "top1": float(ev["agree"].mean()) if n else float("nan"),
        "top1_with_ties": float((ev["agree"] | ev["tie"]).mean()) if n else float("nan"),
        "contested": int(ev["contested"].sum()),
        "top1_contested": float(ev[ev["contested"]]["agree"].mean()) if ev["contested"].any() else float("nan"),
        "close": int(ev["close"].sum()),
        "top1_close": float(ev[ev["close"]]["agree"].mean()) if ev["close"].any() else float("nan"),
        "mean_regret": float(ev["regret"].mean()) if n else float("nan"),
        "max_regret": float(ev["regret"].max()) if n else float("nan"),
        "spearman": spearman(e["predicted_ms"], e["measured_ms"]) if len(e) else float("nan"),
        "kendall": kendall(e["predicted_ms"], e["measured_ms"]) if len(e) else float("nan"),
        "mean_decision_kendall": float(dec["kendall"].mean()) if dec["kendall"].notna().any() else float("nan"),
        "median_error": {r["schedule"]: float(r["median_error"]) for _, r in errs.iterrows()},
        "p90_error": {r["schedule"]: float(r["p90_error"]) for _, r in errs.iterrows()},
    }
    s["targets"] = {
        "top1": {"value": s["top1"], "target": TARGETS["top1"], "met": bool(n and s["top1"] >= TARGETS["top1"])},
        "median_error": {"value": float(cand_errs["median_error"].max()) if len(cand_errs) else float("nan"),
                         "target": TARGETS["median_error"],
                         "met": bool(len(cand_errs) and (cand_errs["median_error"] <= TARGETS["median_error"]).all()),
                         "missed_by": [r["schedule"] for _, r in cand_errs.iterrows() if not r["meets_target"]]},
        "max_regret": {"value": s["max_regret"], "target": TARGETS["max_regret"],
                       "met": bool(n and s["max_regret"] <= TARGETS["max_regret"])},
    }
    return s


# --- strict agreement, ties, contests, run-to-run spread -----------------------------------------
# Outcomes of an evaluable decision, each decision in exactly one (decision_outcomes):
OUTCOMES = ("strict", "same_plan", "tie", "miss")
CONTESTS = ("clear", "close", "uncontested")


def _is_sig(v):
    return isinstance(v, str) and v != ""


def _runner_up(m, best):
    """The fastest measured candidate of one decision (m: its measured candidate rows, fastest first) whose
    plan is not the best's: another ``plan_signature`` where both rows carry one, else another schedule
    name. A second name of the best's plan is the same computation, not an alternative the planner could
    have picked, so it does not make a decision close. Returns (schedule, measured_ms), or (None, nan)
    when no other plan was measured."""
    for _, r in m.iterrows():
        if r["schedule"] == best["schedule"]:
            continue
        if _is_sig(r.get("plan_signature")) and _is_sig(best.get("plan_signature")) \
                and r["plan_signature"] == best["plan_signature"]:
            continue
        return r["schedule"], float(r["measured_ms"])
    return None, float("nan")


def decision_outcomes(df, dec=None, within=CLOSE):
    """One row per evaluable decision with a measured best, classifying the pick against the measured
    fastest candidate (``best``), each decision in exactly one ``outcome``:

    - ``strict``: the pick's schedule name is the best's name;
    - ``same_plan``: the names differ but both rows carry the same ``plan_signature`` (one computation);
    - ``tie``: neither, and measured(pick) / measured(best) - 1 <= ``within`` (5%) — unlike
      ``decisions()``'s ``tie``, which uses the repeats' interquartile range;
    - ``miss``: the pick is more than ``within`` slower.

    ``plan_known`` says whether both the pick and the best carry a signature: where it is False a
    ``tie``/``miss`` may be a same plan that these rows cannot show. ``contest`` says how hard the
    decision was: ``clear`` where the runner-up (the fastest *other plan*, ``_runner_up``) is more than
    ``within`` slower than the best (``margin`` = runner_up_ms / best_ms - 1), ``close`` where it is
    within it, ``uncontested`` where no other plan was measured (e.g. the rest skipped as too slow)."""
    dec = decisions(df) if dec is None else dec
    ev = dec[dec["evaluable"] & dec["best"].notna()] if len(dec) else dec
    cand = measured(df[df["schedule"].isin(CANDIDATES)])
    groups = {k: g.sort_values("measured_ms", kind="stable") for k, g in cand.groupby(["config_id", "tier"], sort=False)}
    out = []
    for _, d in ev.iterrows():
        m = groups[(d["config_id"], d["tier"])]
        best = m[m["schedule"] == d["best"]].iloc[0]
        pick = m[m["schedule"] == d["pick"]].iloc[0]
        known = _is_sig(pick.get("plan_signature")) and _is_sig(best.get("plan_signature"))
        gap = float(pick["measured_ms"] / best["measured_ms"] - 1)
        if d["pick"] == d["best"]:
            outcome = "strict"
        elif known and pick["plan_signature"] == best["plan_signature"]:
            outcome = "same_plan"
        else:
            outcome = "tie" if gap <= within else "miss"
        ru, ru_ms = _runner_up(m, best)
        margin = ru_ms / float(best["measured_ms"]) - 1
        contest = "uncontested" if ru is None else ("close" if margin <= within else "clear")
        out.append({**{c: d[c] for c in CONFIG_COLS}, "tier": d["tier"], "pick": d["pick"], "best": d["best"],
                    "runner_up": ru, "pick_ms": float(pick["measured_ms"]), "best_ms": float(best["measured_ms"]),
                    "runner_up_ms": ru_ms, "gap": gap, "margin": margin, "plan_known": known,
                    "outcome": outcome, "contest": contest})
    cols = CONFIG_COLS + ["tier", "pick", "best", "runner_up", "pick_ms", "best_ms", "runner_up_ms", "gap", "margin",
                          "plan_known", "outcome", "contest"]
    return pd.DataFrame(out, columns=cols)


def outcome_summary(out):
    """Counts over ``decision_outcomes``: ``decisions``; per outcome its count (``strict``, ``same_plan``,
    ``tie``, ``miss``); ``strict_top1`` = strict / decisions (the pick's name is the best's name);
    ``plans_unknown``: ties and misses whose plans could not be compared (a signature missing); per contest
    (``clear``, ``close``, ``uncontested``) its count, ``strict_top1_<contest>`` (strict share of them) and
    ``plan_top1_<contest>`` (strict or same_plan share). Shares are nan where there is nothing to divide."""
    n = len(out)
    s = {"decisions": n}
    for k in OUTCOMES:
        s[k] = int((out["outcome"] == k).sum())
    s["strict_top1"] = s["strict"] / n if n else float("nan")
    s["plans_unknown"] = int((out["outcome"].isin(["tie", "miss"]) & ~out["plan_known"].astype(bool)).sum())
    for c in CONTESTS:
        g = out[out["contest"] == c]
        s[c] = len(g)
        s[f"strict_top1_{c}"] = float((g["outcome"] == "strict").mean()) if len(g) else float("nan")
        s[f"plan_top1_{c}"] = float(g["outcome"].isin(["strict", "same_plan"]).mean()) if len(g) else float("nan")
    return s


def run_to_run_spread(df, schedules=CANDIDATES):
    """How much one row's repeated measurements (its ``samples_ms``: the repeats of all its rounds) vary:
    one row per measured row of ``schedules`` (None: every schedule) with at least two samples, ``spread``
    = (max - min) / median of its samples. Rows without ``samples_ms`` (older sweeps) use
    ``measured_min_ms`` / ``measured_max_ms`` / ``measured_ms`` (the median) when ``repeats`` >= 2.
    Empty when no row was measured more than once: the spread is then not measured."""
    cols = CONFIG_COLS + ["tier", "schedule", "repeats", "spread"]
    m = measured(df)
    if schedules is not None:
        m = m[m["schedule"].isin(schedules)]
    out = []
    for _, r in m.iterrows():
        s = r.get("samples_ms")
        if isinstance(s, (list, tuple, np.ndarray)) and len(s) >= 2:
            v = np.asarray(s, dtype=float)
            n, lo, hi, med = len(v), v.min(), v.max(), float(np.median(v))
        else:
            n = pd.to_numeric(r.get("repeats"), errors="coerce")
            lo = pd.to_numeric(r.get("measured_min_ms"), errors="coerce")
            hi = pd.to_numeric(r.get("measured_max_ms"), errors="coerce")
            med = r["measured_ms"]
            if not (n >= 2 and np.isfinite(lo) and np.isfinite(hi)):
                continue
        if med > 0:
            out.append({**{c: r[c] for c in CONFIG_COLS}, "tier": int(r["tier"]), "schedule": r["schedule"],
                        "repeats": int(n), "spread": float((hi - lo) / med)})
    return pd.DataFrame(out, columns=cols)
