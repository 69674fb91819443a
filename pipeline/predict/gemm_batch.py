"""How a batched GEMM's batch size changes its time on the CPU, measured (no torch).

The whole-wave table holds bmm at batch 2 and 8, with the matrices as large as the waves need.
Inside models a bmm is many small matrices (attention: batch x heads of 128 x 128 x 64), and
on the Xeon VM those ran up to 3.5x as long as the table said at the same output size (bf16,
256 matrices of 32 x 32 x 256: 247 us against 70 priced; float32 1.5x): each matrix costs a
setup the table's few large ones spread over more work. The sweep's "batch" grid times bmm at
batch 1 ... 256 (powers of 4) x square matrices of side 4 ... 1024 (powers of 4) x a few K, and
this correction keeps, per (op, dtype, kernel), log(measured / what that kernel's table predicts)
at each (batch, side, K) the kernel ran, side = sqrt(M N). Per kernel: on bf16 oneDNN runs the
larger cells and ATen's loop the tiny ones (1.2 us against 17), and a correction pooled over
both would price a tiny shape the selector gives oneDNN at ATen's speed. A shape is charged
exp(the correction), trilinear in (log batch, log side, log K) and held at the grid's edges.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.predict.gemm_grids import neighbourhood_median
from pipeline.predict.geometry import bilinear, grid_position
from pipeline.predict.serialize import DataclassJSON

BATCH_GRID = "batch"  # gemm_samples.grid of the batch grid's rows


@dataclass
class BatchCorrection(DataclassJSON):
    op: str
    dtype: str
    kernel: str
    batch: np.ndarray  # (B,) ascending
    side: np.ndarray  # (S,) sqrt(M N) of one matrix, ascending
    ks: np.ndarray  # (K,) ascending
    log: np.ndarray  # (B, S, K) log(measured / predicted without this correction)

    @staticmethod
    def fit(op: str, dtype: str, kernel: str, rows: pd.DataFrame, predicted: np.ndarray) -> "BatchCorrection":
        """rows: the batch grid's rows one kernel ran, their time without page faults;
        predicted: what the kernel's table predicts for them."""
        r = rows.assign(side=np.sqrt(rows["m"].to_numpy(float) * rows["n"]),
                        log=np.log(rows["median_us"].to_numpy(float) / predicted))
        cells = r.pivot_table(index=["batch", "side"], columns="k", values="log", aggfunc="median")
        batch, side = np.unique(r["batch"].to_numpy(float)), np.unique(r["side"].to_numpy(float))
        ks = np.array(sorted(cells.columns), float)
        out = np.full((batch.size, side.size, ks.size), np.nan)
        for (b, s), row in cells.iterrows():
            out[np.searchsorted(batch, b), np.searchsorted(side, s)] = row.to_numpy(float)
        # one cell timed in a slow spell must not price its shapes alone: per batch, the median of
        # each cell's (side x K) neighbourhood
        out = np.stack([np.where(np.isnan(plane), np.nan, neighbourhood_median(plane)) for plane in out])
        return BatchCorrection(op, dtype, kernel, batch, side, ks, fill_cells(out, np.log2(ks), np.log2(side)))

    def factor(self, m, n, k, batch) -> np.ndarray:
        side = np.sqrt(np.asarray(m, float) * np.asarray(n, float))
        ib, fb, ib1 = grid_position(np.log2(self.batch), np.log2(np.asarray(batch, float)))
        sides = grid_position(np.log2(self.side), np.log2(side))
        ks = grid_position(np.log2(self.ks), np.log2(np.asarray(k, float)))
        below, above = (bilinear(self.log, sides, ks, lead=(i,)) for i in (ib, ib1))
        return np.exp(below * (1 - fb) + above * fb)


def fill_cells(cells: np.ndarray, log_k: np.ndarray, log_side: np.ndarray) -> np.ndarray:
    """Cells the sweep's caps skipped (the largest batch x side x K): along K from the measured
    K of the same (batch, side), held at the ends; then along side; 0 where nothing was measured."""
    out = cells.copy()
    for axis, coord in ((2, log_k), (1, log_side)):
        moved = np.moveaxis(out, axis, -1)
        for idx in np.ndindex(moved.shape[:-1]):
            line = moved[idx]
            have = ~np.isnan(line)
            if have.any() and not have.all():
                line[~have] = np.interp(coord[~have], coord[have], line[have])
    return np.nan_to_num(out, nan=0.0)
