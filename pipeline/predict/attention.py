"""PM2Lat's interpolation applied to fused attention (IV-C, Table VI: Flash and Cutlass attention).

Per (backend, dtype, head_dim, causal) kernel: throughput (FLOPs per microsecond) measured
at seq (q = kv) in powers of two and at bh = batch x heads in powers of a step. A new
shape's throughput is interpolated linearly in seq (as in K, eq. 2) and in log2(bh); a
head_dim that was not measured is interpolated linearly between the two nearest measured
head dims. Duration = FLOPs / throughput, FLOPs = 4 b h sq skv d (halved when causal).

Beyond the largest seq or bh measured the throughput is held (time grows with the work);
below the smallest the duration is held (latency-bound there). The grid has seq_q = seq_kv
only: a shape with seq_q != seq_kv is looked up at the geometric mean sqrt(sq x skv), the
square seq with the same score-matrix size (an approximation; decoding, seq_q = 1, is not
calibrated). Prediction is vectorized numpy: no torch, no per-shape Python loop.

A kv length off the kernel's alignment period runs longer than the powers-of-two grid says
(attention_align.py): where a seq scan found a period, each table carries `unaligned_log`,
log(twin time / interpolated time) of the grid's twins at seq - 1 (the period's worst tail),
and a shape with a tail of r elements pays exp(ramp[r] x unaligned_log) at its (bh, seq).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.core.dtypes import check_dtype
from pipeline.core.errors import BadShapeError, MissingModelError, check_positive_arrays
from pipeline.predict.attention_align import find_period, fit_ramp, tail
from pipeline.predict.geometry import bilinear, grid_position
from pipeline.predict.gemm_grids import neighbourhood_median
from pipeline.predict.serialize import DataclassJSON

ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")  # torch SDPA backends, as attention_samples names them
# attention_samples.grid: the powers-of-two grid, its twins at seq - 1, the period scan, held-out
BASE_GRID, TWIN_GRID, SCAN_GRID, HELDOUT_GRID = "seq", "unaligned", "seq_scan", "heldout"


def grid_of(samples: pd.DataFrame) -> pd.Series:
    """Each row's grid; tables taken before the column existed hold the base grid only."""
    if "grid" not in samples:
        return pd.Series(BASE_GRID, index=samples.index)
    return samples["grid"].fillna(BASE_GRID)


def on_base_grid(samples: pd.DataFrame) -> np.ndarray:
    """The rows of the powers-of-two grid: the ones the model interpolates between, as it does for
    the held-out shapes (the period scan and the twins at seq - 1 are of another kind)."""
    return (grid_of(samples) == BASE_GRID).to_numpy()


def attention_flops(batch, heads, seq_q, seq_kv, head_dim, causal) -> np.ndarray:
    """QK^T and PV: 2 x 2 b h sq skv d FLOPs; half of them when causal."""
    f = 4.0 * np.asarray(batch, float) * np.asarray(heads) * np.asarray(seq_q) * np.asarray(seq_kv)
    f = f * np.asarray(head_dim)
    return np.where(np.asarray(causal, bool), f / 2, f)


@dataclass
class AttentionTable(DataclassJSON):
    backend: str
    dtype: str
    head_dim: int
    causal: bool
    bh: np.ndarray  # (B,) batch x heads measured, ascending
    seqs: np.ndarray  # (S,) seq (q = kv) measured, ascending
    thr: np.ndarray  # (B, S) FLOPs per microsecond
    unaligned_log: np.ndarray | None = None  # (B, S) log(twin at seq - 1 / interpolated), >= 0

    def throughput(self, bh, seq) -> np.ndarray:
        """Bilinear: linear in seq between the bracketing measured seqs, linear in log2(bh)."""
        return self._bilinear(self.thr, bh, seq)

    def unaligned(self, bh, seq) -> np.ndarray:
        """The period's worst-tail log excess at (bh, seq); 0 without twins."""
        return np.zeros(np.shape(bh)) if self.unaligned_log is None else self._bilinear(self.unaligned_log, bh, seq)

    def _bilinear(self, t: np.ndarray, bh, seq) -> np.ndarray:
        return bilinear(t, grid_position(np.log2(self.bh), np.log2(bh)), grid_position(self.seqs, seq))

    def with_twins(self, twins: pd.DataFrame, predicted: np.ndarray) -> "AttentionTable":
        """This table with `unaligned_log` from its twins (rows at seq_kv = grid seq - 1) and
        what the table predicts for them: per cell the median log ratio, then the median over
        neighbouring bh (one twin timed in a slow spell must not price its cell alone), floored at 0."""
        ratio = twins.assign(bh=twins["batch"] * twins["heads"], seq=twins["seq_kv"] + 1,
                             log=np.log(twins["median_us"].to_numpy(float) / predicted))
        cells = ratio.pivot_table(index="bh", columns="seq", values="log", aggfunc="median")
        cells = cells.reindex(index=self.bh, columns=self.seqs).to_numpy(float)
        smooth = np.column_stack([neighbourhood_median(cells[:, [j]])[:, 0] for j in range(cells.shape[1])])
        return replace(self, unaligned_log=np.maximum(smooth, 0.0))


