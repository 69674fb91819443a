"""One PM2Lat throughput table (eq. 1-2) for one (op, dtype, kernel): throughput at whole waves x
K in powers of two, and the CPU's corrections for a shape's aspect, for N or K off whole cache
lines and for weights read from memory. predict/gemm.py picks a table per shape and prices it."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.core.dtypes import element_bytes
from pipeline.predict.gemm_alias import alias_factor, alias_grid, rows_alias, short_k
from pipeline.predict.geometry import bilinear, grid_position, whole_wave_shape
from pipeline.predict.geometry import waves as count_waves
from pipeline.predict.gemm_grids import (LINE_BASE_GRID, LINE_BYTES, UNALIGNED_GRIDS, ends_mid_line,
                                         extend_rows_linearly, is_aligned, line_elements, median_on_measured,
                                         relative_to_square)
from pipeline.predict.serialize import DataclassJSON


@dataclass
class GemmTable(DataclassJSON):
    op: str
    dtype: str
    kernel: str
    tile_m: int
    tile_n: int
    slots: int
    waves: np.ndarray  # (W,) whole-wave counts measured, ascending
    ks: np.ndarray  # (K,) K values measured, ascending
    thr: np.ndarray  # (W, K) padded FLOPs per microsecond
    split_k: int = 1  # blocks per output tile (a cuBLASLt configuration's split-K); waves count blocks
    # CPU: log(measured / table-predicted time) over M (rows) x N (columns) in powers of 4, the
    # aspect grid's median over its K values; None where no aspect grid was measured (GPUs)
    aspect_m: np.ndarray | None = None
    aspect_n: np.ndarray | None = None
    aspect_log: np.ndarray | None = None  # (M x N), or (M x N x K) with aspect_k
    # CPU: the aspect grid's K values, one correction each (interpolated in log2 K): skinny shapes
    # lose throughput with K where near-square ones gain it (Xeon VM, linear float32 64 x 4096:
    # 0.31 TFLOP/s at K = 256, 0.25 at K = 1024), which one median over K cannot follow
    aspect_k: np.ndarray | None = None
    # CPU: log of how much longer a shape runs when its N (resp. K) does not fill whole cache
    # lines, over the same (M x N) lattice, measured by twins one element off (sweeps/gemm_points.py)
    unaligned_n_log: np.ndarray | None = None
    unaligned_k_log: np.ndarray | None = None
    # CPU: log of how much longer an aspect cell whose output rows are a multiple of 4 KiB ran
    # than its base one cache line wider (the N twins' LINE_BASE_GRID rows), over the same
    # lattice, less what the aspect correction's square reference took off: the aliasing the
    # price holds, which a shape of another width does not pay (with_alignment, _line_log)
    line_log: np.ndarray | None = None
    # CPU: log of how much longer a shape runs with its weights read from memory (rotated
    # through a pool past the cache, sweeps/gemm_points.py) than hot, over the same (M x N) lattice
    cold_log: np.ndarray | None = None
    # CPU: log of how a short-K shape whose output rows are not a multiple of 4 KiB runs beside
    # the table's, whose rows are, per class of row length (alias_bytes: the largest power of two
    # up to 4 KiB that divides a row) over the table's own (waves x K) cells (gemm_alias.py)
    alias_log: np.ndarray | None = None  # (C x W x K)
    alias_bytes: np.ndarray | None = None  # (C,)

    def __post_init__(self):
        for name in _GRIDS:  # JSON gives lists back
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, np.asarray(value, float))
        if self.alias_log is not None and self.alias_log.ndim == 2:  # saved before the classes: line twins
            self.alias_log, self.alias_bytes = self.alias_log[None], np.array([float(LINE_BYTES)])
        if self.alias_log is not None and (self.alias_bytes is None or self.alias_bytes.size != self.alias_log.shape[0]):
            raise ValueError(f"GemmTable {self.op}/{self.dtype}/{self.kernel}: alias_log has "
                             f"{self.alias_log.shape[0]} classes but alias_bytes is {self.alias_bytes}")

    def to_dict(self) -> dict:
        d = super().to_dict()
        for name in _GRIDS:  # a table without a correction saves as it always did
            if d.get(name) is None:
                d.pop(name, None)
        return d

    def throughput(self, w: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Bilinear: linear in K between the bracketing measured K (eq. 2), linear in log2(waves),
        where the duration that implies is never below the smaller wave row's at that K. At the
        latency floor the rows' durations are equal, their throughputs 4x apart, and a straight
        line between the throughputs prices a shape between them up to 20 % under both (Xeon VM,
        mm bf16 38 x 19 x 12: 12.5 us priced between cells of 15.0-15.6 us, 17.5 measured)."""
        iw, fw, iw1 = grid_position(np.log2(self.waves), np.log2(w))
        ik, fk, ik1 = grid_position(self.ks, k)
        flat, cols = self.thr.ravel(), self.ks.size  # gathers from a table this small stay in cache
        low_rows = w / self.waves[iw]  # thr at w with the lower row's duration: thr_row * w / w_row

        def at(j):  # interpolated in waves at the measured K index j
            lo, hi = flat[iw * cols + j], flat[iw1 * cols + j]
            return np.minimum(lo * (1 - fw) + hi * fw, lo * low_rows)

        return at(ik) * (1 - fk) + at(ik1) * fk

    def predict_us(self, m, n, k, batch, cold: float | None = None) -> np.ndarray:
        # Below the smallest wave count or K measured, the duration is held: a latency floor.
        w = np.maximum(count_waves(m, n, batch, self.tile_m, self.tile_n, self.slots, self.split_k), self.waves[0])
        kk = np.maximum(np.asarray(k, dtype=float), self.ks[0])
        padded_flops = (2.0 * self.slots * self.tile_m * self.tile_n / self.split_k) * w * kk
        hot = padded_flops / self.throughput(w, kk) * self.aspect_factor(m, n, k) * self.alignment_factor(m, n, k)
        if self.line_log is not None:
            hot = hot * self.unaliased_factor(m, n, k)
        if self.alias_log is not None:
            hot = hot * alias_factor(self.alias_log, self.alias_bytes, self.waves, self.ks, w, n, kk, self.dtype)
        return hot if not cold or self.cold_log is None else hot * np.exp(cold * self._on_lattice(self.cold_log, m, n))

    def _on_lattice(self, g: np.ndarray, m, n) -> np.ndarray:
        """Bilinear in (log2 M, log2 N) over the aspect lattice, held at its edges."""
        return bilinear(g, grid_position(np.log2(self.aspect_m), np.log2(np.asarray(m, float))),
                        grid_position(np.log2(self.aspect_n), np.log2(np.asarray(n, float))))

    def aspect_factor(self, m, n, k=None) -> np.ndarray | float:
        """How much slower (> 1) or faster a shape runs than the near-square one of the same
        output size the whole-wave table holds (past the measured cells of a wide shape's row,
        than the table at its size); 1 without an aspect grid. With a correction per
        K: linear in log2 K between the grid's K values, held above them, and below the smallest
        faded out in log2 K to none at K = 1 (k None: their median). Why the fade: with K = 1 a
        GEMM is an outer product, whose cost is writing its M x N outputs whatever their shape;
        the skinny-shape penalty is the K loop's loads of A and B amortized over fewer outputs,
        and it shrinks with the K loop. Held at K = 64 instead, it priced linear float32
        16 x 1699 x 4 at 55.8 us on the model-85 Xeon (14.5 measured, 14.7 without it); over
        the four committed CPUs' held-out shapes the fade moved the (op, dtype) means by -17 to
        +2 points (docs/methods.md)."""
        if self.aspect_log is None:
            return 1.0
        if self.aspect_log.ndim == 2:
            return np.exp(self._on_lattice(self.aspect_log, m, n))
        per_k = np.stack([self._on_lattice(self.aspect_log[..., i], m, n) for i in range(self.aspect_k.size)], -1)
        if k is None:
            return np.exp(np.median(per_k, axis=-1))
        k = np.broadcast_to(np.asarray(k, float), per_k.shape[:-1])
        ik, fk, ik1 = grid_position(np.log2(self.aspect_k), np.log2(k))
        lo = np.take_along_axis(per_k, ik[..., None], -1)[..., 0]
        hi = np.take_along_axis(per_k, ik1[..., None], -1)[..., 0]
        return np.exp((lo * (1 - fk) + hi * fk) * self._below_grid_fade(k))

    def _below_grid_fade(self, k) -> np.ndarray | float:
        """1 from the aspect grid's smallest K up, falling linearly in log2 K to 0 at K = 1."""
        if self.aspect_k[0] <= 1:
            return 1.0
        return np.clip(np.log2(np.maximum(np.asarray(k, float), 1.0)) / np.log2(self.aspect_k[0]), 0.0, 1.0)

    def alignment_factor(self, m, n, k) -> np.ndarray | float:
        """How much longer a shape whose N or K rows end mid cache line runs than an aligned
        one (the twins' measured ratio at its (M, N)); 1 for aligned shapes or without twins."""
        out = 0.0
        for grid, dim in ((self.unaligned_n_log, n), (self.unaligned_k_log, k)):
            if grid is not None:
                out = out + self._on_lattice(grid, m, n) * ends_mid_line(dim, self.dtype)
        return np.exp(out)

    def unaliased_factor(self, m, n, k) -> np.ndarray | float:
        """The aliasing the lattice's cells ran with (line_log), taken off a shape whose output
        rows are not a multiple of 4 KiB; 1 for one whose are, and at a K the whole-wave table's
        short-K twins still reach (gemm_alias.py), which price the aliasing there. It fades below
        the aspect grid's smallest K as the aspect correction it is part of does.
        Why: the lattice's float32 columns of N >= 1024 (1024, 4096, 16 384, 65 536) all alias,
        and their aspect correction priced GPT-2's LM head (512 x 50 257 x 128, rows that do not
        alias) with it: 1.52x the square shape on the Zen 3 EPYC VM, where 512 x 50 256 ran
        1.03-1.07x the square shapes at K = 128 (docs/methods.md)."""
        k = np.asarray(k, float)
        fade = self._below_grid_fade(k) if self.aspect_k is not None else 1.0
        # where the table's short-K correction still reaches (its grid's K past a line, between
        # which and the last short K alias_factor interpolates), it prices the aliasing instead
        past = self.ks[self.ks * element_bytes(self.dtype) > LINE_BYTES]
        clear = past[0] if self.alias_log is not None and past.size else 0.0
        pays = ~rows_alias(n, self.dtype) & ~short_k(k, self.dtype) & (k >= clear)
        return np.exp(-self._on_lattice(self.line_log, m, n) * fade * pays)

    def with_aspect(self, rows: pd.DataFrame) -> "GemmTable":
        """This table with its aspect correction fitted on `rows` (the aspect grid of its kernel):
        per (M, N) and per K of the grid, log(measured / what the table alone predicts), taken
        relative to the most square cell of the same output size at that K; a wide cell past
        its row's measured ones, what its row's last measured cell implies linearly in N
        (gemm_grids.extend_rows_linearly)."""
        base = self.predict_us(rows["m"].to_numpy(), rows["n"].to_numpy(), rows["k"].to_numpy(),
                               rows["batch"].to_numpy())
        ratio = rows.assign(log_ratio=np.log(rows["median_us"].to_numpy(float) / base))
        ms, ns, ks = (np.sort(ratio[c].unique()).astype(float) for c in ("m", "n", "k"))
        batch = float(rows["batch"].median())  # bmm's grid is timed at a batch of its own (sweeps/gemm_points.py)
        slices = []
        for k in ks:
            grid = ratio[ratio["k"] == k].pivot_table(index="m", columns="n", values="log_ratio", aggfunc="median")
            grid = grid.reindex(index=ms, columns=ns)
            one_wave = float(self.tile_m * self.tile_n * self.slots) / batch  # per matrix
            rel = relative_to_square(grid, one_wave, top=one_wave * float(np.max(self.waves)))
            # a wide cell the caps skipped past its row's largest measured N runs as that cell,
            # linear in N; any other holds its row's nearest measured N's correction (the rows'
            # effect is what varies most: few rows spread the packing of B over little work).
            # The measured cell's own time, except for a batched grid (bmm): its batch effect is
            # the batch correction's (gemm_batch.py), which a relative cell leaves to it
            raw = grid.to_numpy(float)
            anchor = raw if batch == 1 else rel
            table_us = self.predict_us(ms[:, None], ns[None, :], k, batch)
            rel = extend_rows_linearly(rel, anchor, table_us, ms, ns)
            slices.append(pd.DataFrame(rel).ffill(axis=1).bfill(axis=1).to_numpy(float))
        cube = np.stack(slices, axis=-1)
        known = ~np.isnan(cube)
        # a cell whose row no K measured: 0; one some K measured: those K's median for the others
        some = known.any(-1)
        fill = np.zeros(cube.shape[:-1])
        fill[some] = np.nanmedian(cube[some], axis=-1)
        cube = np.where(known, cube, fill[..., None])
        return replace(self, aspect_m=ms, aspect_n=ns, aspect_log=cube, aspect_k=ks)

    def with_alignment(self, base: pd.DataFrame, twins: pd.DataFrame) -> "GemmTable":
        """This table with its unaligned-N and -K corrections: per aspect cell (M, N), the median
        over K of log(twin time / aligned time) less the twin's extra FLOPs. Only cells whose own
        N and K are aligned say what misalignment costs; the rest, and cells with no twin, get 0.
        `twins` holds the LINE_BASE_GRID rows too: an N twin of a cell whose rows alias pairs with
        its base one line wider (sweeps/gemm_points.py unaligned_twins), and counts for the cell.
        Both are read whichever kernel ran them, as the twins are. A table holds one take's rows
        (a re-run replaces them), so a cell never mixes these pairs with an older take's N + 1."""
        if self.aspect_log is None or twins.empty:
            return self
        keys = ["m", "n", "k"]
        wider = twins[twins["grid"] == LINE_BASE_GRID]
        pool = pd.concat([base.assign(cell=base["n"]),
                          wider.assign(cell=wider["n"] - line_elements(self.dtype))], ignore_index=True)
        aligned = pool[is_aligned(pool["n"].to_numpy(), self.dtype) & is_aligned(pool["k"].to_numpy(), self.dtype)]
        aligned = aligned.groupby([*keys, "cell"], as_index=False)["median_us"].median()
        out = {"line_log": self._line_log(base, wider)}
        for name, dim in UNALIGNED_GRIDS.items():
            mine = twins[twins["grid"] == name.removesuffix("_log")]
            pair = mine.assign(**{dim: mine[dim] - 1}).merge(aligned, on=keys, suffixes=("", "_base"))
            if pair.empty:
                continue
            extra = np.log((pair[dim] + 1) / pair[dim])  # the twin's FLOPs over the base's
            pair = pair.assign(log_ratio=np.log(pair["median_us"] / pair["median_us_base"]) - extra)
            cells = pair.pivot_table(index="m", columns="cell", values="log_ratio", aggfunc="median")
            cells = cells.reindex(index=self.aspect_m, columns=self.aspect_n).to_numpy(float)
            # columns narrower than a line hold no measurement of their own: not filled from beside
            out[name] = median_on_measured(cells, self.aspect_m, self.aspect_n) * (
                self.aspect_n * element_bytes(self.dtype) >= LINE_BYTES)
        return replace(self, **out)

    def _line_log(self, base: pd.DataFrame, wider: pd.DataFrame) -> np.ndarray | None:
        """Per aliasing aspect cell, log(cell time / its base one line wider's) less the base's
        extra FLOPs, the neighbourhood median over the cells measured, 0 in columns whose rows do
        not alias; None without line bases (every calibration before stop 58's sweep).
        The aspect correction is relative to each output size's most square cells, so at a size
        where those alias and the whole-wave table's own shape does not (float32 2^18: the
        lattice's 256 x 1024 beside the table's 512 x 512), the price of a shape holds their
        aliasing less by their share, and that share is not taken off again."""
        if wider.empty:
            return None
        keys = ["m", "n", "k", "batch"]
        cell = base.groupby(keys, as_index=False)["median_us"].median()
        pair = wider.assign(n=wider["n"] - line_elements(self.dtype)).merge(cell, on=keys, suffixes=("_wide", ""))
        if pair.empty:
            return None
        pair = pair.assign(log_ratio=np.log(pair["median_us"] / pair["median_us_wide"])
                           + np.log((pair["n"] + line_elements(self.dtype)) / pair["n"]))
        cells = pair.pivot_table(index="m", columns="n", values="log_ratio", aggfunc="median")
        cells = cells.reindex(index=self.aspect_m, columns=self.aspect_n).to_numpy(float)
        held = median_on_measured(cells, self.aspect_m, self.aspect_n) * rows_alias(self.aspect_n, self.dtype)
        batch = float(base["batch"].median())
        one_wave = float(self.tile_m * self.tile_n * self.slots) / batch  # per matrix, as with_aspect's
        square = held - relative_to_square(pd.DataFrame(held, index=self.aspect_m, columns=self.aspect_n),
                                           one_wave, top=one_wave * float(np.max(self.waves)))
        outputs = self.aspect_m[:, None] * self.aspect_n[None, :]
        return held - square * ~self._table_shape_aliases(outputs, int(batch))

    def _table_shape_aliases(self, outputs: np.ndarray, batch: int) -> np.ndarray:
        """Whether the whole-wave table's own shape of each output size (per matrix) has output
        rows a multiple of 4 KiB; False for a size no whole number of waves makes."""
        per_wave = self.tile_m * self.tile_n * self.slots
        out = np.zeros(outputs.shape, bool)
        for idx, size in np.ndenumerate(outputs):
            waves = size * batch / per_wave
            if waves >= 1 and waves == int(waves):
                try:
                    out[idx] = bool(rows_alias(whole_wave_shape(int(waves), self.tile_m, self.tile_n, self.slots,
                                                                batch)[1], self.dtype))
                except ValueError:  # the batch does not divide those waves' tiles
                    pass
        return out

    def with_cold(self, hot: pd.DataFrame, cold: pd.DataFrame) -> "GemmTable":
        """This table with its cold-weight correction: per aspect cell (M, N), log(rotated time /
        hot time) of the same shape, the median of the cell and its two neighbours in N (each cell
        is timed once; what varies is mostly M: rows per weight element read); a cell with no
        twin takes its row's nearest in N, then its nearest row's. Never below 0: a weight read
        from memory is not faster than one in cache, so a lower ratio is the noise of one timing."""
        if self.aspect_log is None or cold.empty:
            return self
        keys = ["m", "n", "k"]
        base = hot.groupby(keys, as_index=False)["median_us"].median()
        pair = cold.merge(base, on=keys, suffixes=("", "_hot"))
        if pair.empty:
            return self
        pair = pair.assign(log_ratio=np.log(pair["median_us"] / pair["median_us_hot"]))
        cells = pair.pivot_table(index="m", columns="n", values="log_ratio", aggfunc="median")
        cells = cells.reindex(index=self.aspect_m, columns=self.aspect_n).to_numpy(float)
        smooth = np.full_like(cells, np.nan)
        for j in range(cells.shape[1]):
            near = cells[:, max(j - 1, 0):j + 2]
            have = ~np.isnan(near).all(axis=1)
            smooth[have, j] = np.nanmedian(near[have], axis=1)
        grid = pd.DataFrame(smooth).ffill(axis=1).bfill(axis=1).ffill(axis=0).bfill(axis=0).fillna(0.0)
        return replace(self, cold_log=np.maximum(grid.to_numpy(float), 0.0))


    def with_alias(self, base: pd.DataFrame, twins: pd.DataFrame) -> "GemmTable":
        """This table with its correction for short-K shapes whose rows do not alias, fitted on
        `base` (its whole-wave rows) and `twins` (its ALIAS_GRID rows); unchanged without twins."""
        got = alias_grid(base, twins, self.waves, self.ks, self.dtype) if len(twins) else None
        return self if got is None else replace(self, alias_bytes=got[0], alias_log=got[1])


_GRIDS = ("aspect_m", "aspect_n", "aspect_log", "aspect_k", *UNALIGNED_GRIDS, "line_log", "cold_log", "alias_log",
          "alias_bytes")
