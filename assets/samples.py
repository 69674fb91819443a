"""The measured tables, declared in one place: device_spec (devices) and every sample table.

Each sample asset (@sample_asset, assets/factories.py) asks the `device_runner` resource to
run its sweep where the partition's device is, replaces that device's rows in the DuckDB
table of the asset's name, checks the timings, and reports `rows`, what its function below
returns (a summary, plots) and `dagster/row_count`. The function's docstring describes the
asset. The sweeps themselves live in the engine (pipeline/sweeps, pipeline/opencl/sweep).

Sweeps that fill two tables are multi-assets of their own: overhead_samples and
workload_graphs (assets/overheads.py), gemm_config_samples and gemm_config_choices
(assets/gemm_configs.py).
"""
import os

import pandas as pd

import dagster as dg
from assets.common import device_check, image_md, md_table, metadata_table, rounded, row_count, save_plot
from assets.factories import CHARACTERIZE, sample_asset, timing_checks
from assets.opencl import LAUNCH_CHECKS, launch_report
from pipeline.analysis.drift import ALL, devices_verdict
from pipeline.analysis.plots import (attention_seq_scan_plot, attention_throughput_vs_seq, latency_vs_bytes,
                                    throughput_vs_k)
from pipeline.analysis.run_report import noisy_shares
from pipeline.orchestration.partitions import devices
from pipeline.predict.attention import BASE_GRID, SCAN_GRID, fit_alignment, grid_of
from resources.devices import DeviceRunner
from resources.quality import QualityGates
from resources.warehouse import DuckDBWarehouse


@dg.asset(partitions_def=devices, group_name=CHARACTERIZE, kinds={"pytorch", "duckdb"})
def device_spec(context: dg.AssetExecutionContext, device_runner: DeviceRunner,
                warehouse: DuckDBWarehouse) -> dg.MaterializeResult:
    """The device: identity, versions, and measured peak FLOP/s per dtype and copy bandwidth."""
    df = device_runner.run(context, "device", context.partition_key)
    written = warehouse.replace_partition("devices", context.partition_key, df)
    row = df.iloc[0].dropna().to_dict()
    return dg.MaterializeResult(metadata={"spec": dg.MetadataValue.json({k: str(v) for k, v in row.items()}),
                                          **row_count(written)})


@sample_asset(sweep="gemm")
def gemm_samples(df: pd.DataFrame, device: str) -> dict:
    """GEMM timings (PM2Lat III-C): K over powers of two at whole waves, plus held-out random shapes."""
    # the whole-wave grid alone: the other grids' rows (aspect, twins, batch) are not whole waves
    png = throughput_vs_k(df[df["grid"].fillna("waves") == "waves"] if "grid" in df else df[~df["held_out"]])
    save_plot(png, device, "throughput_vs_k")
    summary = df.groupby(["op", "dtype", "held_out"]).agg(rows=("k", "size"), kernels=("kernel", "nunique"),
                                                          median_us=("median_us", "median")).reset_index()
    return {"held_out_rows": int(df["held_out"].sum()), "summary": md_table(summary),
            "throughput_vs_k": image_md(png, "Throughput vs K (whole waves)")}


@sample_asset(sweep="utility")
def utility_samples(df: pd.DataFrame, device: str) -> dict:
    """Memory-bound ops (activations, add/mul, dropout, softmax, norms, embedding, copy) with bytes and flops."""
    gbps = (df["bytes_read"] + df["bytes_written"]) / df["median_us"] / 1e3
    summary = df.assign(gbps=gbps).groupby(["op", "dtype"]).agg(rows=("op", "size"), best_gbps=("gbps", "max"),
                                                                median_us=("median_us", "median")).reset_index()
    png = latency_vs_bytes(df)
    save_plot(png, device, "utility_latency_vs_bytes")
    return {"summary": md_table(summary), "latency_vs_bytes": image_md(png, "Latency vs bytes moved")}


@sample_asset(sweep="attention")
def attention_samples(df: pd.DataFrame, device: str) -> dict:
    """SDPA timings per backend (flash, math; efficient and cudnn on CUDA): seq x batch*heads grid per
    head_dim and causal flag, plus held-out random shapes; on a CPU, a scan of seq for the kv
    alignment period and, where there is one, the grid again at seq - 1."""
    grid = grid_of(df)
    png = attention_throughput_vs_seq(df[grid == BASE_GRID])
    save_plot(png, device, "attention_throughput_vs_seq")
    summary = (df.assign(tflops=df["flops"] / df["median_us"] / 1e6, grid=grid)
               .groupby(["backend", "dtype", "grid"])
               .agg(rows=("seq_q", "size"), best_tflops=("tflops", "max"), median_us=("median_us", "median"))
               .reset_index())
    out = {"held_out_rows": int(df["held_out"].sum()), "backends": ", ".join(sorted(df["backend"].unique())),
           "summary": md_table(summary),
           "throughput_vs_seq": image_md(png, "Attention throughput vs seq (smallest batch)")}
    scan = df[grid == SCAN_GRID]
    if len(scan):
        alignment = fit_alignment(scan)
        out["kv_alignment_period"] = ", ".join(f"{b} {dt}: {alignment.get((b, dt), {}).get('period', 'none')}"
                                               for (b, dt), _ in scan.groupby(["backend", "dtype"]))
        scan_png = attention_seq_scan_plot(scan, alignment)
        save_plot(scan_png, device, "attention_seq_scan")
        out["seq_scan"] = image_md(scan_png, "Attention time vs seq: the kv alignment scan")
    return out


