"""Predictions through the execution graph and Algorithm 1: dlrm_predictions (DLRM paper
Table V) and the graph rows of transformer_predictions (GPT-2 before/after overheads)."""
import pandas as pd

import dagster as dg
from assets.common import image_md, md_table, row_count, save_plot
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import step_time_vs_batch
from pipeline.predict.graph_predict import free_probe, predict_runs, table_v
from resources.model_store import ModelStore
from resources.warehouse import DuckDBWarehouse

KERNEL_MODELS = ("gemm_model", "utility_model", "embedding_model", "memory_model")


def graph_predictions(warehouse: DuckDBWarehouse, model_store: ModelStore, device: str, workload: str,
                      models=KERNEL_MODELS) -> pd.DataFrame:
    """kernel_only / e2e_individual / e2e_shared rows for every measured run of `workload`."""
    runs = warehouse.device_rows("workload_runs", device, "workload = ?", [workload])
    graphs = warehouse.device_rows("workload_graphs", device)
    samples = warehouse.device_rows("overhead_samples", device)
    loaded = {m: model_store.load(device, m) for m in models}
    synchronous = warehouse.device_kind(device) == "cpu"
    free = free_probe(warehouse.device_rows("devices", device).iloc[0])
    return predict_runs(runs, graphs, samples, loaded, synchronous, free).assign(device=device)


def table_v_metadata(pred: pd.DataFrame, device: str, name: str) -> dict:
    tv = table_v(pred)
    png = step_time_vs_batch(pred)
    save_plot(png, device, name)
    return {"table_v": md_table(tv, ".2%"), "step_time_vs_batch": image_md(png, f"{name}: per-step time vs batch"),
            **{f"{stat}_abs_err_{r.predictor}": float(getattr(r, f"{stat}_abs_err")) for r in tv.itertuples()
               for stat in ("geomean", "mean") if not r.predictor.startswith("active")}}


@dg.asset(partitions_def=devices, group_name="predict", kinds={"numpy", "duckdb"},
          deps=["gemm_model", "utility_model", "embedding_model", "memory_model", "overhead_samples", "workload_runs"],
          automation_condition=dg.AutomationCondition.eager())
def dlrm_predictions(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse,
                     model_store: ModelStore) -> dg.MaterializeResult:
    """Per DLRM config x batch: predicted vs measured training step for kernel_only, e2e_individual
    and e2e_shared (overheads never from the run's own trace), with Table V's geomean/min/max."""
    device = context.partition_key
    pred = graph_predictions(warehouse, model_store, device, "dlrm").assign(run_id=context.run.run_id[:12])
    written = warehouse.replace_partition("predictions", device, pred, scope="workload")
    cols = ["config", "batch", "predictor", "predicted_ms", "measured_ms", "rel_err", "kernel_only_ms",
            "active_measured_ms", "bound", "priced_share"]
    return dg.MaterializeResult(metadata={"rows": len(pred), "predictions": md_table(pred[cols]),
                                          **table_v_metadata(pred, device, "dlrm_step_time_vs_batch"),
                                          **row_count(written)})
