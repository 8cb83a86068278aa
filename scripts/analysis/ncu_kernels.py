#!/usr/bin/env python3
"""Nsight Compute's long CSV (one row per metric, `--metrics gpu__time_duration.sum --csv`) -> one row per
kernel launch: id, kernel, grid, block, duration_us (what kernel_summary.py tabulates).
usage: ncu_kernels.py NCU.csv OUT.kernels.csv"""
import csv
import re
import sys

SCALE_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main(src, dst):
    with open(src) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    with open(dst, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "kernel", "grid", "block", "duration_us"])
        for r in rows:
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            v = float(r["Metric Value"].replace(",", "")) * SCALE_US[r["Metric Unit"]]
            w.writerow([r["ID"], re.sub(r"\(.*", "", r["Kernel Name"]), r["Grid Size"], r["Block Size"], "%.3f" % v])


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
