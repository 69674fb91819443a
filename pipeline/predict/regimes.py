"""One split into two regimes, for latency laws that change with the kernel a shape runs.

A CPU op runs one kernel on small shapes and another on large ones: a scalar path below a
column count, one thread below ATen's grain size and a parallel region (a fork and join that
costs ~1 µs on 2 threads and ~8 µs on 16) above it. So a linear law fitted across both is
wrong at both ends, more so the more threads the CPU has. A fit may split once, at a value of
one of the given split variables seen in the training rows, into two regimes with their own
coefficients, when that cuts the training error by more than half: a depth-1 regression tree
with linear leaves. Where the split falls is measured, per device, not assumed.
"""
from __future__ import annotations

import numpy as np

from pipeline.predict.fitting import nnls_relative

MIN_LEAF = 8  # rows below which a regime is not fitted apart (a two-coefficient law on 4 rows followed noise)
SPLIT_GAIN = 0.5  # a split must leave at most this share of the unsplit squared error


def _sq_err(X, y) -> tuple[np.ndarray, float]:
    c, rms = nnls_relative(X, y)
    return c, rms**2 * len(y)


def fit_regimes(X: np.ndarray, y: np.ndarray, values: dict[str, np.ndarray]) -> dict:
    """{"split": None or {"on", "at"}, "coefs": [one] or [below, at-or-above]}.

    values: the candidate split variables, one array per name, aligned with X's rows. A regime
    needs MIN_LEAF rows and two per coefficient to be fitted on its own.
    """
    min_leaf = max(MIN_LEAF, 2 * X.shape[1])
    c, err = _sq_err(X, y)
    best, best_err = {"split": None, "coefs": [c]}, err * SPLIT_GAIN
    for on, v in values.items():
        for at in np.unique(v)[1:]:
            lo = v < at
            if lo.sum() < min_leaf or (~lo).sum() < min_leaf:
                continue
            (c_lo, e_lo), (c_hi, e_hi) = _sq_err(X[lo], y[lo]), _sq_err(X[~lo], y[~lo])
            if e_lo + e_hi < best_err:
                best, best_err = {"split": {"on": on, "at": float(at)}, "coefs": [c_lo, c_hi]}, e_lo + e_hi
    return best


def predict_regimes(regime: dict, X: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    if regime["split"] is None:
        return X @ regime["coefs"][0]
    below = values[regime["split"]["on"]] < regime["split"]["at"]
    return np.where(below, X @ regime["coefs"][0], X @ regime["coefs"][1])


def regimes_to_dict(regime: dict) -> dict:
    return {"split": regime["split"], "coefs": [np.asarray(c, float).tolist() for c in regime["coefs"]]}


def regimes_from_dict(d: dict) -> dict:
    return {"split": d["split"], "coefs": [np.array(c, float) for c in d["coefs"]]}
