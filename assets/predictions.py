"""Predictions beside measurements: transformer_predictions and the accuracy_report."""

import pandas as pd

import dagster as dg
from assets.common import image_md, md_table, metadata_table, row_count, save_plot
from assets.evaluation import model_evaluation
from assets.graph_predictions import dlrm_predictions, graph_predictions, table_v_metadata
from assets.models import gemm_model, utility_model
from assets.samples import workload_runs
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import predicted_vs_measured
from pipeline.predict.metrics import rel_err
from pipeline.predict.workload import predict_ops
from pipeline.workloads.gpt2 import GPT2Spec, gpt2_ops
from resources.model_store import ModelStore
from resources.warehouse import DuckDBWarehouse

GROUP = "predict"
PREDICTOR = "devchar_kernel_sum"  # PM2Lat: the sum of predicted kernel times, no host overhead


def predict_workload_rows(runs: pd.DataFrame, gemm, utility, bias_copy: bool) -> pd.DataFrame:
    rows = []
    for r in runs.itertuples():
        spec = GPT2Spec(r.config, int(r.n_layer), int(r.n_embd), int(r.n_head), int(r.vocab_size))
        total_us, by_type = predict_ops(gpt2_ops(spec, int(r.batch), int(r.seq), bias_copy=bias_copy), r.dtype,
                                        gemm, utility)
        rows.append({"device": r.device, "workload": r.workload, "config": r.config, "batch": int(r.batch),
                     "seq": int(r.seq), "mode": r.mode, "dtype": r.dtype, "predictor": PREDICTOR,
                     "predicted_ms": total_us / 1e3, "measured_ms": float(r.measured_ms),
                     **{f"pred_{k.lower()}_ms": v / 1e3 for k, v in by_type.items()}})
    out = pd.DataFrame(rows)
    return out.assign(rel_err=rel_err(out["predicted_ms"], out["measured_ms"]))


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"numpy", "duckdb"},
          deps=[gemm_model, utility_model, workload_runs, "overhead_samples"],
          automation_condition=dg.AutomationCondition.eager())
def transformer_predictions(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse,
                            model_store: ModelStore) -> dg.MaterializeResult:
    """GPT-2 forward latency beside the measured run: from the operator list (PM2Lat's kernel
    sum), and from the captured graph before (kernel_only) and after host overheads (Algorithm 1)."""
    device = context.partition_key
    runs = warehouse.device_rows("workload_runs", device, "workload = ?", ["gpt2"])
    kind = warehouse.device_kind(device)
    gemm, utility = model_store.load(device, "gemm_model"), model_store.load(device, "utility_model")
    # CPU addmm copies the bias into the output first; cuBLASLt fuses it into the GEMM epilogue.
    ops = predict_workload_rows(runs, gemm, utility, bias_copy=kind == "cpu")
    graph = graph_predictions(warehouse, model_store, device, "gpt2", models=("gemm_model", "utility_model"))
    pred = pd.concat([ops, graph], ignore_index=True).assign(run_id=context.run.run_id[:12])
    written = warehouse.replace_partition("predictions", device, pred, scope="workload")
    panels = {p: (g["measured_ms"].to_numpy(), g["predicted_ms"].to_numpy()) for p, g in pred.groupby("predictor")}
    png = predicted_vs_measured(panels, unit="ms")
    save_plot(png, device, "transformer_predicted_vs_measured")
    table = pred[["config", "batch", "seq", "predictor", "predicted_ms", "measured_ms", "rel_err"]]
    return dg.MaterializeResult(metadata={
        "rows": len(pred), "mean_abs_rel_err": dg.MetadataValue.json(
            {p: float(g["rel_err"].abs().mean()) for p, g in pred.groupby("predictor")}),
        "predictions": md_table(table), "predicted_vs_measured": image_md(png, "GPT-2: predicted vs measured"),
        **table_v_metadata(graph, device, "gpt2_step_time_vs_batch"), **row_count(written)})


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"duckdb"},
          deps=[transformer_predictions, dlrm_predictions, model_evaluation],
          automation_condition=dg.AutomationCondition.eager())
def accuracy_report(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse) -> dg.MaterializeResult:
    """PM2Lat Table II (per layer type x dtype, held-out shapes, devchar and baselines) beside
    Table IV (per workload x batch): what `devchar run` prints."""
    device = context.partition_key
    errors = warehouse.device_rows("model_errors", device)
    per_layer = errors.pivot_table(index=["layer_type", "dtype"], columns="model", values="mean_rel_err")
    pred = warehouse.device_rows("predictions", device)
    per_workload = pred[["workload", "config", "batch", "seq", "predictor", "predicted_ms", "measured_ms", "rel_err"]]
    # one panel per workload and predictor: every run of the device, predicted against measured
    panels = {f"{w} {p}": (g["measured_ms"].to_numpy(), g["predicted_ms"].to_numpy())
              for (w, p), g in pred.groupby(["workload", "predictor"])}
    png = predicted_vs_measured(panels, unit="ms")
    save_plot(png, device, "accuracy_predicted_vs_measured")
    return dg.MaterializeResult(metadata={
        "table_ii_per_layer": metadata_table(per_layer.reset_index(), pct=list(per_layer.columns)),
        "table_iv_per_workload": metadata_table(per_workload),
        "predicted_vs_measured": image_md(png, "Every workload run: predicted vs measured step (ms)"),
        "mean_abs_rel_err_by_predictor": dg.MetadataValue.json(
            {f"{w}/{p}": float(g["rel_err"].abs().mean()) for (w, p), g in pred.groupby(["workload", "predictor"])})})
