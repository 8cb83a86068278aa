#!/usr/bin/python3
"""Where a measured step's time went against its prediction, from `shardwise run --timeline` traces
(each recorded plan run twice: "(measured)" and "(predicted)", the same action labels).

  /usr/bin/python3 scripts/analysis/timeline_gap.py TRACE.json [...] [--runs A:B]

For each trace: every recorded run's makespan, measured / predicted; then, over the decode runs (tier 1),
the layers grouped by what they hold (a split MoE layer: a CPU share beside a GPU share; a streamed FFN;
a resident one, by what of it runs on the CPU lane): the median layer period (its first action's start to the next layer's)
measured and predicted, and per action of such a layer (its label without "L<n>.") the median start,
relative to the layer's first action, and duration, measured and predicted — the step where the measured layer
falls behind its prediction is the one to explain. Last, over every recorded run (decode or not), the actions
that ran far longer than their prediction (more than STALL_RATIO times it and STALL_US more; --runs applies): the k-th action
of a label measured against the k-th predicted one (the runtime and the simulator run one action list), e.g.
an activation upload that waited behind a weight copy on the copy engine (results/executor/README.md,
seventeenth session).
"""
import json
import re
import statistics
import sys
from collections import defaultdict

LAYER = re.compile(r"^L(\d+)\.(.*)$")


