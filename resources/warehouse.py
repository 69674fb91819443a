"""DuckDB warehouse: one embedded file; a device partition's rows are replaced in one transaction."""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import duckdb
import pandas as pd
from dagster._utils.backoff import backoff
from dagster_duckdb import DuckDBResource
from pydantic import Field, field_validator

from pipeline.core.config import duckdb_path
from pipeline.core.errors import DevcharError, WarehouseLockedError
from pipeline.core.slugs import check_slug
from pipeline.core.tables import SQL_TYPES, check_columns, contract
from resources.env import as_text, number

TABLES = ("devices", "gemm_samples", "utility_samples", "attention_samples", "embedding_samples", "memory_samples",
          "overhead_samples", "workload_graphs", "opencl_launches", "workload_runs", "predictions", "model_errors",
          "reference_timings", "gemm_config_samples", "gemm_config_choices", "shape_advice",
          "drift")


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


# `devchar sql`'s connection (DuckDB 1.x settings): external access covers COPY TO/FROM, ATTACH,
# EXPORT, the file readers and extension INSTALL/LOAD; locked, no statement can SET it back.
USER_QUERY_CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
                     "autoload_known_extensions": False, "lock_configuration": True}


def quote(name: str) -> str:
    """A SQL identifier, double-quoted, any embedded quote doubled."""
    return '"' + str(name).replace('"', '""') + '"'


def _typed_select(table: str, columns) -> str:
    types = COLUMN_TYPES.get(table, {})
    return ", ".join(f"CAST({quote(c)} AS {types[c]}) AS {quote(c)}" if c in types else quote(c) for c in columns)


HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


def locked_message(path: Path, duckdb_message: str, waited_s: float) -> str:
    """One line for a lock wait given up: who holds the file when DuckDB says, and what to do."""
    got = HOLDER.search(duckdb_message)
    holder = f"{got.group(1)} (PID {got.group(2)})" if got else "another process (DuckDB did not say which)"
    return (f"{path} is locked by {holder}; waited {waited_s:g} s (DEVCHAR_LOCK_WAIT_S). DuckDB allows one writer "
            "per file and a read-write client shuts every other process out: close that client, or open the file "
            "read-only (duckdb -readonly)")


class _Locked(Exception):
    """A connection refused because another process holds the file: the one error retried."""


def _open(path: str, read_only: bool, config: dict) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(path, read_only=read_only, config=config)
    except duckdb.IOException as exc:
        if "lock" not in str(exc).lower():
            raise
        raise _Locked(str(exc)) from exc


def lock_pauses(wait_s: float) -> list[float]:
    """The pauses between connection attempts: 0.05 s doubling to at most 2 s, adding up to wait_s."""
    pauses, pause, left = [], 0.05, wait_s
    while left > 1e-9:
        pauses.append(min(pause, left))
        left, pause = left - pauses[-1], min(pause * 2, 2.0)
    return pauses


