"""PM2Lat's GEMM model (eq. 1-2): per kernel, throughput measured at whole waves and at K
in powers of two; a new shape's throughput is interpolated linearly in K (eq. 2) and
in log2(waves), and its duration is padded FLOPs over that throughput.

Padded FLOPs count whole tiles and whole waves (a partial tile or wave costs a full one).
Beyond the largest K or wave count measured the throughput is held (eq. 1: duration grows
with K); below the smallest the duration is held (launch- and latency-bound there).
Prediction is vectorized numpy: no torch, no per-shape Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError, check_positive_arrays
from pipeline.predict.geometry import bilinear, grid_position
from pipeline.predict.geometry import waves as count_waves
from pipeline.predict.gemm_grids import (LINE_BYTES, UNALIGNED_GRIDS, ends_mid_line, fill_capped, is_aligned,
                                         is_cold, median_on_measured, no_faster_with_more_waves,
                                         relative_to_square)
from pipeline.predict.gemm_batch import BATCH_GRID, BatchCorrection
from pipeline.predict.page_faults import OutputFaults, without_faults
from pipeline.predict.selector import KernelSelector, selector_labels
from pipeline.predict.serialize import DataclassJSON
from pipeline.core.ops import GEMM_OPS


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
    # lines, over the same (M x N) lattice, measured by twins one element off (sweeps/gemm.py)
    unaligned_n_log: np.ndarray | None = None
    unaligned_k_log: np.ndarray | None = None
    # CPU: log of how much longer a shape runs with its weights read from memory (rotated
    # through a pool past the cache, sweeps/gemm.py) than hot, over the same (M x N) lattice
    cold_log: np.ndarray | None = None

    def __post_init__(self):
        for name in _GRIDS:  # JSON gives lists back
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, np.asarray(value, float))

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
        return hot if not cold or self.cold_log is None else hot * np.exp(cold * self._on_lattice(self.cold_log, m, n))

    def _on_lattice(self, g: np.ndarray, m, n) -> np.ndarray:
        """Bilinear in (log2 M, log2 N) over the aspect lattice, held at its edges."""
        return bilinear(g, grid_position(np.log2(self.aspect_m), np.log2(np.asarray(m, float))),
                        grid_position(np.log2(self.aspect_n), np.log2(np.asarray(n, float))))

    def aspect_factor(self, m, n, k=None) -> np.ndarray | float:
        """How much slower (> 1) or faster a shape runs than the near-square one of the same
        output size the whole-wave table holds; 1 without an aspect grid. With a correction per
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
        below = np.clip(np.log2(np.maximum(k, 1.0)) / np.log2(self.aspect_k[0]), 0.0, 1.0) \
            if self.aspect_k[0] > 1 else 1.0
        return np.exp((lo * (1 - fk) + hi * fk) * below)

    def alignment_factor(self, m, n, k) -> np.ndarray | float:
        """How much longer a shape whose N or K rows end mid cache line runs than an aligned
        one (the twins' measured ratio at its (M, N)); 1 for aligned shapes or without twins."""
        out = 0.0
        for grid, dim in ((self.unaligned_n_log, n), (self.unaligned_k_log, k)):
            if grid is not None:
                out = out + self._on_lattice(grid, m, n) * ends_mid_line(dim, self.dtype)
        return np.exp(out)

    def with_aspect(self, rows: pd.DataFrame) -> "GemmTable":
        """This table with its aspect correction fitted on `rows` (the aspect grid of its kernel):
        per (M, N) and per K of the grid, log(measured / what the table alone predicts), taken
        relative to the most square cell of the same output size at that K."""
        base = self.predict_us(rows["m"].to_numpy(), rows["n"].to_numpy(), rows["k"].to_numpy(),
                               rows["batch"].to_numpy())
        ratio = rows.assign(log_ratio=np.log(rows["median_us"].to_numpy(float) / base))
        ms, ns, ks = (np.sort(ratio[c].unique()).astype(float) for c in ("m", "n", "k"))
        slices = []
        for k in ks:
            grid = ratio[ratio["k"] == k].pivot_table(index="m", columns="n", values="log_ratio", aggfunc="median")
            grid = grid.reindex(index=ms, columns=ns)
            # a cell the FLOP cap skipped holds its row's nearest measured N (the rows' effect
            # is what varies most: few rows spread the packing of B over little work)
            # (per matrix: bmm's grid is timed at a batch of its own, sweeps/gemm.py)
            one_wave = float(self.tile_m * self.tile_n * self.slots) / float(rows["batch"].median())
            slices.append(pd.DataFrame(relative_to_square(grid, one_wave))
                          .ffill(axis=1).bfill(axis=1).to_numpy(float))
        cube = np.stack(slices, axis=-1)
        known = ~np.isnan(cube)
        # a cell no K measured: 0; one some K measured: those K's median for the others
        some = known.any(-1)
        fill = np.zeros(cube.shape[:-1])
        fill[some] = np.nanmedian(cube[some], axis=-1)
        cube = np.where(known, cube, fill[..., None])
        return replace(self, aspect_m=ms, aspect_n=ns, aspect_log=cube, aspect_k=ks)

    def with_alignment(self, base: pd.DataFrame, twins: pd.DataFrame) -> "GemmTable":
        """This table with its unaligned-N and -K corrections: per aspect cell (M, N), the median
        over K of log(twin time / aligned time) less the twin's extra FLOPs. Only cells whose own
        N and K are aligned say what misalignment costs; the rest, and cells with no twin, get 0."""
        if self.aspect_log is None or twins.empty:
            return self
        keys = ["m", "n", "k"]
        aligned = base[is_aligned(base["n"].to_numpy(), self.dtype) & is_aligned(base["k"].to_numpy(), self.dtype)]
        aligned = aligned.groupby(keys, as_index=False)["median_us"].median()
        out = {}
        for name, dim in UNALIGNED_GRIDS.items():
            mine = twins[twins["grid"] == name.removesuffix("_log")]
            pair = mine.assign(**{dim: mine[dim] - 1}).merge(aligned, on=keys, suffixes=("", "_base"))
            if pair.empty:
                continue
            extra = np.log((pair[dim] + 1) / pair[dim])  # the twin's FLOPs over the base's
            pair = pair.assign(log_ratio=np.log(pair["median_us"] / pair["median_us_base"]) - extra)
            cells = pair.pivot_table(index="m", columns="n", values="log_ratio", aggfunc="median")
            cells = cells.reindex(index=self.aspect_m, columns=self.aspect_n).to_numpy(float)
            # columns narrower than a line hold no measurement of their own: not filled from beside
            out[name] = median_on_measured(cells, self.aspect_m, self.aspect_n) * (
                self.aspect_n * element_bytes(self.dtype) >= LINE_BYTES)
        return replace(self, **out)

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


