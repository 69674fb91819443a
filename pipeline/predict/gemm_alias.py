"""How a short-K GEMM whose output rows are not a multiple of 4 KiB long runs beside the
whole-wave table's, whose rows are (CPU, no torch).

The whole-wave grid lays its outputs out near square in powers of two, so from about a million
outputs on, every row of C is a multiple of 4 KiB long, and the rows a kernel writes together
sit in the same L1 sets (x86's "4K aliasing": an L1 indexed by the low 12 address bits). Where K
is short the kernel does little but write C, and then that costs several times over. On the
Zen 5 EPYC VM (2 threads, float32, 2026-11-30), at M = 1024 and K = 2-8, mm and `F.linear` ran
0.31-0.43 ns an output at N = 1024, 2048, 3072 and 4096, and 0.06-0.12 at N = 1040, 1973 and
2064; at K = 1 (an outer product, another kernel) and at K = 32 all ran alike. The table priced
the held-out mm 882 x 1973 x 2 at 4.6x its time.

The sweep times each such whole-wave cell again, wider by one cache line, by 1 KiB and by 2 KiB
(sweeps/gemm_points.py alias_twins, grid ALIAS_GRID): rows whose length is an odd multiple of
2 KiB put every second row in the same L1 sets, of 1 KiB every fourth, of a line none nearby,
and how much each costs depends on how many rows the kernel writes together. On the Zen 5 VM
(M = 1024, K = 2-8, float32 mm, 2026-11-30 08:18) 2 KiB classes (N = 1536, 2560) ran 0.18-0.23 ns an
output, 1 KiB and line classes (1280, 2304; 1040, 2064) 0.07-0.12, 4 KiB ones 0.30-0.38; on the
same VM two days before, at N = 256 and 768 (1 KiB rows), 1.3-1.5x their neighbours. So each
class is measured. Per (class, waves, K) cell the correction is log(twin / base) less the twin's
extra FLOPs; a shape whose rows are not a multiple of ALIAS_BYTES gets its class's, interpolated
in log2 waves and log2 K over the table's own cells, and in log2 of the class between the classes
timed (a calibration with line twins alone prices every class as that). Cells whose base rows
are not a multiple either (fewer outputs) correct nothing: their table was timed as such shapes
run. K columns past a line were not twinned and correct nothing, so the correction fades out
between the last short K and the next. What the aliasing costs, if anything, is measured per
device; 4 KiB is where x86 puts it (an L1 of 64-byte lines, 64 sets), not a guess about one CPU.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.dtypes import element_bytes
from pipeline.predict.gemm_grids import LINE_BYTES, is_aligned
from pipeline.predict.geometry import bilinear, grid_position

ALIAS_GRID = "off_alias_n"  # gemm_samples.grid of the twins (sweeps/gemm_points.py)
ALIAS_BYTES = 4096
# How much longer than its base's (a multiple of ALIAS_BYTES) each twin's row is: the classes of
# row length mod ALIAS_BYTES that the sweep times; a twin's class is read back from its N.
TWIN_CLASSES = (LINE_BYTES, 1024, 2048)


def rows_alias(n, dtype: str) -> np.ndarray:
    """Whether output rows of `n` elements of `dtype` are a whole multiple of ALIAS_BYTES long."""
    return is_aligned(n, dtype, ALIAS_BYTES)


def short_k(k, dtype: str) -> np.ndarray:
    """Whether a K of `dtype` elements fits in one cache line: where the twins are timed."""
    return np.asarray(k, dtype=np.int64) * element_bytes(dtype) <= LINE_BYTES


def row_class(n, dtype: str) -> np.ndarray:
    """The largest power of two up to ALIAS_BYTES that divides a row of `n` elements of `dtype`,
    in bytes: each row shares its L1 sets with the row ALIAS_BYTES / that many rows on."""
    return np.gcd(np.asarray(n, dtype=np.int64) * element_bytes(dtype), ALIAS_BYTES)


def twin_steps(dtype: str) -> tuple[int, ...]:
    """How much wider each twin is than its base, in elements of `dtype`: one per TWIN_CLASSES."""
    return tuple(c // element_bytes(dtype) for c in TWIN_CLASSES)


def alias_grid(base: pd.DataFrame, twins: pd.DataFrame, waves: np.ndarray, ks: np.ndarray,
               dtype: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(the twins' classes in bytes (C,), the (C x waves x K) log correction) of one kernel's
    table: `base`, its whole-wave rows (page faults taken off), with columns waves, m, n, k,
    batch, median_us; `twins`, its ALIAS_GRID rows. Per class, each twinned cell is the median of
    itself and its twinned neighbours in waves at its K (each is one timing of each side: one slow
    base must not price its shapes alone, as the unaligned twins' neighbourhood median has it),
    and never above 0: a twin differs from its base only in where its rows fall in the cache, so
    one that ran slower (Zen 5, K = 16: N = 2064 at 0.28 ns an output, 2048 at 0.23) timed
    something else. A cell with an aliasing base that was not twinned (the caps) takes the nearest
    twinned cell of its K in log2 waves; None where no twin pairs with a base."""
    keys = ["batch", "m", "k"]
    b = base[rows_alias(base["n"], dtype)].groupby([*keys, "n", "waves"], as_index=False)["median_us"].median()
    twins = twins[~rows_alias(twins["n"], dtype)]  # a twin is never a multiple itself
    step = row_class(twins["n"], dtype) // element_bytes(dtype)
    t = twins.assign(step=step, n=twins["n"] - step)
    pair = t.groupby([*keys, "n", "step"], as_index=False)["median_us"].median().merge(
        b, on=[*keys, "n"], suffixes=("", "_base"))
    if pair.empty:
        return None
    extra = np.log((pair["n"] + pair["step"]) / pair["n"])
    pair = pair.assign(log=np.log(pair["median_us"] / pair["median_us_base"]) - extra)
    aliased = np.isin(waves, b["waves"].to_numpy(float))  # wave rows whose base rows alias
    steps = sorted(pair["step"].unique())
    out = np.stack([_class_grid(pair[pair["step"] == s], waves, ks, aliased) for s in steps])
    classes = np.array(steps, float) * element_bytes(dtype)
    return classes, _fill_across_classes(out, np.log2(classes))


