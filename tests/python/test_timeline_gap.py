"""scripts/analysis/timeline_gap.py: a measured decode step's layers against the predicted ones, from
`shardwise run --timeline` traces; bad input is one line and exit 1."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "analysis" / "timeline_gap.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def trace(runs):
    """runs: {(run, tier, schedule): {"measured": [(name, ts, dur)], "predicted": [...]}} as a Chrome trace."""
    events, pid = [], 0
    for (n, tier, schedule), kinds in runs.items():
        for kind, acts in kinds.items():
            pid += 1
            events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"run {n}: tier {tier}, {schedule} ({kind})"}})
            events += [{"name": a, "ph": "X", "pid": pid, "tid": 1, "ts": ts, "dur": dur} for a, ts, dur in acts]
    return {"traceEvents": events}


def split_layers(period, share_dur, layers=3):
    """Decode layers each a CPU share beside a GPU share, one every `period` us."""
    out = []
    for l in range(layers):
        out += [(f"L{l}.attention", l * period, 10), (f"L{l}.moe_cpu_share", l * period + 12, share_dur),
                (f"L{l}.moe_gpu", l * period + 12, 20)]
    return out


def test_split_layer_periods_and_actions(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace({
        (0, 1, "dynamic"): {"measured": split_layers(100, 80), "predicted": split_layers(60, 40)},
        (1, 512, "gpu-only"): {"measured": [("L0.attention", 0, 1000)], "predicted": [("L0.attention", 0, 500)]},
    })))
    r = run(p)
    assert r.returncode == 0, r.stderr
    # Makespans: the decode run 292 us measured (last share ends at 200 + 12 + 80) against 172 predicted.
    assert "| 0 | 1 | dynamic | 0.29 | 0.17 | 1.70 |" in r.stdout
    assert "| 1 | 512 | gpu-only | 1.00 | 0.50 | 2.00 |" in r.stdout
    # Two layer periods (L0->L1, L1->L2) of the split kind; the prefill run is not a decode run.
    assert "| split MoE layer | 2 | 100.0 | 60.0 | +40.0 |" in r.stdout
    assert "| moe_cpu_share | 12.0 / 12.0 | 80.0 / 40.0 |" in r.stdout
    # --runs keeps only the decode runs in [A, B): none here.
    assert "(no decode runs recorded)" in run(p, "--runs", "1:2").stdout


def test_actions_far_over_their_prediction_are_listed(tmp_path):
    # Three uploads per run, matched to the predicted ones by occurrence: the second waited 3 ms (flagged), the
    # third 150 us against 30 (5x, but only 120 us over: not flagged); the layer actions are as predicted.
    def acts(second, third):
        return [("L0.attention", 0, 10), ("x to gpu", 10, 30), ("L1.attention", 50, 10), ("x to gpu", 60, second),
                ("L2.attention", 100 + second, 10), ("x to gpu", 120 + second, third)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace({
        (0, 1, "dynamic"): {"measured": acts(3000, 150), "predicted": acts(30, 30)},
        (1, 1, "dynamic"): {"measured": acts(2030, 30), "predicted": acts(30, 30)},
        (2, 1, "dynamic"): {"measured": acts(30, 30), "predicted": acts(30, 30)},
    })))
    r = run(p)
    assert r.returncode == 0, r.stderr
    # Two stalls in two of the runs: 2.97 and 2.00 ms over, median 2.485; measured 3000 and 2030 us, median 2515.
    assert "| x to gpu | 2 | 2 | 2.49 | 2515.0 / 30.0 |" in r.stdout
    # --runs limits it to the runs asked for: run 2 had none.
    assert "(none)" in run(p, "--runs", "2:3").stdout


def test_resident_layers_are_told_apart_by_their_cpu_work(tmp_path):
    # A Static step: L0 and L2 with their FFN on the CPU lane (tid 3, named "cpu" as the runtime's traces name
    # it), L1 and L3 all on the GPU lane; the CPU FFNs ran 300 us against 200 predicted, which a median over
    # all four layers would hide.
    def acts(cpu_ffn):
        out, t = [], 0
        for l in range(4):
            cpu = l % 2 == 0
            out += [(f"L{l}.attn", t, 10, 0), (f"L{l}.ffn", t + 10, cpu_ffn if cpu else 20, 3 if cpu else 0)]
            t += 10 + (cpu_ffn if cpu else 20)
        return out
    events = []
    for pid, kind, ffn in ((1, "measured", 300), (2, "predicted", 200)):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"run 5: tier 1, static ({kind})"}})
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": n}} for t, n in ((0, "gpu"), (3, "cpu"))]
        events += [{"name": a, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur} for a, ts, dur, tid in acts(ffn)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    r = run(p)
    assert r.returncode == 0, r.stderr
    # Periods: L0 -> L1 and L2 -> L3 (CPU FFN layers) 310 against 210; L1 -> L2 (GPU) 30 against 30.
    assert "| resident, CPU ffn | 2 | 310.0 | 210.0 | +100.0 |" in r.stdout
    assert "| resident | 1 | 30.0 | 30.0 | +0.0 |" in r.stdout
    assert "| ffn | 10.0 / 10.0 | 300.0 / 200.0 |" in r.stdout


def test_a_real_trace_from_the_emulated_device(tmp_path):
    bin_ = os.environ.get("SHARDWISE_BIN")
    if not bin_:
        pytest.skip("no shardwise binary ($SHARDWISE_BIN; CTest sets it)")
    out = tmp_path / "real.json"
    moe = REPO / "tests" / "fixtures" / "hf" / "qwen3moe_nonorm"
    subprocess.run([bin_, "run", "--model", str(moe), "--tokens", "1,2,3", "-n", "4", "--threads", "2", "--device", "emu",
                    "--vram-budget", "2M", "--schedule", "gpu-only", "--timeline", str(out), "--timeline-runs", "4"],
                   check=True, capture_output=True)
    r = run(out)
    assert r.returncode == 0, r.stderr
    assert "| 1 | 1 | gpu-only |" in r.stdout  # the first decode step, after the prompt's run 0
    # The fixture's weights fit: its decode layers are resident, each with its attention and FFN actions.
    assert "| resident |" in r.stdout
    assert "| ffn |" in r.stdout


@pytest.mark.parametrize("content,says", [
    ("not json", "not a `shardwise run --timeline` trace"),
    ("[1, 2]", "no 'traceEvents' list"),
    ('{"traceEvents": [3]}', "traceEvents[0] is not an object"),
    ('{"traceEvents": [{"name": "L0.x", "ph": "X", "pid": 1, "ts": "a", "dur": 1}]}', "traceEvents[0]: a complete event"),
    ('{"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "args": 5}]}', "not a `shardwise run --timeline` trace"),
    ('{"traceEvents": []}', "no recorded runs"),
])
def test_bad_traces_are_one_line(tmp_path, content, says):
    p = tmp_path / "bad.json"
    p.write_text(content)
    r = run(p)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and says in r.stderr and str(p) in r.stderr


def test_bad_arguments_are_one_line(tmp_path):
    r = run(tmp_path / "missing.json")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot read" in r.stderr
    for bad in (["--runs", "3"], ["--runs", "4:2"], ["--runs"]):
        r = run(tmp_path / "x.json", *bad)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--runs takes A:B" in r.stderr
