"""Export one device's measured tables from a warehouse into a committed reference calibration,
models_store/reference/<slug>/<table>.parquet, which `devchar run --device <slug>` replays on any
machine (`make check-references`). Only the sweep tables (what a replay loads), one run each.

    DEVCHAR_HOME=<home of the make run> .venv/bin/python scripts/export_reference.py [--device SLUG]

Refuses a table whose rows for the device come from more than one run or carry no run_id (a
partly re-run calibration is not one take), and writes every file to a temporary folder first,
so a failure leaves the reference as it was; a table file the new take lacks is removed from
the folder, so it never mixes two takes. The folder's README.md (what machine, when, what it
measured) and any other file in it are left to the hand.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.core.config import duckdb_path, reference_root  # noqa: E402
from pipeline.core.slugs import check_slug, under  # noqa: E402
from pipeline.runner import SWEEPS, tables_of  # noqa: E402


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}


def export(con: duckdb.DuckDBPyConnection, device: str, dest: Path) -> dict[str, int]:
    """table -> rows written for `device` into `dest` (only the tables the warehouse has rows of)."""
    have = _tables(con)
    counts = {}
    for table in (t for sweep in SWEEPS for t in tables_of(sweep)):  # the device sweep's `devices` first
        if table not in have:
            continue
        runs = con.execute(f"SELECT count(*), count(DISTINCT run_id), count(*) - count(run_id) FROM {table} "
                           "WHERE device = ?", [device]).fetchone()
        if runs[0] == 0:
            continue
        if runs[1] > 1 or runs[2]:
            raise SystemExit(f"export_reference: {table} holds {runs[1]} runs and {runs[2]} rows without a run_id "
                             f"for {device}; re-run the device whole")
        path = str(dest / f"{table}.parquet").replace("'", "''")
        con.execute(f"COPY (SELECT * FROM {table} WHERE device = ?) TO '{path}' (FORMAT parquet, COMPRESSION zstd)",
                    [device])
        counts[table] = runs[0]
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="the slug to export (default: the warehouse's only device)")
    args = ap.parse_args()
    db = duckdb_path()
    if not db.exists():
        raise SystemExit(f"export_reference: no warehouse at {db}; set DEVCHAR_HOME to a make run's home")
    con = duckdb.connect(str(db), read_only=True)
    have = _tables(con)
    devices = [r[0] for r in con.execute("SELECT DISTINCT device FROM devices").fetchall()] if "devices" in have else []
    if args.device:
        device = args.device
    elif len(devices) == 1:
        device = devices[0]
    else:
        raise SystemExit(f"export_reference: the warehouse holds devices {devices}; name one with --device")
    device = check_slug(device, "--device")
    with tempfile.TemporaryDirectory() as tmp:
        counts = export(con, device, Path(tmp))
        if "devices" not in counts:
            raise SystemExit(f"export_reference: no devices row for {device} in {db}")
        dest = under(reference_root(), device)
        dest.mkdir(parents=True, exist_ok=True)
        for stale in dest.glob("*.parquet"):  # a table of an earlier take that this one lacks
            if stale.stem not in counts:
                stale.unlink()
        for name in counts:
            shutil.copy(Path(tmp) / f"{name}.parquet", dest / f"{name}.parquet")
    for name, n in counts.items():
        print(f"{device}: {name}: {n} rows")
    print(f"-> {dest} (write its README.md: machine, commit, date, what the run measured)")


if __name__ == "__main__":
    main()
