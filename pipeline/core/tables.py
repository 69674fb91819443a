"""The table contract: the columns each warehouse table may hold, those it must, what they hold.

Every write goes through `check_columns` (resources/warehouse.py refuses a column not named
here, so a column name never reaches SQL unless it is one of these); a file given to
`devchar load` goes through `validate` first: required columns, kinds, finite positive
times, a valid device slug. A sweep that writes a new column adds it here (and to the
README's Tables section). Kinds: "int", "float", "str", "bool" (0 and 1 count as
bools: a JSON-lines file read back turns a bool column with NULLs into 0.0/1.0/NaN); NULL is
allowed in any column except `device` and the checked times.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.core.errors import BadSlugError, ContractError
from pipeline.core.slugs import check_slug

KEY = {"device": "str", "run_id": "str"}
MEASURED = {"median_us": "float", "p20_us": "float", "p80_us": "float", "cv": "float", "reps": "int", "noisy": "bool"}
HARNESS = {"remeasured": "bool", "stalled": "bool", "cpu_util": "float", "timing_method": "str",
           "faults_per_call": "float", "canary_us": "float",
           "visits": "int", "first_us": "float", "suspect": "bool", "probe_us": "float",
           "host_probe_us": "float"}  # added after the first tables: optional
TIMES = {"median_us": ">0", "p20_us": ">0", "p80_us": ">0"}
GEMM = {"op": "str", "dtype": "str", "layout": "str", "batch": "int", "m": "int", "n": "int", "k": "int",
        "kernel": "str", "tile_m": "int", "tile_n": "int", "split_k": "int", "slots": "int", "blocks": "int",
        "waves": "int", "flops": "float", "held_out": "bool"}
SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR", "bool": "BOOLEAN"}  # for all-NULL new columns
WORKLOAD_KEY = {"workload": "str", "config": "str", "batch": "int", "seq": "int", "mode": "str", "dtype": "str"}


@dataclass(frozen=True)
class Table:
    required: dict[str, str]
    optional: dict[str, str] = field(default_factory=dict)
    # column -> ">0" (finite and > 0), ">=0" (finite and >= 0) or ">0?" (NULL or finite and > 0)
    checks: dict[str, str] = field(default_factory=dict)
    checks_where: tuple[str, str] | None = None  # checks apply only to rows where column == value
    optional_pattern: str | None = None  # further optional float columns named like this

    def kind(self, column: str) -> str | None:
        got = self.required.get(column) or self.optional.get(column)
        if got is None and self.optional_pattern and re.fullmatch(self.optional_pattern, column):
            return "float"
        return got


def _sample(required: dict, optional: dict | None = None, checks: dict | None = None) -> Table:
    """A sample table: its own columns, the harness's timing columns, the row key."""
    return Table({**required, **MEASURED, **KEY}, {**HARNESS, **(optional or {})}, {**TIMES, **(checks or {})})


