#!/usr/bin/python3
"""How README.md counted the CPU-lane actions of the Static/Dynamic traces: run from this folder after
extracting each rows_*/timelines.tgz into rows_*/tl/ (tar -C rows_wait0/tl -xzf rows_wait0/timelines.tgz, ...):
  /usr/bin/python3 cpu_lane.py rows_wait0 rows_wait1 rows_wait0_again"""
import glob, json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', '..', 'scripts', 'analysis'))
import timeline_gap as tg
# Every CPU-lane action of the decode runs of the Static/Dynamic traces: measured / predicted duration,
# and how many ran > 2x their prediction and 300 us longer (a stall).
for mode in sys.argv[1:]:
    ratios, n, st, over_us = [], 0, 0, 0.0
    for f in sorted(glob.glob(f'{mode}/tl/timelines/*.json')):
        if 'gpu-only' in f: continue
        runs = tg.runs_of(json.load(open(f)))
        for r in runs.values():
            pred = {}
            for e in r['predicted']:
                if e.get('lane') == 'cpu': pred.setdefault(e['name'], []).append(e['dur'])
            cnt = {}
            for e in sorted(r['measured'], key=lambda e: e['ts']):
                if e.get('lane') != 'cpu': continue
                k = cnt.get(e['name'], 0); cnt[e['name']] = k + 1
                p = pred.get(e['name'], [])
                if k >= len(p) or p[k] <= 0: continue
                n += 1; ratios.append(e['dur'] / p[k])
                if e['dur'] > 2 * p[k] and e['dur'] - p[k] > 300: st += 1; over_us += e['dur'] - p[k]
    ratios.sort()
    q = lambda x: ratios[int(x * (len(ratios) - 1))]
    print(f"{mode:18} CPU-lane actions {n:6}  measured/predicted p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f}  stalls (>2x and +300us) {st} ({st/n*100:.2f}%), {over_us/1000:.1f} ms lost")
