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

from assets.common import (calibration_usual, data_hash, device_check, image_md, metadata_table, rounded, row_count,
                           save_plot)
from pipeline.analysis import drift as drift_
from pipeline.analysis.plots import predicted_vs_measured
from pipeline.analysis.quality import Gates
from pipeline.orchestration.partitions import devices
from pipeline.predict.evaluate import error_table
from pipeline.core.config import devchar_home
from pipeline.core.errors import DevcharError
from pipeline.predict.probe_scaling import fit_scaled
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
    return [device_check("finite_positive", name, blocking=True, description="every timing is finite and > 0")]


def timing_check_results(df: pd.DataFrame, gates: Gates, time_col: str) -> list[dg.AssetCheckResult]:
    t = df[time_col].to_numpy(float)
    bad = int((~np.isfinite(t) | (t <= 0)).sum())
    return [dg.AssetCheckResult(check_name="finite_positive", passed=bad == 0, metadata={"bad_rows": bad})]


def timing_checks(time_col: str = "median_us") -> Checks:
    """finite_positive (blocking) on the timing column `time_col`. How noisy the sweeps were is
    told once per device run, by sweep_quality's sweep_noise check (assets/samples.py)."""
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


# --- drift between two calibrations of a device (pipeline/analysis/drift.py) ----------------

def drift_check_spec(name: str) -> dg.AssetCheckSpec:
    return device_check("drift", name, description=(
        "did the device change since its previous calibration? per (op, dtype), the median new/old "
        "time over the points both runs measured and the share of points moved beyond their own "
        "p20-p80 spread; warns when the table as a whole moved over $DEVCHAR_MAX_DRIFT_RATIO (default "
        "0.2) with $DEVCHAR_MAX_DRIFT_MOVED_SHARE (default 0.5) of its points moved (quality_gates); "
        "single ops that moved alone are listed, and flagged in the drift table"))


def previous_rows(warehouse: DuckDBWarehouse, table: str, device: str) -> Optional[pd.DataFrame]:
    try:
        return warehouse.device_rows(table, device)
    except DevcharError:  # a first calibration: no table, or no rows for this device yet
        return None


def drift_rows(drift: pd.DataFrame, device: str, run_id: str) -> pd.DataFrame:
    return drift.assign(device=device, run_id=run_id[:12])


def drift_result(drift: Optional[pd.DataFrame]) -> dg.AssetCheckResult:
    if drift is None:
        return dg.AssetCheckResult(check_name="drift", passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   metadata={"previous": "none: the first calibration of this device"})
    return dg.AssetCheckResult(
        check_name="drift", passed=not drift_.device_changed(drift), severity=dg.AssetCheckSeverity.WARN,
        metadata={"flagged": drift_.summary(drift, pooled=True),
                  "ops_moved_alone": drift_.summary(drift, pooled=False),
                  "groups_compared": int((drift["op"] != drift_.ALL).sum()),
                  "points_compared": int(drift.loc[drift["op"] == drift_.ALL, "points"].sum()),
                  "previous_run_id": ",".join(sorted(set(drift["previous_run_id"]))) or "none"})


# --- sample tables --------------------------------------------------------------------------

