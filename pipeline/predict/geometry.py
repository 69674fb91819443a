"""Tile and wave arithmetic shared by the sweeps (to choose shapes) and the GEMM model (to predict).

A GEMM's output is cut into tile_m x tile_n tiles, one thread block each; `slots` blocks
run at once (SMs on a GPU, threads on the CPU). A partial tile costs a whole one and a
partial last wave costs a whole wave (PM2Lat III-C), hence the ceilings.
"""
from __future__ import annotations

import numpy as np


def _ceil_div(a, b: int):
    return -(-np.asarray(a, dtype=np.int64) // b)  # integer ceiling: exact, and faster than float ceil


def blocks(m, n, batch, tile_m: int, tile_n: int, split_k: int = 1):
    """Thread blocks launched; split-K puts split_k blocks on each output tile."""
    return _ceil_div(m, tile_m) * _ceil_div(n, tile_n) * np.asarray(batch, dtype=np.int64) * split_k


def waves(m, n, batch, tile_m: int, tile_n: int, slots: int, split_k: int = 1):
    return _ceil_div(blocks(m, n, batch, tile_m, tile_n, split_k), slots)


def near_square(tiles: int, tile_m: int = 1, tile_n: int = 1) -> tuple[int, int]:
    """Split a tile count into (tiles_m, tiles_n) with tiles_m * tiles_n == tiles whose output,
    tiles_m * tile_m x tiles_n * tile_n elements, is as square as possible (M <= N on a tie).
    Square in elements, not in tiles: with the CPU's 1 x 16 tile, square tiles would make every
    training shape 16x wider than tall, and a CPU GEMM's speed depends on that aspect."""
    pairs = [p for a in range(1, int(tiles**0.5) + 1) if tiles % a == 0 for p in ((a, tiles // a), (tiles // a, a))]
    # least skew first; on a tie the pair with M <= N
    return min(pairs, key=lambda p: (round(abs(np.log(p[0] * tile_m / (p[1] * tile_n))), 9), p[0] * tile_m > p[1] * tile_n))


def whole_wave_shape(n_waves: int, tile_m: int, tile_n: int, slots: int, batch: int = 1) -> tuple[int, int]:
    """M, N whose tiles, over `batch` matrices, fill exactly n_waves waves."""
    if (n_waves * slots) % batch:
        raise ValueError(f"batch={batch} does not divide {n_waves} waves x {slots} slots")
    tm, tn = near_square(n_waves * slots // batch, tile_m, tile_n)
    return tm * tile_m, tn * tile_n


def grid_position(grid: np.ndarray, x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each x: the grid cell below it, the fraction across the cell, and the cell above,
    clamped to the grid's ends (np.interp onto the index axis searches and clamps in C)."""
    pos = np.interp(x, grid, np.arange(grid.size, dtype=float))
    i = np.minimum(pos.astype(np.int64), max(grid.size - 2, 0))
    return i, pos - i, np.minimum(i + 1, grid.size - 1)


def bilinear(values: np.ndarray, rows: tuple, cols: tuple, lead: tuple = ()) -> np.ndarray:
    """values[*lead, row, col] interpolated linearly between the bracketing cells of each axis;
    `rows` and `cols` are grid_position() triples (the grids' ends hold)."""
    i, fi, i1 = rows
    j, fj, j1 = cols
    lo = values[(*lead, i, j)] * (1 - fj) + values[(*lead, i, j1)] * fj
    hi = values[(*lead, i1, j)] * (1 - fj) + values[(*lead, i1, j1)] * fj
    return lo * (1 - fi) + hi * fi
