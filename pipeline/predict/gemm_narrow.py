"""How a GEMM with fewer output columns than a cache line holds runs at each such N, measured
(CPU, no torch).

The aspect lattice holds N in powers of 4 and 2 (1, 2, 4, 16, ...), and a shape between two of
its columns is priced between them. Below a line of columns a BLAS changes kernels at N of its
own, and the time between two lattice columns is then not between theirs. On the Zen 3 EPYC VM
(2 threads, float32, 2026-11-29) mm 1024 x N x 1024 ran 841 us at N = 4, 1037-1718 at N = 5-10,
569 at N = 12 and 332 at N = 16; `F.linear` of the same sizes ran 410-942 us at N = 5-15, against
283 at N = 4 and 384 at N = 16. Over ten CPU calibrations (two CPU vendors) the held-out shapes with
N of 4-15 were priced 0.71 (mm) and 0.74 (linear) of their time, geometric mean
(scripts/heldout_bias.py).

The sweep's narrow grid times every whole N under a line that is not on the lattice, at a few
(M, K) cells (sweeps/gemm_points.py narrow_points). Per (op, dtype) and N the correction is the
median over those cells of log(measured / the model without it) (with the quick profile's two
cells, their geometric mean). It applies to shapes of that exact N whatever their M, K and
batch: on that VM mm's times over N, relative to N = 4, kept their pattern within ~20 % across
M = 64-1024 and K = 64-1024. Below M = 64 nothing was checked. Other N are left alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.predict.gemm_grids import TWIN_N_GRID
from pipeline.predict.serialize import DataclassJSON

NARROW_GRID = "narrow_n"  # gemm_samples.grid of the narrow grid's rows


def narrow_rows(samples: pd.DataFrame, grid: pd.Series) -> pd.DataFrame:
    """The rows the correction is fitted on: the narrow grid's, and the unaligned-N twins at an N
    of (op, dtype) it times (N = 5 at the twins' K): the sweep times such a shape once
    (sweep_points), and the twins' own correction skips columns under a line."""
    narrow = samples[(grid == NARROW_GRID).to_numpy()]
    timed = set(zip(narrow["op"], narrow["dtype"], narrow["n"]))
    twin = (grid == TWIN_N_GRID).to_numpy() & np.array(
        [key in timed for key in zip(samples["op"], samples["dtype"], samples["n"])], bool)
    return pd.concat([narrow, samples[twin]], ignore_index=True)


@dataclass
class NarrowCorrection(DataclassJSON):
    op: str
    dtype: str
    ns: np.ndarray  # (N,) the whole N values measured, ascending
    log: np.ndarray  # (N,) median log(measured / predicted without this correction)
    k_min: float = 1.0  # the smallest K the grid measured: below it the correction fades (factor)

    def __post_init__(self):  # JSON gives lists back
        self.ns, self.log = np.asarray(self.ns, float), np.asarray(self.log, float)

    @staticmethod
    def fit(op: str, dtype: str, rows: pd.DataFrame, predicted: np.ndarray) -> "NarrowCorrection":
        """rows: the narrow grid's rows of (op, dtype), their time without page faults;
        predicted: what the model without this correction prices them."""
        per_n = rows.assign(log=np.log(rows["median_us"].to_numpy(float) / np.asarray(predicted, float))) \
            .groupby("n")["log"].median()
        return NarrowCorrection(op, dtype, per_n.index.to_numpy(float), per_n.to_numpy(float),
                                float(rows["k"].min()))

    def factor(self, n, k) -> np.ndarray:
        """exp(the correction) where N is one the grid measured, 1 elsewhere; below the grid's
        smallest K faded in log2 K to none at K = 1, as the aspect correction is: with a short K
        loop a GEMM's cost is writing its outputs, and the kernel N picks matters less. Held at
        full strength there, the EPYC VM's corrections (fitted at K = 64 and 256) priced held-out
        shapes of K = 1-8 up to 4x their time (bmm 1 x 496 x 11 x 8: 40 us, 10 measured)."""
        n, k = np.asarray(n, float), np.asarray(k, float)
        i = np.clip(np.searchsorted(self.ns, n), 0, self.ns.size - 1)
        fade = np.clip(np.log2(np.maximum(k, 1.0)) / np.log2(self.k_min), 0.0, 1.0) if self.k_min > 1 else 1.0
        return np.where(self.ns[i] == n, np.exp(self.log[i] * fade), 1.0)
