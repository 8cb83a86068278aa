"""Metrics on hand-made rows whose right numbers are known (conftest.known_rows)."""
import json
import math

import numpy as np

import pytest

from shardwise import metrics
from shardwise.results import load_results


def test_rank_statistics():
    assert metrics.kendall([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert metrics.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert metrics.kendall([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # tau-b with a tie: x = 1,2,2  y = 1,2,3 -> (2 concordant, 0 discordant) / sqrt(2 * 3)
    assert metrics.kendall([1, 2, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(metrics.kendall([1], [1]))


def test_decisions(known_jsonl):
    df = load_results(known_jsonl)
    dec = metrics.decisions(df).set_index(["config_id", "tier"])
    assert len(dec) == 5
    a1, a512, b1, b512, c1 = (dec.loc[k] for k in [("A", 1), ("A", 512), ("B", 1), ("B", 512), ("C", 1)])
    assert a1["agree"] and a1["regret"] == 0 and not a1["close"]
    assert a512["pick"] == "gpu-only" and a512["best"] == "static" and not a512["agree"] and not a512["tie"]
    assert a512["regret"] == pytest.approx(3 / 97) and a512["close"]
    assert b1["tie"] and not b1["agree"] and b1["close"] and b1["regret"] == pytest.approx(0.025)
    assert b512["evaluable"] and b512["agree"]  # the skipped gpu-only was predicted 16x the best
    assert not c1["evaluable"] and "static" in c1["not_evaluable_reason"] and "error" in c1["not_evaluable_reason"]


def test_summary_numbers(known_jsonl):
    s = metrics.summarize(load_results(known_jsonl))
    assert s["decisions"] == 5 and s["evaluable"] == 4
    assert s["agree"] == 2 and s["ties"] == 1
    assert s["top1"] == pytest.approx(0.5)
    assert s["top1_with_ties"] == pytest.approx(0.75)
    assert s["close"] == 2 and s["top1_close"] == pytest.approx(0.0)
    assert s["mean_regret"] == pytest.approx((3 / 97 + 0.025) / 4)
    assert s["max_regret"] == pytest.approx(3 / 97)
    assert s["median_error"]["gpu-only"] == pytest.approx((0 + 0.5 / 20.5) / 2)
    assert s["median_error"]["static"] == pytest.approx((10 / 310 + 1 / 20) / 2)
    assert s["median_error"]["dynamic"] == pytest.approx(10 / 130)
    assert s["rows_skipped"] == 1 and s["rows_error"] == 1
    t = s["targets"]
    assert not t["top1"]["met"] and t["median_error"]["met"] and t["max_regret"]["met"]


def test_shares_and_speedups(known_jsonl):
    df = load_results(known_jsonl)
    dec = metrics.decisions(df)
    sh = metrics.winner_shares(dec)
    assert sh.loc["static", "measured_best"] == pytest.approx(1.0)
    assert sh.loc["gpu-only", "planner_pick"] == pytest.approx(0.5)
    sp = metrics.baseline_speedups(df, dec)
    got = {(r.config_id, r.tier): (r.metric, r.speedup) for r in sp.itertuples()}
    assert got[("A", 1)] == ("TPS", pytest.approx(2.0))
    assert got[("A", 512)] == ("TTFT", pytest.approx(2.0))
    summ = metrics.speedup_summary(sp)
    assert set(summ["metric"]) == {"TPS", "TTFT"}


def test_error_summary_flags_a_bad_schedule(tmp_path):
    from conftest import row
    import json
    p = tmp_path / "bad.jsonl"
    rows = [row(f"c{i}", 1, "static", 10, 20, chosen=True) for i in range(5)]  # static predicted 2x too fast
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = metrics.summarize(load_results(p))
    assert s["median_error"]["static"] == pytest.approx(0.5)
    assert not s["targets"]["median_error"]["met"] and s["targets"]["median_error"]["missed_by"] == ["static"]


def test_same_plan_under_two_names_counts_as_agreement(tmp_path):
    """Dynamic whose plan is GPU-only's (one plan_signature) measured 1% faster than the picked
    gpu-only: the same computation, so an agreement listed as same_plan; a different signature with
    the same numbers stays a disagreement."""
    from conftest import row
    import json
    p = tmp_path / "same.jsonl"
    rows = [row("S", 1, "gpu-only", 10, 10.1, 0.01, chosen=True, plan_signature="aa"), row("S", 1, "static", 12, 13, 0.01, plan_signature="bb"),
            row("S", 1, "dynamic", 10, 10.0, 0.01, plan_signature="aa"),
            row("D", 1, "gpu-only", 10, 10.1, 0.01, chosen=True, plan_signature="cc"), row("D", 1, "static", 12, 13, 0.01, plan_signature="dd"),
            row("D", 1, "dynamic", 10, 10.0, 0.01, plan_signature="ee")]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = load_results(p)
    dec = metrics.decisions(df).set_index("config_id")
    assert dec.loc["S", "agree"] and dec.loc["S", "same_plan"] and dec.loc["S", "best"] == "dynamic"
    assert not dec.loc["D", "agree"] and not dec.loc["D", "same_plan"] and not dec.loc["D", "tie"]
    # No regret for the same computation; the different plan's 1% stays.
    assert dec.loc["S", "regret"] == 0 and dec.loc["D", "regret"] == pytest.approx(0.01)
    s = metrics.summarize(df)
    assert s["agree"] == 1 and s["same_plan"] == 1 and s["top1"] == pytest.approx(0.5)
    assert s["max_regret"] == pytest.approx(0.01)


def test_repeatability_of_one_plan_under_two_names(tmp_path):
    from conftest import row
    rows = [row("D", 1, "gpu-only", 100, 100, 0.5, chosen=True, plan_signature="x"),
            row("D", 1, "dynamic", 100, 106, 0.5, plan_signature="x"),
            row("D", 1, "static", 90, 120, 0.5, plan_signature="y"),
            row("D", 512, "gpu-only", 300, 300, 1.0, chosen=True, plan_signature="z"),
            row("D", 512, "dynamic", 300, None, plan_signature="z", status="error")]
    p = tmp_path / "rep.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = metrics.repeatability(load_results(p))
    assert len(rep) == 1  # tier 512's second name was not measured
    r = rep.iloc[0]
    assert r["tier"] == 1 and r["schedules"] == "gpu-only = dynamic"
    assert r["spread"] == pytest.approx(0.06)
    # Without signatures there is nothing to compare.
    q = tmp_path / "nosig.jsonl"
    q.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "plan_signature"}) + "\n" for r in rows))
    assert len(metrics.repeatability(load_results(q))) == 0


def test_machine_drift_per_configuration(tmp_path):
    from conftest import row
    rows = [row("D", 1, "static", 100, 100, chosen=True, machine_slowdown=1.25),
            row("D", 512, "static", 100, 100, chosen=True, machine_slowdown=1.25),
            row("E", 1, "static", 100, 100, chosen=True, machine_slowdown=None),
            row("F", 1, "static", 100, None, chosen=True, status="skipped")]
    p = tmp_path / "drift.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = load_results(p)
    drift = metrics.machine_drift(df)
    assert list(drift["config_id"]) == ["D"] and drift["machine_slowdown"].iloc[0] == 1.25
    assert drift["probes"].iloc[0] == 1  # rows without machine_probes (sweeps before --calm): probed once
    # A configuration the sweep waited for: every probe recorded, the last one is its factor.
    waited = [row("G", 1, "static", 100, 100, chosen=True, machine_slowdown=1.05, machine_probes=[1.6, 1.4, 1.05]),
              row("H", 1, "static", 100, 100, chosen=True, machine_slowdown=1.1, machine_probes=[1.1])]
    q = tmp_path / "waited.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in waited))
    drift = metrics.machine_drift(load_results(q)).set_index("config_id")
    assert drift.loc["G", "probes"] == 3 and drift.loc["G", "machine_slowdown"] == 1.05
    assert drift.loc["H", "probes"] == 1
    dec = metrics.decisions(df).set_index(["config_id", "tier"])
    assert dec.loc[("D", 512), "machine_slowdown"] == 1.25
    assert np.isnan(dec.loc[("E", 1), "machine_slowdown"])


def outcome_rows():
    """Hand-made decisions, one per outcome / contest; their classification is worked out in
    test_decision_outcomes_by_hand (and used by test_report)."""
    from conftest import row
    return [
        # S: gpu-only picked and fastest; static 20% slower: strict, clear.
        row("S", 1, "gpu-only", 10, 10, chosen=True, plan_signature="s1"), row("S", 1, "static", 11, 12, plan_signature="s2"),
        # P: gpu-only picked (10.2), dynamic fastest (10.0) with gpu-only's plan; static, another plan, 30% slower:
        # same_plan, and clear (the 2% twin is no runner-up).
        row("P", 1, "gpu-only", 10, 10.2, chosen=True, plan_signature="p1"), row("P", 1, "dynamic", 10, 10.0, plan_signature="p1"),
        row("P", 1, "static", 12, 13, plan_signature="p2"),
        # T: dynamic picked 4% slower than static, another plan: tie, close.
        row("T", 1, "dynamic", 9, 10.4, chosen=True, plan_signature="t1"), row("T", 1, "static", 10, 10.0, plan_signature="t2"),
        # M: static picked 10% slower than gpu-only: miss, clear (runner-up 10%).
        row("M", 1, "static", 9, 11, chosen=True, plan_signature="m1"), row("M", 1, "gpu-only", 10, 10, plan_signature="m2"),
        # U: static picked and fastest, dynamic skipped (predicted 10x), gpu-only infeasible: strict, uncontested.
        row("U", 1, "static", 10, 10, chosen=True, plan_signature="u1"),
        row("U", 1, "dynamic", 100, None, status="skipped", plan_signature="u2"), row("U", 1, "gpu-only", None, None),
        # N: no signatures: gpu-only picked 2% slower than dynamic: a tie whose plans cannot be compared; the
        # runner-up falls back to the next name (gpu-only): close.
        row("N", 1, "gpu-only", 10, 10.2, chosen=True), row("N", 1, "dynamic", 10, 10.0),
        # X: the pick failed to run: not evaluable, so in no outcome.
        row("X", 1, "static", 10, None, chosen=True, status="error", plan_signature="x1"),
        row("X", 1, "gpu-only", 12, 12, plan_signature="x2"),
    ]


def test_decision_outcomes_by_hand(tmp_path):
    p = tmp_path / "out.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in outcome_rows()))
    out = metrics.decision_outcomes(load_results(p)).set_index("config_id")
    assert sorted(out.index) == ["M", "N", "P", "S", "T", "U"]  # X is not evaluable
    assert dict(out["outcome"]) == {"S": "strict", "P": "same_plan", "T": "tie", "M": "miss", "U": "strict", "N": "tie"}
    assert dict(out["contest"]) == {"S": "clear", "P": "clear", "T": "close", "M": "clear", "U": "uncontested", "N": "close"}
    assert out.loc["P", "runner_up"] == "static" and out.loc["P", "margin"] == pytest.approx(0.3)
    assert out.loc["T", "gap"] == pytest.approx(0.04) and out.loc["M", "gap"] == pytest.approx(0.1)
    assert out.loc["N", "runner_up"] == "gpu-only" and not out.loc["N", "plan_known"] and out.loc["P", "plan_known"]
    assert out.loc["U", "runner_up"] is None and np.isnan(out.loc["U", "margin"])
    s = metrics.outcome_summary(out.reset_index())
    assert (s["decisions"], s["strict"], s["same_plan"], s["tie"], s["miss"]) == (6, 2, 1, 2, 1)
    assert s["strict_top1"] == pytest.approx(2 / 6) and s["plans_unknown"] == 1
    assert (s["clear"], s["close"], s["uncontested"]) == (3, 2, 1)
    assert s["strict_top1_clear"] == pytest.approx(1 / 3) and s["plan_top1_clear"] == pytest.approx(2 / 3)
    assert s["strict_top1_close"] == 0 and s["strict_top1_uncontested"] == 1


def test_outcomes_tie_threshold_is_five_percent(tmp_path):
    """6% slower is a miss, 4.9% a tie, whatever the repeats' spread (decisions()'s IQR tie would call a
    pick 6% slower within a 1 ms spread a tie)."""
    from conftest import row
    rows = [row("A", 1, "static", 9, 10.6, 1.0, chosen=True, plan_signature="a"), row("A", 1, "dynamic", 10, 10.0, 1.0, plan_signature="b"),
            row("B", 1, "static", 9, 10.49, 0.0, chosen=True, plan_signature="c"), row("B", 1, "dynamic", 10, 10.0, 0.0, plan_signature="d")]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = load_results(p)
    out = metrics.decision_outcomes(df).set_index("config_id")
    assert out.loc["A", "outcome"] == "miss" and out.loc["A", "contest"] == "clear"
    assert out.loc["B", "outcome"] == "tie" and out.loc["B", "contest"] == "close"
    assert metrics.decisions(df).set_index("config_id").loc["A", "tie"]  # the IQR tie, unlike the outcome
    assert len(metrics.decision_outcomes(load_results(tmp_path / "t.jsonl").iloc[0:0])) == 0


def test_run_to_run_spread(tmp_path):
    from conftest import row
    rows = [row("A", 1, "static", 10, 11, chosen=True, samples_ms=[10, 11, 15], repeats=3),   # 5 / 11 (the median, not the mean)
            row("A", 1, "dynamic", 10, 102, samples_ms=[100, 104], repeats=2),                # 4 / 102
            row("A", 1, "gpu-only", 10, 50, samples_ms=[50], repeats=1),                      # one sample: none
            row("A", 1, "layer-split", 10, 20, samples_ms=[10, 30], repeats=2),               # a baseline: 20 / 20
            # An older row without samples: min / max / median (measured_ms) of its repeats: 3 / 30.
            row("B", 1, "static", 10, 30, chosen=True, repeats=4, measured_min_ms=29, measured_max_ms=32)]
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = load_results(p)
    sp = metrics.run_to_run_spread(df).set_index(["config_id", "schedule"])
    assert sorted(sp.index) == [("A", "dynamic"), ("A", "static"), ("B", "static")]
    assert sp.loc[("A", "static"), "spread"] == pytest.approx(5 / 11)
    assert sp.loc[("A", "dynamic"), "spread"] == pytest.approx(4 / 102) and sp.loc[("A", "dynamic"), "repeats"] == 2
    assert sp.loc[("B", "static"), "spread"] == pytest.approx(0.1)
    assert metrics.run_to_run_spread(df, None).set_index("schedule").loc["layer-split", "spread"] == pytest.approx(1.0)
    # Measured once each: no spread.
    q = tmp_path / "once.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in [row("C", 1, "static", 10, 10, chosen=True)]))
    assert len(metrics.run_to_run_spread(load_results(q))) == 0
