"""The DLRM paper's memory-kernel models (III-B): roofline and ML.

- concat, memcpy_h2d, memcpy_d2d (heuristic, III-B1, or the MLP below where it validates
  better): the roofline's memory side,
  time = overhead + bytes / BW. As in the paper the bandwidth is a measured one, not a spec:
  per (op, dtype) the per-byte cost and a fixed per-call overhead are fitted to the training
  rows by non-negative least squares on the relative error. Two additions the paper's GPU did
  not need: concat also pays per input and per (row, input) segment (ATen's CPU cat copies
  input by input), and a fit may split once on bytes into two regimes (pipeline.predict.regimes)
  where a copy goes from one thread to a parallel region, whose fork costs ~8 µs on a 16-thread
  CPU. Without them a 16-thread Xeon's held-out concat was 76 % off (median; mean 71 %),
  memcpy 52 % (mean 50 %).
  Both the law and the MLP are fitted; the one with the lower mean relative error on the same
  validation rows (a seeded fifth of the training rows, pipeline.predict.mlp.validation_split)
  prices the (op, dtype), and both scores are saved with it. A CPU's cat is still not one law:
  an input's copy forks threads only past a grain of its own slice (batch x n), not of the
  total, so on the four CPUs measured the MLP validated better for concat on three.
- transpose, tril_fwd, tril_bwd (ML, III-B2): an MLP per (op, dtype) from the op's input
  dimensions to its time, both in logarithms, grid-searched (Table II's space; the reduced grid
  by default) with the helpers of pipeline.predict.mlp.

Shapes by op (OP_DIMS): concat (batch, n, k): k tensors of (batch, n) joined along dim 1;
memcpy_* (m, n); transpose (batch, m, n); tril_* (batch, n): the (batch, n, n) interaction.
Prediction is vectorized numpy (no torch).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict.embedding import check_positive, kernel_error_stats
from pipeline.predict.mlp import Net, search, validation_split
from pipeline.predict.regimes import fit_regimes, predict_regimes, regimes_from_dict, regimes_to_dict
from pipeline.predict.serialize import OP_DTYPE, keyed, records

MEMORY_OPS = ("concat", "memcpy_h2d", "memcpy_d2d", "transpose", "tril_fwd", "tril_bwd")
OP_DIMS = {"concat": ("batch", "n", "k"), "memcpy_h2d": ("m", "n"), "memcpy_d2d": ("m", "n"),
           "transpose": ("batch", "m", "n"), "tril_fwd": ("batch", "n"), "tril_bwd": ("batch", "n")}
# ops the paper prices by the roofline heuristic: it competes with the MLP for them; the rest
# (transpose, tril) are the MLP alone
ROOFLINE_OPS = ("concat", "memcpy_h2d", "memcpy_d2d")
KERNEL_NAMES = {"concat": "concat", "memcpy_h2d": "memcpy", "memcpy_d2d": "memcpy-D2D", "transpose": "transpose",
                "tril_fwd": "tril-F", "tril_bwd": "tril-B"}  # Table IV's names
TRIL_INDEX_BYTES = 8


def kernel_name(op: str) -> str:
    """The DLRM paper's Table IV name of a memory op (the layer type its errors are reported under)."""
    return KERNEL_NAMES.get(op, op)


def check_op(op: str) -> str:
    if op not in MEMORY_OPS:
        raise BadShapeError(f"unknown memory op {op!r}; expected one of {MEMORY_OPS}")
    return op


def check_shape(op: str, shape: dict) -> dict[str, np.ndarray]:
    """The op's dims as float arrays; BadShapeError naming a missing, unexpected or bad dim."""
    want = OP_DIMS[check_op(op)]
    extra = sorted(set(shape) - set(want))
    if extra:
        raise BadShapeError(f"op {op!r} takes dims {want}; got unexpected {extra[0]}={shape[extra[0]]!r}")
    missing = [d for d in want if d not in shape]
    if missing:
        raise BadShapeError(f"op {op!r} takes dims {want}; dimension {missing[0]} is missing")
    arrs = dict(zip(want, check_positive(**{d: shape[d] for d in want})))
    if op.startswith("tril") and arrs["n"].size and (arrs["n"] < 2).any():
        raise BadShapeError(f"dimension n={arrs['n'][arrs['n'] < 2].ravel()[0]:g} of {op} must be at least 2 "
                            "(an n x n interaction has no lower triangle below that)")
    return arrs


