"""scripts/analysis/repredict.py: a study's measurements against a re-prediction of its rows."""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "analysis" / "repredict.py"


def study_rows(cid, pick, times):
    """times: schedule -> (predicted, measured, signature)"""
    return [{"record": "row", "config_id": cid, "model": "m", "budget": "2G", "ctx": 4096, "threads": 16,
             "pcie_cap": "none", "tier": 1, "schedule": s, "candidate": True, "status": "measured",
             "planner_choice": pick, "predicted_ms": p, "measured_ms": m, "plan_signature": sig}
            for s, (p, m, sig) in times.items()]


def pred_rows(cid, pick, times):
    """times: schedule -> (predicted, signature)"""
    return [{"record": "prediction", "config_id": cid, "tier": 1, "schedule": s, "candidate": True,
             "planner_choice": pick, "predicted_ms": p, "plan_signature": sig, "git_rev": "new"}
            for s, (p, sig) in times.items()]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(a, b):
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True)


def test_errors_and_picks_before_and_after(tmp_path):
    study = write(tmp_path / "s.jsonl", [{"record": "sweep"}]
                  + study_rows("a", "dynamic", {"static": (20, 16, "S"), "dynamic": (16, 20, "D")})
                  + study_rows("b", "static", {"static": (10, 10, "S2"), "dynamic": (12, 12, "D2")}))
    # a: the new model predicts dynamic slower (same plans): the pick moves to the measured best.
    # b: dynamic's plan changed: its measurement is left out, the decision still scored on static.
    pred = write(tmp_path / "p.jsonl",
                 pred_rows("a", "static", {"static": (17, "S"), "dynamic": (19, "D")})
                 + pred_rows("b", "static", {"static": (10, "S2"), "dynamic": (11, "D3")}))
    r = run(study, pred)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "4 measured rows: 3 plans unchanged, 1 changed" in out
    # static: |20/16-1| = 25% and 0% before (median 12.5%); after |17/16-1| = 6.25% and 0%.
    assert "| static | 2 | 12.5% | 3.1% | 12.5% | 3.1% |" in out
    assert "| dynamic | 1 | 20.0% | 5.0% | -20.0% | -5.0% |" in out
    assert "| top-1 (the pick measured best) | 1 (50.0%) | 2 (100.0%) |" in out
    assert "| regret max | 25.0% | 0.0% |" in out
    assert "| m 2G 4096 16 none 1 | dynamic (25.0%) | static (0.0%) | static |" in out
    assert "still miss" not in out  # both new picks are the measured best


def test_decisions_still_missed_are_listed_by_regret(tmp_path):
    study = write(tmp_path / "s.jsonl",
                  study_rows("a", "dynamic", {"static": (20, 10, "S"), "dynamic": (16, 11, "D")})
                  + study_rows("b", "dynamic", {"static": (20, 10, "S2"), "dynamic": (16, 15, "D2")})
                  + study_rows("c", "static", {"static": (10, 10, "S3"), "dynamic": (12, 12, "D3")}))
    pred = write(tmp_path / "p.jsonl",
                 pred_rows("a", "dynamic", {"static": (20, "S"), "dynamic": (16, "D")})
                 + pred_rows("b", "dynamic", {"static": (20, "S2"), "dynamic": (16, "D2")})
                 + pred_rows("c", "static", {"static": (10, "S3"), "dynamic": (12, "D3")}))
    r = run(study, pred)
    assert r.returncode == 0, r.stderr
    missed = r.stdout.split("still miss, by regret:")[1]
    lines = [l for l in missed.splitlines() if l.startswith("| m ")]
    assert lines == ["| m 2G 4096 16 none 1 | dynamic (50.0%) | static |",  # b: 15 / 10
                     "| m 2G 4096 16 none 1 | dynamic (10.0%) | static |"]  # a: 11 / 10; c is right


def test_bad_input_is_one_line(tmp_path):
    study = write(tmp_path / "s.jsonl", study_rows("a", "static", {"static": (1, 1, "S")}))
    torn = tmp_path / "t.jsonl"
    torn.write_text('{"record": "prediction"\n')
    r = run(study, torn)
    assert r.returncode != 0 and "t.jsonl:1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run(study, study)  # a results file where the predictions should be
    assert r.returncode != 0 and "--predict" in r.stderr
    other = write(tmp_path / "o.jsonl", pred_rows("zzz", "static", {"static": (1, "S")}))
    r = run(study, other)
    assert r.returncode != 0 and "none of the study's rows" in r.stderr
    keyless = write(tmp_path / "k.jsonl", [{"record": "prediction", "tier": 1}])
    r = run(study, keyless)
    assert r.returncode != 0 and "k.jsonl" in r.stderr and len(r.stderr.strip().splitlines()) == 1
