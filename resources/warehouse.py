"""DuckDB warehouse: one embedded file; a device partition's rows are replaced in one transaction."""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd

from pipeline.config import duckdb_path
from pipeline.errors import DevcharError

TABLES = ("devices", "gemm_samples", "utility_samples", "attention_samples", "embedding_samples", "memory_samples",
          "overhead_samples", "workload_graphs", "opencl_launches", "workload_runs", "predictions", "model_errors",
          "reference_timings", "gemm_config_samples", "gemm_config_choices")


# Columns that one kind of device leaves NULL (a CPU has no CUDA version, no tf32 peak):
# declared, so the first device to create a table does not fix them to DuckDB's guess for
# an all-NULL column (INTEGER), which a later GPU row could not be inserted into.
COLUMN_TYPES = {
    "devices": {"cores": "INTEGER", "threads": "INTEGER", "sm_count": "INTEGER", "memory_bytes": "BIGINT",
                "l2_bytes": "BIGINT", "cuda_version": "VARCHAR", "driver_version": "VARCHAR",
                **{f"peak_flops_{dt}": "DOUBLE" for dt in ("float32", "tf32", "bfloat16", "float16")}},
    "gemm_samples": {"split_k": "INTEGER"},
    # training rows leave the held-out columns NULL
    "gemm_config_samples": {"split_k": "INTEGER", "torch_kernel": "VARCHAR", "selection_match": "BOOLEAN",
                            "lt_kernel": "VARCHAR", "config_source": "VARCHAR"},
}


def _typed_select(table: str, columns) -> str:
    types = COLUMN_TYPES.get(table, {})
    return ", ".join(f'CAST("{c}" AS {types[c]}) AS "{c}"' if c in types else f'"{c}"' for c in columns)


class DuckDBWarehouse(dg.ConfigurableResource):
    """Tables named in ARCHITECTURE.md; every row carries `device` and `run_id`."""

    path: str = ""  # empty: $DEVCHAR_HOME/devchar.duckdb

    def db_path(self) -> Path:
        return Path(self.path) if self.path else duckdb_path()

    @contextmanager
    def connect(self, read_only: bool = False):
        """Opens the file, retrying while another process holds the write lock (DuckDB allows one writer)."""
        path = self.db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        if read_only and not path.exists():
            raise DevcharError(f"no warehouse at {path}; run `devchar run` first")
        for attempt in range(40):
            try:
                con = duckdb.connect(str(path), read_only=read_only)
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or attempt == 39:
                    raise
                time.sleep(0.25)
        try:
            yield con
        finally:
            con.close()

    def replace_partition(self, table: str, device: str, rows: pd.DataFrame, scope: str | None = None) -> int:
        """Delete `device`'s rows of `table` and insert `rows`, atomically. Other devices are untouched.

        `scope` names a column whose values in `rows` bound the delete: tables that several
        assets write (model_errors by `model`, predictions by `workload`) replace only the
        writer's own slice, so one asset re-materializing never erases another's rows.
        """
        if table not in TABLES:
            raise DevcharError(f"unknown table {table!r}; expected one of {TABLES}")
        if rows.empty:
            raise DevcharError(f"refusing to replace {table} for device {device!r} with zero rows")
        if "device" not in rows or set(rows["device"].unique()) != {device}:
            raise DevcharError(f"rows for {table} name devices {sorted(rows.get('device', pd.Series()).unique())}, "
                               f"not the partition {device!r}")
        with self.connect() as con:
            con.register("raw_incoming", rows)
            con.execute(f"CREATE TEMP VIEW incoming AS SELECT {_typed_select(table, rows.columns)} FROM raw_incoming")
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM incoming LIMIT 0")
                have = {r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()}
                for col in rows.columns:  # additive schema change: new columns appear, old rows get NULL
                    if col not in have:
                        dtype = con.execute(f'SELECT typeof("{col}") FROM incoming LIMIT 1').fetchone()[0]
                        dtype = "VARCHAR" if dtype == "NULL" else dtype
                        con.execute(f'ALTER TABLE {table} ADD COLUMN "{col}" {dtype}')
                if scope is None:
                    con.execute(f"DELETE FROM {table} WHERE device = ?", [device])
                else:
                    if scope not in rows:
                        raise DevcharError(f"scope column {scope!r} is not in the rows for {table}")
                    values = sorted(rows[scope].astype(str).unique())
                    marks = ", ".join("?" * len(values))
                    con.execute(f'DELETE FROM {table} WHERE device = ? AND CAST("{scope}" AS VARCHAR) IN ({marks})',
                                [device, *values])
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        return len(rows)

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        with self.connect(read_only=self.db_path().exists()) as con:
            return con.execute(sql, params or []).df()

    def device_rows(self, table: str, device: str, where: str = "", params: list | None = None) -> pd.DataFrame:
        """`device`'s rows of `table`, optionally filtered by `where` (with `?` placeholders for `params`)."""
        if table not in TABLES:
            raise DevcharError(f"unknown table {table!r}; expected one of {TABLES}")
        if not self.has_table(table):
            raise DevcharError(f"table {table!r} does not exist yet; materialize it for device {device!r} first")
        df = self.query(f"SELECT * FROM {table} WHERE device = ? {('AND ' + where) if where else ''}",
                        [device, *(params or [])])
        if df.empty:
            raise DevcharError(f"table {table!r} has no rows for device {device!r}; materialize it first")
        return df

    def device_kind(self, device: str) -> str:
        """'cpu' or 'cuda', as device_spec recorded it."""
        return str(self.device_rows("devices", device)["kind"].iloc[0])

    def has_table(self, table: str) -> bool:
        if not self.db_path().exists():
            return False
        got = self.query("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [table])
        return bool(got["n"].iloc[0])
