"""The report's plots: each function writes one PNG and returns its path (no display needed; the
report selects the Agg backend, notebooks keep theirs)."""
import matplotlib.pyplot as plt
import numpy as np

from .metrics import prediction_errors
from .results import BASELINES, CANDIDATES

SCHEDULE_COLORS = {"gpu-only": "tab:blue", "static": "tab:orange", "dynamic": "tab:green",
                   "layer-split": "tab:gray", "cpu-moe": "tab:purple"}


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scatter_predicted_vs_measured(df, path, title=""):
    """One panel per schedule: predicted vs measured step time (log-log), y = x and ±10% lines."""
    e = prediction_errors(df)
    scheds = [s for s in list(CANDIDATES) + list(BASELINES) if (e["schedule"] == s).any()] or list(CANDIDATES)
    fig, axes = plt.subplots(1, len(scheds), figsize=(3.6 * len(scheds), 3.6), squeeze=False)
    tiers = sorted(e["tier"].unique()) if len(e) else []
    markers = ["o", "s", "^", "D", "v", "P"]
    for ax, s in zip(axes[0], scheds):
        g = e[e["schedule"] == s]
        for i, t in enumerate(tiers):
            gt = g[g["tier"] == t]
            if len(gt):
                ax.scatter(gt["predicted_ms"], gt["measured_ms"], s=14, marker=markers[i % len(markers)],
                           color=SCHEDULE_COLORS.get(s), alpha=0.7, label=f"tier {t}")
        if len(g):
            lo = min(g["predicted_ms"].min(), g["measured_ms"].min()) * 0.8
            hi = max(g["predicted_ms"].max(), g["measured_ms"].max()) * 1.25
            xs = np.array([lo, hi])
            ax.plot(xs, xs, "k-", lw=0.8)
            ax.plot(xs, xs * 1.1, "k:", lw=0.6)
            ax.plot(xs, xs / 1.1, "k:", lw=0.6)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set_title(f"{s} ({len(g)} rows)")
        ax.set_xlabel("predicted ms")
        ax.set_ylabel("measured ms")
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def winner_shares_plot(shares, path):
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    x = np.arange(len(shares.index))
    ax.bar(x - 0.2, shares["measured_best"] * 100, 0.4, label="measured best")
    ax.bar(x + 0.2, shares["planner_pick"] * 100, 0.4, label="planner pick")
    ax.set_xticks(x)
    ax.set_xticklabels(shares.index)
    ax.set_ylabel("% of decisions")
    ax.legend(fontsize=8)
    return _save(fig, path)


def regret_plot(dec, path):
    """Sorted regret of every evaluable decision, with the 5% target."""
    d = dec[dec["evaluable"]].sort_values("regret")
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    ax.plot(np.arange(len(d)), d["regret"].to_numpy() * 100, ".-", lw=0.8)
    ax.axhline(5, color="r", ls=":", lw=0.8, label="target 5%")
    ax.set_xlabel("decisions (sorted)")
    ax.set_ylabel("regret % (pick / best - 1)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def error_plot(df, path):
    """Signed prediction error (predicted / measured - 1) per schedule."""
    e = prediction_errors(df)
    scheds = [s for s in list(CANDIDATES) + list(BASELINES) if (e["schedule"] == s).any()]
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    if scheds:
        ax.boxplot([e[e["schedule"] == s]["signed_error"].to_numpy() * 100 for s in scheds], labels=scheds)
    ax.axhspan(-10, 10, color="g", alpha=0.1, label="±10%")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("predicted / measured - 1 (%)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def drift_plot(df, path):
    """Signed prediction error of each measured candidate row against the machine's slowdown when its
    configuration was measured (``machine_slowdown``), per thread count: errors that follow the drift are
    the machine's, not the planner's."""
    e = prediction_errors(df)
    e = e[e["schedule"].isin(CANDIDATES)]
    if "machine_slowdown" in e.columns:
        e = e[e["machine_slowdown"].astype(float) > 0]
    else:
        e = e.iloc[0:0]
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for t, g in e.groupby("threads"):
        ax.scatter(g["machine_slowdown"].astype(float), g["signed_error"] * 100, s=12, alpha=0.7, label=f"{t} threads")
    ax.axvline(1.0, color="k", lw=0.6)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("machine slowdown against the profile (x)")
    ax.set_ylabel("predicted / measured - 1 (%)")
    if len(e):
        ax.legend(fontsize=8)
    return _save(fig, path)


def speedups_plot(summary, path):
    """Geometric-mean speedup of the planner's pick over each baseline, per model and metric."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    if len(summary):
        labels = [f"{r.model}\n{r.baseline} {r.metric}" for r in summary.itertuples()]
        x = np.arange(len(summary))
        ax.bar(x, summary["geomean"], color=[SCHEDULE_COLORS.get(b) for b in summary["baseline"]])
        # A geometric mean of equal values can land a rounding error outside them (exp(log(x)) != x):
        # the bars' error ranges are clipped at 0, which matplotlib requires.
        low = np.maximum(summary["geomean"] - summary["min"], 0)
        high = np.maximum(summary["max"] - summary["geomean"], 0)
        ax.errorbar(x, summary["geomean"], yerr=[low, high], fmt="none", ecolor="k", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
    ax.axhline(1, color="k", lw=0.6)
    ax.set_ylabel("speedup of the pick (x)")
    return _save(fig, path)