CONTRACT: dict[str, Table] = {
    "devices": Table(
        {"kind": "str", "name": "str", "bandwidth_gbps": "float", **KEY},
        {"slug": "str", "model": "str", "torch_device": "str", "cores": "int", "threads": "int", "sm_count": "int",
         "memory_bytes": "int", "l2_bytes": "int", "torch_version": "str", "cuda_version": "str",
         "driver_version": "str", **{f"peak_flops_{dt}": "float" for dt in ("float32", "tf32", "bfloat16", "float16")},
         "free_us_per_page": "float", "free_from_bytes": "float", "timing_scale": "float"},
        {"bandwidth_gbps": ">0?", "timing_scale": ">0?", **{f"peak_flops_{dt}": ">0?" for dt in ("float32", "tf32", "bfloat16", "float16")},
         "free_us_per_page": ">0?", "free_from_bytes": ">0?"}),
    "gemm_samples": _sample(GEMM, {"grid": "str", "fault_us_per_page": "float", "fault_from_bytes": "float",
                                            "weight_cache_bytes": "float",
                                            "kept_us": "float", "held_us": "float", "held_faults": "float", "repeat_us": "float",
                                            "repeat_stalled": "bool"},
                           {"fault_from_bytes": ">0?"}),
    "utility_samples": _sample({"op": "str", "dtype": "str", "rows": "int", "cols": "int", "shape": "str",
                                "bytes_read": "float", "bytes_written": "float", "flops": "float", "held_out": "bool"},
                               {"cold_us": "float", "evict_bytes": "float", "repeat_us": "float",
                                "repeat_stalled": "bool"}),
    "attention_samples": _sample({"backend": "str", "dtype": "str", "batch": "int", "heads": "int", "seq_q": "int",
                                  "seq_kv": "int", "head_dim": "int", "causal": "bool", "flops": "float",
                                  "held_out": "bool"}, {"grid": "str"}),
    "embedding_samples": _sample({"direction": "str", "B": "int", "E": "int", "T": "int", "L": "int", "D": "int",
                                  "dtype": "str", "shape": "str", "bytes": "float", "index_bytes": "int",
                                  "l2_bytes": "int", "llc_bytes": "int", "units": "int", "rows_per_block": "int",
                                  "held_out": "bool"}, {"cold": "bool", "backward_call_us": "float"},
                                 {"backward_call_us": ">0?"}),  # the fit subtracts it: 0 or less is a broken timing
    "memory_samples": _sample({"op": "str", "dtype": "str", "batch": "int", "m": "int", "n": "int", "k": "int",
                               "shape": "str", "bytes": "float", "held_out": "bool"},
                              {"repeat_us": "float", "repeat_stalled": "bool"}),
    "overhead_samples": Table({**WORKLOAD_KEY, "op": "str", "type": "str", "us": "float", **KEY},
                              {"profiler_overhead_us": "float", "prev_us": "float"}, {"us": ">=0"}),
    "workload_graphs": Table({**WORKLOAD_KEY, "n_ops": "int", "n_top_level": "int", "traced_ms": "float",
                              "graph_json": "str", **KEY}, {"capture_source": "str", "times_source": "str",
                                                          "span_ms": "float", "passes": "int", "pass_spread": "float",
                                                          "probe_us": "float", "host_probe_us": "float"},
                             {"traced_ms": ">0"}),
    "workload_runs": Table({**WORKLOAD_KEY, "measured_ms": "float", "p20_ms": "float", "p80_ms": "float",
                            "cv": "float", "reps": "int", **KEY},
                           {"n_layer": "int", "n_embd": "int", "n_head": "int", "vocab_size": "int",
                            "canary_us": "float", "faults_per_step": "float", "passes": "int",
                            "pass_spread": "float", "probe_us": "float", "host_probe_us": "float"},
                           {"measured_ms": ">0", "p20_ms": ">0", "p80_ms": ">0"}),
    "opencl_launches": Table(
        {"kernel_id": "str", "source_hash": "str", "suite": "str", "family": "str", "kernel_name": "str",
         "source": "str", "arg_method": "str", "args": "str", "gsize": "int", "lsize": "int", "work_groups": "int",
         "compute_units": "int", "input_size": "int", "regime": "str", "arg_plan": "str", "status": "str",
         "error": "str", **MEASURED, **KEY}, dict(HARNESS), TIMES, checks_where=("status", "ok")),
    "reference_timings": _sample({"source": "str", "op": "str", "dtype": "str", "batch": "int", "m": "int",
                                  "n": "int", "k": "int", "kernel": "str"}),
    "gemm_config_samples": _sample(
        {**GEMM, "bias": "bool"},
        {"tile_source": "str", "config_source": "str", "algo_id": "int", "tile_id": "int", "tile_rows": "int",
         "tile_cols": "int", "stages_id": "int", "stages": "str", "reduction": "int", "swizzle": "int",
         "custom": "int", "inner_shape": "int", "cluster_shape": "int", "lt_waves_count": "float",
         "lt_workspace_bytes": "int", "lt_kernel": "str", "torch_kernel": "str", "selection_match": "bool",
         "cublaslt_version": "int"}),
    "gemm_config_choices": Table(
        {"op": "str", "layout": "str", "bias": "bool", "dtype": "str", "batch": "int", "m": "int", "n": "int",
         "k": "int", "kernel": "str", **KEY},
        {"tile_m": "int", "tile_n": "int", "split_k": "int", "swept": "bool", "cublaslt_version": "int"}),
    "predictions": Table(
        {**WORKLOAD_KEY, "predictor": "str", "predicted_ms": "float", "measured_ms": "float", "rel_err": "float",
         **KEY},
        {"kernel_only_ms": "float", "active_measured_ms": "float", "bound": "str", "priced_share": "float",
         "dropped_share": "float"}, optional_pattern=r"pred_[a-z0-9_]+_ms"),  # pred_<layer type>_ms
    "model_errors": Table({"model": "str", "layer_type": "str", "dtype": "str", "n": "int", "mean_rel_err": "float",
                           **KEY}, {"max_rel_err": "float", "median_rel_err": "float"}),
    "shape_advice": Table(
        {"model": "str", "dimension": "str", "original": "str", "proposed": "str", "params_change": "float",
         "predicted_speedup": "float", **KEY},
        {"measured_speedup": "float", "measured_p20": "float", "measured_p80": "float", "measured_layers": "int",
         "predicted_at_depth": "float", "verdict": "str", "speedup_equal_params": "float", "source": "str",
         "note": "str", "dtype": "str", "batch": "int", "seq": "int"},
        {"predicted_speedup": ">0", "measured_speedup": ">0?"}),
    "drift": Table(
        {"kind": "str", "source": "str", "op": "str", "dtype": "str", "points": "int", "flagged": "bool", **KEY},
        {"median_ratio": "float", "moved_share": "float", "error_previous_heldout": "float",
         "error_new_heldout": "float", "previous_run_id": "str"}),
}


