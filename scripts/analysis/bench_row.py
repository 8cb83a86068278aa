#!/usr/bin/env python3
"""One row of scripts/gpu/bench.sh: a `run --json` result with the plan's predictions beside it, or the
error of a run that gave none, as one JSON line on stdout.
usage: bench_row.py MODEL CTX BUDGET SCHEDULE GRAPHS RUN.json PLAN.json ERR.txt
GRAPHS: graphs | nographs | timeline (how the run launched its decode steps)."""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(model, ctx, budget, sched, graphs, run_path, plan_path, err_path):
    row = {"model": model, "ctx": int(ctx), "budget": budget, "schedule": sched,
           "cuda_graphs": graphs == "graphs", "timeline": graphs == "timeline",
           "host_kv_attention": os.environ.get("HOST_KV_ATTENTION", "choose"), "run_args": os.environ.get("RUN_ARGS", "")}
    run = load(run_path)
    if run is None:
        try:
            with open(err_path) as f:
                row["error"] = f.read().strip()[-300:]
        except OSError:
            row["error"] = "no result"
        return row
    pred = {}
    for t in (load(plan_path) or {}).get("tiers", []):
        by = pred.setdefault(str(t["tokens"]), {})
        for c in t["candidates"]:
            by[c["schedule"]] = c["predicted_ms"] if c["feasible"] else None
        by["auto"] = by.get(t["chosen"])
    run.pop("generated_ids", None)
    run.pop("text", None)
    row["run"] = run
    # The run's own table's prediction (a forced schedule plans a table of its own, whose layout may
    # differ from the planner's mix), and the mixed table's.
    row["predicted_decode_ms"] = (run.get("predicted_step_ms") or {}).get("1", (pred.get("1") or {}).get(sched))
    row["predicted_decode_ms_mixed_table"] = (pred.get("1") or {}).get(sched)
    row["predicted_prefill_512_ms"] = (pred.get("512") or {}).get(sched)
    return row


if __name__ == "__main__":
    if len(sys.argv) != 9:
        sys.exit(__doc__)
    print(json.dumps(main(*sys.argv[1:])))