_GRIDS = ("aspect_m", "aspect_n", "aspect_log", "aspect_k", *UNALIGNED_GRIDS, "cold_log")


CHUNK = 1 << 15


class GemmModel:
    """Tables per (op, dtype, kernel) and the selector that says which kernel runs a shape."""

    name = "gemm_model"

    def __init__(self, tables: dict[tuple[str, str, str], GemmTable], selector: KernelSelector,
                 faults: OutputFaults | None = None, weight_cache_bytes: float | None = None):
        self.tables, self.selector = tables, selector
        self.faults = faults  # CPU: page faults of fresh outputs, charged by output size (page_faults.py)
        # CPU: weights the cache holds between two uses of one, as the sweep's probe measured
        # (harness/weight_rotation.py); with the tables' cold corrections it prices a graph's
        # GEMMs by the share of its weights that come from memory (uncached_share)
        self.weight_cache_bytes = weight_cache_bytes
        # CPU: (op, dtype, kernel) -> how the batch size changes a bmm's time (gemm_batch.py)
        self.batch_corrections: dict[tuple[str, str, str], BatchCorrection] = {}

    def uncached_share(self, weight_bytes: float) -> float | None:
        """The share of a graph's GEMM weights (`weight_bytes` in all) that the cache cannot hold
        between two uses, min(1, cache / weights) held, as the embedding model blends its tables;
        None without a probe or cold corrections (GPUs, older calibrations): priced hot."""
        if not self.weight_cache_bytes or weight_bytes <= 0 or all(t.cold_log is None for t in self.tables.values()):
            return None
        return float(1.0 - min(1.0, self.weight_cache_bytes / weight_bytes))

    @staticmethod
    def fit(samples, choices=None) -> "GemmModel":
        """samples: gemm_samples (or one layout's gemm_config_samples) rows; held-out rows are
        refused, not silently used. The selector learns from the kernel each training shape ran,
        or, given `choices` (shapes labelled with the configuration the device's heuristic picks,
        gemm_config_choices), from those: a per-configuration sweep runs every configuration at
        every point, so its own rows say nothing about which one the device would pick."""
        if bool(samples["held_out"].any()):
            raise ValueError("GemmModel.fit got held-out rows; fit on training rows only")
        faults = OutputFaults.fit(samples)
        samples = without_faults(samples)  # the tables hold the kernels; faults are added by output size
        every_grid = samples  # the selector learns from all of them (selector_labels)
        grid = samples["grid"] if "grid" in samples else pd.Series("waves", index=samples.index)
        is_twin = grid.isin([name.removesuffix("_log") for name in UNALIGNED_GRIDS]).to_numpy()
        is_aspect = (grid == "aspect").to_numpy()
        cold_rows, is_batch = is_cold(samples), (grid == BATCH_GRID).to_numpy()
        twins, aspect, cold, batched = samples[is_twin], samples[is_aspect], samples[cold_rows], samples[is_batch]
        samples = samples[~(is_twin | is_aspect | cold_rows | is_batch)]
        tables = {}
        for (op, dtype, kernel), g in samples.groupby(["op", "dtype", "kernel"]):
            tm, tn = (int(g[c].mode().iloc[0]) for c in ("tile_m", "tile_n"))
            split_k = int(g["split_k"].fillna(1).mode().iloc[0]) if "split_k" in g else 1
            slots = int(g["slots"].iloc[0])
            g = g.assign(thr=2.0 * g["waves"] * slots * tm * tn * g["k"] / (split_k * g["median_us"]))
            grid = g.pivot_table(index="waves", columns="k", values="thr", aggfunc="median").sort_index()
            grid = grid.sort_index(axis=1)
            ks = grid.columns.to_numpy(float)
            table = GemmTable(op, dtype, str(kernel), tm, tn, slots, grid.index.to_numpy(float), ks,
                              no_faster_with_more_waves(fill_capped(grid.to_numpy(float), ks),
                                                        grid.index.to_numpy(float), ks), split_k)
            mine = aspect[(aspect["op"] == op) & (aspect["dtype"] == dtype) & (aspect["kernel"] == kernel)]
            if len(mine):  # whole-wave and batch-grid rows on the aspect lattice were not measured
                # twice: they join it (bmm's lattice is timed at a batch of its own, its squares
                # at that batch by the batch grid)
                sides = set(mine["m"]) | set(mine["n"])
                own_batched = batched[(batched["op"] == op) & (batched["dtype"] == dtype) & (batched["kernel"] == kernel)]
                pool = pd.concat([g.drop(columns="thr"), own_batched], ignore_index=True)
                on_lattice = (pool["m"].isin(sides) & pool["n"].isin(sides) & pool["k"].isin(set(mine["k"]))
                              & pool["batch"].isin(set(mine["batch"])))
                mine = pd.concat([mine, pool[on_lattice]], ignore_index=True)
            if len(mine):
                own_twins = twins[(twins["op"] == op) & (twins["dtype"] == dtype)]
                own_cold = cold[(cold["op"] == op) & (cold["dtype"] == dtype)]
                table = table.with_aspect(mine).with_alignment(mine, own_twins).with_cold(mine, own_cold)
            tables[(op, dtype, str(kernel))] = table
        cache = samples["weight_cache_bytes"].dropna() if "weight_cache_bytes" in samples else pd.Series(dtype=float)
        model = GemmModel(tables, KernelSelector.fit(selector_labels(every_grid, choices, tables)), faults,
                          float(cache.median()) if len(cache) and len(cold) else None)
        return model.with_batch(batched)

    def with_batch(self, rows: pd.DataFrame) -> "GemmModel":
        """This model with a batch correction per (op, dtype, kernel) the batch grid measured
        (gemm_batch.py), fitted against that kernel's table: the rows have their page faults taken off."""
        for (op, dtype, kernel), g in rows.groupby(["op", "dtype", "kernel"]):
            key = (str(op), str(dtype), str(kernel))
            if key in self.tables:
                pred = self.tables[key].predict_us(g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(),
                                                   g["batch"].to_numpy())
                self.batch_corrections[key] = BatchCorrection.fit(*key, g, pred)
        return self

    def check(self, op: str, dtype: str) -> None:
        check_dtype(dtype)
        if op not in GEMM_OPS:
            raise BadShapeError(f"unknown GEMM op {op!r}; expected one of {GEMM_OPS}")
        if (op, dtype) not in self.selector.trees:
            have = sorted({(o, d) for o, d, _ in self.tables})
            raise MissingModelError(f"no GEMM calibration for op={op!r} dtype={dtype!r}; have {have}")

    def kernels(self, op: str, dtype: str) -> list[str]:
        self.check(op, dtype)
        return self.selector.kernels(op, dtype)

    def table(self, op: str, dtype: str, kernel: str | None = None) -> GemmTable:
        """The table of `kernel`, or of the only kernel the sweep saw for (op, dtype)."""
        names = self.kernels(op, dtype)
        if kernel is None and len(names) == 1:
            kernel = names[0]
        if (op, dtype, kernel) not in self.tables:
            raise MissingModelError(f"no table for kernel {kernel!r} of op={op!r} dtype={dtype!r}; have {names}")
        return self.tables[(op, dtype, kernel)]

    def predict(self, op: str, dtype: str, m, n, k, batch=1, kernel: str | None = None,
                cold: float | None = None) -> np.ndarray:
        """Predicted microseconds for arrays (or scalars) of m, n, k, batch; the kernel is the
        selector's choice per shape unless one is named. `cold` (0..1): the share of the weights
        read from memory rather than cache (uncached_share); None or 0: timed hot, as swept."""
        arrs = check_positive_arrays(m=m, n=n, k=k, batch=batch)
        if kernel is not None:
            tables = [self.table(op, dtype, kernel)]
        else:
            tables = [self.table(op, dtype, name) for name in self.kernels(op, dtype)]
        flat = [a.ravel() for a in arrs]
        out = np.empty(flat[0].size)
        # Chunks small enough that every temporary stays in cache: ~3x faster on 10M shapes.
        for lo in range(0, out.size, CHUNK):
            out[lo:lo + CHUNK] = self._predict_chunk(op, dtype, tables, [a[lo:lo + CHUNK] for a in flat], cold)
        if self.faults is not None:
            m_, n_, _, b_ = flat
            out += self.faults.fault_us(b_ * m_.astype(float) * n_ * element_bytes(dtype))
        return out.reshape(arrs[0].shape)

    def _predict_chunk(self, op, dtype, tables, arrs, cold=None) -> np.ndarray:
        if len(tables) == 1:
            return self._kernel_us(tables[0], arrs, cold)
        out = np.empty(arrs[0].size)
        for table, sel in self._by_kernel(op, dtype, tables, arrs):
            out[sel] = self._kernel_us(table, [a[sel] for a in arrs], cold)
        return out

    def _kernel_us(self, table: GemmTable, arrs, cold=None) -> np.ndarray:
        """One kernel's table, and its batch correction where the batch grid measured one."""
        us = table.predict_us(*arrs, cold=cold)
        corr = self.batch_corrections.get((table.op, table.dtype, table.kernel))
        return us if corr is None else us * corr.factor(*arrs)

    def _by_kernel(self, op, dtype, tables, arrs):
        """(table, mask of the shapes whose kernel it is) for each kernel the selector picks."""
        which = self.selector.predict_index(op, dtype, *arrs)
        for i in np.unique(which):
            yield tables[i], which == i

    def calibrated_range(self, op: str, dtype: str) -> dict[str, tuple[float, float]]:
        """kernel -> (largest whole-wave count, largest K) its sweep measured for (op, dtype).
        Beyond either edge a prediction is an extrapolation: the edge's throughput is held."""
        return {name: (float(t.waves[-1]), float(t.ks[-1]))
                for name in self.kernels(op, dtype) for t in [self.table(op, dtype, name)]}

    def beyond_range(self, op: str, dtype: str, m, n, k, batch=1) -> tuple[float, float]:
        """How far the shapes reach past the calibration: (most waves / the largest measured waves,
        largest K / the largest measured K), each against the table of the kernel the selector
        picks for the shape; both <= 1 when every shape lies inside what was measured."""
        m, n, k, batch = (a.ravel() for a in check_positive_arrays(m=m, n=n, k=k, batch=batch))
        edges = self.calibrated_range(op, dtype)
        w_ratio = k_ratio = 0.0
        for t, sel in self._by_kernel(op, dtype, [self.table(op, dtype, name) for name in edges], (m, n, k, batch)):
            w = count_waves(m[sel], n[sel], batch[sel], t.tile_m, t.tile_n, t.slots, t.split_k)
            w_ratio = max(w_ratio, float(w.max()) / edges[t.kernel][0])
            k_ratio = max(k_ratio, float(k[sel].max()) / edges[t.kernel][1])
        return w_ratio, k_ratio

    def to_dict(self) -> dict:
        d = {"kind": "gemm_model", "tables": [t.to_dict() for t in self.tables.values()],
             "selector": self.selector.to_dict()}
        if self.faults is not None:  # a model without fault counts saves as it always did
            d["output_faults"] = self.faults.to_dict()
        if self.weight_cache_bytes:
            d["weight_cache_bytes"] = self.weight_cache_bytes
        if self.batch_corrections:
            d["batch_corrections"] = [c.to_dict() for c in self.batch_corrections.values()]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GemmModel":
        tables = [GemmTable.from_dict(t) for t in d["tables"]]
        faults = OutputFaults.from_dict(d["output_faults"]) if d.get("output_faults") else None
        model = cls({(t.op, t.dtype, t.kernel): t for t in tables}, KernelSelector.from_dict(d["selector"]), faults,
                    d.get("weight_cache_bytes"))
        for c in d.get("batch_corrections", []):
            corr = BatchCorrection.from_dict(c)
            model.batch_corrections[(corr.op, corr.dtype, corr.kernel)] = corr
        return model
