"""Oracle results files (JSON lines written by ``shardwise sweep``) as pandas DataFrames.

Each line is a record: ``"record": "row"`` (one per configuration x tier x schedule, the DESIGN.md §6
keys), ``"sweep"`` (one per sweep invocation: the effective experiment, revision, machine) or
``"sweep_end"``. Torn or unparsable lines (a sweep killed mid-write) are skipped and counted.
"""
import json

import numpy as np
import pandas as pd

# The contract (DESIGN.md §6): every row has these keys.
ROW_KEYS = ["config_id", "model", "budget_bytes", "ctx", "threads", "pcie_cap", "tier", "schedule", "predicted_ms",
            "measured_ms", "measured_spread_ms", "vram_bytes", "chosen", "machine", "device", "profile_hash", "git_rev"]
# Written by the sweep as well; filled with defaults when absent (e.g. in hand-made files).
EXTRA_DEFAULTS = {"status": None, "reason": "", "feasible": True, "candidate": None, "planner_choice": None,
                  "repeats": np.nan, "budget": None, "experiment": None, "plan_signature": None,
                  "machine_slowdown": np.nan, "predicted_ms_at_probe": np.nan}
CANDIDATES = ("gpu-only", "static", "dynamic")
BASELINES = ("layer-split", "cpu-moe")


def _records(path):
    bad = 0
    out = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict):
                out.append(rec)
            else:
                bad += 1
    return out, bad


def load_sweeps(path):
    """The ``sweep`` records of a results file (one per invocation), as a list of dicts."""
    recs, _ = _records(path)
    return [r for r in recs if r.get("record") == "sweep"]


def load_results(path):
    """The rows of a results file as a DataFrame, one row per (config_id, tier, schedule).

    Missing optional columns get defaults; ``status`` is derived when absent ("measured" when
    measured_ms is set, else "infeasible"). Duplicate keys keep the first row. ``df.attrs`` carries
    ``sweeps`` (the sweep records), ``bad_lines`` and ``duplicates``.
    """
    recs, bad = _records(path)
    rows = [r for r in recs if r.get("record", "row") == "row"]
    missing = sorted({k for r in rows for k in ROW_KEYS if k not in r})
    if missing:
        raise ValueError(f"{path}: rows lack the required keys {missing} (DESIGN.md §6)")
    df = pd.DataFrame(rows, columns=None if rows else ROW_KEYS)
    for k, v in EXTRA_DEFAULTS.items():
        if k not in df.columns:
            df[k] = v
    if len(df):
        df["candidate"] = df["candidate"].where(df["candidate"].notna(), df["schedule"].isin(CANDIDATES))
        derived = np.where(df["measured_ms"].notna(), "measured", "infeasible")
        df["status"] = df["status"].where(df["status"].notna(), derived)
        for c in ("predicted_ms", "measured_ms", "measured_spread_ms"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        df["measured_spread_ms"] = df["measured_spread_ms"].fillna(0.0).where(df["measured_ms"].notna())
        df["chosen"] = df["chosen"].astype(bool)
        df["candidate"] = df["candidate"].astype(bool)
    n = len(df)
    df = df.drop_duplicates(subset=["config_id", "tier", "schedule"], keep="first").reset_index(drop=True)
    df.attrs["sweeps"] = [r for r in recs if r.get("record") == "sweep"]
    df.attrs["bad_lines"] = bad
    df.attrs["duplicates"] = n - len(df)
    df.attrs["path"] = str(path)
    return df


def is_emulated(df):
    """True when any row was measured on the emulated device (timings are not GPU numbers)."""
    return bool(len(df)) and (df["device"] != "cuda").any()
