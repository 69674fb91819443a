"""End-to-end prediction of an operator list: the sum of its kernels (PM2Lat's sequential model)."""
from __future__ import annotations

from collections import defaultdict

from pipeline.predict.gemm import GemmModel
from pipeline.predict.utility import UtilityModel
from pipeline.workloads.ops import GemmOp, Op, UtilityOp

LAYER_TYPE = {"mm": "MM", "bmm": "BMM", "linear": "Linear", "softmax": "Softmax"}


def predict_op_us(op: Op, dtype: str, gemm: GemmModel, utility: UtilityModel) -> float:
    if isinstance(op, GemmOp):
        return float(gemm.predict(op.op, dtype, op.m, op.n, op.k, op.batch)) * op.count
    if isinstance(op, UtilityOp):
        return float(utility.predict(op.op, dtype, op.rows, op.cols)) * op.count
    raise TypeError(f"cannot price operator {op!r}")


def predict_ops(ops: list[Op], dtype: str, gemm: GemmModel, utility: UtilityModel) -> tuple[float, dict[str, float]]:
    """Total predicted microseconds and a breakdown by layer type (MM, BMM, Linear, Softmax, Vector)."""
    by_type: dict[str, float] = defaultdict(float)
    for op in ops:
        by_type[LAYER_TYPE.get(op.op, "Vector")] += predict_op_us(op, dtype, gemm, utility)
    return sum(by_type.values()), dict(by_type)