def fill_missing(thr: np.ndarray) -> np.ndarray:
    """Fill the (bh, seq) cells a sweep skipped (FLOP cap per point, or a backend without a kernel there).

    Cells right of a row's last measured seq take that cell's throughput scaled by how the
    row below (smaller bh, already whole) grows from there; other gaps are interpolated
    along seq (held at the ends); a row with nothing measured copies the nearest row.
    """
    out = np.array(thr, dtype=float)
    have_any = ~np.isnan(out).all(axis=1)
    if not have_any.any():
        raise ValueError("attention table has no measured cell at all")
    rows = np.flatnonzero(have_any)
    for i in np.flatnonzero(~have_any):
        out[i] = out[rows[np.argmin(np.abs(rows - i))]]
    for i, row in enumerate(out):
        idx = np.flatnonzero(~np.isnan(row))
        last = idx[-1]
        if i > 0 and last + 1 < row.size:
            below = out[i - 1]
            row[last + 1:] = row[last] * below[last + 1:] / below[last]
        miss = np.isnan(row)
        if miss.any():
            row[miss] = np.interp(np.flatnonzero(miss), idx, row[idx])
    return out


class AttentionModel:
    name = "attention_model"

    def __init__(self, tables: dict[tuple[str, str, int, bool], AttentionTable],
                 alignment: dict[tuple[str, str], dict] | None = None):
        self.tables = tables
        # (backend, dtype) -> {"period": p, "ramp": [p shares]}: where a seq scan found a period
        self.alignment = alignment or {}

    @staticmethod
    def fit(samples) -> "AttentionModel":
        """samples: a DataFrame of attention_samples rows; held-out rows are refused, not silently used."""
        if bool(samples["held_out"].any()):
            raise ValueError("AttentionModel.fit got held-out rows; fit on training rows only")
        grid = grid_of(samples)
        if not (grid == BASE_GRID).any():
            raise ValueError("AttentionModel.fit got no rows of the attention grid")
        model = AttentionModel(AttentionModel._tables(samples[grid == BASE_GRID]),
                               fit_alignment(samples[grid == SCAN_GRID]))
        return model.with_twins(samples[grid == TWIN_GRID])

    @staticmethod
    def _tables(samples: pd.DataFrame) -> dict:
        g = samples.assign(bh=samples["batch"] * samples["heads"], seq=np.sqrt(samples["seq_q"] * samples["seq_kv"]),
                           thr=samples["flops"] / samples["median_us"], causal=samples["causal"].astype(bool))
        # one groupby for every table's cell medians, then a table each: pivot_table per table
        # was most of a fit (probe scaling's cross-validation fits 26 times), the same medians
        keys = ["backend", "dtype", "head_dim", "causal"]
        # (all-NaN rows and columns dropped as pivot_table drops them: a table with no measured
        # cell at all still reaches fill_missing, which refuses it)
        cells = g.groupby([*keys, "bh", "seq"])["thr"].median()
        tables = {}
        for (backend, dtype, hd, causal), t in cells.groupby(level=keys):
            grid = t.droplevel(keys).unstack("seq").sort_index().sort_index(axis=1)
            grid = grid.dropna(how="all").dropna(axis=1, how="all")
            key = (str(backend), str(dtype), int(hd), bool(causal))
            tables[key] = AttentionTable(*key, grid.index.to_numpy(float), grid.columns.to_numpy(float),
                                         fill_missing(grid.to_numpy(float)))
        return tables

    def with_twins(self, twins: pd.DataFrame) -> "AttentionModel":
        """Each table of a (backend, dtype) with a period gets the unaligned correction of its twins."""
        tables = dict(self.tables)
        for key, t in twins.groupby(["backend", "dtype", "head_dim", "causal"]):
            key = (str(key[0]), str(key[1]), int(key[2]), bool(key[3]))
            if key in tables and key[:2] in self.alignment:
                base = self.predict(*key[:2], t["batch"], t["heads"], t["seq_q"], t["seq_kv"], key[2], key[3])
                tables[key] = tables[key].with_twins(t, base)
        return AttentionModel(tables, self.alignment)

    def head_dims(self, backend: str, dtype: str, causal: bool) -> list[int]:
        """The head dims measured for this kernel, ascending; MissingModelError when there are none."""
        dims = sorted(d for (b, dt, d, c) in self.tables if (b, dt, c) == (backend, dtype, bool(causal)))
        if not dims:
            raise MissingModelError(f"no attention calibration for backend={backend!r} dtype={dtype!r} "
                                    f"causal={bool(causal)}")
        return dims

    def _check(self, backend: str, dtype: str) -> str:
        check_dtype(dtype)
        if backend not in ATTENTION_BACKENDS:
            raise BadShapeError(f"unknown attention backend {backend!r}; expected one of {ATTENTION_BACKENDS}")
        dtype = "float32" if dtype == "tf32" else dtype  # attention stores float32 either way
        if not any(k[:2] == (backend, dtype) for k in self.tables):
            have = sorted({k[:2] for k in self.tables})
            raise MissingModelError(f"no attention calibration for backend={backend!r} dtype={dtype!r}; have {have}")
        return dtype

    def throughput(self, backend: str, dtype: str, causal: bool, head_dim, bh, seq) -> np.ndarray:
        """FLOPs/us at (head_dim, bh, seq): the two nearest measured head dims' tables, linear between them."""
        dims = self.head_dims(backend, dtype, causal)
        return self._across_dims(dims, [self.tables[(backend, dtype, d, causal)].throughput(bh, seq) for d in dims],
                                 head_dim)

    def unaligned(self, backend: str, dtype: str, causal: bool, head_dim, bh, seq) -> np.ndarray:
        """The worst-tail log excess at (head_dim, bh, seq), linear between the nearest head dims."""
        dims = self.head_dims(backend, dtype, causal)
        return self._across_dims(dims, [self.tables[(backend, dtype, d, causal)].unaligned(bh, seq) for d in dims],
                                 head_dim)

    @staticmethod
    def _across_dims(dims: list[int], per_dim: list[np.ndarray], head_dim) -> np.ndarray:
        per_dim = np.stack(per_dim)
        i, f, i1 = grid_position(np.array(dims, float), head_dim)
        cols = np.arange(per_dim.shape[1])
        return per_dim[i, cols] * (1 - f) + per_dim[i1, cols] * f

    def tail_factor(self, backend: str, dtype: str, causal: bool, head_dim, bh, seq, seq_kv) -> np.ndarray:
        """exp(ramp[r] x unaligned log) for a kv tail of r elements; 1 where aligned or uncalibrated."""
        align = self.alignment.get((backend, dtype))
        if not align:
            return np.ones(np.shape(bh))
        r = tail(seq_kv, align["period"])
        share = np.asarray(align["ramp"], float)[r]
        return np.exp(share * self.unaligned(backend, dtype, causal, head_dim, bh, seq))

    def predict(self, backend: str, dtype: str, batch, heads, seq_q, seq_kv, head_dim, causal=False) -> np.ndarray:
        """Predicted microseconds for arrays (or scalars) of the shape; causal may be an array too."""
        dtype = self._check(backend, dtype)
        b, h, sq, skv, d, c = np.broadcast_arrays(*(np.asarray(x) for x in (batch, heads, seq_q, seq_kv, head_dim,
                                                                            causal)))
        check_positive_arrays(batch=b, heads=h, seq_q=sq, seq_kv=skv, head_dim=d)
        shape = b.shape
        b, h, sq, skv, d, c = (a.ravel() for a in (b, h, sq, skv, d, c.astype(bool)))
        bh, seq = b.astype(float) * h, np.sqrt(sq.astype(float) * skv)
        flops = attention_flops(b, h, sq, skv, d, c)
        out = np.empty(b.size)
        for causal_flag in (False, True):
            m = c == causal_flag
            if not m.any():
                continue
            t0 = self.tables[(backend, dtype, self.head_dims(backend, dtype, causal_flag)[0], causal_flag)]
            # Below the smallest bh or seq measured, hold the duration: price the work of the smallest cell.
            bh_c, seq_c = np.maximum(bh[m], t0.bh[0]), np.maximum(seq[m], t0.seqs[0])
            work = flops[m] * (bh_c / bh[m]) * (seq_c / seq[m]) ** 2
            out[m] = work / self.throughput(backend, dtype, causal_flag, d[m], bh_c, seq_c)
            out[m] *= self.tail_factor(backend, dtype, causal_flag, d[m], bh_c, seq_c, skv[m])
        return out.reshape(shape)

    def to_dict(self) -> dict:
        tables = [{k: v for k, v in t.to_dict().items() if v is not None} for t in self.tables.values()]
        out = {"kind": "attention_model", "tables": tables}
        if self.alignment:
            out["alignment"] = [{"backend": b, "dtype": dt, **a} for (b, dt), a in self.alignment.items()]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "AttentionModel":
        tables = [AttentionTable.from_dict(t) for t in d["tables"]]
        alignment = {(a["backend"], a["dtype"]): {"period": int(a["period"]), "ramp": list(a["ramp"])}
                     for a in d.get("alignment", [])}
        return cls({(t.backend, t.dtype, t.head_dim, t.causal): t for t in tables}, alignment)


def fit_alignment(scan: pd.DataFrame) -> dict[tuple[str, str], dict]:
    """Per (backend, dtype) of a seq scan: its period and ramp, where it has a period."""
    out = {}
    for (backend, dtype), t in scan.groupby(["backend", "dtype"]):
        period = find_period(t["seq_kv"], t["median_us"])
        if period:
            out[(str(backend), str(dtype))] = {"period": period,
                                              "ramp": fit_ramp(t["seq_kv"], t["median_us"], period).tolist()}
    return out
