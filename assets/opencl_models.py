"""opencl_models: LLMPerf-style latency models for OpenCL launches (sections III-IV).

Three models on the same kernel-disjoint split of opencl_launches: opencl_lm (pretrained
MiniLM fine-tuned on the paper's prompts), opencl_scratch (a small transformer from
scratch on the same prompts), opencl_features (boosted trees on Clang-AST features). Each
is saved to the model store and logged to MLflow; validation and per-benchmark-kernel MAPE
go to model_errors (Tables III-IV) beside the paper's numbers, with the Fig. 2 plot.
"""
import pandas as pd

import dagster as dg
from assets.common import data_hash, device_check, image_md, md_table, row_count, save_plot
from pipeline.opencl.models.evaluate import PAPER_BENCH_MAPE, PAPER_VAL_MAPE
from pipeline.opencl.models.fit import fit_all
from pipeline.opencl.models.settings import train_device
from pipeline.orchestration.partitions import devices
from pipeline.predict.store import new_version
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse


def _paper_table(fitted: dict) -> pd.DataFrame:
    rows = [{"model": n, "val MAPE %": 100 * f.summary["val_mape"], "val launches": f.summary["val_n"],
             "bench MAPE % (mean over kernels)": 100 * f.summary["bench_mape"],
             "bench kernels": f.summary["bench_kernels"], "fit s": f.fit_s} for n, f in fitted.items()]
    rows.append({"model": "LLMPerf-2B-400K (paper)", "val MAPE %": 100 * PAPER_VAL_MAPE, "val launches": 38797,
                 "bench MAPE % (mean over kernels)": 100 * PAPER_BENCH_MAPE, "bench kernels": 12, "fit s": None})
    return pd.DataFrame(rows)


@dg.asset(partitions_def=devices, group_name="fit", kinds={"pytorch", "scikitlearn", "mlflow"},
          deps=["opencl_launches"],
          # Not blocking: nothing downstream uses these models, and a quick CPU sweep has too few
          # kernels for paper-like accuracy; a failing version is still marked in its meta.json.
          check_specs=[device_check("validation_mape", "opencl_models", blocking=False,
                                    description="MAPE on kernels never trained on <= "
                                                "max_opencl_val_mape (quality_gates; "
                                                "$DEVCHAR_MAX_OPENCL_VAL_MAPE, default 1.0) for every model")])
def opencl_models(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                  model_store: ModelStore, device_runner: DeviceRunner,
                  quality_gates: QualityGates) -> dg.MaterializeResult:
    """opencl_lm, opencl_scratch and opencl_features fitted on log2(time) of the device's OpenCL launches."""
    device = context.partition_key
    launches = warehouse.device_rows("opencl_launches", device)
    profile, torch_device = device_runner.profile, train_device(device_runner.train_device)
    limit = quality_gates.gates().max_opencl_val_mape
    fitted, fig2, split_sizes = fit_all(launches, profile, torch_device, seed=0, log=context.log.info)
    dhash = data_hash(launches.drop(columns=["args"]))  # args is JSON text; every other column hashes as is
    fig_path = save_plot(fig2, device, "opencl_fig2") if fig2 else None
    run_id = context.run.run_id[:12]
    for name, f in fitted.items():
        version = new_version(dhash)
        passed = bool(f.summary["val_mape"] <= limit)
        meta = {"device": device, "version": version, "data_hash": dhash, "profile": profile, "split": split_sizes,
                "fit_s": f.fit_s, "errors": f.errors.to_dict("records"), "run_id": context.run.run_id,
                "heldout_check_passed": passed}
        path = model_store.save(device, name, f.model, meta, version)
        metrics = {"val_mape": f.summary["val_mape"], "bench_mape": f.summary["bench_mape"], "fit_s": f.fit_s,
                   **{f"mape_{r.layer_type}": r.mean_rel_err for r in f.errors.itertuples()}}
        tracking.log_fit(name, device, {**f.params, "version": version, "train_device": torch_device,
                                        **{f"{k}_launches": v for k, v in split_sizes.items()}},
                         metrics, {"data_hash": dhash, "heldout_check_passed": str(passed)},
                         [path / "model.json", *([fig_path] if fig_path else [])], store_version=version,
                         store_path=path, passed=passed)
    errors = pd.concat([f.errors for f in fitted.values()], ignore_index=True).assign(device=device, run_id=run_id)
    written = warehouse.replace_partition("model_errors", device, errors, scope="model")
    val = {n: f.summary["val_mape"] for n, f in fitted.items()}
    metadata = {"profile": profile, "train_device": torch_device, "data_hash": dhash,
                "split": dg.MetadataValue.json(split_sizes), "vs_paper": md_table(_paper_table(fitted)),
                "model_errors": md_table(errors.drop(columns=["device", "run_id"])), **row_count(written)}
    if fig2:
        metadata["fig2"] = image_md(fig2, "Benchmark kernels: predicted vs measured over input size (LLMPerf Fig. 2)")
    return dg.MaterializeResult(metadata=metadata, check_results=[dg.AssetCheckResult(
        check_name="validation_mape", passed=all(v <= limit for v in val.values()),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"val_mape": dg.MetadataValue.json(val), "max_allowed": limit})])
