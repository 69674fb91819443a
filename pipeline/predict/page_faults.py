"""Page faults of a GEMM's fresh output, fitted from the sweep's own counts and, from the size
a step's process faults every page of (the ladder probe's `fault_from_bytes`), charged in full
(no torch).

A CPU GEMM that allocates its output above the allocator's mmap threshold faults in every
page of it on every call (harness/page_faults.py); below it the allocator reuses memory and
little faults. The GEMM sweep counts each row's faults per call and measures what one fault
costs; the GEMM model fits its tables on the time without them (`without_faults`) and adds
them back by output size (`OutputFaults.fault_us`), so a whole-wave cell whose output was
faulted in (4096 x 8192 float32, 128 MB: ~30 ms at every K from 1 to 32 on the Xeon VM) no
longer prices its neighbours' outputs, which the allocator reuses, as if they faulted too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.core.dtypes import element_bytes
from pipeline.predict.serialize import DataclassJSON

PAGE_BYTES = 4096
COLUMNS = ("faults_per_call", "fault_us_per_page")
MIN_COMPUTE_SHARE = 0.05  # a row whose counted faults would leave less keeps this share: a miscount, not a kernel


def output_bytes(rows: pd.DataFrame) -> np.ndarray:
    eb = rows["dtype"].map(element_bytes).to_numpy(float)
    return rows["batch"].to_numpy(float) * rows["m"].to_numpy(float) * rows["n"].to_numpy(float) * eb


def has_counts(rows: pd.DataFrame) -> bool:
    return all(c in rows for c in COLUMNS) and bool(rows[list(COLUMNS)].notna().all(axis=1).any())


def without_faults(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with their page faults taken off: a row timed into a kept output too (`kept_us`)
    takes that time; any other its counted faults times the probe's cost (rows without counts
    as they are)."""
    if not has_counts(rows):
        return rows
    fault_us = (rows["faults_per_call"] * rows["fault_us_per_page"]).fillna(0.0).clip(lower=0.0)
    out = rows.copy()
    kept = rows["kept_us"].to_numpy(float) if "kept_us" in rows else np.full(len(rows), np.nan)
    has_kept = np.isfinite(kept) & (kept > 0)
    scale = np.where(has_kept, kept / rows["median_us"].to_numpy(float), 1.0)
    for col in ("median_us", "p20_us", "p80_us"):
        if col in out:
            less = np.maximum(out[col] - fault_us, MIN_COMPUTE_SHARE * out[col])
            out[col] = np.where(has_kept, out[col].to_numpy(float) * scale, less)
    return out


def kept_us_per_page(rows: pd.DataFrame) -> float | None:
    """What a fault cost inside the sweep's own GEMMs: the median over rows timed both ways of
    (fresh - kept) / faults; None without such rows. The probe's 64 MB fill (0.54 us a page on
    the Xeon VM) under-priced GPT-2's LM head, whose fresh and kept outputs differed by 0.78-1.0
    us a page: the faults also evict the GEMM's packed panels.
    Fresh is the row's `held_us` where the sweep timed one (since 2026-11-30: the previous output
    held through the call, as in a step), else its median, which also frees each output inside
    the timing: a step frees a returned output once, at its end (graph_predict.output_free_us),
    and priced both ways GPT-2's logits paid their free twice (Zen 5 EPYC VM: 0.89 us a page from
    the medians, 0.56-0.64 to fault and 0.32 to free, harness/page_faults.held_output_us)."""
    if "kept_us" not in rows:
        return None
    both = rows[np.isfinite(rows["kept_us"].to_numpy(float)) & (rows["faults_per_call"] > 0)]
    if both.empty:
        return None
    fresh, faults = both["median_us"].to_numpy(float), both["faults_per_call"].to_numpy(float)
    if "held_us" in both and "held_faults" in both:  # the held timing's own count
        held, held_faults = both["held_us"].to_numpy(float), both["held_faults"].to_numpy(float)
        use = np.isfinite(held) & (held > 0) & np.isfinite(held_faults) & (held_faults > 0)
        fresh, faults = np.where(use, held, fresh), np.where(use, held_faults, faults)
    return float(np.median(np.maximum(fresh - both["kept_us"].to_numpy(float), 0.0) / faults))


@dataclass
class OutputFaults(DataclassJSON):
    us_per_page: float
    log2_bytes: np.ndarray  # (B,) floor(log2(output bytes)) of the measured rows, ascending
    fraction: np.ndarray  # (B,) median share of the output's pages faulted per call there

    def __post_init__(self):
        self.log2_bytes = np.asarray(self.log2_bytes, float)
        self.fraction = np.asarray(self.fraction, float)

    @staticmethod
    def fit(rows: pd.DataFrame) -> "OutputFaults | None":
        """From gemm_samples rows with fault counts; None without counts or when a fault costs nothing.
        A fault's cost is the sweep's own (kept_us_per_page) where rows were timed both ways,
        else the probe's. With the rows' `fault_from_bytes` (the ladder probe, a step's process),
        every size class from it up faults its every page; the rows' own counts say only what
        the sweep's heap did, and decide the classes below it."""
        if not has_counts(rows):
            return None
        rows = rows.dropna(subset=list(COLUMNS))
        kept = kept_us_per_page(rows)
        us = kept if kept is not None else float(rows["fault_us_per_page"].median())
        if not us > 0:
            return None
        nbytes = output_bytes(rows)
        share = np.clip(rows["faults_per_call"].to_numpy(float) / np.ceil(nbytes / PAGE_BYTES), 0.0, 1.0)
        per_bin = pd.Series(share).groupby(np.floor(np.log2(nbytes))).median().sort_index()
        from_bytes = rows["fault_from_bytes"].dropna() if "fault_from_bytes" in rows else pd.Series(dtype=float)
        if len(from_bytes):  # a step's process faults these in whatever the sweep's heap did
            first = np.floor(np.log2(float(from_bytes.median())))
            classes = np.arange(first, max(first, float(per_bin.index.max())) + 1)
            per_bin = per_bin.combine(pd.Series(1.0, index=classes), max, fill_value=0.0).sort_index()
        return OutputFaults(us, per_bin.index.to_numpy(float), per_bin.to_numpy(float))

    def fault_us(self, nbytes) -> np.ndarray:
        """Microseconds of faults for outputs of `nbytes`: the share measured in the size class at
        or below (a step, as the allocator's threshold is; the smallest class below all of them)."""
        nbytes = np.asarray(nbytes, float)
        at = np.searchsorted(self.log2_bytes, np.floor(np.log2(np.maximum(nbytes, 1.0))), side="right") - 1
        share = self.fraction[np.clip(at, 0, self.fraction.size - 1)]
        return share * np.ceil(nbytes / PAGE_BYTES) * self.us_per_page
