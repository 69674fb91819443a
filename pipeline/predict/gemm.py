"""PM2Lat's GEMM model (eq. 1-2): per kernel, throughput measured at whole waves and at K
in powers of two; a new shape's throughput is interpolated linearly in K (eq. 2) and
in log2(waves), and its duration is padded FLOPs over that throughput.

Padded FLOPs count whole tiles and whole waves (a partial tile or wave costs a full one).
Beyond the largest K or wave count measured the throughput is held (eq. 1: duration grows
with K); below the smallest the duration is held (launch- and latency-bound there).
Prediction is vectorized numpy: no torch, no per-shape Python loop.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError, check_positive_arrays
from pipeline.predict.geometry import waves as count_waves
from pipeline.predict.gemm_grids import TWIN_GRIDS, fill_capped, is_cold, no_faster_with_more_waves
from pipeline.predict.gemm_alias import ALIAS_GRID
from pipeline.predict.gemm_batch import BATCH_GRID, BatchCorrection
from pipeline.predict.gemm_narrow import NARROW_GRID, NarrowCorrection, narrow_rows
from pipeline.predict.gemm_table import GemmTable
from pipeline.predict.page_faults import OutputFaults, without_faults
from pipeline.predict.selector import KernelSelector, selector_labels
from pipeline.core.ops import GEMM_OPS


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
        # CPU: (op, dtype) -> what each whole N under a cache line costs beyond the lattice's price
        # (gemm_narrow.py)
        self.narrow_corrections: dict[tuple[str, str], NarrowCorrection] = {}

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
        is_twin = grid.isin(TWIN_GRIDS).to_numpy()
        is_aspect = (grid == "aspect").to_numpy()
        cold_rows, is_batch = is_cold(samples), (grid == BATCH_GRID).to_numpy()
        is_narrow, is_alias = (grid == NARROW_GRID).to_numpy(), (grid == ALIAS_GRID).to_numpy()
        twins, aspect, cold, batched = samples[is_twin], samples[is_aspect], samples[cold_rows], samples[is_batch]
        narrow, alias_twins = narrow_rows(samples, grid), samples[is_alias]
        samples = samples[~(is_twin | is_aspect | cold_rows | is_batch | is_narrow | is_alias)]
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
            # paired with this kernel's cells by shape, whichever kernel the twin ran
            table = table.with_alias(g, alias_twins[(alias_twins["op"] == op) & (alias_twins["dtype"] == dtype)])
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
        if choices is None:  # a configuration sweep's own rows say nothing of which one is picked
            tables = without_one_k_tables(tables, samples)
        cache = samples["weight_cache_bytes"].dropna() if "weight_cache_bytes" in samples else pd.Series(dtype=float)
        model = GemmModel(tables, KernelSelector.fit(selector_labels(every_grid, choices, tables)), faults,
                          float(cache.median()) if len(cache) and len(cold) else None)
        return model.with_batch(batched).with_narrow(narrow)

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

    def with_narrow(self, rows: pd.DataFrame) -> "GemmModel":
        """This model with a narrow-N correction per (op, dtype) the narrow grid measured
        (gemm_narrow.py), fitted against everything else the model prices them with."""
        for (op, dtype), g in rows.groupby(["op", "dtype"]):
            if (op, dtype) in self.selector.trees:
                self.narrow_corrections.pop((str(op), str(dtype)), None)  # fitted against the model without one
                pred = self.predict(op, dtype, g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(),
                                    g["batch"].to_numpy(), faults=False)
                self.narrow_corrections[(str(op), str(dtype))] = NarrowCorrection.fit(str(op), str(dtype), g, pred)
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
                cold: float | None = None, faults: bool = True) -> np.ndarray:
        """Predicted microseconds for arrays (or scalars) of m, n, k, batch; the kernel is the
        selector's choice per shape unless one is named. `cold` (0..1): the share of the weights
        read from memory rather than cache (uncached_share); None or 0: timed hot, as swept.
        faults=False: the kernel alone, without its fresh output's page faults."""
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
        narrow = self.narrow_corrections.get((op, dtype))
        if narrow is not None:
            out *= narrow.factor(flat[1], flat[2])
        if faults and self.faults is not None:
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
        if self.narrow_corrections:
            d["narrow_corrections"] = [c.to_dict() for c in self.narrow_corrections.values()]
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
        for c in d.get("narrow_corrections", []):
            corr = NarrowCorrection.from_dict(c)
            model.narrow_corrections[(corr.op, corr.dtype)] = corr
        return model


def without_one_k_tables(tables: dict, rows: pd.DataFrame) -> dict:
    """`tables` less the table of each kernel measured at one K only whose whole-wave points lie
    between other kernels' points at that K (`rows`: the whole-wave rows the tables were fitted
    on), where those kernels were measured at several K. A one-K table holds its throughput at
    every other K, so it prices time in proportion to K, and the kernels around it have cells
    of their own. On the 16-core Xeon (2026-11-30) oneDNN ran one whole-wave point of bf16 bmm,
    K = 2 at 256 waves, with its avx512_core_bf16 kernel, between ATen's points (up to 64 waves)
    and AMX's (from 1024); the selector gave that kernel a held-out 108 x 2 x 22 bmm, priced
    225.8 us against 19.6 measured (11x = 22 / 2). A dropped kernel's rows teach the selector
    nothing (selector_labels keeps kernels with a table), so the shapes around them go to the
    kernels measured there. A one-K table that is all that measured its K at the largest (or
    smallest) wave counts stays: the 2-thread AMX Xeons ran K = 1 with avx512_core_bf16 at 7
    wave counts per op, above ATen's 6 smaller ones, and no other kernel ran them."""
    points = {(op, dtype, str(kernel)): g for (op, dtype, kernel), g in rows.groupby(["op", "dtype", "kernel"])}

    def surrounded(key):
        mine = points[key]
        waves = [g.loc[g["k"].isin(set(mine["k"])), "waves"] for other, g in points.items()
                 if other[:2] == key[:2] and other != key and len(tables[other].ks) > 1]
        waves = pd.concat(waves) if waves else pd.Series(dtype=float)
        return len(waves) > 0 and waves.min() <= mine["waves"].min() and waves.max() >= mine["waves"].max()

    return {key: t for key, t in tables.items() if len(t.ks) > 1 or not surrounded(key)}