def memory_bytes(op: str, elem_bytes: int, **shape) -> np.ndarray:
    """Bytes the op must move (read + write; H2D: the bytes over the bus; tril: plus its int64 indices)."""
    s = check_shape(op, shape)
    if op == "concat":
        return 2.0 * s["batch"] * s["n"] * s["k"] * elem_bytes
    if op == "memcpy_h2d":
        return s["m"] * s["n"] * elem_bytes
    if op == "memcpy_d2d":
        return 2.0 * s["m"] * s["n"] * elem_bytes
    if op == "transpose":
        return 2.0 * s["batch"] * s["m"] * s["n"] * elem_bytes
    pairs = s["n"] * (s["n"] - 1) / 2
    if op == "tril_fwd":  # gather the pairs, write them
        return 2.0 * s["batch"] * pairs * elem_bytes + pairs * TRIL_INDEX_BYTES
    # tril_bwd: zero-fill the (batch, n*n) gradient, read the pairs' gradient, read-modify-write its targets
    return s["batch"] * s["n"] ** 2 * elem_bytes + 3.0 * s["batch"] * pairs * elem_bytes + pairs * TRIL_INDEX_BYTES


def roofline_features(op: str, dtype: str, s: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The roofline's columns (a constant, bytes; concat: inputs, row segments) and the split
    variable (bytes), broadcast to one row per shape."""
    nbytes = memory_bytes(op, element_bytes(dtype), **s)
    cols = [np.ones_like(nbytes), nbytes]
    if op == "concat":
        k, batch = np.broadcast_arrays(np.asarray(s["k"], float), np.asarray(s["batch"], float))
        cols += [k * np.ones_like(nbytes), batch * k * np.ones_like(nbytes)]
    X = np.stack(np.broadcast_arrays(*cols), axis=-1)
    return X, {"bytes": np.broadcast_to(nbytes, X.shape[:-1])}


def _log_features(op: str, s: dict[str, np.ndarray]) -> np.ndarray:
    arrs = np.broadcast_arrays(*(s[d] for d in OP_DIMS[op]))
    return np.log(np.stack([a.ravel() for a in arrs], axis=-1))


class MemoryModel:
    name = "memory_model"

    def __init__(self, roofline: dict[tuple[str, str], dict], nets: dict[tuple[str, str], dict]):
        self.roofline, self.nets = roofline, nets  # nets: exported MLP params (pipeline.predict.mlp)
        self._net_cache: dict[tuple[str, str], Net] = {}

    @staticmethod
    def fit(samples: pd.DataFrame, grid: str | dict = "reduced", seed: int = 0) -> "MemoryModel":
        """samples: memory_samples rows, training only (held-out rows are refused)."""
        if samples.empty:
            raise ValueError("MemoryModel.fit got no rows")
        if bool(samples["held_out"].any()):
            raise ValueError("MemoryModel.fit got held-out rows; fit on training rows only")
        roofline, nets = {}, {}
        for (op, dtype), g in samples.groupby(["op", "dtype"]):
            check_op(op)
            y = g["median_us"].to_numpy(float)
            dims = {d: g[d].to_numpy(float) for d in OP_DIMS[op]}
            params = _fit_mlp(op, dims, y, grid, seed)
            if op in ROOFLINE_OPS:
                law = _fit_heuristic(op, dtype, dims, y, seed)
                if law["val_rel_err"] is None or params["val_rel_err"] is None \
                        or law["val_rel_err"] <= params["val_rel_err"]:
                    roofline[(op, dtype)] = {**law, "mlp_val_rel_err": params["val_rel_err"]}
                    continue
                params = {**params, "heuristic_val_rel_err": law["val_rel_err"]}
            nets[(op, dtype)] = params
        return MemoryModel(roofline, nets)

    def method(self, op: str, dtype: str) -> str:
        """"heuristic" or "mlp": which model prices (op, dtype)."""
        key = self._key(op, dtype)
        return "mlp" if key in self.nets else "heuristic"

    def bandwidth_gbps(self, op: str, dtype: str) -> float:
        """A heuristic-priced op's fitted effective bandwidth, in its largest shapes' regime (inf
        when the fit gave bytes no cost)."""
        key = self._key(op, dtype)
        if key not in self.roofline:
            raise MissingModelError(f"{op} {dtype} is priced by an MLP here, which has no bandwidth")
        c = self.roofline[key]["coefs"][-1][1]
        return 1e-3 / c if c > 0 else float("inf")

    def _key(self, op: str, dtype: str) -> tuple[str, str]:
        check_op(op)
        check_dtype(dtype)
        key = (op, "float32" if dtype == "tf32" else dtype)
        if key not in self.roofline and key not in self.nets:
            have = sorted(set(self.roofline) | set(self.nets))
            raise MissingModelError(f"no memory calibration for op={op!r} dtype={dtype!r}; have {have}")
        return key

    def predict(self, op: str, dtype: str, **shape) -> np.ndarray:
        """Predicted microseconds; shape: the op's dims (OP_DIMS[op]) as scalars or arrays that broadcast."""
        s = check_shape(op, shape)
        out_shape = np.broadcast(*s.values()).shape
        key = self._key(op, dtype)
        if key in self.roofline:
            r = self.roofline[key]
            X, split_on = roofline_features(op, key[1], s)
            if r["coefs"][0].size < X.shape[-1]:  # saved before concat's per-input terms: as it priced then
                X = X[..., : r["coefs"][0].size]
            return np.broadcast_to(predict_regimes(r, X, split_on), out_shape).astype(float)
        if key not in self._net_cache:
            self._net_cache[key] = Net(self.nets[key])
        return np.exp(self._net_cache[key](_log_features(op, s))).reshape(out_shape)

    def to_dict(self) -> dict:
        roofline = {key: _roofline_to_dict(r) for key, r in self.roofline.items()}
        return {"kind": "memory_model", "roofline": records(roofline, OP_DTYPE),
                "nets": records({key: {"params": p} for key, p in self.nets.items()}, OP_DTYPE)}

    @classmethod
    def from_dict(cls, d: dict) -> "MemoryModel":
        if d.get("kind") != "memory_model":
            raise MissingModelError(f"not a memory model: kind={d.get('kind')!r}")
        nets = {key: e["params"] for key, e in keyed(d["nets"], OP_DTYPE).items()}
        return cls({key: _roofline_from_dict(e) for key, e in keyed(d["roofline"], OP_DTYPE).items()}, nets)


def _fit_mlp(op: str, dims: dict[str, np.ndarray], y: np.ndarray, grid: str | dict, seed: int) -> dict:
    """The DLRM paper's MLP (III-B2): log dims to log time, grid-searched; its val_rel_err is
    scored on validation_split(len(y), seed)."""
    params = search(_log_features(op, dims), np.log(y), lambda out, idx: np.exp(out), y, grid=grid, seed=seed)
    return {**params, "n": int(y.size)}


def _fit_heuristic(op: str, dtype: str, dims: dict[str, np.ndarray], y: np.ndarray, seed: int) -> dict:
    """The roofline law (with its regimes) on all rows, and its mean relative error on the MLP
    search's validation rows when fitted on the rest: the two are compared on the same rows.
    The paper prices concat and memcpy this way; where a CPU's copies do not follow one law
    (ATen's cat forks per input, by the input's slice) the MLP validates better and is kept."""
    X, split_on = roofline_features(op, dtype, dims)
    law = {**fit_regimes(X, y, split_on), "n": int(y.size), "val_rel_err": None}
    val, tr = validation_split(y.size, seed)
    if len(val) and len(tr) >= X.shape[1]:
        on = lambda idx: {k: v[idx] for k, v in split_on.items()}  # noqa: E731
        pred = predict_regimes(fit_regimes(X[tr], y[tr], on(tr)), X[val], on(val))
        law["val_rel_err"] = float(np.mean(np.abs(pred / y[val] - 1)))
    return law


def _roofline_to_dict(r: dict) -> dict:
    scores = {k: r[k] for k in ("val_rel_err", "mlp_val_rel_err") if r.get(k) is not None}
    if r["split"] is None and len(r["coefs"][0]) == 2:  # one law, overhead + bytes / BW: the paper's form
        return {"overhead_us": float(r["coefs"][0][0]), "us_per_byte": float(r["coefs"][0][1]), "n": r["n"],
                **scores}
    return {**regimes_to_dict(r), "n": r["n"], **scores}


def _roofline_from_dict(e: dict) -> dict:
    scores = {k: e.get(k) for k in ("val_rel_err", "mlp_val_rel_err")}
    if "coefs" not in e:  # saved before regimes: overhead + bytes / BW, one law
        return {"split": None, "coefs": [np.array([e["overhead_us"], e["us_per_byte"]], float)],
                "n": e.get("n", 0), **scores}
    return {**regimes_from_dict(e), "n": e.get("n", 0), **scores}


def table_iv_rows(model: MemoryModel, heldout_df: pd.DataFrame) -> pd.DataFrame:
    """Table IV for the rows given (pass the held-out ones): per (op, dtype) GMAE, mean and std
    of |relative error| (fractions), under Table IV's kernel names."""
    out = []
    for (op, dtype), g in heldout_df.groupby(["op", "dtype"], sort=False):
        pred = model.predict(op, dtype, **{d: g[d].to_numpy() for d in OP_DIMS[op]})
        out.append({"kernel": kernel_name(op), "op": op, "dtype": dtype, "method": model.method(op, dtype),
                    **kernel_error_stats(pred, g["median_us"].to_numpy(float))})
    return pd.DataFrame(out, columns=["kernel", "op", "dtype", "method", "n", "gmae", "mean", "std"])