def sample_asset(*, sweep: str, checks: Checks = timing_checks(),
                 kinds: frozenset[str] = frozenset({"pytorch", "duckdb"}),
                 deps: tuple[str, ...] = ("device_spec",)) -> Callable[[Callable], dg.AssetsDefinition]:
    """Decorates `report(rows, device) -> metadata` into the sample asset named after it (and its
    DuckDB table), described by its docstring: the asset runs `sweep` (a pipeline.runner.SWEEPS
    entry) where the partition's device is, replaces that device's rows of the table, and
    reports `rows`, what `report` returns (a summary, plots, also saved under plots/) and
    `dagster/row_count`, with `checks` on the rows (default: timings finite and positive).
    A table with drift keys (drift.DRIFT_KEYS) is also compared with the rows it replaces:
    the `drift` table, metadata and check."""
    def build(report: Callable[[pd.DataFrame, str], dict]) -> dg.AssetsDefinition:
        name = report.__name__
        tracks_drift = name in drift_.DRIFT_KEYS
        specs = checks.specs(name) + ([drift_check_spec(name)] if tracks_drift else [])

        @dg.asset(name=name, description=inspect.getdoc(report), partitions_def=devices, group_name=CHARACTERIZE,
                  kinds=set(kinds), deps=list(deps), check_specs=specs)
        def _sample(context: dg.AssetExecutionContext, device_runner: DeviceRunner,
                    warehouse: DuckDBWarehouse, quality_gates: QualityGates) -> dg.MaterializeResult:
            device, gates = context.partition_key, quality_gates.gates()
            anchor = calibration_usual(warehouse, device, sweep, context.log.info)
            df = device_runner.run(context, sweep, device, **anchor)
            previous = previous_rows(warehouse, name, device) if tracks_drift else None
            drift = None if previous is None else drift_.table_drift(previous, df, name, gates)
            parts = [(name, device, df)]
            if drift is not None and not drift.empty:  # the sample rows and their drift land together
                parts.append(("drift", device, drift_rows(drift, device, context.run.run_id), "source"))
            warehouse.replace_partitions(parts)
            if previous is not None:  # for the model fitted next: its error on these replaced points
                drift_.keep_previous(devchar_home(), device, name, previous)
            extra = {} if drift is None else {"drift": metadata_table(drift.drop(columns=[
                "kind", "source", "error_previous_heldout", "error_new_heldout"]), pct=["moved_share"])}
            return dg.MaterializeResult(
                metadata={"rows": len(df), **report(df, device), **extra, **row_count(len(df))},
                check_results=[*checks.results(df, gates), *([drift_result(drift)] if tracks_drift else [])])

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
    # fit on training rows scaled by the spell probe, beta chosen by cross-validation
    # (pipeline/predict/probe_scaling.py); rows without a probe reading (GPU) are left as they are
    probe_scaled: bool = False
    # rows -> which training rows the cross-validation scores (those like the held-out rows);
    # None: all of them
    probe_scored: Optional[Callable] = None


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
    if spec.probe_scaled:
        model, choice = fit_scaled(train, spec.fit, spec.predict, spec.probe_scored)
        context.log.info(f"{name}: probe scaling {choice.summary()}")
    else:
        model, choice = spec.fit(train), None
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
    probe = probe_meta(choice) if choice else {}
    # Saved either way (its history is worth keeping), but marked: `latest` skips failed versions.
    meta = {"device": device, "version": version, "data_hash": dhash, "train_rows": len(train),
            "heldout_rows": len(held), "errors": errors.to_dict("records"), "run_id": context.run.run_id,
            "heldout_check_passed": passed, **probe}
    path = store.save(device, name, model, meta, version)
    metrics = {"heldout_mean_rel_err": overall["mean_rel_err"], "heldout_max_rel_err": overall["max_rel_err"]}
    metrics.update({f"mre_{r.op}_{r.dtype}": r.mean_rel_err for r in errors.itertuples()})
    params = {"train_rows": len(train), "version": version, **probe}
    mlflow_run = tracking.log_fit(name, device, params, metrics,
                                  {"data_hash": dhash, "heldout_check_passed": str(passed)},
                                  [path / "model.json", plot_path], store_version=version, store_path=path,
                                  passed=passed)
    metadata = {"version": version, "path": dg.MetadataValue.path(str(path)), "mlflow_run_id": mlflow_run,
                "mlflow_run": dg.MetadataValue.url(tracking.run_url(mlflow_run)), "data_hash": dhash,
                "heldout_mean_rel_err": rounded(overall["mean_rel_err"]),
                "heldout_max_rel_err": rounded(overall["max_rel_err"]),
                "heldout_errors": metadata_table(errors),  # per (op, dtype); relative errors in %
                "predicted_vs_measured": image_md(png, "Held-out shapes: predicted vs measured")}
    if choice is not None:
        metadata["probe_scaling"] = choice.summary()
    metadata.update(model_drift(context, warehouse, spec, model, errors, gates))
    if spec.table_iv is not None:  # of the version just saved, even if it fails its check
        metadata["table_iv"] = metadata_table(spec.table_iv(store.load(device, name, version), held))
    return dg.MaterializeResult(metadata=metadata, check_results=[heldout_check_result(errors, overall, passed, gates)])


def probe_meta(choice) -> dict:
    """The probe scaling's choice, for the saved meta and the MLflow params: beta, the reading the
    rows were scaled to (None when not scaled) and how beta came about."""
    return {"probe_beta": choice.beta, "probe_reference_us": choice.reference_us if choice.beta else None,
            "probe_beta_by": choice.how}


def model_drift(context, warehouse, spec: FittedModel, model, errors: pd.DataFrame, gates: Gates) -> dict:
    """After a re-calibration: the new model's error on the held-out points of the run its
    samples replaced, beside its own, into the `drift` table and the asset's metadata."""
    device = context.partition_key
    previous = drift_.load_previous(devchar_home(), device, spec.samples)
    if previous is None or not previous["held_out"].astype(bool).any():
        return {}
    held = previous[previous["held_out"].astype(bool)]
    on_previous = error_table(spec.predict(model, held), ["op", "dtype"])
    drift = drift_.model_drift(spec.name, on_previous, errors, drift_.run_id_of(previous), gates)
    warehouse.replace_partition("drift", device, drift_rows(drift, device, context.run.run_id), scope="source")
    return {"error_on_previous_heldout": metadata_table(
                drift[["op", "dtype", "points", "error_previous_heldout", "error_new_heldout", "flagged"]],
                pct=["error_previous_heldout", "error_new_heldout"]),
            "drift_flagged": drift_.summary(drift)}
