"""The measured tables: device_spec (devices), gemm_samples, utility_samples, workload_runs.

Each asset asks the `device_runner` resource to run its sweep where the partition's device
is, replaces that device's rows in DuckDB, and reports row counts, a preview and plots.
"""

import numpy as np
import pandas as pd

import dagster as dg
from assets.common import image_md, md_table, save_plot
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import latency_vs_bytes, throughput_vs_k
from pipeline.analysis.quality import Gates
from resources.devices import DeviceRunner
from resources.quality import QualityGates
from resources.warehouse import DuckDBWarehouse

GROUP = "characterize"


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"pytorch", "duckdb"})
def device_spec(context: dg.AssetExecutionContext, device_runner: DeviceRunner,
                warehouse: DuckDBWarehouse) -> dg.MaterializeResult:
    """The device: identity, versions, and measured peak FLOP/s per dtype and copy bandwidth."""
    df = device_runner.run(context, "device", context.partition_key)
    warehouse.replace_partition("devices", context.partition_key, df)
    row = df.iloc[0].dropna().to_dict()
    return dg.MaterializeResult(metadata={"spec": dg.MetadataValue.json({k: str(v) for k, v in row.items()})})


def sample_checks(name: str) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec("finite_positive", asset=name, blocking=True,
                          description="every timing is finite and > 0"),
        dg.AssetCheckSpec("sweep_noise", asset=name,
                          description="share of rows still noisy after a re-measure <= max_noisy_share "
                                      "(quality_gates; $DEVCHAR_MAX_NOISY_SHARE, default 0.25)"),
    ]


def check_results(df: pd.DataFrame, time_col: str, gates: Gates) -> list[dg.AssetCheckResult]:
    """`gates`: the run's thresholds (the quality_gates resource)."""
    t = df[time_col].to_numpy(float)
    bad = int((~np.isfinite(t) | (t <= 0)).sum())
    noisy = float((df["cv"] > 0.1).mean()) if "noisy" not in df else float(df["noisy"].mean())
    return [
        dg.AssetCheckResult(check_name="finite_positive", passed=bad == 0, metadata={"bad_rows": bad}),
        dg.AssetCheckResult(check_name="sweep_noise", passed=noisy <= gates.max_noisy_share,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"noisy_share": noisy, "max_noisy_share": gates.max_noisy_share}),
    ]


def store_sweep(context, device_runner, warehouse, sweep: str, table: str) -> pd.DataFrame:
    df = device_runner.run(context, sweep, context.partition_key)
    warehouse.replace_partition(table, context.partition_key, df)
    return df


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"pytorch", "duckdb"}, deps=[device_spec],
          check_specs=sample_checks("gemm_samples"))
def gemm_samples(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse,
                 quality_gates: QualityGates) -> dg.MaterializeResult:
    """GEMM timings (PM2Lat III-C): K over powers of two at whole waves, plus held-out random shapes."""
    df = store_sweep(context, device_runner, warehouse, "gemm", "gemm_samples")
    train = df[~df["held_out"]]
    png = throughput_vs_k(train)
    save_plot(png, context.partition_key, "throughput_vs_k")
    summary = df.groupby(["op", "dtype", "held_out"]).agg(rows=("k", "size"), kernels=("kernel", "nunique"),
                                                          median_us=("median_us", "median")).reset_index()
    return dg.MaterializeResult(
        metadata={"rows": len(df), "held_out_rows": int(df["held_out"].sum()), "summary": md_table(summary),
                  "throughput_vs_k": image_md(png, "Throughput vs K (whole waves)")},
        check_results=check_results(df, "median_us", quality_gates.gates()))


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"pytorch", "duckdb"}, deps=[device_spec],
          check_specs=sample_checks("utility_samples"))
def utility_samples(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse,
                    quality_gates: QualityGates) -> dg.MaterializeResult:
    """Memory-bound ops (activations, add/mul, dropout, softmax, norms, embedding, copy) with bytes and flops."""
    df = store_sweep(context, device_runner, warehouse, "utility", "utility_samples")
    gbps = (df["bytes_read"] + df["bytes_written"]) / df["median_us"] / 1e3
    summary = df.assign(gbps=gbps).groupby(["op", "dtype"]).agg(rows=("op", "size"), best_gbps=("gbps", "max"),
                                                                median_us=("median_us", "median")).reset_index()
    png = latency_vs_bytes(df)
    save_plot(png, context.partition_key, "utility_latency_vs_bytes")
    return dg.MaterializeResult(metadata={"rows": len(df), "summary": md_table(summary),
                                          "latency_vs_bytes": image_md(png, "Latency vs bytes moved")},
                                check_results=check_results(df, "median_us", quality_gates.gates()))


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"pytorch", "duckdb"}, deps=[device_spec],
          check_specs=sample_checks("workload_runs"))
def workload_runs(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse,
                  quality_gates: QualityGates) -> dg.MaterializeResult:
    """Real measured GPT-2-family forward passes: 5 warm-up, 25 timed repetitions, median (PM2Lat)."""
    df = store_sweep(context, device_runner, warehouse, "workloads", "workload_runs")
    preview = df[["config", "batch", "seq", "measured_ms", "p20_ms", "p80_ms", "cv"]]
    return dg.MaterializeResult(metadata={"rows": len(df), "runs": md_table(preview)},
                                check_results=check_results(df, "measured_ms", quality_gates.gates()))
