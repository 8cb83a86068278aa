"""scripts/analysis/kernel_summary.py: a run's GPU time by kernel, alone and against another run."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "analysis" / "kernel_summary.py"


def table(path, rows):
    path.write_text("id,kernel,grid,block,duration_us\n" +
                    "".join(f'{i},"{k}","{g}","(128, 1, 1)",{us}\n' for i, (k, g, us) in enumerate(rows)))
    return path


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_totals_shares_and_grids(tmp_path):
    a = table(tmp_path / "a.csv", [("gemv", "(512, 1, 1)", 10.0), ("gemv", "(768, 1, 1)", 20.0), ("norm", "(1, 1, 1)", 10.0)])
    r = run(a)
    assert r.returncode == 0, r.stderr
    assert "3 launches, 0.04 ms of GPU time" in r.stdout
    assert "| gemv |  | 2 | 0.030 | 75.0% | 15.00 |" in r.stdout
    assert r.stdout.index("| gemv |") < r.stdout.index("| norm |")  # largest total first
    g = run(a, "--by-grid")
    assert "| gemv | (768, 1, 1) | 1 | 0.020 | 50.0% | 20.00 |" in g.stdout
    top = run(a, "--top", 1)
    assert "| norm |" not in top.stdout


def test_two_runs_side_by_side(tmp_path):
    a = table(tmp_path / "a.csv", [("sgemm", "g", 30.0), ("norm", "g", 12.0)])
    b = table(tmp_path / "b.csv", [("sgemm", "g", 10.0), ("norm", "g", 3.0), ("split", "g", 1.0)])
    r = run(a, b)
    assert r.returncode == 0, r.stderr
    assert "| sgemm |  | 1 | 0.030 | 1 | 0.010 | -0.020 |" in r.stdout
    assert "| split |  | 0 | 0.000 | 1 | 0.001 | +0.001 |" in r.stdout


def test_bad_input_is_one_line(tmp_path):
    for name, text, want in [("cols.csv", "id,name\n1,x\n", "not a kernel table"),
                             ("nan.csv", "id,kernel,grid,block,duration_us\n0,k,g,b,fast\n", "nan.csv:2: duration_us"),
                             ("neg.csv", "id,kernel,grid,block,duration_us\n0,k,g,b,-1\n", "negative"),
                             ("empty.csv", "id,kernel,grid,block,duration_us\n", "no kernel launches")]:
        p = tmp_path / name
        p.write_text(text)
        r = run(p)
        assert r.returncode != 0
        assert want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run(tmp_path / "missing.csv")
    assert r.returncode != 0 and "cannot read" in r.stderr
    r = run(tmp_path / "cols.csv", "--top", "x")
    assert r.returncode != 0 and "--top N" in r.stderr
