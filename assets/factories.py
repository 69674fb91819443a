"""The two shapes most assets share, built from a declaration:

- @sample_asset(sweep=...) on a report function -> a sample asset (group `characterize`):
  run a sweep where the partition's device is, replace that device's rows of the table,
  report row counts, a summary and plots, and check the timings.
- FittedModel -> a model asset (group `fit`): fit on the training rows of a sample table,
  score on its held-out rows, save to the model store, log to MLflow, and block what is
  downstream when the held-out error is too high.

The declarations are the catalogs: assets/samples.py (every sample table) and
assets/models.py (every fitted model). What is left to each asset is only what differs:
its sweep, report and checks; its table, fit and predict functions.
"""

import inspect
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import dagster as dg
import numpy as np
import pandas as pd

from assets.common import data_hash, device_check, image_md, metadata_table, rounded, row_count, save_plot
from pipeline.analysis.plots import predicted_vs_measured
from pipeline.analysis.quality import Gates
from pipeline.orchestration.partitions import devices
from pipeline.predict.evaluate import error_table
from pipeline.predict.store import new_version
from resources.devices import DeviceRunner
from resources.model_store import ModelStore
from resources.quality import QualityGates
from resources.tracking import MLflowTracking
from resources.warehouse import DuckDBWarehouse

CHARACTERIZE, FIT = "characterize", "fit"


# --- checks ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checks:
    """An asset's checks: their specs (given the asset's name), and the results for the rows
    one materialization wrote (given the run's thresholds, the `quality_gates` resource)."""
    specs: Callable[[str], list[dg.AssetCheckSpec]]
    results: Callable[[pd.DataFrame, Gates], list[dg.AssetCheckResult]]


def timing_check_specs(name: str) -> list[dg.AssetCheckSpec]:
    return [
        device_check("finite_positive", name, blocking=True,
                     description="every timing is finite and > 0"),
        device_check("sweep_noise", name,
                     description="share of rows still noisy after a re-measure <= max_noisy_share "
                                 "(quality_gates; $DEVCHAR_MAX_NOISY_SHARE, default 0.25)"),
    ]


def timing_check_results(df: pd.DataFrame, gates: Gates, time_col: str) -> list[dg.AssetCheckResult]:
    t = df[time_col].to_numpy(float)
    bad = int((~np.isfinite(t) | (t <= 0)).sum())
    noisy = float((df["cv"] > 0.1).mean()) if "noisy" not in df else float(df["noisy"].mean())
    return [
        dg.AssetCheckResult(check_name="finite_positive", passed=bad == 0, metadata={"bad_rows": bad}),
        dg.AssetCheckResult(check_name="sweep_noise", passed=noisy <= gates.max_noisy_share,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"noisy_share": rounded(noisy), "max_noisy_share": gates.max_noisy_share}),
    ]


def timing_checks(time_col: str = "median_us") -> Checks:
    """finite_positive (blocking) and sweep_noise (a warning) on the timing column `time_col`."""
    return Checks(timing_check_specs, partial(timing_check_results, time_col=time_col))


def heldout_check_specs(name: str) -> list[dg.AssetCheckSpec]:
    return [device_check("heldout_error", name, blocking=True,
                         description="held-out relative error: median <= max_heldout_err for every "
                                     "(op, dtype) and mean <= max_heldout_mean_err overall (quality_gates; "
                                     "$DEVCHAR_MAX_HELDOUT_ERR, default 0.5; $DEVCHAR_MAX_HELDOUT_MEAN_ERR, "
                                     "default 1.0); predictions never use a model that fails")]


def heldout_check_result(errors: pd.DataFrame, overall: pd.Series, passed: bool,
                         gates: Gates) -> dg.AssetCheckResult:
    worst = errors.sort_values("median_rel_err").iloc[-1]
    over = errors[errors["median_rel_err"] > gates.max_heldout_err]
    return dg.AssetCheckResult(
        check_name="heldout_error", passed=passed,
        metadata={"worst_median": f"{worst['op']} {worst['dtype']}: {worst['median_rel_err']:.1%}",
                  "over_threshold": "; ".join(f"{r.op} {r.dtype}: median {r.median_rel_err:.1%}"
                                              for r in over.itertuples()) or "none",
                  "overall_mean": rounded(overall["mean_rel_err"]), "max_median_allowed": gates.max_heldout_err,
                  "max_mean_allowed": gates.max_heldout_mean_err})


# --- sample tables --------------------------------------------------------------------------

