"""scripts/analysis/vision_sweep_table.py: the vision encoder's oracle as a table — the planner's choice
against the measured best, the peak against the budget, re-predictions standing in for the rows'."""
import json
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "scripts" / "analysis" / "vision_sweep_table.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def row(config, schedule, predicted, measured, chosen=False, peak=1 << 30, budget=2 << 30, status="measured"):
    r = {"record": "row", "part": "vision", "config_id": config, "model": "m", "budget": "2G", "budget_bytes": budget,
         "image": "854x480", "tier": 2040 if config == "a" else 4784, "schedule": schedule, "chosen": chosen,
         "status": status, "predicted_ms": predicted, "resident_blocks": 3}
    if status == "measured":
        r.update(measured_ms=measured, device_peak_bytes=peak, within_budget=peak <= budget)
    return r


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"record": "row", "part"')  # a torn last line
    return path


def test_choice_best_regret_and_peak(tmp_path):
    rows = write(tmp_path / "v.jsonl", [
        row("a", "gpu-only", 100, 120, chosen=True), row("a", "partial", 100, 100), row("a", "streamed", 100, 110),
        row("b", "gpu-only", 0, 0, status="infeasible"), row("b", "partial", 200, 250, chosen=True),
        row("b", "streamed", 200, 260, peak=3 << 30),
    ])
    r = run(rows)
    assert r.returncode == 0, r.stderr
    line_a = next(l for l in r.stdout.splitlines() if "| 2040 |" in l)
    assert "| gpu-only | partial | 20.0% |" in line_a
    assert "| partial | partial | 0.0% |" in next(l for l in r.stdout.splitlines() if "| 4784 |" in l)
    assert "peak within the budget in 4 of 5" in r.stdout and "**over**" in r.stdout
    assert "measured best in 1 of 2 configurations" in r.stdout and "max 20.0%" in r.stdout

    # Predictions of another profile stand in for the rows' own.
    again = [dict(x, record="prediction", predicted_ms=x["measured_ms"]) for x in
             [row("a", s, 0, m) for s, m in (("gpu-only", 120), ("partial", 100), ("streamed", 110))] +
             [row("b", s, 0, m) for s, m in (("gpu-only", 1), ("partial", 250), ("streamed", 260))]]
    r = run(rows, write(tmp_path / "p.jsonl", again))
    assert r.returncode == 0, r.stderr
    assert "max |error| 0.0%" in r.stdout
    r = run(rows, write(tmp_path / "short.jsonl", again[:2]))
    assert r.returncode != 0 and "no prediction of a streamed" in r.stderr


def test_no_vision_rows(tmp_path):
    r = run(write(tmp_path / "empty.jsonl", [{"record": "row", "config_id": "x"}]))
    assert r.returncode != 0 and "no vision rows" in r.stderr
