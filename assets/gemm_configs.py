"""cuBLASLt configurations, one by one (PM2Lat III-B/C, CUDA only): gemm_config_samples and
gemm_config_choices (one sweep) -> gemm_config_model (per-configuration tables + a selector
learned from the heuristic's choices, for offline prediction).

A CPU has one BLAS path per op and dtype, already modeled by gemm_model; there these assets
materialize as "not applicable" and write nothing. A GPU that is not local (a committed
reference calibration) is read from models_store/reference/<device>/.
"""
import numpy as np
import pandas as pd

import dagster as dg
from assets.common import data_hash, device_check, md_table, metadata_table, row_count
from assets.samples import device_spec
from pipeline.orchestration.partitions import devices
from pipeline.predict.evaluate import error_table
from pipeline.predict.gemm_configs import GemmConfigModel
from pipeline.predict.store import new_version
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse

CPU_REASON = ("not applicable: this device is a CPU, which has one BLAS path per op and dtype "
              "(gemm_model is its per-kernel model); cuBLASLt configurations exist on CUDA devices only")


@dg.multi_asset(
    specs=[dg.AssetSpec("gemm_config_samples", deps=[device_spec], group_name="characterize",
                        kinds={"pytorch", "duckdb"},
                        description="Each cuBLASLt configuration run by itself at whole waves of its own tile and "
                                    "split-K, K over powers of two; held-out shapes time the heuristic's choice "
                                    "beside the kernel torch ran."),
           dg.AssetSpec("gemm_config_choices", deps=[device_spec], group_name="characterize",
                        kinds={"pytorch", "duckdb"},
                        description="The cuBLASLt heuristic's first choice at random shapes (not timed): what the "
                                    "offline selector learns.")],
    partitions_def=devices,
    check_specs=[device_check("finite_positive", "gemm_config_samples", blocking=True,
                              description="every timing is finite and > 0")])
def gemm_config_sweep(context: dg.AssetExecutionContext, device_runner: DeviceRunner, warehouse: DuckDBWarehouse):
    device = context.partition_key
    if warehouse.device_kind(device) != "cuda":
        context.log.info(f"{device}: {CPU_REASON}")
        for key in ("gemm_config_samples", "gemm_config_choices"):
            yield dg.MaterializeResult(asset_key=key, metadata={"applicable": False, "reason": CPU_REASON, "rows": 0})
        yield dg.AssetCheckResult(asset_key="gemm_config_samples", check_name="finite_positive", passed=True,
                                  metadata={"applicable": False})
        return
    tables = device_runner.run_tables(context, "gemm_configs", device)
    samples, choices = tables["gemm_config_samples"], tables["gemm_config_choices"]
    written = {t: warehouse.replace_partition(t, device, rows)
               for t, rows in (("gemm_config_samples", samples), ("gemm_config_choices", choices))}
    train, held = samples[~samples["held_out"]], samples[samples["held_out"]]
    per_problem = train.groupby(["op", "layout", "dtype"]).agg(configs=("kernel", "nunique"),
                                                             rows=("k", "size")).reset_index()
    if len(choices):
        coverage = choices.groupby(["op", "layout", "dtype"])["swept"].mean().rename("choices_swept").reset_index()
        per_problem = per_problem.merge(coverage, how="left")
    t = samples["median_us"].to_numpy(float)
    bad = int((~np.isfinite(t) | (t <= 0)).sum())
    yield dg.MaterializeResult(asset_key="gemm_config_samples", metadata={
        "rows": len(samples), "held_out_rows": len(held), "configs": int(train["kernel"].nunique()),
        "heuristic_matches_torch": float(held["selection_match"].astype(float).mean()) if len(held) else float("nan"),
        "per_problem": md_table(per_problem), **row_count(written["gemm_config_samples"])})
    yield dg.MaterializeResult(asset_key="gemm_config_choices", metadata={
        "rows": len(choices), "distinct_choices": int(choices["kernel"].nunique()) if len(choices) else 0,
        "share_swept": float(choices["swept"].mean()) if len(choices) else float("nan"),
        **row_count(written["gemm_config_choices"])})
    yield dg.AssetCheckResult(asset_key="gemm_config_samples", check_name="finite_positive", passed=bad == 0,
                              metadata={"bad_rows": bad})


def split_choices(choices: pd.DataFrame, every: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fit, test): every `every`-th choice is kept out of the selector's fit, to score it."""
    test = np.arange(len(choices)) % every == every - 1
    return choices[~test], choices[test]