def sample_asset(*, sweep: str, checks: Checks = timing_checks(),
                 kinds: frozenset[str] = frozenset({"pytorch", "duckdb"}),
                 deps: tuple[str, ...] = ("device_spec",)) -> Callable[[Callable], dg.AssetsDefinition]:
    """Decorates `report(rows, device) -> metadata` into the sample asset named after it (and its
    DuckDB table), described by its docstring: the asset runs `sweep` (a pipeline.runner.SWEEPS
    entry) where the partition's device is, replaces that device's rows of the table, and
    reports `rows`, what `report` returns (a summary, plots, also saved under plots/) and
    `dagster/row_count`, with `checks` on the rows (default: timings finite and not noisy)."""
    def build(report: Callable[[pd.DataFrame, str], dict]) -> dg.AssetsDefinition:
        name = report.__name__

        @dg.asset(name=name, description=inspect.getdoc(report), partitions_def=devices, group_name=CHARACTERIZE,
                  kinds=set(kinds), deps=list(deps), check_specs=checks.specs(name))
        def _sample(context: dg.AssetExecutionContext, device_runner: DeviceRunner,
                    warehouse: DuckDBWarehouse, quality_gates: QualityGates) -> dg.MaterializeResult:
            device = context.partition_key
            df = device_runner.run(context, sweep, device)
            written = warehouse.replace_partition(name, device, df)
            return dg.MaterializeResult(metadata={"rows": len(df), **report(df, device), **row_count(written)},
                                        check_results=checks.results(df, quality_gates.gates()))

        return _sample

    return build


# --- fitted models --------------------------------------------------------------------------

@dataclass(frozen=True)
class FittedModel:
    """A predictor fitted on the training rows of the sample table `samples` and scored on its
    held-out rows: `fit(train) -> model`, `predict(model, held) -> rows with predicted_us`."""
    name: str
    samples: str
    fit: Callable
    predict: Callable
    doc: str  # the asset's description in the UI
    # (model, held-out rows) -> the DLRM paper's Table IV rows (GMAE / mean / std per kernel)
    table_iv: Optional[Callable] = None


def model_asset(spec: FittedModel) -> dg.AssetsDefinition:
    @dg.asset(name=spec.name, description=spec.doc, partitions_def=devices, group_name=FIT,
              kinds={"numpy", "mlflow"}, deps=[spec.samples], check_specs=heldout_check_specs(spec.name))
    def _model(context: dg.AssetExecutionContext, warehouse: DuckDBWarehouse, tracking: MLflowTracking,
               model_store: ModelStore, quality_gates: QualityGates) -> dg.MaterializeResult:
        return fit_and_register(context, warehouse, tracking, model_store, spec, quality_gates.gates())

    return _model


def fit_and_register(context, warehouse, tracking, store, spec: FittedModel, gates: Gates) -> dg.MaterializeResult:
    device, name = context.partition_key, spec.name
    df = warehouse.device_rows(spec.samples, device)
    train, held = df[~df["held_out"]], df[df["held_out"]]
    model = spec.fit(train)
    pred = spec.predict(model, held)
    errors = error_table(pred, ["op", "dtype"])
    overall = error_table(pred.assign(all="all"), ["all"]).iloc[0]
    dhash = data_hash(train)
    version = new_version(dhash)
    png = predicted_vs_measured({f"{op} {dt}": (g["median_us"].to_numpy(), g["predicted_us"].to_numpy())
                                 for (op, dt), g in pred.groupby(["op", "dtype"])})
    plot_path = save_plot(png, device, f"{name}_heldout")
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
                                  [path / "model.json", plot_path], store_version=version, store_path=path,
                                  passed=passed)
    metadata = {"version": version, "path": dg.MetadataValue.path(str(path)), "mlflow_run_id": mlflow_run,
                "mlflow_run": dg.MetadataValue.url(tracking.run_url(mlflow_run)), "data_hash": dhash,
                "heldout_mean_rel_err": rounded(overall["mean_rel_err"]),
                "heldout_max_rel_err": rounded(overall["max_rel_err"]),
                "heldout_errors": metadata_table(errors),  # per (op, dtype); relative errors in %
                "predicted_vs_measured": image_md(png, "Held-out shapes: predicted vs measured")}
    if spec.table_iv is not None:  # of the version just saved, even if it fails its check
        metadata["table_iv"] = metadata_table(spec.table_iv(store.load(device, name, version), held))
    return dg.MaterializeResult(metadata=metadata, check_results=[heldout_check_result(errors, overall, passed, gates)])
