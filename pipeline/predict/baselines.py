"""The baselines devchar compares its own models against (PM2Lat Table II, DLRM paper III-B).

- RooflineModel: max(flops / measured peak, bytes / measured bandwidth); nothing fitted.
- NeuSightMLP: per (op, dtype) an MLP predicts the achieved fraction of the roofline
  (sigmoid-squashed into (0, 1]) from tile/wave features; time = roofline / fraction.
- LinMLP (Lin et al., DLRM paper III-B2): per (op, dtype) an MLP maps log2 of the input
  dimensions to log2(time), grid-searched over the paper's Table II.

All three share one interface: fit(gemm_samples, utility_samples, device_row, grid, seed),
predict_gemm / predict_utility (vectorized, microseconds), to_dict / from_dict (JSON).
Prediction is numpy only; fitting the MLPs uses scikit-learn (pipeline.predict.mlp).
"""
from __future__ import annotations

import numpy as np

from pipeline.core.dtypes import ELEMENT_BYTES, check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError, check_positive_arrays
from pipeline.predict.geometry import waves as count_waves
from pipeline.predict.mlp import Net, search_all
from pipeline.predict.serialize import OP_DTYPE, keyed, records
from pipeline.predict.traffic import utility_traffic
from pipeline.core.ops import GEMM_OPS, UTILITY_OPS

_U_MIN, _U_MAX = 1e-5, 0.999  # utilization clipped here before the logit (measured may beat the peak)


def _positive(**dims) -> list[np.ndarray]:
    return [a.astype(float) for a in check_positive_arrays(**dims)]


def _refuse_held_out(who: str, *frames) -> None:
    for df in frames:
        if df is not None and len(df) and bool(df["held_out"].any()):
            raise ValueError(f"{who}.fit got {int(df['held_out'].sum())} held-out rows; fit on training rows only")


def _util_key(op: str, dtype: str) -> tuple[str, str]:
    return op, "float32" if dtype == "tf32" else dtype  # tf32 stores float32: same memory-bound op


def _groups(df, keys):
    return [] if df is None or not len(df) else df.groupby(keys)


def gemm_traffic(dtype: str, m, n, k, batch) -> tuple[np.ndarray, np.ndarray]:
    """(flops, bytes) of a GEMM that reads A and B and writes C once."""
    flops = 2.0 * batch * m * n * k
    return flops, (batch * m * k + batch * k * n + batch * m * n) * float(element_bytes(dtype))


class _Baseline:
    name = ""

    def predict_gemm(self, op: str, dtype: str, m, n, k, batch=1) -> np.ndarray:
        check_dtype(dtype)
        if op not in GEMM_OPS:
            raise BadShapeError(f"unknown GEMM op {op!r}; expected one of {GEMM_OPS}")
        return self._gemm(op, dtype, *_positive(m=m, n=n, k=k, batch=batch))

    def predict_utility(self, op: str, dtype: str, rows, cols) -> np.ndarray:
        check_dtype(dtype)
        if op not in UTILITY_OPS:
            raise BadShapeError(f"unknown utility op {op!r}; expected one of {UTILITY_OPS}")
        return self._utility(op, dtype, *_positive(rows=rows, cols=cols))



class RooflineModel(_Baseline):
    name = "roofline"

    def __init__(self, peaks: dict[str, float], bandwidth_gbps: float):
        self.peaks = {dt: float(p) for dt, p in peaks.items()}  # FLOP/s, measured
        self.bandwidth_gbps = float(bandwidth_gbps)  # GB/s, measured copy (read + write)

    @staticmethod
    def fit(gemm_samples=None, utility_samples=None, device_row: dict | None = None, grid="reduced",
            seed=0) -> "RooflineModel":
        _refuse_held_out("RooflineModel", gemm_samples, utility_samples)
        if not device_row or not device_row.get("bandwidth_gbps"):
            raise MissingModelError("RooflineModel needs a device row with measured bandwidth_gbps")
        peaks = {}
        for dt in ELEMENT_BYTES:
            p = device_row.get(f"peak_flops_{dt}")
            if p is not None and np.isfinite(float(p)) and float(p) > 0:
                peaks[dt] = float(p)
        return RooflineModel(peaks, float(device_row["bandwidth_gbps"]))

    def _peak(self, dtype: str) -> float:
        if dtype not in self.peaks:
            raise MissingModelError(f"roofline: no measured peak FLOP/s for dtype={dtype!r}; have {sorted(self.peaks)}")
        return self.peaks[dtype]

    def time_us(self, dtype: str, flops, nbytes) -> np.ndarray:
        return np.maximum(flops / self._peak(dtype), nbytes / (self.bandwidth_gbps * 1e9)) * 1e6

    def _gemm(self, op, dtype, m, n, k, batch):
        return self.time_us(dtype, *gemm_traffic(dtype, m, n, k, batch))

    def _utility(self, op, dtype, rows, cols):
        br, bw, fl = utility_traffic(op, rows, cols, element_bytes(dtype))
        return self.time_us(_util_key(op, dtype)[1], fl, br + bw)

    def to_dict(self) -> dict:
        return {"kind": self.name, "peaks": dict(self.peaks), "bandwidth_gbps": self.bandwidth_gbps}

    @classmethod
    def from_dict(cls, d: dict) -> "RooflineModel":
        return cls(d["peaks"], d["bandwidth_gbps"])


