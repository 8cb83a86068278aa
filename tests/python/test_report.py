"""Report generation: Markdown + PNGs, the emulated-device warning, the missed-target section, the CLI verb."""
import json
import os
import subprocess

from conftest import known_rows
from shardwise.report import build_report, main
from shardwise.results import load_results

PNGS = ["predicted_vs_measured.png", "winner_shares.png", "regret.png", "prediction_error.png", "baseline_speedups.png"]


def test_report_on_known_rows(tmp_path, known_jsonl):
    out = tmp_path / "rep"
    path = build_report(load_results(known_jsonl), str(out))
    md = open(path).read()
    for p in PNGS:
        assert (out / p).stat().st_size > 1000, p
        assert f"({p})" in md
    assert "Emulated device" not in md
    assert "**2 of 4**" in md  # top-1
    assert "## Where targets are missed" in md and "**Top-1 agreement** 50.0% < 95%" in md
    assert "Ties" in md and "Disagreements" in md
    assert "static over-predicted (+55%)" in md  # A/512: static 150 predicted, 97 measured made the planner miss it
    assert "boom" in md  # the error row is listed
    assert "| A" not in md  # configurations are described, not just ids
    assert "## Measurement resolution" in md and "not known from these rows" in md  # no plan_signature here


def test_report_states_the_measurements_resolution(tmp_path):
    from conftest import row
    rows = [row("D", 1, "gpu-only", 100, 100, 0.5, chosen=True, plan_signature="x"),
            row("D", 1, "dynamic", 100, 106, 0.5, plan_signature="x"),
            row("D", 1, "static", 90, 120, 0.5, plan_signature="y")]
    p = tmp_path / "rep.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "r"))).read()
    assert "## Measurement resolution" in md
    assert "1 plans were measured twice" in md and "max **6.0%**" in md and "gpu-only = dynamic" in md


def test_report_states_the_machines_drift(tmp_path):
    from conftest import row
    rows = [row("D", 1, "static", 100, 100, 0.5, chosen=True, machine_slowdown=1.3, threads=1, predicted_ms_at_probe=130),
            row("D", 1, "dynamic", 90, 80, 0.5, machine_slowdown=1.3, threads=1, predicted_ms_at_probe=85),
            row("E", 1, "static", 100, 100, 0.5, chosen=True, machine_slowdown=1.02, predicted_ms_at_probe=102),
            row("E", 1, "dynamic", 110, 110, 0.5, machine_slowdown=1.02, predicted_ms_at_probe=112),
            row("F", 1, "static", 100, 100, 0.5, chosen=True)]  # not probed
    p = tmp_path / "drift.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "r"))).read()
    assert "## Machine drift" in md
    assert "2 configurations were probed" in md and "1 threads 1.3x" in md and "16 threads 1.02x" in md
    assert "1 of 2 probed decisions were measured while the machine was more than 10% off" in md
    assert "1 of the 1 probed disagreements" in md  # D: static picked, dynamic faster, at 1.3x
    assert "| 1.30x |" in md  # the disagreements table's machine column
    # With the probe's factor the planner would have picked dynamic at D (85 < 130): 2 of 2, against 1.
    assert "picked the measured best in **2 of the 2** decisions" in md and "against 1 of them with the profile" in md
    assert "0.0% with the profile, 4.1% with the probe's factor" in md  # 0/12.5/0/0% and 30/6.25/2/1.8%: medians
    assert "| static | 2 | 0.0% | 16.0% |" in md and "| dynamic | 2 | 6.2% | 4.0% |" in md  # by schedule
    assert "worst candidate's median error is" not in md  # the median-error target is met here
    assert "![drift](machine_drift.png)" in md and (tmp_path / "r" / "machine_drift.png").stat().st_size > 1000
    assert "waited for it to calm" not in md  # each configuration probed once
    # D waited twice for the machine (sweep --calm): the report says how many configurations waited and
    # the factor each was measured at in the end.
    for r in rows[:2]:
        r["machine_probes"] = [1.7, 1.5, 1.3]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "w"))).read()
    assert "1 configurations found the machine slow and waited for it to calm" in md and "2 waits in all" in md
    assert "measured at: 1.3x." in md
    none = tmp_path / "none.jsonl"
    none.write_text("".join(json.dumps(r) + "\n" for r in known_rows()))
    md = open(build_report(load_results(none), str(tmp_path / "n"))).read()
    assert "were not probed" in md and not (tmp_path / "n" / "machine_drift.png").exists()


def test_report_says_emu_is_not_gpu(tmp_path):
    p = tmp_path / "emu.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in known_rows(device="emu")))
    assert main([str(p), "--out", str(tmp_path / "r")]) == 0
    md = open(tmp_path / "r" / "report.md").read()
    assert "not GPU numbers" in md


