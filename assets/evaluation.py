"""Baselines and the comparison against them: mlp_baselines and model_evaluation.

model_evaluation is the PM2Lat Table II analog: devchar and each baseline on the same
held-out shapes, per layer type x dtype, into `model_errors`; plus the worst case per bin
(Fig. 5), the error distribution (Figs. 6-9), kernel-selection accuracy and prediction speed.
"""
import time

import pandas as pd

import dagster as dg
from assets.common import data_hash, image_md, metadata_table, row_count, save_plot
from assets.models import attention_model, embedding_model, gemm_model, memory_model, utility_model
from assets.samples import gemm_samples, utility_samples
from pipeline.analysis.bench import bench_predict, evaluation_sizes
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import error_distribution_plot, worst_per_bin_plot
from pipeline.predict.baselines import BASELINES
from pipeline.predict.compare import (DevcharPair, bias_by_dim, bias_pivot, error_distribution, held_out_predictions,
                                      table_ii, worst_per_bin)
from pipeline.predict.evaluate import attention_predictions, embedding_predictions, gemm_predictions, memory_predictions
from pipeline.predict.gemm_grids import hot_rows, is_cold
from pipeline.predict.selector import selection_accuracy
from pipeline.predict.store import new_version
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse


def _held(warehouse: DuckDBWarehouse, device: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Held-out (hot GEMM, utility, cold-weight GEMM) rows: the baselines know nothing of cache
    state, so they are scored on the hot GEMMs only, as PM2Lat's are."""
    gemm = warehouse.device_rows("gemm_samples", device, "held_out")
    return hot_rows(gemm), warehouse.device_rows("utility_samples", device, "held_out"), gemm[is_cold(gemm)]


@dg.asset(partitions_def=devices, group_name="fit", kinds={"scikitlearn", "mlflow"},
          deps=[gemm_samples, utility_samples])
def mlp_baselines(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                  model_store: ModelStore, device_runner: DeviceRunner) -> dg.MaterializeResult:
    """Roofline, NeuSight-style MLP and Lin et al.'s grid-searched MLP, fitted on the same training rows."""
    device = context.partition_key
    gemm = hot_rows(warehouse.device_rows("gemm_samples", device, "NOT held_out"))
    util = warehouse.device_rows("utility_samples", device, "NOT held_out")
    spec = warehouse.device_rows("devices", device).iloc[0].to_dict()
    grid = device_runner.profile if device_runner.profile in ("full", "tiny") else "reduced"
    gheld, uheld, _ = _held(warehouse, device)
    dhash, version, summary = data_hash(gemm), None, []
    for name, cls in BASELINES.items():
        t0 = time.perf_counter()
        model = cls.fit(gemm, util, spec, grid=grid, seed=0)
        fit_s = time.perf_counter() - t0
        errors = table_ii(held_out_predictions({name: model}, gheld, uheld))
        version = new_version(dhash)
        meta = {"device": device, "version": version, "data_hash": dhash, "grid": grid, "fit_s": fit_s,
                "errors": errors.to_dict("records"), "run_id": context.run.run_id}
        path = model_store.save(device, name, model, meta, version)
        metrics = {"fit_s": fit_s, **{f"mre_{r.layer_type}_{r.dtype}": r.mean_rel_err for r in errors.itertuples()}}
        tracking.log_fit(name, device, {"grid": grid, "version": version}, metrics, {"data_hash": dhash},
                         [path / "model.json"], store_version=version, store_path=path)
        summary.append({"model": name, "fit_s": fit_s, "mean_rel_err": float(errors["mean_rel_err"].mean())})
    return dg.MaterializeResult(metadata={"grid": grid, "baselines": metadata_table(pd.DataFrame(summary))})


@dg.asset(partitions_def=devices, group_name="evaluate", kinds={"numpy", "duckdb"},
          deps=[gemm_model, utility_model, attention_model, embedding_model, memory_model, mlp_baselines],
          automation_condition=dg.AutomationCondition.eager())
def model_evaluation(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse,
                     model_store: ModelStore, device_runner: DeviceRunner) -> dg.MaterializeResult:
    """devchar vs roofline / NeuSight MLP / Lin MLP on held-out shapes: Table II, Fig. 5, Figs. 6-9, speed."""
    device = context.partition_key
    gemm = model_store.load(device, "gemm_model")
    models = {"devchar": DevcharPair(gemm, model_store.load(device, "utility_model"))}
    models.update({name: model_store.load(device, name) for name in BASELINES})
    gheld, uheld, gcold = _held(warehouse, device)
    pred = held_out_predictions(models, gheld, uheld)
    # Fused attention has no baseline here: devchar's own rows only (PM2Lat Table VI).
    attn = attention_predictions(model_store.load(device, "attention_model"),
                                 warehouse.device_rows("attention_samples", device, "held_out"))
    # DLRM kernels (the paper's Table IV names: EL-F, EL-B, concat, memcpy-D2D, transpose, tril-F/B).
    emb = embedding_predictions(model_store.load(device, "embedding_model"),
                                warehouse.device_rows("embedding_samples", device, "held_out"))
    mem = memory_predictions(model_store.load(device, "memory_model"),
                             warehouse.device_rows("memory_samples", device, "held_out"))
    # CPU: held-out GEMMs timed with their weights rotated through memory, priced cold ("Linear cold")
    cold = gemm_predictions(gemm, gcold).assign(model="devchar", domain=lambda d: d["flops"]) if len(gcold) else None
    pred = pd.concat([pred, attn.assign(model="devchar", domain=attn["flops"])[pred.columns],
                      *(d.assign(model="devchar", domain=d["bytes"])[pred.columns] for d in (emb, mem)),
                      *([cold[pred.columns]] if cold is not None else [])],
                     ignore_index=True)
    errors = table_ii(pred).assign(device=device, run_id=context.run.run_id[:12])
    written = warehouse.replace_partition("model_errors", device, errors, scope="model")
    bins_png = worst_per_bin_plot(worst_per_bin(pred))
    dist_png = error_distribution_plot(error_distribution(pred))
    save_plot(bins_png, device, "worst_error_per_bin")
    save_plot(dist_png, device, "error_distribution")
    speed = bench_predict(gemm, {n: m for n, m in models.items() if n != "devchar"}, op="linear", dtype="float32",
                          **evaluation_sizes(device_runner.profile))
    pivot = errors.pivot_table(index=["layer_type", "dtype"], columns="model", values="mean_rel_err").reset_index()
    # devchar's held-out GEMMs by dimension band: where the tables price a size range under or over
    bias = bias_by_dim(gemm_predictions(gemm, pd.concat([gheld, gcold]))) if len(gheld) + len(gcold) else None
    return dg.MaterializeResult(metadata={
        # Table II: mean relative error (%) per (layer type, dtype), one column per model
        "table_ii_mean_rel_err": metadata_table(pivot, pct=[c for c in pivot.columns if c not in ("layer_type", "dtype")]),
        # geometric mean of predicted / measured per band of M, N and K (1 = no bias)
        **({"heldout_bias_by_dim": metadata_table(bias_pivot(bias))} if bias is not None else {}),
        "selection_accuracy": dg.MetadataValue.json(selection_accuracy(gemm.selector, gheld)),
        "predictions_per_s": dg.MetadataValue.json({k: round(v) for k, v in speed.items()}),
        "worst_error_per_bin": image_md(bins_png, "Max relative error per FLOP bin (PM2Lat Fig. 5)"),
        "error_distribution": image_md(dist_png, "Relative-error distribution (PM2Lat Figs. 6-9)"),
        **row_count(written)})
