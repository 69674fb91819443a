"""The operators of a workload, as plain data: what the predictors price (no torch here)."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import BadShapeError, check_dims

GEMM_OPS = ("mm", "bmm", "linear")
# Memory-bound ops devchar measures in utility_samples. Shapes are (rows, cols); the
# reductions (softmax, layernorm, rmsnorm) reduce over cols; embedding gathers `rows`
# rows of width `cols` from a table. A copy is priced by its source's layout (price.py
# copy_layout): `copy` transposes (a strided innermost dim), `copy_rows` gathers contiguous
# runs of `cols` elements (a permute of heads, a slice), `copy_bcast` repeats a source
# broadcast along a dim (a bias copied into a GEMM output, repeat_kv's expand).
UTILITY_OPS = ("relu", "gelu", "silu", "add", "mul", "dropout", "softmax", "layernorm", "rmsnorm", "embedding", "copy",
               "copy_rows", "copy_bcast")


@dataclass(frozen=True)
class GemmOp:
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]; op says which torch call runs it."""

    name: str
    op: str
    m: int
    n: int
    k: int
    batch: int = 1
    count: int = 1

    def __post_init__(self):
        if self.op not in GEMM_OPS:
            raise BadShapeError(f"unknown GEMM op {self.op!r}; expected one of {GEMM_OPS}")
        check_dims(m=self.m, n=self.n, k=self.k, batch=self.batch, count=self.count)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class UtilityOp:
    name: str
    op: str
    rows: int
    cols: int
    count: int = 1

    def __post_init__(self):
        if self.op not in UTILITY_OPS:
            raise BadShapeError(f"unknown utility op {self.op!r}; expected one of {UTILITY_OPS}")
        check_dims(rows=self.rows, cols=self.cols, count=self.count)


Op = GemmOp | UtilityOp
