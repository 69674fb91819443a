"""Fitted predictors: gemm_model (PM2Lat eq. 1-2) and utility_model (regression on proxies).

Each fit uses training rows only, is scored on the held-out random shapes, saved to the
model store, logged to MLflow, and blocked by a check when its held-out error is too high.
"""


import dagster as dg
from assets.common import data_hash, image_md, md_table, save_plot
from assets.samples import gemm_samples, utility_samples
from pipeline.orchestration.partitions import devices
from pipeline.analysis.plots import predicted_vs_measured
from pipeline.predict.evaluate import error_table, gemm_predictions, utility_predictions
from pipeline.predict.gemm import GemmModel
from pipeline.predict.store import new_version
from pipeline.predict.utility import UtilityModel
from pipeline.analysis.quality import Gates
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse

GROUP = "fit"


def heldout_check(name: str) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec("heldout_error", asset=name, blocking=True,
                              description="held-out relative error: median <= max_heldout_err for every "
                                          "(op, dtype) and mean <= max_heldout_mean_err overall (quality_gates; "
                                          "$DEVCHAR_MAX_HELDOUT_ERR, default 0.5; $DEVCHAR_MAX_HELDOUT_MEAN_ERR, "
                                          "default 1.0); predictions never use a model that fails")]


def fit_and_register(context, warehouse, tracking, store, name: str, table: str, fit, predict,
                     gates: Gates) -> dg.MaterializeResult:
    """`gates`: the run's thresholds (the quality_gates resource)."""
    device = context.partition_key
    df = warehouse.device_rows(table, device)
    train, held = df[~df["held_out"]], df[df["held_out"]]
    model = fit(train)
    pred = predict(model, held)
    errors = error_table(pred, ["op", "dtype"])
    overall = error_table(pred.assign(all="all"), ["all"]).iloc[0]
    dhash = data_hash(train)
    version = new_version(dhash)
    png = predicted_vs_measured({f"{op} {dt}": (g["median_us"].to_numpy(), g["predicted_us"].to_numpy())
                                 for (op, dt), g in pred.groupby(["op", "dtype"])})
    plot_path = save_plot(png, device, f"{name}_heldout")
    worst = errors.sort_values("median_rel_err").iloc[-1]
    passed = bool((errors["median_rel_err"] <= gates.max_heldout_err).all()
                  and overall["mean_rel_err"] <= gates.max_heldout_mean_err)
    # Saved either way (its history is worth keeping), but marked: `latest` skips failed versions.
    meta = {"device": device, "version": version, "data_hash": dhash, "train_rows": len(train),
            "heldout_rows": len(held), "errors": errors.to_dict("records"), "run_id": context.run.run_id,
            "heldout_check_passed": passed}
    path = store.save(device, name, model, meta, version)
    metrics = {"heldout_mean_rel_err": overall["mean_rel_err"], "heldout_max_rel_err": overall["max_rel_err"]}
    metrics.update({f"mre_{r.op}_{r.dtype}": r.mean_rel_err for r in errors.itertuples()})
    mlflow_run = tracking.log_fit(name, device, {"train_rows": len(train), "version": version}, metrics,
                                  {"data_hash": dhash, "heldout_check_passed": str(passed)},
                                  [path / "model.json", plot_path])
    return dg.MaterializeResult(
        metadata={"version": version, "path": dg.MetadataValue.path(str(path)), "mlflow_run_id": mlflow_run,
                  "data_hash": dhash, "heldout_mean_rel_err": float(overall["mean_rel_err"]),
                  "heldout_max_rel_err": float(overall["max_rel_err"]), "heldout_errors": md_table(errors),
                  "predicted_vs_measured": image_md(png, "Held-out shapes: predicted vs measured")},
        check_results=[dg.AssetCheckResult(
            check_name="heldout_error", passed=passed,
            metadata={"worst_median": f"{worst['op']} {worst['dtype']}: {worst['median_rel_err']:.1%}",
                      "over_threshold": "; ".join(f"{r.op} {r.dtype}: median {r.median_rel_err:.1%}" for r in
                                                  errors[errors["median_rel_err"] > gates.max_heldout_err].itertuples())
                      or "none",
                      "overall_mean": float(overall["mean_rel_err"]), "max_median_allowed": gates.max_heldout_err,
                      "max_mean_allowed": gates.max_heldout_mean_err})])


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"numpy", "mlflow"}, deps=[gemm_samples],
          check_specs=heldout_check("gemm_model"))
def gemm_model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
               model_store: ModelStore, quality_gates: QualityGates) -> dg.MaterializeResult:
    """Per (op, dtype) kernel: throughput over (waves, K), interpolated (PM2Lat eq. 1-2)."""
    return fit_and_register(context, warehouse, tracking, model_store, "gemm_model", "gemm_samples",
                            GemmModel.fit, gemm_predictions, quality_gates.gates())


@dg.asset(partitions_def=devices, group_name=GROUP, kinds={"numpy", "mlflow"}, deps=[utility_samples],
          check_specs=heldout_check("utility_model"))
def utility_model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                  model_store: ModelStore, quality_gates: QualityGates) -> dg.MaterializeResult:
    """Per (op, dtype): latency = non-negative linear function of bytes moved, flops and rows."""
    return fit_and_register(context, warehouse, tracking, model_store, "utility_model", "utility_samples",
                            UtilityModel.fit, utility_predictions, quality_gates.gates())