def _mode(s) -> int:
    return int(s.mode().iloc[0])


class _MLPBaseline(_Baseline):
    """Per (op, dtype) exported MLPs: self.gemm[(op, dtype)] and self.util[(op, dtype)] are dicts
    holding "params" (see mlp.train) plus, for GEMMs, the group's tile_m, tile_n and slots."""

    def __init__(self, gemm: dict, util: dict, roofline: RooflineModel | None = None):
        self.gemm, self.util, self.roofline = gemm, util, roofline
        self._nets: dict = {}  # numpy forward passes, built on first use

    def _entry(self, kind: str, key: tuple[str, str]) -> tuple[dict, Net]:
        table = self.gemm if kind == "GEMM" else self.util
        if key not in table:
            raise MissingModelError(f"{self.name}: no {kind} calibration for op={key[0]!r} dtype={key[1]!r}; "
                                    f"have {sorted(table)}")
        if (kind, key) not in self._nets:
            self._nets[(kind, key)] = Net(table[key]["params"])
        return table[key], self._nets[(kind, key)]

    def to_dict(self) -> dict:
        out = {"kind": self.name, "gemm": records(self.gemm, OP_DTYPE),
               "utility": records(self.util, OP_DTYPE)}
        if self.roofline is not None:
            out["roofline"] = self.roofline.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict):
        roof = RooflineModel.from_dict(d["roofline"]) if "roofline" in d else None
        return cls(keyed(d["gemm"], OP_DTYPE), keyed(d["utility"], OP_DTYPE), roof)


def _exp2_out(out: np.ndarray, idx) -> np.ndarray:
    """LinMLP's decode: the network predicts log2 of the time."""
    return np.exp2(out)


class LinMLP(_MLPBaseline):
    name = "lin_mlp"

    @staticmethod
    def gemm_features(m, n, k, batch) -> np.ndarray:
        return np.log2(np.stack(np.broadcast_arrays(batch, m, n, k), axis=-1).astype(float))

    @staticmethod
    def utility_features(rows, cols) -> np.ndarray:
        return np.log2(np.stack(np.broadcast_arrays(rows, cols), axis=-1).astype(float))

    @staticmethod
    def fit(gemm_samples=None, utility_samples=None, device_row: dict | None = None, grid="reduced",
            seed=0) -> "LinMLP":
        _refuse_held_out("LinMLP", gemm_samples, utility_samples)
        tasks = {}
        for key, g in _groups(gemm_samples, ["op", "dtype"]):
            X = LinMLP.gemm_features(*(g[c].to_numpy(float) for c in ("m", "n", "k", "batch")))
            tasks[("GEMM", key)] = LinMLP._task(X, g["median_us"].to_numpy(float))
        for key, g in _groups(utility_samples, ["op", "dtype"]):
            X = LinMLP.utility_features(g["rows"].to_numpy(float), g["cols"].to_numpy(float))
            tasks[("utility", key)] = LinMLP._task(X, g["median_us"].to_numpy(float))
        fitted = search_all(tasks, grid, seed)
        gemm = {key: {"params": p} for (kind, key), p in fitted.items() if kind == "GEMM"}
        util = {key: {"params": p} for (kind, key), p in fitted.items() if kind == "utility"}
        return LinMLP(gemm, util)

    @staticmethod
    def _task(X: np.ndarray, t: np.ndarray) -> tuple:
        return X, np.log2(t), _exp2_out, t

    def _gemm(self, op, dtype, m, n, k, batch):
        return np.exp2(self._entry("GEMM", (op, dtype))[1](self.gemm_features(m, n, k, batch)))

    def _utility(self, op, dtype, rows, cols):
        return np.exp2(self._entry("utility", _util_key(op, dtype))[1](self.utility_features(rows, cols)))


