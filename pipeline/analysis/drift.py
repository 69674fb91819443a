"""Did the device change between two calibrations? (issue 15: drift)

A re-calibration re-measures the same points (the sweep grids are deterministic per profile
and device), so the previous run's rows and the new ones can be joined on their shape and
compared point by point:

- per (op, dtype): the median of new/old time over the points both runs measured, and the
  share of points that *moved*: whose two [p20, p80] intervals do not overlap, i.e. that
  changed by more than either run's own spread. The spread is each point's measured noise,
  so no noise level is assumed for any machine.
- for a fitted model: its error on the previous run's held-out points beside its error on
  its own held-out points. A model fitted on a changed device mispredicts the old points.

A group is flagged when its median moved by more than `max_drift_ratio` AND at least
`max_drift_moved_share` of its points moved: one noisy point, or a whole group shifting
within its noise, is not drift. The thresholds are quality gates (resources/quality.py).

The same rule over all of a table's points (the row with op and dtype "all") says whether
the *device* changed: clocks, threads, a driver or a BLAS update move most of what a sweep
measures. Seen on a 2-thread VM: between two unchanged runs minutes apart, single ops
(transpose, silu) moved by 25-40% beyond their within-run spread while the rest stayed
within 2%: process state (where the allocator placed the buffers), not the device. Those
groups stay flagged in the table; the check warns on the pooled row.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.analysis.quality import Gates

# table -> (the column naming the kind of op, the columns that identify one measured point)
DRIFT_KEYS: dict[str, tuple[str, list[str]]] = {
    "gemm_samples": ("op", ["op", "dtype", "layout", "batch", "m", "n", "k", "grid"]),
    "utility_samples": ("op", ["op", "dtype", "rows", "cols", "shape"]),
    "attention_samples": ("backend", ["backend", "dtype", "batch", "heads", "seq_q", "seq_kv", "head_dim", "causal",
                                      "grid"]),
    "embedding_samples": ("direction", ["direction", "dtype", "B", "E", "T", "L", "D", "cold"]),
    "memory_samples": ("op", ["op", "dtype", "batch", "m", "n", "k", "shape"]),
}
# Per table, optional key columns and the value a row written before the column existed stands
# for (embedding rows before cold timings were all hot; grids before the extra grids, the base one).
KEY_DEFAULTS = {"embedding_samples": {"cold": False}, "gemm_samples": {"grid": "waves"},
                "attention_samples": {"grid": "seq"}}
MIN_TABLES_MOVED = 2  # sample tables flagged in one run for the device as a whole to count as changed

ALL = "all"  # op and dtype of the row that pools every point of a table
COLUMNS = ["kind", "source", "op", "dtype", "points", "median_ratio", "moved_share", "error_previous_heldout",
           "error_new_heldout", "flagged", "previous_run_id"]


def run_id_of(rows: pd.DataFrame) -> str:
    ids = sorted(set(rows["run_id"].dropna().astype(str))) if "run_id" in rows else []
    return ",".join(ids)


def _with_key_defaults(rows: pd.DataFrame, table: str) -> pd.DataFrame:
    fill = KEY_DEFAULTS.get(table, {})
    if not fill:
        return rows
    rows = rows.assign(**{k: v for k, v in fill.items() if k not in rows})
    return rows.assign(**{k: rows[k].fillna(v).astype(type(v)) for k, v in fill.items()})


def table_drift(previous: pd.DataFrame, new: pd.DataFrame, table: str, gates: Gates = Gates()) -> pd.DataFrame:
    """One row per (op, dtype) that both runs measured (COLUMNS; kind "samples")."""
    op_col, keys = DRIFT_KEYS[table]
    cols = [*keys, "median_us", "p20_us", "p80_us"]
    previous, new = _with_key_defaults(previous, table), _with_key_defaults(new, table)
    if not all(c in previous and c in new for c in cols):  # rows written before a column existed
        return pd.DataFrame(columns=COLUMNS)
    both = new[cols].merge(previous[cols], on=keys, suffixes=("", "_prev"))
    both = both[(both["median_us"] > 0) & (both["median_us_prev"] > 0)]
    if both.empty:
        return pd.DataFrame(columns=COLUMNS)
    both = both.assign(ratio=both["median_us"] / both["median_us_prev"],
                       moved=(both["p20_us"] > both["p80_us_prev"]) | (both["p80_us"] < both["p20_us_prev"]))
    groups = [((str(op), str(dtype)), g) for (op, dtype), g in both.groupby([op_col, "dtype"], sort=True)]
    previous_run_id, out = run_id_of(previous), []
    for (op, dtype), g in [*groups, ((ALL, ALL), both)]:
        ratio, moved = float(np.median(g["ratio"])), float(g["moved"].mean())
        out.append(dict(kind="samples", source=table, op=op, dtype=dtype, points=len(g),
                        median_ratio=ratio, moved_share=moved, error_previous_heldout=np.nan,
                        error_new_heldout=np.nan, flagged=is_drift(ratio, moved, gates),
                        previous_run_id=previous_run_id))
    return pd.DataFrame(out, columns=COLUMNS)


def device_changed(drift: pd.DataFrame) -> bool:
    """The pooled row's verdict: did the table as a whole move (not one op on its own)?"""
    pooled = drift[(drift["kind"] == "samples") & (drift["op"] == ALL) & (drift["dtype"] == ALL)]
    return bool(pooled["flagged"].any())


