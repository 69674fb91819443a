"""The CPU GEMM sweep's extra grids as the GEMM model reads them (no torch): their names, the
cache-line alignment of a shape's rows, and the helpers that turn a grid's cells into a
correction over the (M x N) lattice or fill the cells the sweep's caps skipped (gemm.py,
gemm_table.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.dtypes import element_bytes


def neighbourhood_median(cells: np.ndarray) -> np.ndarray:
    """Each cell as the median of the measured cells in its 3 x 3 neighbourhood (0 where none):
    one twin timed in a slow spell, or a base that stalled (a cell of -6.6 on the EPYC VM
    beside neighbours of 0.1-0.2), must not price its shapes on its own."""
    rows, cols = cells.shape
    out = np.zeros_like(cells)
    for i in range(rows):
        for j in range(cols):
            near = cells[max(i - 1, 0):i + 2, max(j - 1, 0):j + 2]
            if not np.isnan(near).all():
                out[i, j] = np.nanmedian(near)
    return out


def median_on_measured(cells: np.ndarray, ms: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """neighbourhood_median over the rows and columns that hold a measurement, the others then
    filled linearly in log2 M (rows, `ms`) and log2 N (columns, `ns`), held at the edges: the
    aspect grid's rows and columns of 2 have no twins, and left in, they would take the M = 1 row's
    neighbours away (its median would be its own row's, one slow twin pricing a decode LM head)."""
    rows, cols = ~np.isnan(cells).all(axis=1), ~np.isnan(cells).all(axis=0)
    out = np.zeros_like(cells)
    if not rows.any():
        return out
    sub = neighbourhood_median(cells[np.ix_(rows, cols)])
    lm, ln = np.log2(np.asarray(ms, float)), np.log2(np.asarray(ns, float))
    per_col = np.stack([np.interp(lm, lm[rows], sub[:, j]) for j in range(sub.shape[1])], axis=1)
    return np.stack([np.interp(ln, ln[cols], per_col[i]) for i in range(per_col.shape[0])], axis=0)


# Rows that fill whole cache lines are what the grids measured; 64 bytes is the line of every
# x86-64 and of most ARM server cores. What misalignment costs is measured (the twins), not assumed.
LINE_BYTES = 64
# gemm_samples.grid of the aspect cells' twins one column (row of A) wider (sweeps/gemm_points.py)
TWIN_N_GRID, TWIN_K_GRID = "unaligned_n", "unaligned_k"
UNALIGNED_GRIDS = {f"{TWIN_N_GRID}_log": "n", f"{TWIN_K_GRID}_log": "k"}
# The base of an N twin where the aspect cell's rows alias: the cell one line wider, its rows
# whole lines but no longer a multiple of 4 KiB (sweeps/gemm_points.py unaligned_twins)
LINE_BASE_GRID = "line_n"
# gemm_samples.grid of the unaligned twins and their bases: they fit the unaligned correction alone
TWIN_GRIDS = (TWIN_N_GRID, TWIN_K_GRID, LINE_BASE_GRID)


def line_elements(dtype: str) -> int:
    """Elements of `dtype` in one cache line: how much wider than its cell an N twin's base is,
    in the sweep that times it and in the fit that pairs it."""
    return LINE_BYTES // element_bytes(dtype)
# Rows timed with their weights rotated through memory (sweeps/gemm_points.py cold_points): the
# aspect grid's twins (fit the cold correction) and the held-out ones (scored priced cold)
COLD_GRID, COLD_HELDOUT = "cold_weights", "cold_heldout"
COLD_GRIDS = (COLD_GRID, COLD_HELDOUT)


def is_cold(samples: pd.DataFrame) -> np.ndarray:
    """Mask of the gemm_samples rows timed with rotated weights (none in tables without `grid`)."""
    return samples["grid"].isin(COLD_GRIDS).to_numpy() if "grid" in samples else np.zeros(len(samples), bool)


def hot_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """gemm_samples without the rows timed with rotated weights: what models that know nothing
    of cache state (the MLP baselines, a roofline) are fitted and scored on, as PM2Lat's are."""
    return samples[~is_cold(samples)]


def is_aligned(dim, dtype: str, unit: int = LINE_BYTES) -> np.ndarray:
    """Whether a row of `dim` elements of `dtype` fills whole cache lines (or units of `unit` bytes)."""
    return (np.asarray(dim, dtype=np.int64) * element_bytes(dtype)) % unit == 0


def ends_mid_line(dim, dtype: str) -> np.ndarray:
    """Rows longer than a line whose last line is partial: what the twins measured. Rows shorter
    than a line (K = 1 ... 15 in float32) are on the whole-wave grid's own K and aspect sides;
    the twins, timed at K = 256, say nothing of them (882 x 1973 x 2 was priced 3x too slow)."""
    nbytes = np.asarray(dim, dtype=np.int64) * element_bytes(dtype)
    return (nbytes % LINE_BYTES != 0) & (nbytes > LINE_BYTES)


# A cell at most this far from square (|log2 M - log2 N|) can stand for its output size: one
# step of the aspect grid's powers of 4 (4 x 16 for 64 outputs, where no 8 x 8 is timed).
NEAR_SQUARE_SKEW = 2.0


def relative_to_square(grid: pd.DataFrame, one_wave: float = 0.0, top: float = np.inf) -> np.ndarray:
    """Each cell of a (M x N) log-ratio grid minus its anti-diagonal's most square cells (the
    same output size M*N, |log M - log N| smallest), square in elements as the whole-wave
    table's shapes are (geometry.near_square): the correction is then the aspect's effect
    alone, 0 where the table was measured, and what the table already gets wrong at that
    output size (alignment, K) is not counted twice.
    Square in tiles instead (1:16 in elements for the CPU's 1 x 16 float32 tile) took the
    1:16 cells as the zero: on the Xeon VM, linear float32 64 x 1024 x 1024 ran 26 % over the
    table and was corrected by 0, so the square 256 x 256 x 1024, which the table prices
    right, was corrected 18 % down.
    Cells smaller than `one_wave` outputs keep their own value: the table measured nothing that
    small (it holds its one-wave cell there), so nothing is counted twice, and relative to the
    square cell of a size like 1 x 1, itself, a GEMV 4x slower than priced (mm float32 1 x 1 x
    1024 on the Xeon VM: 9.2 us, priced 2.3) was corrected by 0. Cells larger than `top` outputs
    (the table's largest measured) keep theirs too: the table holds its last row's throughput
    there, and relative to a square cell the lattice timed past it, each cell of that size was
    priced at one common factor off its own time (Zen 5 EPYC VM, 2^26 outputs at K = 256: 0.83x
    in linear bfloat16, 1.03x in float32)."""
    logm, logn = np.log2(grid.index.to_numpy(float)), np.log2(grid.columns.to_numpy(float))
    vals = grid.to_numpy(float)
    size = np.round(logm[:, None] + logn[None, :], 6)
    skew = np.round(np.abs(logm[:, None] - logn[None, :]), 6)
    sizes = np.unique(size[~np.isnan(vals)])
    ref = np.full(sizes.size, np.nan)  # the most square cells' mean, per output size
    squarish = np.zeros(sizes.size, bool)
    for i, s in enumerate(sizes):
        on = (size == s) & ~np.isnan(vals)
        least = skew[on].min()
        ref[i], squarish[i] = vals[on & (skew == least)].mean(), least <= NEAR_SQUARE_SKEW
    if squarish.any():  # a size whose cells are all skinny (the grid's side of 2 against powers
        # of 4: 2 x 16 and 16 x 2 alone at 32) takes its reference between the sizes that hold a
        # near-square cell, linear in log2 size, held beyond them: against itself it would be 0
        ref = np.where(squarish, ref, np.interp(sizes, sizes[squarish], ref[squarish]))
    out = np.full_like(vals, np.nan)
    for s, r in zip(sizes, ref):
        out[size == s] = vals[size == s] - (0.0 if 2.0 ** s < one_wave or 2.0 ** s > top else r)
    return out


def no_faster_with_more_waves(thr: np.ndarray, waves: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """The (waves x K) throughput table with its duration made non-decreasing in waves at each K:
    a cell that ran longer than a larger problem of the same K (a smaller output with the same
    reduction) is given that larger one's time. At the latency floor whole-wave rows differ by
    noise, and one slow small row (EPYC VM, linear bf16: 35.6 us at 1 wave, 21.8 at 4, 17.5 at
    16) would otherwise price every shape below it slower than shapes many times its size."""
    dur = waves[:, None] * ks[None, :] / thr  # up to a constant factor, which cancels
    dur = np.fmin.accumulate(dur[::-1], axis=0)[::-1]
    return waves[:, None] * ks[None, :] / dur


def fill_capped(thr: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Fill the cells of a kernel's (waves x K) table that were not measured: large-K cells
    the sweep's FLOP cap skipped, and cells where another kernel ran instead.

    Latency grows linearly in K at fixed waves (PM2Lat Fig. 3), so a missing cell is this
    row's nearest measured time per wave plus the change the next smaller wave row shows
    between the two K: fixed costs measured in this row (on the CPU, page faults of a fresh
    output buffer) are kept once, not scaled with K. Time never falls as K grows.
    """
    out = thr.copy()
    for i, row in enumerate(out):
        have = ~np.isnan(row)
        if have.all():
            continue
        if not have.any():
            raise ValueError(f"wave row {i} has no measured K at all")
        if i == 0:  # nothing below to borrow from: hold the nearest measured throughput, but
            # below the row's smallest measured K its duration (the latency floor; another kernel
            # ran those shapes, and K / throughput would price oneDNN's 16 us kernel at 0.1 us)
            measured = np.flatnonzero(have)
            row[~have] = np.interp(np.flatnonzero(~have), measured, row[have])
            below = np.arange(measured[0])
            row[below] = row[measured[0]] * ks[below] / ks[measured[0]]
            continue
        measured, miss = np.flatnonzero(have), np.flatnonzero(~have)
        j = measured[np.abs(measured[None, :] - miss[:, None]).argmin(axis=1)]  # nearest measured K
        per_wave = ks / out[i - 1]  # time per wave, up to a constant factor that cancels
        mine = ks[j] / row[j]
        floor = np.where(miss > j, mine, mine * ks[miss] / ks[j])
        row[miss] = ks[miss] / np.maximum(mine + per_wave[miss] - per_wave[j], floor)
    return out


def extend_rows_linearly(rel: np.ndarray, anchor: np.ndarray, table_us: np.ndarray, ms: np.ndarray,
                         ns: np.ndarray) -> np.ndarray:
    """`rel` (an (M x N) correction, relative_to_square) with each row's wide cells (N more than
    NEAR_SQUARE_SKEW powers of 2 past M) beyond its largest measured N set so that the table
    times their correction is the measured cell's price, `table_us` x exp(`anchor`) there,
    scaled linearly in N: its throughput held, as the whole-wave table holds its last row's.
    `table_us`: the table's own times over the lattice; `anchor`: the log ratio to start from
    (NaN where nothing was measured). Near-square cells past the caps keep their row's last
    correction: the whole-wave table measured such shapes, and it prices them.
    Why not hold the wide cell's correction: relative to the square cell of a smaller size, it
    carries that size's aspect effect to one where the square cell runs at another rate. On the
    Zen 3 EPYC VM (2026-11-29, kept outputs), linear float32 1024 x 16384 x 256 ran 1.35x
    4096 x 4096 x 256, while 1024 x 65536 ran ~1.1x twice 4096 x 8192; 1024 x 50240 ran 282-295
    ms, and 1024 x 16384 scaled by N priced it 312. Held, the correction priced GPT-2's 1024 x
    50257 x 256 LM head at 729 ms from stop 49's take, 631 this way; it ran ~505 ms alone and
    434 ms traced inside the step (docs/methods.md)."""
    out = rel.copy()
    ms, ns = np.asarray(ms, float), np.asarray(ns, float)
    for i in range(anchor.shape[0]):
        have = np.flatnonzero(~np.isnan(anchor[i]))
        if not have.size:
            continue
        j0 = have[-1]
        past = np.arange(j0 + 1, ns.size)
        past = past[np.log2(ns[past] / ms[i]) > NEAR_SQUARE_SKEW]
        out[i, past] = anchor[i, j0] + np.log(table_us[i, j0] * (ns[past] / ns[j0]) / table_us[i, past])
    return out