def _fill_across_classes(grid: np.ndarray, log_classes: np.ndarray) -> np.ndarray:
    """A class not twinned at some K (a point left out) takes the nearest class's column there,
    in log2 of the class; a K no class twinned (past a line) corrects nothing. Read as 0, a
    missing column would price that class at the aliasing base's rate."""
    out = grid.copy()
    for j in range(grid.shape[2]):
        have = ~np.isnan(grid[:, 0, j])
        if not have.any():
            out[:, :, j] = 0.0
            continue
        for c in np.flatnonzero(~have):
            near = np.flatnonzero(have)[np.argmin(np.abs(log_classes[have] - log_classes[c]))]
            out[c, :, j] = grid[near, :, j]
    return out


def _class_grid(pair: pd.DataFrame, waves: np.ndarray, ks: np.ndarray, aliased: np.ndarray) -> np.ndarray:
    """One class's (waves x K) grid from its paired rows (columns waves, k, log); NaN columns at
    the K it has no pairs at."""
    cells = pair.pivot_table(index="waves", columns="k", values="log", aggfunc="median")
    out = np.full((waves.size, ks.size), np.nan)
    lw = np.log2(waves)
    for j, k in enumerate(ks):
        if k not in cells.columns:
            continue
        col = cells[k].dropna()
        if col.empty:
            continue
        vals = col.to_numpy(float)
        lo = np.clip(np.arange(vals.size) - 1, 0, max(vals.size - 3, 0))  # three rows, shifted in at the ends
        smooth = np.minimum([np.median(vals[i:i + 3]) for i in lo], 0.0)
        filled = np.interp(lw, np.log2(col.index.to_numpy(float)), smooth)
        out[:, j] = np.where(aliased, filled, 0.0)
    return out


def alias_factor(grid: np.ndarray, classes: np.ndarray, waves: np.ndarray, ks: np.ndarray, w, n, k,
                 dtype: str) -> np.ndarray:
    """exp(the correction) at each shape's (class, waves, K), for shapes whose rows do not alias;
    1 for those whose rows do. The table then prices an aliasing shape at the rate of its wave
    row's base, which at few outputs (rows under 4 KiB, e.g. 64 x 1024 x 2 from a 1 KiB row)
    aliased less or not at all: what a short-K shape of 4 KiB rows costs there is not measured.
    A class between two timed ones (512 bytes, between a line and 1 KiB) is interpolated in log2
    of the class; one below the smallest (rows ending mid line) takes the smallest's."""
    w, k = np.asarray(w, float), np.asarray(k, float)
    rows, cols = grid_position(np.log2(waves), np.log2(w)), grid_position(np.log2(ks), np.log2(k))
    cls = row_class(n, dtype)
    c, fc, c1 = grid_position(np.log2(classes), np.log2(cls.astype(float)))
    at = bilinear(grid, rows, cols, lead=(c,)) * (1 - fc) + bilinear(grid, rows, cols, lead=(c1,)) * fc
    return np.where(cls >= ALIAS_BYTES, 1.0, np.exp(at))
