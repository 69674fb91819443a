"""PM2Lat's utility-layer model: per (op, dtype), latency as a non-negative linear function
of its proxies (bytes moved, flops, rows) plus a constant for the call itself.

Fitted to minimise *relative* error (each row divided by its measured time), since a
latency model is judged by relative error across sizes spanning several decades.
"""
from __future__ import annotations

import numpy as np

from pipeline.dtypes import check_dtype, element_bytes
from pipeline.errors import BadShapeError, MissingModelError
from pipeline.predict.fitting import nnls_relative
from pipeline.predict.traffic import utility_traffic
from pipeline.workloads.ops import UTILITY_OPS

FEATURES = ("const", "bytes", "flops", "rows")


def features(op: str, dtype: str, rows, cols) -> np.ndarray:
    br, bw, fl = utility_traffic(op, rows, cols, element_bytes(dtype))
    rows = np.asarray(rows, dtype=float) * np.ones_like(br)
    return np.stack([np.ones_like(br), br + bw, fl, rows], axis=-1)


class UtilityModel:
    name = "utility_model"

    def __init__(self, coefs: dict[tuple[str, str], np.ndarray]):
        self.coefs = coefs

    @staticmethod
    def fit(samples) -> "UtilityModel":
        if bool(samples["held_out"].any()):
            raise ValueError("UtilityModel.fit got held-out rows; fit on training rows only")
        coefs = {}
        for (op, dtype), g in samples.groupby(["op", "dtype"]):
            X = features(op, dtype, g["rows"].to_numpy(), g["cols"].to_numpy())
            y = g["median_us"].to_numpy(float)
            coefs[(op, dtype)] = nnls_relative(X, y)[0]
        return UtilityModel(coefs)

    def predict(self, op: str, dtype: str, rows, cols) -> np.ndarray:
        check_dtype(dtype)
        if op not in UTILITY_OPS:
            raise BadShapeError(f"unknown utility op {op!r}; expected one of {UTILITY_OPS}")
        r, c = np.asarray(rows), np.asarray(cols)
        if (r <= 0).any() or (c <= 0).any():
            raise BadShapeError(f"utility shape must be positive; got rows={r.min()} cols={c.min()}")
        key = (op, "float32" if dtype == "tf32" else dtype)
        if key not in self.coefs:
            raise MissingModelError(f"no utility calibration for op={op!r} dtype={dtype!r}")
        return features(op, key[1], r, c) @ self.coefs[key]

    def to_dict(self) -> dict:
        return {"kind": "utility_model", "features": FEATURES,
                "coefs": [{"op": op, "dtype": dt, "coef": c.tolist()} for (op, dt), c in self.coefs.items()]}

    @staticmethod
    def from_dict(d: dict) -> "UtilityModel":
        return UtilityModel({(e["op"], e["dtype"]): np.array(e["coef"], float) for e in d["coefs"]})
