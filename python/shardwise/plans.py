"""Plan tables from the compiled module as pandas DataFrames (the schedule explorer's views)."""
import pandas as pd


def candidates(table):
    """One row per (tier, schedule): feasible, predicted ms, tokens/s, VRAM bytes, chosen."""
    rows = []
    for e in table.tiers:
        for p in e.candidates:
            rows.append({"tier": e.tokens, "schedule": p.schedule, "feasible": p.feasible,
                         "predicted_ms": p.predicted_ms if p.feasible else float("nan"),
                         "tokens_per_s": 1000.0 * e.tokens / p.predicted_ms if p.feasible and p.predicted_ms > 0 else float("nan"),
                         "vram_bytes": p.vram_bytes, "chosen": e.feasible and p.schedule == e.chosen})
    return pd.DataFrame(rows)


def predictions(table):
    """tier x schedule table of predicted step ms (NaN = infeasible)."""
    c = candidates(table)
    return c.pivot(index="tier", columns="schedule", values="predicted_ms")


def chosen(table):
    """tier -> the chosen schedule ("none" when nothing fits)."""
    return pd.Series({e.tokens: e.chosen for e in table.tiers}, name="chosen")