def contract(table: str) -> Table:
    if table not in CONTRACT:
        raise ContractError(f"unknown table {table!r}; expected one of {sorted(CONTRACT)}")
    return CONTRACT[table]


_IS = {
    "bool": lambda v: isinstance(v, (bool, np.bool_)) or isinstance(v, (int, float, np.number)) and v in (0, 1),
    "int": lambda v: (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                      or isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer()),
    "float": lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)),
    "str": lambda v: isinstance(v, str),
}


def _first_misfit(values: pd.Series, kind: str):
    """The first non-null value in `values` that is not of `kind`, or None when all fit."""
    s = values.dropna()
    dt = s.dtype
    numeric = pd.api.types.is_numeric_dtype(dt) and not pd.api.types.is_bool_dtype(dt)
    if (kind == "float" and numeric or kind == "int" and pd.api.types.is_integer_dtype(dt)
            or kind == "bool" and pd.api.types.is_bool_dtype(dt) or kind == "str" and isinstance(dt, pd.StringDtype)):
        return None
    return next((v for v in s.tolist() if not _IS[kind](v)), None)


def check_columns(table: str, rows: pd.DataFrame, source: str = "") -> None:
    """Every column of `rows` is in `table`'s contract and holds values of its kind."""
    spec, where = contract(table), f"{source}: " if source else ""
    bad = [c for c in rows.columns if not isinstance(c, str) or spec.kind(c) is None]
    if bad:
        raise ContractError(f"{where}{table} has no column(s) {bad}; allowed: "
                            f"{sorted({**spec.required, **spec.optional})}"
                            + (f" and {spec.optional_pattern}" if spec.optional_pattern else ""))
    for col in rows.columns:
        misfit = _first_misfit(rows[col], spec.kind(col))
        if misfit is not None:
            raise ContractError(f"{where}{table}.{col} holds {misfit!r}; expected {spec.kind(col)} values")


def _check_values(table: str, rows: pd.DataFrame, where: str) -> None:
    spec = contract(table)
    if spec.checks_where:
        col, value = spec.checks_where
        rows = rows[rows[col] == value]
    for col, rule in spec.checks.items():
        if col not in rows:
            continue
        vals = pd.to_numeric(rows[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(vals) & ((vals >= 0) if rule == ">=0" else (vals > 0))
        if rule == ">0?":
            ok |= rows[col].isna().to_numpy()
        if not ok.all():
            i = int(np.argmin(ok))
            need = "a finite number >= 0" if rule == ">=0" else "a finite number > 0"
            raise ContractError(f"{where}{table}.{col} row {rows.index[i]}: {rows[col].tolist()[i]!r} is not {need}")


def validate(table: str, rows: pd.DataFrame, source: str = "") -> None:
    """The whole contract: known columns of the right kinds, every required column, finite
    positive times, and a valid device slug on every row. ContractError names source, column
    and value."""
    spec, where = contract(table), f"{source}: " if source else ""
    if rows.empty:
        raise ContractError(f"{where}{table} has no rows")
    check_columns(table, rows, source)
    missing = [c for c in spec.required if c not in rows]
    if missing:
        raise ContractError(f"{where}{table} lacks required column(s) {missing}")
    empty = rows["device"].isna() | (rows["device"].astype(str) == "")
    if empty.any():
        raise ContractError(f"{where}{table}.device row {empty.idxmax()} is empty")
    for device in rows["device"].unique():
        try:
            check_slug(device)
        except BadSlugError as exc:
            raise ContractError(f"{where}{table}.device: {exc}") from None
    _check_values(table, rows, where)