class NeuSightMLP(_MLPBaseline):
    name = "neusight_mlp"

    def gemm_features(self, dtype, m, n, k, batch, tile_m, tile_n, slots) -> np.ndarray:
        flops, nbytes = gemm_traffic(dtype, m, n, k, batch)
        w = count_waves(m, n, batch, tile_m, tile_n, slots)
        cols = np.broadcast_arrays(m, n, k, batch, w, np.full(np.shape(w), float(slots)), flops / nbytes)
        return np.log2(np.stack(cols, axis=-1).astype(float))

    @staticmethod
    def utility_features(op, dtype, rows, cols) -> np.ndarray:
        br, bw, _ = utility_traffic(op, rows, cols, element_bytes(dtype))
        return np.log2(np.stack(np.broadcast_arrays(rows, cols, br + bw), axis=-1).astype(float))

    @staticmethod
    def _decode(roof: np.ndarray):
        # time = roofline / sigmoid(z) = roofline * (1 + exp(-z)) >= roofline, always
        return lambda z, idx: roof[idx] * (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))

    @staticmethod
    def _target(roof: np.ndarray, t: np.ndarray) -> np.ndarray:
        u = np.clip(roof / t, _U_MIN, _U_MAX)
        return np.log(u / (1.0 - u))  # logit: the network's output before the sigmoid

    @staticmethod
    def fit(gemm_samples=None, utility_samples=None, device_row: dict | None = None, grid="reduced",
            seed=0) -> "NeuSightMLP":
        _refuse_held_out("NeuSightMLP", gemm_samples, utility_samples)
        roof = RooflineModel.fit(gemm_samples, utility_samples, device_row)
        model, tasks = NeuSightMLP({}, {}, roof), {}
        for (op, dt), g in _groups(gemm_samples, ["op", "dtype"]):
            geo = {"tile_m": _mode(g["tile_m"]), "tile_n": _mode(g["tile_n"]), "slots": _mode(g["slots"])}
            dims = [g[c].to_numpy(float) for c in ("m", "n", "k", "batch")]
            t, r = g["median_us"].to_numpy(float), roof.predict_gemm(op, dt, *dims)
            model.gemm[(op, dt)] = geo
            tasks[("GEMM", (op, dt))] = (model.gemm_features(dt, *dims, **geo), NeuSightMLP._target(r, t),
                                         NeuSightMLP._decode(r), t)
        for (op, dt), g in _groups(utility_samples, ["op", "dtype"]):
            dims = [g[c].to_numpy(float) for c in ("rows", "cols")]
            t, r = g["median_us"].to_numpy(float), roof.predict_utility(op, dt, *dims)
            tasks[("utility", (op, dt))] = (NeuSightMLP.utility_features(op, dt, *dims), NeuSightMLP._target(r, t),
                                            NeuSightMLP._decode(r), t)
        for (kind, key), params in search_all(tasks, grid, seed).items():
            table = model.gemm if kind == "GEMM" else model.util
            table[key] = {**table.get(key, {}), "params": params}
        return model

    def _gemm(self, op, dtype, m, n, k, batch):
        e, net = self._entry("GEMM", (op, dtype))
        X = self.gemm_features(dtype, m, n, k, batch, e["tile_m"], e["tile_n"], e["slots"])
        return self._decode(self.roofline.predict_gemm(op, dtype, m, n, k, batch))(net(X), ...)

    def _utility(self, op, dtype, rows, cols):
        _, net = self._entry("utility", _util_key(op, dtype))
        roof = self.roofline.predict_utility(op, dtype, rows, cols)
        return self._decode(roof)(net(self.utility_features(op, dtype, rows, cols)), ...)


BASELINES = {cls.name: cls for cls in (RooflineModel, NeuSightMLP, LinMLP)}
