"""Shared fixtures for the Python tests (run by CTest with /usr/bin/python3 and PYTHONPATH=<build>/python)."""
import json
import os
import pathlib

import pytest

REPO = pathlib.Path(os.environ.get("SHARDWISE_REPO", pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture
def repo():
    return REPO


@pytest.fixture
def smoke_results():
    p = os.environ.get("SHARDWISE_SMOKE_RESULTS")
    if not p or not os.path.exists(p):
        pytest.skip("no smoke sweep results ($SHARDWISE_SMOKE_RESULTS; CTest's oracle_smoke_sweep makes them)")
    return p


def row(config_id, tier, schedule, predicted, measured, spread=0.0, chosen=False, status=None, model="m", threads=16,
        device="cuda", **extra):
    """One oracle row with every DESIGN.md §6 key."""
    r = {"record": "row", "config_id": config_id, "model": model, "budget_bytes": 4 << 30, "ctx": 4096, "threads": threads,
         "pcie_cap": "16GB/s", "tier": tier, "schedule": schedule, "predicted_ms": predicted, "measured_ms": measured,
         "measured_spread_ms": spread if measured is not None else None, "vram_bytes": 1 << 30, "chosen": chosen,
         "machine": "test machine", "device": device, "profile_hash": "p", "git_rev": "g",
         "status": status or ("measured" if measured is not None else "infeasible"), "reason": ""}
    r.update(extra)
    return r


def known_rows(device="cuda"):
    """Hand-made decisions whose metrics are worked out in test_metrics.py."""
    R = lambda *a, **k: row(*a, device=device, **k)  # noqa: E731
    return [
        # A, tier 1: static picked and best.
        R("A", 1, "gpu-only", 10, 12, 0.1), R("A", 1, "static", 5, 5, 0.1, chosen=True), R("A", 1, "dynamic", 6, 5.5, 0.1),
        R("A", 1, "layer-split", 9, 10, 0.1), R("A", 1, "cpu-moe", None, None),
        # A, tier 512: gpu-only picked, static best by 3/97 (a close contest), not a tie.
        R("A", 512, "gpu-only", 100, 100, 1.0, chosen=True), R("A", 512, "static", 150, 97, 1.0),
        R("A", 512, "dynamic", 120, 130, 1.0), R("A", 512, "layer-split", 190, 200, 1.0),
        # B, tier 1: gpu-only picked, static best by 0.5 ms within the spread of 1 ms: a tie.
        R("B", 1, "gpu-only", 20, 20.5, 1.0, chosen=True, model="n"), R("B", 1, "static", 21, 20, 1.0, model="n"),
        R("B", 1, "dynamic", None, None, model="n"),
        # B, tier 512: gpu-only skipped (predicted 5000 >= 2 x best), static picked and best.
        R("B", 512, "gpu-only", 5000, None, status="skipped", model="n"), R("B", 512, "static", 300, 310, 2.0, chosen=True, model="n"),
        R("B", 512, "dynamic", 320, 330, 2.0, model="n"),
        # C, tier 1: static failed to run: not evaluable.
        R("C", 1, "gpu-only", 8, 8, 0.1, chosen=True), R("C", 1, "static", 7, None, status="error", reason="boom"),
        R("C", 1, "dynamic", None, None),
    ]


@pytest.fixture
def known_jsonl(tmp_path):
    p = tmp_path / "known.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps({"record": "sweep", "experiment": "known", "experiment_hash": "h"}) + "\n")
        for r in known_rows():
            f.write(json.dumps(r) + "\n")
    return p
