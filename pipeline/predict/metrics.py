"""Error summaries: signed relative error per row, mean/max of its magnitude per group."""
from __future__ import annotations

import numpy as np


def rel_err(predicted, measured) -> np.ndarray:
    """Signed: positive means the prediction is too slow (over-estimates)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    return (p - m) / m


def summarize(predicted, measured) -> dict:
    e = np.abs(rel_err(predicted, measured))
    if e.size == 0:
        return {"n": 0, "mean_rel_err": float("nan"), "max_rel_err": float("nan"), "median_rel_err": float("nan")}
    return {"n": int(e.size), "mean_rel_err": float(e.mean()), "max_rel_err": float(e.max()),
            "median_rel_err": float(np.median(e))}
