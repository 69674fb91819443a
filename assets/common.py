"""Small helpers the assets share: per-device checks, images and tables in metadata, row counts,
plots, data hashes."""
from __future__ import annotations

import base64
import hashlib
import warnings

import dagster as dg
import pandas as pd

from pipeline.core.config import devchar_home
from pipeline.core.slugs import check_slug, under
from pipeline.orchestration.partitions import devices


def device_check(name: str, asset: str, **kwargs) -> dg.AssetCheckSpec:
    """A check on a device-partitioned asset, recorded per device partition: each device's
    result is its own (the UI's "Partition" column shows the device), so a second device's
    evaluation never replaces the first's.

    `AssetCheckSpec(partitions_def=...)` is a *preview* API in dagster 1.13.27 (the constructor
    calls `preview_warning`; it may change in a patch release). What devchar relies on — the
    evaluation of a check whose spec has the asset's partitions_def carries the step's partition
    key (dagster/_core/definitions/asset_checks/asset_check_result.py) and can be queried per
    partition — is tested in tests/test_partitioned_checks.py. The warning is silenced here
    only, so every `devchar` command does not print it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, partitions_def=devices, **kwargs)


def image_md(png: bytes, title: str) -> dg.MetadataValue:
    """A PNG embedded in markdown, so the Dagster UI shows it inline."""
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})")


def save_plot(png: bytes, device: str, name: str):
    path = under(devchar_home() / "plots", check_slug(device, "partition key"), f"{name}.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def data_hash(df: pd.DataFrame) -> str:
    cols = sorted(c for c in df.columns if c != "run_id")
    h = pd.util.hash_pandas_object(df[cols].sort_values(cols[:4]).reset_index(drop=True), index=False)
    return hashlib.sha256(h.to_numpy().tobytes()).hexdigest()[:16]


def md_table(df: pd.DataFrame, floatfmt: str = ".3g") -> dg.MetadataValue:
    return dg.MetadataValue.md(df.to_markdown(index=False, floatfmt=floatfmt) if not df.empty else "_no rows_")


def row_count(n: int) -> dict:
    """Dagster's standard `dagster/row_count` (the asset catalog's row count): the rows a
    materialization wrote to its DuckDB table for the partition's device."""
    return {"dagster/row_count": dg.MetadataValue.int(int(n))}
