"""PM2Lat's utility-layer model: per (op, dtype), latency as a non-negative linear function
of its proxies (bytes moved, flops, rows) plus a constant for the call itself.

Fitted to minimise *relative* error (each row divided by its measured time), since a
latency model is judged by relative error across sizes spanning several decades.

One op can run different kernels by shape, as a GEMM does: on the CPU, softmax over fewer
than 16 columns takes a scalar path ~15x slower per element than the vectorized one, and
small tensors run on one thread. So a fit may split once, at a column count or an element
count seen in the sweep, into two regimes with their own coefficients, when that cuts the
training error by more than half (a depth-1 regression tree with linear leaves).
"""
from __future__ import annotations

import numpy as np

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict.cache_cold import ColdPenalty
from pipeline.predict.fitting import nnls_relative
from pipeline.predict.serialize import OP_DTYPE, keyed, records
from pipeline.predict.traffic import utility_traffic
from pipeline.core.ops import UTILITY_OPS

FEATURES = ("const", "bytes", "flops", "rows")
COPY_LAYOUTS = ("copy_rows", "copy_bcast")  # timed since 2026-11-25; "copy" (transposing) before


def features(op: str, dtype: str, rows, cols) -> np.ndarray:
    br, bw, fl = utility_traffic(op, rows, cols, element_bytes(dtype))
    rows = np.asarray(rows, dtype=float) * np.ones_like(br)
    return np.stack([np.ones_like(br), br + bw, fl, rows], axis=-1)


SPLIT_ON = ("cols", "elems")
MIN_LEAF = 2 * len(FEATURES)  # rows a regime needs to be fitted on its own
SPLIT_GAIN = 0.5  # a split must leave at most this share of the unsplit squared error


def _split_values(rows, cols) -> dict[str, np.ndarray]:
    r, c = np.asarray(rows, dtype=float), np.asarray(cols, dtype=float)
    return {"cols": c * np.ones_like(r), "elems": r * c}


def _sq_err(X, y) -> tuple[np.ndarray, float]:
    c, rms = nnls_relative(X, y)
    return c, rms**2 * len(y)


def fit_regimes(X: np.ndarray, y: np.ndarray, values: dict[str, np.ndarray]) -> dict:
    """{"split": None or {"on", "at"}, "coefs": [one] or [below, at-or-above]}."""
    c, err = _sq_err(X, y)
    best, best_err = {"split": None, "coefs": [c]}, err * SPLIT_GAIN
    for on in SPLIT_ON:
        v = values[on]
        for at in np.unique(v)[1:]:
            lo = v < at
            if lo.sum() < MIN_LEAF or (~lo).sum() < MIN_LEAF:
                continue
            (c_lo, e_lo), (c_hi, e_hi) = _sq_err(X[lo], y[lo]), _sq_err(X[~lo], y[~lo])
            if e_lo + e_hi < best_err:
                best, best_err = {"split": {"on": on, "at": float(at)}, "coefs": [c_lo, c_hi]}, e_lo + e_hi
    return best


class UtilityModel:
    name = "utility_model"

    def __init__(self, regimes: dict[tuple[str, str], dict], cold: ColdPenalty | None = None):
        self.regimes = regimes
        self.cold = cold  # CPU: the extra an op pays after a large one evicted L2 (cache_cold.py)

    @staticmethod
    def fit(samples) -> "UtilityModel":
        if bool(samples["held_out"].any()):
            raise ValueError("UtilityModel.fit got held-out rows; fit on training rows only")
        regimes = {}
        for (op, dtype), g in samples.groupby(["op", "dtype"]):
            rows, cols = g["rows"].to_numpy(), g["cols"].to_numpy()
            X = features(op, dtype, rows, cols)
            regimes[(op, dtype)] = fit_regimes(X, g["median_us"].to_numpy(float), _split_values(rows, cols))
        return UtilityModel(regimes, ColdPenalty.fit(samples))

    def predict(self, op: str, dtype: str, rows, cols) -> np.ndarray:
        check_dtype(dtype)
        if op not in UTILITY_OPS:
            raise BadShapeError(f"unknown utility op {op!r}; expected one of {UTILITY_OPS}")
        r, c = np.asarray(rows), np.asarray(cols)
        if (r <= 0).any() or (c <= 0).any():
            raise BadShapeError(f"utility shape must be positive; got rows={r.min()} cols={c.min()}")
        key = (op, "float32" if dtype == "tf32" else dtype)
        if key not in self.regimes and op in COPY_LAYOUTS and ("copy", key[1]) in self.regimes:
            key = ("copy", key[1])  # a calibration from before copies were told by layout: as it priced them
            op = "copy"
        if key not in self.regimes:
            raise MissingModelError(f"no utility calibration for op={op!r} dtype={dtype!r}")
        reg = self.regimes[key]
        X = features(op, key[1], r, c)
        if reg["split"] is None:
            return X @ reg["coefs"][0]
        below = _split_values(r, c)[reg["split"]["on"]] < reg["split"]["at"]
        return np.where(below, X @ reg["coefs"][0], X @ reg["coefs"][1])

    def to_dict(self) -> dict:
        regimes = {key: {"split": r["split"], "coefs": [c.tolist() for c in r["coefs"]]}
                   for key, r in self.regimes.items()}
        d = {"kind": "utility_model", "features": FEATURES, "regimes": records(regimes, OP_DTYPE)}
        if self.cold is not None:  # a model without cold twins saves as it always did
            d["cold"] = self.cold.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "UtilityModel":
        if "coefs" in d:  # saved before regimes: one coefficient vector per (op, dtype)
            return cls({key: {"split": None, "coefs": [np.array(e["coef"], float)]}
                        for key, e in keyed(d["coefs"], OP_DTYPE).items()})
        return cls({key: {"split": e["split"], "coefs": [np.array(c, float) for c in e["coefs"]]}
                    for key, e in keyed(d["regimes"], OP_DTYPE).items()},
                   ColdPenalty.from_dict(d["cold"]) if d.get("cold") else None)
