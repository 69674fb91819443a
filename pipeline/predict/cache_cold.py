"""What a memory-bound op costs on a CPU with L2 evicted, as inside a step that streams more
than L2 (no torch).

The CPU utility sweep times each op hot: back to back, its inputs left in L1/L2 by the call
before. Inside a model an op runs once a step, and what it touched, the dispatcher's own data
and, a microbenchmark says, its code, is gone from L2 by then. On the Xeon VM a 128 x 576
float32 add ran 5 us hot, 18-20 us right after a 128 x 576 x 1536 linear or an 8 MB fill, and
39 us after a 64 MB fill; a silu 14 us hot, 19-22 us after either.

The sweep times a twin of each row whose footprint is within a few flushes after evicting L2
(`cold_us`: the harness's flush, twice the L2 size, written between calls). ColdPenalty keeps
the median extra per (op, dtype) and size class of the op's footprint; the graph pricer adds
it to every utility op of a step whose footprint (`graph_footprint` of each op's `op_bytes`)
passes the flush (price.py). Until 2026-11-30 it charged only an op whose predecessor passed
the flush; on the seven committed CPU references replayed and one more take, the step's
footprint priced DLRM better on six of the eight and GPT-2 as well or better on seven
(docs/methods.md; in-sample, on the captures that prompted it). Why, as far as measured:
inside a step an op's pages were last touched a step of traffic ago, whatever ran just before
it; the twins flush data only, so they are a floor for that. One level only: an op after a
GEMM streaming hundreds of MB finds its data further still (the 64 MB case), which this does
not price.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.core.dtypes import element_bytes
from pipeline.predict.serialize import DataclassJSON
from pipeline.predict.traffic import utility_traffic

MIN_ROWS = 3  # an (op, dtype) with fewer cold twins is priced by every op's twins pooled


def footprint(rows: pd.DataFrame) -> np.ndarray:
    """Bytes an op touches: read plus written (the sweep's traffic columns)."""
    return rows["bytes_read"].to_numpy(float) + rows["bytes_written"].to_numpy(float)


def has_twins(rows: pd.DataFrame) -> bool:
    return {"cold_us", "evict_bytes"} <= set(rows) and bool(np.isfinite(rows["cold_us"].to_numpy(float)).any())


def _classes(nbytes: np.ndarray, extra: np.ndarray) -> tuple[list, list]:
    per = pd.Series(extra).groupby(np.floor(np.log2(np.maximum(nbytes, 1.0)))).median().sort_index()
    return per.index.tolist(), per.tolist()


@dataclass
class ColdPenalty(DataclassJSON):
    # the flush the twins ran after: a step touching this much evicts L2 between two runs of an op
    evict_bytes: float
    # "op/dtype" (and "*" for all pooled) -> [log2 footprint classes ascending, median extra us]
    classes: dict = field(default_factory=dict)
    max_bytes: float = float("inf")  # the largest twin's footprint: a larger op streams past L2 either way

    @staticmethod
    def fit(rows: pd.DataFrame) -> "ColdPenalty | None":
        """From utility_samples rows (training rows) with cold twins; None without any."""
        if not has_twins(rows):
            return None
        rows = rows[np.isfinite(rows["cold_us"].to_numpy(float))]
        # a twin is timed right after its row: a row that stalled, was timed again for its
        # spread, or sat off its neighbours' surface (harness/suspects.py) had its twin taken in
        # the same disturbance, and the hot time it is set against may be a later, steadier one
        for flag in ("stalled", "remeasured", "suspect"):
            if flag in rows:
                rows = rows[~rows[flag].fillna(False).astype(bool).to_numpy()]
        if rows.empty:
            return None
        extra = np.maximum(rows["cold_us"].to_numpy(float) - rows["median_us"].to_numpy(float), 0.0)
        nbytes = footprint(rows)
        classes = {"*": _classes(nbytes, extra)}
        for (op, dtype), idx in rows.groupby(["op", "dtype"]).indices.items():
            if len(idx) >= MIN_ROWS:
                classes[f"{op}/{dtype}"] = _classes(nbytes[idx], extra[idx])
        return ColdPenalty(float(rows["evict_bytes"].median()), classes, float(nbytes.max()))

    def extra_us(self, op: str, dtype: str, nbytes) -> np.ndarray:
        """Microseconds an op of `nbytes` footprint pays beyond its hot time after an eviction:
        linear in log2 bytes between the measured classes, held below them, and 0 past the
        largest twin (the sweep times none there: such an op streams past L2 hot or cold)."""
        dtype = "float32" if dtype == "tf32" else dtype  # tf32 is float32 storage
        log2s, extra = self.classes.get(f"{op}/{dtype}", self.classes["*"])
        nbytes = np.asarray(nbytes, float)
        x = np.log2(np.maximum(nbytes, 1.0))
        return np.where(nbytes > self.max_bytes, 0.0, np.interp(x, np.asarray(log2s, float) + 0.5,
                                                               np.asarray(extra, float)))

    def evicts(self, nbytes: float) -> bool:
        """Whether `nbytes` of traffic (a step's footprint) leaves an op's data out of L2 by its next run."""
        return nbytes >= self.evict_bytes


def utility_bytes(model_op: str, dims, dtype: str) -> float:
    """Bytes a utility op of (rows, cols) reads and writes."""
    read, written, _ = utility_traffic(model_op, dims[0], dims[1], element_bytes(dtype))
    return float(read + written)


def op_bytes(kind: str, model_op: str, dims, shapes, dtype: str) -> float:
    """Bytes a priced op touches, summed over a step by graph_footprint: a
    GEMM's operands and output (kind "gemm", dims (m, n, k, batch)), a utility op's traffic
    ("utility"), any other op's inputs (`shapes`)."""
    eb = element_bytes(dtype)
    if kind == "gemm":
        m, n, k, batch = (list(dims) + [1])[:4]
        weight_batch = batch if model_op == "bmm" else 1
        return float(eb * (batch * m * k + weight_batch * k * n + batch * m * n))
    if kind == "utility":
        return utility_bytes(model_op, dims, dtype)
    return float(eb * _elements(shapes or []))


def graph_footprint(ops_bytes) -> float:
    """Bytes a captured step's priced ops span, summed with repeats (`ops_bytes`: op_bytes of
    each): what passes through the cache between one op and its own next run a step later, as
    the GEMM weights' uncached share counts a training graph's backward GEMMs again."""
    return float(sum(ops_bytes))


def _elements(shapes) -> int:
    """Elements of every tensor among an op's inputs (a tensor list's entries each)."""
    if not isinstance(shapes, (list, tuple)):
        return 0
    if all(isinstance(d, int) for d in shapes):
        return math.prod(shapes)
    return sum(_elements(s) for s in shapes)