class DuckDBWarehouse(DuckDBResource):
    """Tables named in ARCHITECTURE.md; every row carries `device` and `run_id`.

    A DuckDBResource (its `database` and `connection_config`; get_connection() opens the
    warehouse read-write), whose connections wait for another process's lock as
    DuckDBResource's do, through dagster's backoff(), but on the warehouse's own terms:
    DuckDBResource.get_connection retries a fixed 10 times (0.1 s doubling, about 102 s), on
    any IOException, read-write only, and gives up with DuckDB's bare error. Here the wait is
    lock_wait_s (DEVCHAR_LOCK_WAIT_S, 60 s), only a lock conflict is retried, a read-only
    connection stays read-only, and giving up names the process that holds the file."""

    ENV: ClassVar[dict[str, str]] = {"lock_wait_s": "DEVCHAR_LOCK_WAIT_S"}  # resources/env.py

    database: str = Field(default="", description="the DuckDB file; empty: $DEVCHAR_HOME/devchar.duckdb")
    # seconds to wait for another process's lock before giving up (a str: an EnvVar feeds it)
    lock_wait_s: str = "60"

    _seconds = field_validator("lock_wait_s", mode="before")(as_text)  # lock_wait_s=0.5 as "0.5"

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def db_path(self) -> Path:
        return Path(self.database) if self.database else duckdb_path()

    @contextmanager
    def get_connection(self):
        """DuckDBResource's read-write connection, to db_path(), waiting as connect() does."""
        with self.connect() as con:
            yield con

    @contextmanager
    def connect(self, read_only: bool = False, config: dict | None = None):
        """Opens the file, waiting (with back-off, up to lock_wait_s) while another process holds
        it: DuckDB allows one writer per file, and a process that has it open read-write shuts
        every other process out. Giving up raises WarehouseLockedError naming the holder.
        Read-only never creates anything: no file, no directory. `config` adds DuckDB settings
        to connection_config's."""
        path = self.db_path()
        if read_only and not path.is_file():
            raise DevcharError(f"no warehouse at {path}; run `devchar run` or `devchar load` first")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        wait_s = number(self, "lock_wait_s")
        pauses = lock_pauses(wait_s)
        settings = {**self.connection_config, **(config or {})}
        try:
            con = backoff(_open, retry_on=(_Locked,), args=(str(path), read_only, settings), max_retries=len(pauses),
                          delay_generator=(p for p in pauses))
        except _Locked as exc:
            raise WarehouseLockedError(locked_message(path, str(exc), wait_s)) from exc.__cause__
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
        return self.replace_partitions([(table, device, rows, scope)])

    def replace_partitions(self, parts: list[tuple]) -> int:
        """Several (table, device, rows[, scope]) replacements in ONE transaction: all land or none.

        Every frame is checked first (known table, a valid device slug naming every row, only
        the contract's columns, of their kinds: pipeline/core/tables.py); nothing touches the
        file until all pass. Column names reach SQL only quoted, and only contract names.
        """
        parts = [(t, d, r, (s[0] if s else None)) for t, d, r, *s in parts]
        for table, device, rows, scope in parts:
            if table not in TABLES:
                raise DevcharError(f"unknown table {table!r}; expected one of {TABLES}")
            check_slug(device)
            if rows.empty:
                raise DevcharError(f"refusing to replace {table} for device {device!r} with zero rows")
            if "device" not in rows or set(rows["device"].unique()) != {device}:
                raise DevcharError(f"rows for {table} name devices "
                                   f"{sorted(rows.get('device', pd.Series()).unique())}, not the partition {device!r}")
            check_columns(table, rows)
            if scope is not None and scope not in rows:
                raise DevcharError(f"scope column {scope!r} is not in the rows for {table}")
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for i, (table, device, rows, scope) in enumerate(parts):
                    self._replace(con, i, table, device, rows, scope)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return sum(len(p[2]) for p in parts)

    @staticmethod
    def _replace(con, i: int, table: str, device: str, rows: pd.DataFrame, scope: str | None) -> None:
        """One replacement inside the caller's transaction."""
        raw, incoming, tbl = f"raw_incoming_{i}", f"incoming_{i}", quote(table)
        con.register(raw, rows)
        con.execute(f"CREATE TEMP VIEW {incoming} AS SELECT {_typed_select(table, rows.columns)} FROM {raw}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {tbl} AS SELECT * FROM {incoming} LIMIT 0")
        have = {r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE {tbl})").fetchall()}
        for col in rows.columns:  # additive schema change: new columns appear, old rows get NULL
            if col not in have:
                dtype = con.execute(f"SELECT typeof({quote(col)}) FROM {incoming} LIMIT 1").fetchone()[0]
                dtype = SQL_TYPES[contract(table).kind(col)] if dtype == "NULL" else dtype
                con.execute(f"ALTER TABLE {tbl} ADD COLUMN {quote(col)} {dtype}")
        if scope is None:
            con.execute(f"DELETE FROM {tbl} WHERE device = ?", [device])
        else:
            values = sorted(rows[scope].astype(str).unique())
            marks = ", ".join("?" * len(values))
            con.execute(f"DELETE FROM {tbl} WHERE device = ? AND CAST({quote(scope)} AS VARCHAR) IN ({marks})",
                        [device, *values])
        con.execute(f"INSERT INTO {tbl} BY NAME SELECT * FROM {incoming}")

    def user_query(self, sql: str) -> pd.DataFrame:
        """`devchar sql`: exactly one statement, on a read-only connection that can reach nothing
        but the warehouse (no COPY/EXPORT to files, no ATTACH, no read_csv of other files, no
        extension installs: DuckDB's own settings refuse them, and are locked so the statement
        cannot turn them back on). Never creates the database. DuckDB's errors come back as
        one-line DevcharErrors."""
        try:
            with self.connect(read_only=True, config=USER_QUERY_CONFIG) as con:
                n = len(con.extract_statements(sql))
                if n != 1:
                    raise DevcharError(f"expected exactly one SQL statement; got {n}")
                return con.execute(sql).df()
        except duckdb.Error as exc:  # the message's first paragraph (its LINE 1 ... caret part dropped)
            raise DevcharError(" ".join(str(exc).split("\n\n")[0].split())) from exc

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
