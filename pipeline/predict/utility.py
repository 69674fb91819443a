"""PM2Lat's utility-layer model: per (op, dtype), latency as a non-negative linear function
of its proxies (bytes moved, flops, rows) plus a constant for the call itself.

Fitted to minimise *relative* error (each row divided by its measured time), since a
latency model is judged by relative error across sizes spanning several decades.

One op can run different kernels by shape, as a GEMM does: on the CPU, softmax over fewer
than 16 columns takes a scalar path ~15x slower per element than the vectorized one, small
tensors run on one thread, and a row-wise op (softmax, layernorm) forks once it has rows to
share. So a fit may split once, at a column, element or row count seen in the sweep, into two
regimes with their own coefficients (pipeline.predict.regimes).
"""
from __future__ import annotations

import numpy as np

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict.cache_cold import ColdPenalty
from pipeline.predict.regimes import fit_regimes, predict_regimes, regimes_from_dict, regimes_to_dict
from pipeline.predict.serialize import OP_DTYPE, keyed, records
from pipeline.predict.traffic import utility_traffic
from pipeline.core.ops import UTILITY_OPS

FEATURES = ("const", "bytes", "flops", "rows")
COPY_LAYOUTS = ("copy_rows", "copy_bcast")  # timed since 2026-11-25; "copy" (transposing) before


def features(op: str, dtype: str, rows, cols) -> np.ndarray:
    br, bw, fl = utility_traffic(op, rows, cols, element_bytes(dtype))
    rows = np.asarray(rows, dtype=float) * np.ones_like(br)
    return np.stack([np.ones_like(br), br + bw, fl, rows], axis=-1)


def _split_values(rows, cols) -> dict[str, np.ndarray]:
    r, c = np.broadcast_arrays(np.asarray(rows, dtype=float), np.asarray(cols, dtype=float))
    return {"cols": c, "elems": r * c, "rows": r}


class UtilityModel:
    name = "utility_model"

    def __init__(self, regimes: dict[tuple[str, str], dict], cold: ColdPenalty | None = None):
        self.regimes = regimes
        self.cold = cold  # CPU: the extra an op pays with L2 evicted, as in a step past the flush (cache_cold.py)

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
        return predict_regimes(self.regimes[key], features(op, key[1], r, c), _split_values(r, c))

    def to_dict(self) -> dict:
        regimes = {key: regimes_to_dict(r) for key, r in self.regimes.items()}
        d = {"kind": "utility_model", "features": FEATURES, "regimes": records(regimes, OP_DTYPE)}
        if self.cold is not None:  # a model without cold twins saves as it always did
            d["cold"] = self.cold.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "UtilityModel":
        if "coefs" in d:  # saved before regimes: one coefficient vector per (op, dtype)
            return cls({key: {"split": None, "coefs": [np.array(e["coef"], float)]}
                        for key, e in keyed(d["coefs"], OP_DTYPE).items()})
        return cls({key: regimes_from_dict(e) for key, e in keyed(d["regimes"], OP_DTYPE).items()},
                   ColdPenalty.from_dict(d["cold"]) if d.get("cold") else None)