def devices_verdict(pooled: pd.DataFrame) -> tuple[bool, list[str], list[str]]:
    """One verdict per device run from each sample table's pooled drift row of that run
    (columns source, flagged, median_ratio): (changed, tables flagged, tables compared).

    A changed device (threads, clocks, driver, BLAS) moves most of what every sweep measures;
    a shared VM's slow spell can last a whole short sweep (on the EPYC VM, unchanged re-runs
    moved memory_samples x0.66, attention_samples x1.37 and x0.78, each alone, in three re-runs)
    and moves one table. So the device counts as changed when two tables or more are flagged
    (2 -> 1 threads flagged 4 of 5 tables there, 1 -> 2 threads 2 of 5: a count of half the
    tables would have missed the second)."""
    compared = sorted(pooled["source"].astype(str))
    flagged = sorted(pooled.loc[pooled["flagged"].astype(bool), "source"].astype(str))
    return len(flagged) >= MIN_TABLES_MOVED, flagged, compared


def is_drift(median_ratio: float, moved_share: float, gates: Gates) -> bool:
    shift = abs(np.log(median_ratio))
    return bool(shift > np.log1p(gates.max_drift_ratio) and moved_share >= gates.max_drift_moved_share)


def model_drift(model: str, on_previous: pd.DataFrame, on_new: pd.DataFrame, previous_run_id: str,
                gates: Gates = Gates()) -> pd.DataFrame:
    """A model's median relative error per (op, dtype) on the previous run's held-out points
    (`on_previous`) beside its own (`on_new`); both are pipeline.predict.evaluate.error_table
    frames. Flagged when the previous points are mispredicted by more than max_drift_ratio
    beyond the model's own error."""
    own = on_new.set_index(["op", "dtype"])["median_rel_err"]
    out = []
    for r in on_previous.itertuples():
        mine = float(own.get((r.op, r.dtype), np.nan))
        out.append(dict(kind="model", source=model, op=str(r.op), dtype=str(r.dtype), points=int(r.n),
                        median_ratio=np.nan, moved_share=np.nan, error_previous_heldout=float(r.median_rel_err),
                        error_new_heldout=mine,
                        flagged=bool(mine == mine and r.median_rel_err - mine > gates.max_drift_ratio),
                        previous_run_id=previous_run_id))
    return pd.DataFrame(out, columns=COLUMNS)


def summary(drift: pd.DataFrame, pooled: bool | None = None) -> str:
    """'none' or the flagged groups, worded for a check's metadata; `pooled` True: only the
    table-wide row, False: only the per-(op, dtype) rows, None: both."""
    flagged = drift[drift["flagged"].astype(bool)]
    if pooled is not None:
        flagged = flagged[(flagged["op"] == ALL) == pooled]
    if flagged.empty:
        return "none"
    parts = []
    for r in flagged.itertuples():
        if r.kind == "samples":
            parts.append(f"{r.op} {r.dtype}: x{r.median_ratio:.2f}, {r.moved_share:.0%} of {r.points} points moved")
        else:
            parts.append(f"{r.source} {r.op} {r.dtype}: {r.error_previous_heldout:.0%} on the previous held-out "
                         f"points vs {r.error_new_heldout:.0%} on its own")
    return "; ".join(parts)


# --- the previous run's rows, kept for the model fits that follow a re-calibration -----------

def previous_path(home: Path, device: str, table: str) -> Path:
    return home / "drift" / device / f"{table}.previous.parquet"


def keep_previous(home: Path, device: str, table: str, rows: pd.DataFrame) -> Path:
    """Write the rows a re-calibration replaced, whole or not at all (a temporary file renamed)."""
    path = previous_path(home, device, table)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    rows.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def load_previous(home: Path, device: str, table: str) -> pd.DataFrame | None:
    path = previous_path(home, device, table)
    return pd.read_parquet(path) if path.exists() else None
