"""End-to-end prediction of an operator list: the sum of its kernels (PM2Lat's sequential model)."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from pipeline.core.dtypes import element_bytes
from pipeline.predict.gemm import GemmModel
from pipeline.predict.price import WEIGHT_OPS
from pipeline.predict.utility import UtilityModel
from pipeline.core.ops import GemmOp, Op, UtilityOp

LAYER_TYPE = {"mm": "MM", "bmm": "BMM", "linear": "Linear", "softmax": "Softmax"}


def predict_op_us(op: Op, dtype: str, gemm: GemmModel, utility: UtilityModel, cold: float | None = None) -> float:
    """`cold`: the share of the GEMM weights read from memory (weights_cold); only tables with a
    cold-weight correction (mm and linear) apply it."""
    if isinstance(op, GemmOp):
        return float(gemm.predict(op.op, dtype, op.m, op.n, op.k, op.batch, cold=cold)) * op.count
    if isinstance(op, UtilityOp):
        return float(utility.predict(op.op, dtype, op.rows, op.cols)) * op.count
    raise TypeError(f"cannot price operator {op!r}")


def predict_ops(ops: list[Op], dtype: str, gemm: GemmModel, utility: UtilityModel) -> tuple[float, dict[str, float]]:
    """Total predicted microseconds and a breakdown by layer type (MM, BMM, Linear, Softmax, Vector)."""
    by_type: dict[str, float] = defaultdict(float)
    cold = weights_cold(ops, dtype, gemm)
    for op in ops:
        by_type[LAYER_TYPE.get(op.op, "Vector")] += predict_op_us(op, dtype, gemm, utility, cold)
    return sum(by_type.values()), dict(by_type)


def weights_cold(ops: list[Op], dtype: str, gemm: GemmModel) -> float | None:
    """The share of the ops' GEMM weights (N x K of each mm and linear, times its count) that
    the cache the GEMM sweep measured cannot hold (GemmModel.uncached_share; price.py does
    the same for a captured graph). None for a model without a cold-weight correction."""
    share = getattr(gemm, "uncached_share", None)
    nbytes = sum(op.n * op.k * op.count for op in ops if isinstance(op, GemmOp) and op.op in WEIGHT_OPS)
    return share(nbytes * element_bytes(dtype)) if share is not None and nbytes else None


def extrapolation(ops: list[Op], dtype: str, gemm: GemmModel) -> dict[str, tuple[float, float]]:
    """GEMM op kind (mm, bmm, linear) -> (waves, K) reach as GemmModel.beyond_range reports it,
    for the kinds whose shapes go past the calibrated range (either ratio above 1)."""
    shapes: dict[str, list] = defaultdict(list)
    for op in ops:
        if isinstance(op, GemmOp):
            shapes[op.op].append((op.m, op.n, op.k, op.batch))
    out = {}
    for kind, rows in shapes.items():
        reach = gemm.beyond_range(kind, dtype, *np.array(rows, dtype=np.int64).T)
        if max(reach) > 1:
            out[kind] = reach
    return out


def extrapolation_warnings(reach: dict[str, tuple[float, float]]) -> list[str]:
    """One line per op kind: how far past the largest measured waves and K its shapes go."""
    def times(r: float) -> str:
        return f"{r:.1f}x" if r < 10 else f"{r:,.0f}x"

    lines = []
    for kind, (w, k) in sorted(reach.items()):
        past = [f"{times(r)} beyond the largest measured {what}" for r, what in ((w, "waves"), (k, "K")) if r > 1]
        lines.append(f"{kind}: extrapolated, {' and '.join(past)} (the throughput measured at the edge "
                     "is held there: a guess, not a measurement)")
    return lines
