"""Host overheads (DLRM paper §III-C): overhead_samples (+ workload_graphs, from the same
traces) -> overhead_model, the shared table `devchar predict` uses for a never-seen model."""
import pandas as pd

import dagster as dg
from assets.common import calibration_usual, data_hash, device_check, image_md, md_table, row_count, save_plot
from assets.samples import device_spec
from pipeline.analysis.plots import t1_after_op_plot
from pipeline.orchestration.partitions import devices
from pipeline.predict.overheads import TYPES, OverheadModel
from pipeline.predict.store import new_version
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse


@dg.multi_asset(
    specs=[dg.AssetSpec("overhead_samples", deps=[device_spec], group_name="characterize",
                        kinds={"pytorch", "duckdb"},
                        description="T1–T5 host gaps from profiler traces of every profiled workload."),
           dg.AssetSpec("workload_graphs", deps=[device_spec], group_name="characterize", kinds={"pytorch", "duckdb"},
                        description="The execution graph (ops, shapes, nesting, data deps) of each workload.")],
    partitions_def=devices,
    check_specs=[device_check("overheads_finite", "overhead_samples", blocking=True,
                              description="every gap is a finite number >= 0 of a known type (T1-T5)")])
def overhead_traces(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse):
    device = context.partition_key
    anchor = calibration_usual(warehouse, device, "traces", context.log.info)
    tables = device_runner.run_tables(context, "traces", device, **anchor)
    samples, graphs = tables["overhead_samples"], tables["workload_graphs"]
    written = {t: warehouse.replace_partition(t, device, rows)
               for t, rows in (("overhead_samples", samples), ("workload_graphs", graphs))}
    summary = samples.groupby(["workload", "type"])["us"].agg(["count", "mean", "median"]).reset_index()
    us = samples["us"]
    ok = bool(us.notna().all() and (us >= 0).all() and samples["type"].isin(TYPES).all())
    ovh = float(samples["profiler_overhead_us"].iloc[0]) if "profiler_overhead_us" in samples else float("nan")
    yield dg.MaterializeResult(asset_key="overhead_samples", metadata={
        "rows": len(samples), "profiler_overhead_us_per_event": ovh, "per_workload": md_table(summary),
        **row_count(written["overhead_samples"])})
    yield dg.MaterializeResult(asset_key="workload_graphs", metadata={
        "rows": len(graphs), "graphs": md_table(graphs[["workload", "config", "batch", "seq", "mode", "n_ops",
                                                        "n_top_level", "traced_ms"]]),
        **row_count(written["workload_graphs"])})
    yield dg.AssetCheckResult(asset_key="overhead_samples", check_name="overheads_finite", passed=ok,
                              metadata={"types": sorted(samples["type"].unique())})


@dg.asset(partitions_def=devices, group_name="fit", kinds={"numpy", "mlflow"}, deps=["overhead_samples"])
def overhead_model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                   model_store: ModelStore) -> dg.MaterializeResult:
    """Mean overhead per (op type, T-type) after 1.5-IQR outlier removal, pooled over all traced
    workloads (the paper's shared overhead database); per-workload tables are fitted where a
    prediction needs them (leave-one-workload-out, graph_predict.py)."""
    device = context.partition_key
    samples = warehouse.device_rows("overhead_samples", device)
    model = OverheadModel.fit(samples)
    dhash = data_hash(samples)
    version = new_version(dhash)
    kept = sum(n for per_type in model.counts.values() for n in per_type.values())  # after the fit's IQR filter
    meta = {"device": device, "version": version, "data_hash": dhash, "samples": len(samples),
            "kept_after_iqr": kept, "workloads": sorted(samples["config"].unique()), "heldout_check_passed": True}
    path = model_store.save(device, "overhead_model", model, meta, version)
    per_type = pd.DataFrame([{"type": t, "shared_mean_us": v} for t, v in model.shared.items()])
    run = tracking.log_fit("overhead_model", device, {"samples": len(samples), "version": version},
                           {f"shared_{t}_us": v for t, v in model.shared.items()} | {"outlier_share": 1 - kept / len(samples)},
                           {"data_hash": dhash}, [path / "model.json"], store_version=version, store_path=path)
    after = {}
    if model.t1_after is not None:  # T1 after a long op: the measured slowdown per duration bin
        a = model.t1_after
        png = t1_after_op_plot(samples[(samples["type"] == "T1") & samples["prev_us"].notna()], a, model.shared["T1"])
        save_plot(png, device, "t1_after_op")
        after = {"t1_after_previous_op": md_table(pd.DataFrame(
            {"previous op from (us)": 2.0 ** a.log2_us, "T1 slowdown": a.slowdown.round(2)})),
            "t1_after_op_plot": image_md(png, "T1 gap vs the previous op's duration")}
    return dg.MaterializeResult(metadata={
        "version": version, "path": dg.MetadataValue.path(str(path)), "mlflow_run_id": run,
        "mlflow_run": dg.MetadataValue.url(tracking.run_url(run)),
        "op_types": len(model.individual), "outliers_removed": len(samples) - kept, "shared_means": md_table(per_type),
        **after})