def _kernel_summary(df: pd.DataFrame, kernel: str) -> dict:
    """The DLRM paper's kernel tables (section III-B): rows and median time per kernel, dtype, split."""
    summary = df.groupby([kernel, "dtype", "held_out"]).agg(rows=("median_us", "size"),
                                                            median_us=("median_us", "median")).reset_index()
    return {"summary": md_table(summary)}


@sample_asset(sweep="embedding")
def embedding_samples(df: pd.DataFrame, device: str) -> dict:
    """Batched EmbeddingBag (sum) forward and backward over B, E, T, L, D."""
    return _kernel_summary(df, "direction")


@sample_asset(sweep="memory")
def memory_samples(df: pd.DataFrame, device: str) -> dict:
    """concat, memcpy (H2D on CUDA, D2D), batched transpose, tril forward/backward."""
    return _kernel_summary(df, "op")


@sample_asset(sweep="workloads", checks=timing_checks("measured_ms"))
def workload_runs(df: pd.DataFrame, device: str) -> dict:
    """Real measured GPT-2-family forward passes: 5 warm-up, 25 timed repetitions, median (PM2Lat)."""
    return {"runs": md_table(df[["config", "batch", "seq", "measured_ms", "p20_ms", "p80_ms", "cv"]])}


@sample_asset(sweep="opencl", checks=LAUNCH_CHECKS, kinds=frozenset({"opencl", "duckdb"}))
def opencl_launches(df: pd.DataFrame, device: str) -> dict:
    """One row per OpenCL launch: kernel source, arguments, gsize/lsize, status and timings."""
    return launch_report(df)


@dg.asset(partitions_def=devices, group_name=CHARACTERIZE, kinds={"duckdb"},
          deps=[gemm_samples, utility_samples, attention_samples, embedding_samples, memory_samples, workload_runs],
          check_specs=[device_check(
              "sweep_noise", "sweep_quality",
              description="share of each sample table's rows still noisy after one re-measure <= "
                          "max_noisy_share (quality_gates; $DEVCHAR_MAX_NOISY_SHARE, default 0.25): one "
                          "verdict per device run, naming the tables over it"),
              device_check(
              "device_drift", "sweep_quality",
              description="the device as a whole did not change since its previous calibration: fewer than "
                          "two of the sample tables re-measured in this run have a flagged `drift` check; a "
                          "single table moving is a slow spell of a shared machine, not a device")])
def sweep_quality(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse,
                  quality_gates: QualityGates) -> dg.MaterializeResult:
    """How noisy this device's sweeps were, once per run: per sample table the share of rows
    still noisy after one re-measure and the share that stalled waiting for a core, and the
    load average when the sweeps finished. On a shared machine this is one warning a run, not
    one per table."""
    device, gates = context.partition_key, quality_gates.gates()
    shares = noisy_shares(warehouse, device)
    table = pd.DataFrame([{"table": t, "noisy_share": n, "stalled_share": st} for t, (n, st) in shares.items()])
    over = [f"{t} {n:.0%}" for t, (n, _) in shares.items() if n > gates.max_noisy_share]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    changed, flagged, compared = device_drift_of(warehouse, device, context.run.run_id[:12])
    return dg.MaterializeResult(
        metadata={"noise": metadata_table(table, pct=["noisy_share", "stalled_share"]),
                  "load_average_1m": rounded(load)},
        check_results=[dg.AssetCheckResult(
            check_name="sweep_noise", passed=not over, severity=dg.AssetCheckSeverity.WARN,
            metadata={"noisy_share": "; ".join(over) or "none over the gate",
                      "max_noisy_share": gates.max_noisy_share, "load_average_1m": rounded(load)}),
            dg.AssetCheckResult(
            check_name="device_drift", passed=not changed, severity=dg.AssetCheckSeverity.WARN,
            metadata={"tables_flagged": ", ".join(flagged) or "none",
                      "tables_compared": ", ".join(compared) or "none (a first calibration)"})])


def device_drift_of(warehouse: DuckDBWarehouse, device: str, run_id: str) -> tuple[bool, list[str], list[str]]:
    """devices_verdict over the pooled drift rows this run's sample assets wrote."""
    if not warehouse.has_table("drift"):
        return False, [], []
    pooled = warehouse.query("SELECT source, flagged, median_ratio FROM drift WHERE device = ? AND run_id = ? "
                             "AND kind = 'samples' AND op = ? AND dtype = ?", [device, run_id, ALL, ALL])
    return devices_verdict(pooled)
