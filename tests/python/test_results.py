"""The results loader: §6 keys, torn lines, duplicates, the smoke sweep's file."""
import json

import pytest

from shardwise import results
from shardwise.results import load_results, load_sweeps


def test_loader_on_the_smoke_sweep(smoke_results):
    df = load_results(smoke_results)
    assert len(df) > 50
    for k in results.ROW_KEYS:
        assert k in df.columns
    assert set(df["device"]) == {"emu"} and results.is_emulated(df)
    assert set(df["status"]) <= {"measured", "infeasible", "skipped", "error"}
    assert (df["status"] == "measured").sum() > 20
    m = df[df["status"] == "measured"]
    assert (m["measured_ms"] > 0).all() and (m["measured_spread_ms"] >= 0).all()
    # One pick per (configuration, tier) that has a feasible candidate.
    picks = df[df["chosen"]].groupby(["config_id", "tier"]).size()
    assert (picks == 1).all()
    assert not df.duplicated(["config_id", "tier", "schedule"]).any()
    sweeps = load_sweeps(smoke_results)
    assert sweeps and sweeps[0]["experiment"] == "smoke" and "effective_config" in sweeps[0]


def test_torn_lines_and_duplicates(tmp_path, known_jsonl):
    p = tmp_path / "torn.jsonl"
    text = open(known_jsonl).read()
    first_row = text.splitlines()[1]
    p.write_text(text + first_row + "\n" + '{"record": "row", "config_id": "tor')
    df = load_results(p)
    assert df.attrs["bad_lines"] == 1 and df.attrs["duplicates"] == 1
    assert len(df) == len(load_results(known_jsonl))


def test_missing_keys_are_an_error(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"record": "row", "config_id": "x"}) + "\n")
    with pytest.raises(ValueError, match="required keys"):
        load_results(p)