PROBLEM = ["op", "layout", "bias", "dtype"]


def selected_kernel_matches_torch(evaluated: pd.DataFrame, train: pd.DataFrame) -> pd.Series:
    """Whether the kernel behind the selector's configuration (its profiler name, recorded when
    the configuration was swept for that problem and dtype: one config id names different
    kernels across dtypes and layouts) is the kernel torch ran on that held-out shape."""
    if not len(evaluated):
        return pd.Series([], dtype=bool, index=evaluated.index)
    names = train.dropna(subset=["lt_kernel"]).groupby([*PROBLEM, "kernel"])["lt_kernel"].first()
    keys = pd.MultiIndex.from_arrays([evaluated[c] for c in PROBLEM] + [evaluated["selected"].astype(str)])
    picked = names.reindex(keys).to_numpy()
    return pd.Series(picked == evaluated["torch_kernel"].to_numpy(), index=evaluated.index)


@dg.asset(partitions_def=devices, group_name="fit", kinds={"numpy", "mlflow"},
          deps=["gemm_config_samples", "gemm_config_choices"],
          check_specs=[device_check("selection_accuracy", "gemm_config_model",
                                    description="the selector reproduces the heuristic's choice on >= 50% "
                                                "of held-out shapes (warn)")])
def gemm_config_model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
                      model_store: ModelStore) -> dg.MaterializeResult:
    """Per (op, layout, bias) problem: a PM2Lat table per cuBLASLt configuration and a decision
    tree that says which configuration runs a shape, without the device or its library."""
    device = context.partition_key
    if warehouse.device_kind(device) != "cuda":
        return dg.MaterializeResult(metadata={"applicable": False, "reason": CPU_REASON}, check_results=[
            dg.AssetCheckResult(check_name="selection_accuracy", passed=True, metadata={"applicable": False})])
    samples = warehouse.device_rows("gemm_config_samples", device)
    choices = warehouse.device_rows("gemm_config_choices", device)
    train, held = samples[~samples["held_out"]], samples[samples["held_out"]]
    fit_choices, test_choices = split_choices(choices)
    model = GemmConfigModel.fit(train, fit_choices)
    evaluated = model.evaluate(held)
    evaluated = evaluated.assign(selected_matches_torch=selected_kernel_matches_torch(evaluated, train))
    errors = error_table(evaluated, ["problem", "dtype"]) if len(evaluated) else pd.DataFrame()
    selection = model.selection_accuracy(test_choices)
    sel_mean = float(np.mean(list(selection.values()))) if selection else float("nan")
    dhash = data_hash(train)
    version = new_version(dhash)
    metrics = {"selection_accuracy_mean": sel_mean, **{f"selection_{k}": v for k, v in selection.items()}}
    if len(evaluated):
        metrics.update(heldout_mean_rel_err=float(errors["mean_rel_err"].mean()),
                       selector_matches_heuristic=float(evaluated["selector_agrees"].mean()),
                       selector_matches_torch=float(evaluated["selected_matches_torch"].mean()),
                       heuristic_matches_torch=float(evaluated["selection_match"].astype(float).mean()))
    meta = {"device": device, "version": version, "data_hash": dhash, "train_rows": len(train),
            "heldout_rows": len(held), "choices_fit": len(fit_choices), "choices_test": len(test_choices),
            "metrics": metrics, "run_id": context.run.run_id}
    path = model_store.save(device, "gemm_config_model", model, meta, version)
    mlflow_run = tracking.log_fit("gemm_config_model", device, {"train_rows": len(train), "version": version},
                                  metrics, {"data_hash": dhash}, [path / "model.json"], store_version=version,
                                  store_path=path)
    passed = bool(np.isfinite(sel_mean) and sel_mean >= 0.5)
    return dg.MaterializeResult(
        metadata={"version": version, "path": dg.MetadataValue.path(str(path)), "mlflow_run_id": mlflow_run,
                  "mlflow_run": dg.MetadataValue.url(tracking.run_url(mlflow_run)),
                  "problems": ", ".join(sorted(model.models)), **metrics,
                  "heldout_errors": metadata_table(errors) if len(errors) else "no held-out rows"},
        check_results=[dg.AssetCheckResult(check_name="selection_accuracy", passed=passed,
                                           severity=dg.AssetCheckSeverity.WARN,
                                           metadata={"selection_accuracy_mean": sel_mean})])
