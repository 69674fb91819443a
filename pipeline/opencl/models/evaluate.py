"""The paper's evaluation: MAPE on a kernel-disjoint validation split (Table III) and per
benchmark kernel that is never trained on (Table IV), as model_errors rows.

The split keeps every launch of a kernel on one side, and also every launch of a source
that appears under several kernel ids (a duplicated source is the same kernel to a model
that reads the source): kernels are grouped by the connected components of
kernel_id <-> source_hash, and whole groups go to validation.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.errors import DevcharError
from pipeline.predict.compare import table_ii

PAPER_VAL_MAPE = 0.2425  # LLMPerf-2B-400K, Table III
PAPER_BENCH_MAPE = 0.4611  # Table IV average


def ok_launches(df: pd.DataFrame | None) -> pd.DataFrame:
    """The launches a model may learn from: status ok with a positive median time."""
    if df is None or df.empty:
        raise DevcharError("opencl_launches has no rows for this device; materialize opencl_launches first")
    missing = {"status", "median_us", "source", "args", "gsize", "lsize", "kernel_id", "source_hash", "suite"} - set(df)
    if missing:
        raise DevcharError(f"opencl_launches rows lack columns {sorted(missing)}")
    ok = df[(df["status"] == "ok") & (df["median_us"] > 0)]
    if ok.empty:
        statuses = df["status"].value_counts().to_dict()
        raise DevcharError(f"opencl_launches has {len(df)} rows but none with status 'ok' and a positive time "
                           f"(statuses: {statuses})")
    return ok.reset_index(drop=True)


def kernel_groups(df: pd.DataFrame) -> pd.Series:
    """Group label per row: rows sharing a kernel_id or a source_hash (transitively) share a label."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for k, s in zip(df["kernel_id"].astype(str), df["source_hash"].astype(str)):
        parent[find(("k", k))] = find(("s", s))
    return pd.Series([find(("k", k)) for k in df["kernel_id"].astype(str)], index=df.index).map(str)


def split(df: pd.DataFrame, val_frac: float = 0.1, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, validation, benchmark): benchmark-suite rows apart; the rest split 9:1 by kernel group."""
    bench = df[df["suite"] == "benchmark"]
    gen = df[df["suite"] != "benchmark"]
    if gen.empty:
        raise DevcharError("no generated-suite launches to train on (every ok row is a benchmark kernel)")
    groups = kernel_groups(gen)
    order = np.random.default_rng(seed).permutation(sorted(groups.unique()))
    if len(order) < 2:
        raise DevcharError(f"need launches of at least 2 distinct kernels for a kernel-disjoint split; "
                           f"got {len(order)}")
    sizes = groups.value_counts()
    val, n_val = set(), 0
    for g in order[:-1]:  # the last group always stays in training
        if n_val >= val_frac * len(gen):
            break
        val.add(g)
        n_val += sizes[g]
    is_val = groups.isin(val)
    return gen[~is_val], gen[is_val], bench


def error_rows(model: str, val: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """model_errors rows: layer_type 'validation' for the split, the kernel's name per benchmark
    kernel; val and bench carry predicted_us beside median_us. mean_rel_err is MAPE / 100."""
    parts = [val.assign(layer_type="validation")] if len(val) else []
    parts += [bench.assign(layer_type=bench["kernel_name"].astype(str))] if len(bench) else []
    if not parts:
        raise DevcharError(f"{model}: no validation or benchmark launches to evaluate on")
    return table_ii(pd.concat(parts).assign(model=model, dtype="-"))


def summary(errors: pd.DataFrame) -> dict:
    """Validation MAPE and the mean of the per-benchmark-kernel MAPEs (Table IV's 'Average')."""
    val = errors[errors["layer_type"] == "validation"]
    bench = errors[errors["layer_type"] != "validation"]
    return {"val_mape": float(val["mean_rel_err"].iloc[0]) if len(val) else float("nan"),
            "val_n": int(val["n"].sum()), "bench_mape": float(bench["mean_rel_err"].mean()) if len(bench) else
            float("nan"), "bench_kernels": int(len(bench)), "bench_n": int(bench["n"].sum())}
