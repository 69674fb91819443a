"""Would scaling each GEMM training row by the spell probe's reading make the held-out error smaller?

Each CPU row carries `probe_us` (harness/spells.py: a 128^3 mm timed just before and after it).
This refits the GEMM model with every training row's times (and its fault cost per page, which
the fit subtracts from them) scaled by (the training rows' median probe reading / the row's
own) ** beta and scores the held-out rows as measured (raw): nothing is measured, nothing is
written.

    .venv/bin/python scripts/probe_normalize_ablation.py WAREHOUSE.duckdb|REFERENCE_DIR ...

A REFERENCE_DIR is a committed calibration (models_store/reference/<slug>/). Prints the mean
|error| per (op, dtype) for beta 0 (as fitted today), 0.5 and 1.
"""
from __future__ import annotations

import os
import sys

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.predict.evaluate import error_table, gemm_predictions  # noqa: E402
from pipeline.predict.gemm import GemmModel  # noqa: E402

# what the GEMM fit reads in microseconds; fault_us_per_page is subtracted from median_us per fault
TIMES = ("median_us", "p20_us", "p80_us", "kept_us", "fault_us_per_page")
BETAS = (0.0, 0.5, 1.0)


def scaled(rows: pd.DataFrame, beta: float) -> pd.DataFrame:
    """The rows with their times scaled to their median probe reading; rows without one as they are."""
    p = rows["probe_us"].to_numpy(float)
    ok = np.isfinite(p) & (p > 0)
    factor = np.where(ok, (np.median(p[ok]) / np.where(ok, p, 1.0)) ** beta, 1.0)
    return rows.assign(**{c: rows[c].to_numpy(float) * factor for c in TIMES if c in rows})


def gemm_rows(source: str) -> pd.DataFrame:
    parquet = os.path.join(source, "gemm_samples.parquet")
    if not (source.endswith(".duckdb") and os.path.isfile(source) or os.path.isfile(parquet)):
        raise SystemExit(f"{source}: neither a warehouse file (.duckdb) nor a folder with gemm_samples.parquet")
    if source.endswith(".duckdb"):
        with duckdb.connect(source, read_only=True) as con:
            return con.execute("SELECT * FROM gemm_samples").df()
    return pd.read_parquet(parquet)


def main(sources: list[str]) -> int:
    if not sources:
        print(__doc__)
        return 2
    for source in sources:
        rows = gemm_rows(source).assign(held_out=lambda d: d["held_out"].astype(bool))
        if "probe_us" not in rows or not rows["probe_us"].notna().any():
            print(f"{source}: no probe readings (taken before 2026-11-27 19:00)")
            continue
        train, held = rows[~rows["held_out"]], rows[rows["held_out"]]
        cols = {}
        for beta in BETAS:
            err = error_table(gemm_predictions(GemmModel.fit(scaled(train, beta)), held), ["op", "dtype"])
            cols[f"beta={beta:g}"] = err.set_index(["op", "dtype"])["mean_rel_err"]
        print(f"== {source}: held-out mean |error|")
        print(pd.DataFrame(cols).round(3).to_string())
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