def test_cli_report_on_the_smoke_sweep(tmp_path, smoke_results):
    out = tmp_path / "smoke_report"
    bin_ = os.environ["SHARDWISE_BIN"]
    r = subprocess.run([bin_, "report", smoke_results, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    assert md.startswith("# Planner accuracy: smoke")
    assert "not GPU numbers" in md
    for p in PNGS:
        assert (out / p).exists()


def test_report_says_which_calls_checked_the_machine(tmp_path):
    p = tmp_path / "calls.jsonl"
    check = {"same_machine": True, "min_slowdown": 0.97, "max_slowdown": 1.04, "tolerance": 0.15, "rows": []}
    with open(p, "w") as f:
        f.write(json.dumps({"record": "sweep", "experiment": "known", "experiment_hash": "h", "device": "cuda",
                            "started": "T1", "machine_check": check}) + "\n")
        f.write(json.dumps({"record": "sweep", "experiment": "known", "experiment_hash": "h", "device": "cuda",
                            "started": "T2"}) + "\n")
        for r in known_rows():
            f.write(json.dumps(r) + "\n")
    md = open(build_report(load_results(str(p)), str(tmp_path / "r"))).read()
    assert "call 1 (T1): machine check passed" in md and "1.04x" in md
    assert "call 2 (T2): **no machine check**" in md


def test_report_says_what_the_machines_drift_leaves_of_a_missed_error_target(tmp_path):
    from conftest import row
    # Static 25% too slow as predicted on a machine probed 0.8x: with the probe's factor 2.5% (82 / 80).
    rows = [row("G", 1, "static", 100, 80, 0.5, chosen=True, machine_slowdown=0.8, predicted_ms_at_probe=82),
            row("G", 1, "dynamic", 120, 96, 0.5, machine_slowdown=0.8, predicted_ms_at_probe=99),
            row("H", 1, "static", 50, 40, 0.5, chosen=True, machine_slowdown=0.8, predicted_ms_at_probe=41),
            row("H", 1, "dynamic", 60, 48, 0.5, machine_slowdown=0.8, predicted_ms_at_probe=50)]
    p = tmp_path / "g.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "r"))).read()
    assert "| median per-schedule error (worst candidate) | 25.0% | ≤ 10% | **no** |" in md
    assert "the worst candidate's median error is 3.6% (dynamic, 2 rows)" in md  # 3.1% and 4.2%: median 3.6%


def test_report_says_which_rows_were_measured_in_rounds(tmp_path):
    from conftest import row
    rows = [row("D", 1, "gpu-only", 100, 100, 0.5, chosen=True, rounds=2),
            row("D", 1, "static", 90, 120, 0.5, rounds=2),
            row("D", 1, "layer-split", 200, 210, 0.5, rounds=1)]
    p = tmp_path / "rep.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "r"))).read()
    assert "measured in rounds: 2 candidate rows in 2 rounds each" in md
    # Rows of one round (or of binaries before rounds existed): nothing said.
    p.write_text("".join(json.dumps(r) + "\n" for r in [row("D", 1, "gpu-only", 100, 100, 0.5, chosen=True)]))
    assert "measured in rounds" not in open(build_report(load_results(p), str(tmp_path / "s"))).read()


def test_speedups_plot_draws_a_geomean_a_rounding_error_outside_its_range(tmp_path):
    # One decision per bar: the geometric mean exp(log(x)) can differ from x in the last bit
    # (study v15's partial report failed on it: "'yerr' must not contain negative values").
    import pandas as pd
    from shardwise import plots
    import numpy as np
    x = 1.2345678901234567
    summary = pd.DataFrame({"model": ["m", "m"], "baseline": ["layer-split", "cpu-moe"], "metric": ["tps", "ttft"],
                            "tier": [1, 1], "decisions": [1, 1],
                            "geomean": [np.nextafter(x, 2.0), np.nextafter(x, 0.0)], "min": [x, x], "max": [x, x]})
    out = tmp_path / "speedups.png"
    plots.speedups_plot(summary, str(out))
    assert out.stat().st_size > 0


def test_report_states_strict_agreement_ties_and_contests(tmp_path):
    from test_metrics import outcome_rows
    rows = outcome_rows()
    rows[0]["samples_ms"], rows[0]["repeats"] = [9.5, 10, 10.5], 3  # S's pick: spread 10%
    rows[1]["samples_ms"], rows[1]["repeats"] = [11.7, 12.3], 2  # S's static: 0.6 / 12 = 5%
    p = tmp_path / "o.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = open(build_report(load_results(p), str(tmp_path / "r"))).read()
    assert "## Strict agreement, ties and contests" in md and "**2 of 6 (33.3%)**" in md
    assert "| strict top-1: same schedule name | 2 | 33.3% |" in md
    assert "| same plan under another name (same `plan_signature`) | 1 | 16.7% |" in md
    assert "| tie: another plan, ≤ 5% slower than the best | 2 | 33.3% |" in md
    assert "| miss: > 5% slower than the best | 1 | 16.7% |" in md
    assert "1 of the ties and misses lack a `plan_signature`" in md  # N
    assert "| clear | 3 | 33.3% | 66.7% |" in md and "| close | 2 | 0.0% | 0.0% |" in md
    assert "| uncontested | 1 | 100.0% | 100.0% |" in md
    # Next to regret: the median of 10% and 5% over the two rows measured more than once.
    assert "| run-to-run spread: (max − min) / median of a row's repeats | median **7.5%**" in md
    assert "over 2 candidate rows measured 2-3 times" in md


def test_report_says_when_plans_and_spread_are_not_known(tmp_path, known_jsonl):
    md = open(build_report(load_results(known_jsonl), str(tmp_path / "r"))).read()
    assert "These rows carry no `plan_signature`, so whether a differently named pick ran the best's plan cannot be told" in md
    assert "not measured (no candidate row was measured more than once)" in md