def runs_of(trace):
    """{run: {"tier", "measured": [events], "predicted": [events]}} from one Chrome trace; ValueError
    naming the event where the trace is not what `shardwise run --timeline` writes."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("no 'traceEvents' list")
    events = trace["traceEvents"]
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ValueError(f"traceEvents[{i}] is not an object")
        if e.get("ph") == "X" and not (isinstance(e.get("name"), str) and
                                       all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur"))):
            raise ValueError(f"traceEvents[{i}]: a complete event needs a name, ts and dur")
    names = {e.get("pid"): e.get("args", {}).get("name", "") for e in events if e.get("name") == "process_name"}
    lanes = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "") for e in events if e.get("name") == "thread_name"}
    out = {}
    for pid, name in names.items():
        m = re.match(r"run (\d+): tier (\d+), (\S+) \((measured|predicted)\)", str(name))
        if not m:
            continue
        r = out.setdefault(int(m.group(1)), {"tier": int(m.group(2)), "schedule": m.group(3), "measured": [], "predicted": []})
        r[m.group(4)] = [dict(e, lane=lanes.get((pid, e.get("tid")), "")) for e in events
                         if e.get("ph") == "X" and e.get("pid") == pid]
    if not out:
        raise ValueError("no recorded runs ('run N: tier T, SCHEDULE (measured)' processes)")
    return out


def by_layer(events):
    """{layer: {action: (start us, dur us, lane)}}; the first of a label if it repeats."""
    layers = defaultdict(dict)
    for e in events:
        m = LAYER.match(e["name"])
        if m:
            layers[int(m.group(1))].setdefault(m.group(2), (e["ts"], e["dur"], e.get("lane", "")))
    return layers


def start(actions):
    """A layer's start: its first action's (its attention's, or the copy of its streamed attention)."""
    return min(ts for ts, _, _ in actions.values())


def kind(actions):
    """What a layer holds. A resident layer with work on the CPU lane is told apart by that work (a Static
    step's CPU FFN layers beside its GPU ones: a median over both would hide the CPU's)."""
    if any("moe_cpu_share" in a for a in actions):
        return "split MoE layer"
    if any(a.endswith("weights") or a.endswith("guessed experts") for a in actions):
        return "streamed FFN"
    on_cpu = sorted({a.split()[0] for a, (_, _, lane) in actions.items() if lane == "cpu"})
    return "resident, CPU " + " and ".join(on_cpu) if on_cpu else "resident"


STALL_RATIO = 4.0
STALL_US = 200.0


def stalls(runs, runs_filter=None):
    """{label: [(run, measured us, predicted us)]} of the actions that ran more than STALL_RATIO times their
    prediction and STALL_US longer, the k-th occurrence of a label against the k-th predicted."""
    out = defaultdict(list)
    for run in sorted(runs):
        if runs_filter and not (runs_filter[0] <= run < runs_filter[1]):
            continue
        r = runs[run]
        seen = defaultdict(list)
        for e in sorted(r["predicted"], key=lambda e: e["ts"]):
            seen[e["name"]].append(e["dur"])
        count = defaultdict(int)
        for e in sorted(r["measured"], key=lambda e: e["ts"]):
            k = count[e["name"]]
            count[e["name"]] += 1
            pred = seen.get(e["name"], [])
            if k < len(pred) and e["dur"] > STALL_RATIO * pred[k] and e["dur"] - pred[k] > STALL_US:
                m = LAYER.match(e["name"])
                out[m.group(2) if m else e["name"]].append((run, e["dur"], pred[k]))
    return out


def med(v):
    return statistics.median(v) if v else float("nan")


def report(path, runs_filter=None):
    try:
        with open(path) as f:
            runs = runs_of(json.load(f))
    except OSError as e:
        sys.exit(f"timeline_gap: {path}: cannot read ({e.strerror})")
    except (ValueError, AttributeError) as e:
        sys.exit(f"timeline_gap: {path}: not a `shardwise run --timeline` trace ({e}): give the file --timeline wrote")
    print(f"## {path}\n")
    print("| run | tier | schedule | measured ms | predicted ms | measured / predicted |\n|---|---|---|---|---|---|")
    for run in sorted(runs):
        r = runs[run]
        if not r["measured"] or not r["predicted"]:
            continue
        m = max(e["ts"] + e["dur"] for e in r["measured"]) / 1e3
        p = max(e["ts"] + e["dur"] for e in r["predicted"]) / 1e3
        print(f"| {run} | {r['tier']} | {r['schedule']} | {m:.2f} | {p:.2f} | {m / p:.2f} |")
    print()
    periods = defaultdict(lambda: ([], []))  # kind -> (measured, predicted) layer periods, us
    actions = defaultdict(lambda: defaultdict(lambda: ([], [], [], [])))  # kind -> action -> starts/durs
    for run in sorted(runs):
        r = runs[run]
        if r["tier"] != 1 or (runs_filter and not (runs_filter[0] <= run < runs_filter[1])):
            continue
        lm, lp = by_layer(r["measured"]), by_layer(r["predicted"])
        for layer in sorted(lm):
            if layer not in lp:
                continue
            k = kind(lm[layer])
            m0, p0 = start(lm[layer]), start(lp[layer])
            nxt = layer + 1
            if nxt in lm and nxt in lp:
                periods[k][0].append(start(lm[nxt]) - m0)
                periods[k][1].append(start(lp[nxt]) - p0)
            for a, (ts, dur, _) in lm[layer].items():
                if a in lp[layer]:
                    s = actions[k][a]
                    s[0].append(ts - m0), s[1].append(lp[layer][a][0] - p0), s[2].append(dur), s[3].append(lp[layer][a][1])
    stalled = stalls(runs, runs_filter)
    if not periods:
        print("(no decode runs recorded)\n")
    else:
        print_layers(periods, actions)
    print(f"Actions that ran over {STALL_RATIO:g}x their prediction and {STALL_US:g} us longer (all recorded runs):\n")
    if not stalled:
        print("(none)\n")
        return
    print("| action | count | runs with one | ms over the prediction, per such run (median) | measured / predicted us (median) |")
    print("|---|---|---|---|---|")
    for a, v in sorted(stalled.items(), key=lambda kv: -sum(m - p for _, m, p in kv[1])):
        per_run = defaultdict(float)
        for run, m, p in v:
            per_run[run] += (m - p) / 1e3
        print(f"| {a} | {len(v)} | {len(per_run)} | {med(list(per_run.values())):.2f} | "
              f"{med([m for _, m, _ in v]):.1f} / {med([p for _, _, p in v]):.1f} |")
    print()


def print_layers(periods, actions):
    print("Decode layers (tier 1), medians over the recorded runs, microseconds:\n")
    print("| layers | count | period measured | period predicted | measured - predicted |\n|---|---|---|---|---|")
    for k, (m, p) in sorted(periods.items()):
        print(f"| {k} | {len(m)} | {med(m):.1f} | {med(p):.1f} | {med(m) - med(p):+.1f} |")
    print()
    for k, acts in sorted(actions.items()):
        print(f"{k}: each action's start (from the layer's first action) and duration, measured / predicted\n")
        print("| action | start | duration |\n|---|---|---|")
        for a, (sm, sp, dm, dp) in sorted(acts.items(), key=lambda kv: med(kv[1][1])):
            print(f"| {a} | {med(sm):.1f} / {med(sp):.1f} | {med(dm):.1f} / {med(dp):.1f} |")
        print()


def main(argv):
    runs_filter = None
    paths = []
    i = 0
    while i < len(argv):
        if argv[i] == "--runs":
            m = re.fullmatch(r"(\d+):(\d+)", argv[i + 1] if i + 1 < len(argv) else "")
            if not m or int(m.group(1)) >= int(m.group(2)):
                sys.exit("timeline_gap: --runs takes A:B, the recorded runs [A, B) with A < B (e.g. --runs 4:12)")
            runs_filter = (int(m.group(1)), int(m.group(2)))
            i += 2
            continue
        paths.append(argv[i])
        i += 1
    if not paths:
        print(__doc__)
        return 2
    for p in paths:
        report(p, runs_filter)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
