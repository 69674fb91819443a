"""Small helpers the assets share: per-device checks, images and tables (Dagster tables, markdown)
in metadata, row counts, plots, data hashes."""
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


def metadata_table(df: pd.DataFrame, pct: list[str] | None = None, digits: int = 4) -> dg.MetadataValue:
    """A DataFrame as a Dagster table (typed, sortable columns in the UI). Columns in `pct`
    (default: every `*_rel_err`) are shown as percentages, named "<column> %", to 0.01 %;
    other floats are rounded to `digits` significant digits; NaN is an empty cell."""
    pct = [c for c in df.columns if str(c).endswith("_rel_err")] if pct is None else pct
    kinds, names, cols = {}, {}, {}
    for c in df.columns:
        s = df[c]
        if c in pct:
            names[c], kinds[c] = f"{c} %", "float"
            cols[c] = [None if v != v else round(100 * float(v), 2) for v in s]
        elif pd.api.types.is_bool_dtype(s):
            names[c], kinds[c], cols[c] = str(c), "bool", [bool(v) for v in s]
        elif pd.api.types.is_integer_dtype(s):
            names[c], kinds[c], cols[c] = str(c), "int", [int(v) for v in s]
        elif pd.api.types.is_float_dtype(s):
            names[c], kinds[c] = str(c), "float"
            cols[c] = [None if v != v else float(f"{float(v):.{digits}g}") for v in s]
        else:
            names[c], kinds[c], cols[c] = str(c), "string", [None if v is None else str(v) for v in s]
    schema = dg.TableSchema(columns=[dg.TableColumn(names[c], kinds[c]) for c in df.columns])
    records = [dg.TableRecord({names[c]: cols[c][i] for c in df.columns}) for i in range(len(df))]
    return dg.MetadataValue.table(records=records, schema=schema)


def rounded(x: float, digits: int = 4) -> float:
    """A metric for metadata: `digits` significant digits (0.123456789 -> 0.1235)."""
    x = float(x)
    return x if x != x else float(f"{x:.{digits}g}")


def md_table(df: pd.DataFrame, floatfmt: str = ".3g") -> dg.MetadataValue:
    return dg.MetadataValue.md(df.to_markdown(index=False, floatfmt=floatfmt) if not df.empty else "_no rows_")


def row_count(n: int) -> dict:
    """Dagster's standard `dagster/row_count` (the asset catalog's row count): the rows a
    materialization wrote to its DuckDB table for the partition's device."""
    return {"dagster/row_count": dg.MetadataValue.int(int(n))}


def calibration_usual(warehouse, device: str, sweep: str, log=None) -> dict:
    """{"usual_probes": (GEMM probe, host probe)} for a sweep that tests its spells against the
    device's calibration too (runner.SPELL_ANCHORED): each probe's usual time over the device's
    stored gemm_samples rows, the table most predictions rest on (harness/spells.anchored_usual),
    said to `log` with the run they came from. Stored, not this run's: a run that materializes the
    workload runs without the GEMM sweep scores them against the stored calibration, so that is the
    machine state to test them against. Empty for other sweeps, and where those rows hold no
    readings (a GPU's, or a calibration from before the probes)."""
    from pipeline.core.errors import DevcharError
    from pipeline.harness.spells import usual_of_rows
    from pipeline.runner import SPELL_ANCHORED

    if sweep not in SPELL_ANCHORED:
        return {}
    try:
        rows = warehouse.device_rows("gemm_samples", device)
    except DevcharError:  # no GEMM table yet: the sweep's own readings alone
        return {}
    usual = usual_of_rows(rows.reindex(columns=["probe_us", "host_probe_us"]).to_dict("records"))
    if usual and log:
        runs = ", ".join(sorted(map(str, rows["run_id"].dropna().unique()))) if "run_id" in rows else "?"
        said = ", ".join(f"{name} {'-' if u is None else f'{u:.2f} us'}"
                         for name, u in zip(("GEMM probe", "host probe"), usual))
        log(f"{sweep}: spells also tested against the usual times of {device}'s stored gemm_samples (run {runs}): "
            f"{said}")
    return {"usual_probes": usual} if usual else {}
