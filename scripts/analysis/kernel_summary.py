#!/usr/bin/env python3
"""Where a run's GPU time went, by kernel: a table from scripts/gpu/kernels.sh's output (kprof.tgz).

    /usr/bin/python3 scripts/analysis/kernel_summary.py RUN.kernels.csv [OTHER.kernels.csv] [--by-grid] [--top N]

RUN.kernels.csv: id, kernel, grid, block, duration_us per kernel launch (Nsight Compute's durations,
kernels serialised). Prints Markdown: per kernel (and launch grid with --by-grid) the launches, total
time, share and mean; with a second file, both side by side and the change of each total.
"""
import csv
import sys


def load(path, by_grid):
    totals, count, grand = {}, {}, 0.0
    try:
        f = open(path, newline="")
    except OSError as e:
        sys.exit(f"{path}: cannot read ({e.strerror})")
    with f:
        reader = csv.DictReader(f)
        need = {"kernel", "grid", "duration_us"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            sys.exit(f"{path}: not a kernel table (columns {', '.join(sorted(need))} expected): give a *.kernels.csv "
                     "of scripts/gpu/kernels.sh")
        for n, row in enumerate(reader, 2):
            try:
                us = float(row["duration_us"])
            except (TypeError, ValueError):
                sys.exit(f"{path}:{n}: duration_us '{row.get('duration_us')}' is not a number")
            if us < 0:
                sys.exit(f"{path}:{n}: duration_us {us} is negative")
            key = (row["kernel"], row["grid"]) if by_grid else (row["kernel"], "")
            totals[key] = totals.get(key, 0.0) + us
            count[key] = count.get(key, 0) + 1
            grand += us
    if not count:
        sys.exit(f"{path}: no kernel launches")
    return totals, count, grand


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    by_grid = "--by-grid" in argv
    top = 20
    if "--top" in argv:
        i = argv.index("--top")
        try:
            top = int(argv[i + 1])
            args.remove(argv[i + 1])
        except (IndexError, ValueError):
            sys.exit("--top N: N is a whole number of rows")
    if len(args) not in (1, 2):
        sys.exit("usage: kernel_summary.py RUN.kernels.csv [OTHER.kernels.csv] [--by-grid] [--top N]")
    runs = [load(p, by_grid) for p in args]
    a_tot, a_cnt, a_sum = runs[0]
    print(f"# Kernels of {args[0]}" + (f" against {args[1]}" if len(runs) == 2 else "") + "\n")
    print(f"{sum(a_cnt.values())} launches, {a_sum / 1000:.2f} ms of GPU time"
          + (f"; other: {sum(runs[1][1].values())} launches, {runs[1][2] / 1000:.2f} ms" if len(runs) == 2 else "") + "\n")
    keys = sorted(set(a_tot) | (set(runs[1][0]) if len(runs) == 2 else set()),
                  key=lambda k: -max(a_tot.get(k, 0.0), runs[1][0].get(k, 0.0) if len(runs) == 2 else 0.0))
    if len(runs) == 1:
        print("| kernel | grid | launches | total ms | share | mean us |")
        print("|---|---|---|---|---|---|")
        for k in keys[:top]:
            print(f"| {k[0]} | {k[1]} | {a_cnt[k]} | {a_tot[k] / 1000:.3f} | {100 * a_tot[k] / a_sum:.1f}% "
                  f"| {a_tot[k] / a_cnt[k]:.2f} |")
    else:
        b_tot, b_cnt, _ = runs[1]
        print("| kernel | grid | launches | total ms | other launches | other total ms | change ms |")
        print("|---|---|---|---|---|---|---|")
        for k in keys[:top]:
            ta, tb = a_tot.get(k, 0.0), b_tot.get(k, 0.0)
            print(f"| {k[0]} | {k[1]} | {a_cnt.get(k, 0)} | {ta / 1000:.3f} | {b_cnt.get(k, 0)} | {tb / 1000:.3f} "
                  f"| {(tb - ta) / 1000:+.3f} |")


if __name__ == "__main__":
    main(sys.argv)
