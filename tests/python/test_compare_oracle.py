"""scripts/analysis/compare_oracle.py: common decisions of two oracle files, agreement before/after."""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "analysis" / "compare_oracle.py"


def rows(decision, pick, times, signatures=None):
    model, budget = decision
    out = []
    for s, (pred, meas) in times.items():
        out.append({"record": "row", "model": model, "budget": budget, "ctx": 4096, "threads": 16, "pcie_cap": "none",
                    "tier": 1, "schedule": s, "status": "measured", "planner_choice": pick, "predicted_ms": pred,
                    "measured_ms": meas, "plan_signature": (signatures or {}).get(s, s)})
    return out


def write(path, all_rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"record": "sweep"}] + all_rows))
    return path


def run(a, b):
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True)


def test_agreement_before_and_after(tmp_path):
    before = write(tmp_path / "a.jsonl",
                   rows(("m", "2G"), "dynamic", {"gpu-only": (30, 33), "static": (33, 28), "dynamic": (30, 33)})
                   + rows(("m", "4G"), "gpu-only", {"gpu-only": (20, 20), "static": (25, 30), "dynamic": (20, 19.8)},
                          {"gpu-only": "same", "dynamic": "same"})
                   + rows(("m", "8G"), "static", {"static": (10, 10)}))  # only in the first file
    after = write(tmp_path / "b.jsonl",
                  rows(("m", "2G"), "static", {"gpu-only": (30, 33), "static": (25, 27), "dynamic": (26, 27.5)})
                  + rows(("m", "4G"), "static", {"gpu-only": (20, 20), "static": (19, 21), "dynamic": (20, 19.8)}))
    r = run(before, after)
    assert r.returncode == 0, r.stderr
    lines = {l.split(" | ")[0].lstrip("| "): l for l in r.stdout.splitlines() if l.startswith("| m ")}
    assert set(lines) == {"m 2G 4096 16 none 1", "m 4G 4096 16 none 1"}
    # 2G: wrong before (regret 33/28 - 1), right after.
    assert "dynamic / static (17.9%) |" in lines["m 2G 4096 16 none 1"]
    assert "static / static (0.0%) ✓" in lines["m 2G 4096 16 none 1"]
    # 4G: before, gpu-only has dynamic's plan (same signature): agreement; after, static is 6% behind.
    assert "gpu-only / dynamic (1.0%) ✓" in lines["m 4G 4096 16 none 1"]
    assert "static / dynamic (6.1%) |" in lines["m 4G 4096 16 none 1"]
    assert "agreement on the 2 common decisions: before 1, after 1" in r.stdout


def test_bad_input_is_one_line(tmp_path):
    good = write(tmp_path / "g.jsonl", rows(("m", "2G"), "static", {"static": (1, 1)}))
    torn = tmp_path / "t.jsonl"
    torn.write_text('{"record": "row", "model": "m"\n')
    r = run(good, torn)
    assert r.returncode != 0 and "t.jsonl:1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    other = write(tmp_path / "o.jsonl", rows(("x", "2G"), "static", {"static": (1, 1)}))
    r = run(good, other)
    assert r.returncode != 0 and "no decision" in r.stderr
    keyless = tmp_path / "k.jsonl"
    keyless.write_text(json.dumps({"record": "row", "model": "m"}) + "\n")
    r = run(good, keyless)
    assert r.returncode != 0 and "not a `shardwise sweep` result file" in r.stderr
