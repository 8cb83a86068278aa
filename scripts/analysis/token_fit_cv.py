#!/usr/bin/python3
"""Leave-one-shape-out check of the measured cost model's per-token-count matmul fits on a profile's
own rows (no validation cases): at each token count measured for >= 5 shapes, fit
ms = c + a*bytes + b*flops (and with + d*cols, the row length) by non-negative least squares in
relative error on all shapes but one, predict the one left out. Prints median and p90 relative
error per backend for both forms. Used to decide that GPU matmul fits carry the row-length term
(costmodel/measured_cost_model.cpp, TokenFit).

    /usr/bin/python3 scripts/analysis/token_fit_cv.py configs/profiles/h200-host.profile.json
"""
import json
import sys

import itertools

import numpy as np

BYTES_PER_ELEM = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def nnls(a, b):
    """Non-negative least squares by enumerating supports (few unknowns), as the C++ fit does."""
    best, best_obj = np.zeros(a.shape[1]), None
    for k in range(a.shape[1], 0, -1):
        for support in itertools.combinations(range(a.shape[1]), k):
            z, *_ = np.linalg.lstsq(a[:, support], b, rcond=None)
            if (z < 0).any():
                continue
            obj = float(np.sum((a[:, support] @ z - b) ** 2))
            if best_obj is None or obj < best_obj - 1e-12:
                best, best_obj = np.zeros(a.shape[1]), obj
                best[list(support)] = z
    return best, best_obj


def features(rows, cols, tokens, dtype, with_cols):
    b = rows * cols * BYTES_PER_ELEM[dtype] + tokens * (rows + cols) * 4.0
    f = [1.0, b, 2.0 * rows * cols * tokens]
    return f + [float(cols)] if with_cols else f


def main(path):
    db = json.load(open(path))
    for backend in ("gpu", "cpu"):
        errors = {False: [], True: []}
        for cls in db["ops"]:
            if cls["backend"] != backend or cls["kind"] != "matmul" or cls["contention"]:
                continue
            by_tokens = {}
            for tokens, rows, cols, ms, *_ in cls["points"]:
                by_tokens.setdefault(tokens, []).append((rows, cols, ms))
            for tokens, pts in by_tokens.items():
                if len(pts) < 5:
                    continue
                for i, (qr, qc, qms) in enumerate(pts):
                    train = [p for j, p in enumerate(pts) if j != i]
                    y = np.array([p[2] for p in train])
                    for with_cols in (False, True):
                        x = np.array([features(r, c, tokens, cls["dtype"], with_cols) for r, c, _ in train])
                        scale = x.max(axis=0)
                        scale[scale == 0] = 1
                        coef, _ = nnls(x / scale / y[:, None], np.ones(len(y)))
                        pred = np.dot(np.array(features(qr, qc, tokens, cls["dtype"], with_cols)) / scale, coef)
                        errors[with_cols].append(abs(pred - qms) / qms)
        for with_cols in (False, True):
            e = np.array(errors[with_cols])
            form = "c + a*bytes + b*flops" + (" + d*cols" if with_cols else "")
            print(f"{backend} {form:32s} {len(e)} cases  median {np.median(e):.3f}  p90 {np.percentile(e, 90):.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "configs/profiles/h200-host.profile.json")
