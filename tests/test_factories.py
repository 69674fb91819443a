"""assets/factories.py: sample and model assets built from declarations, and the code location
that loads them from their modules. Resources are stubs: no sweep runs, nothing is fitted."""
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

import assets
from pipeline.core.errors import DevcharError
from assets.factories import FittedModel, model_asset, sample_asset, timing_checks

DEVICE = "cpu-test"
# Defined in assets/ but not (yet) in the code location: registering an asset is its own change
# (shape_advice, assets/advice.py: one entry in definitions.ASSET_MODULES, commit c65af8f).
UNREGISTERED = {dg.AssetKey("shape_advice")}


def test_the_code_location_loads_every_asset_the_assets_package_defines():
    """definitions.ASSET_MODULES misses no module: an asset declared anywhere in assets/ is in defs."""
    from pipeline.definitions import defs

    in_package = {k for a in dg.load_assets_from_package_module(assets) for k in a.keys}
    loaded = set(defs.resolve_asset_graph().get_all_asset_keys())
    assert loaded <= in_package and in_package - loaded <= UNREGISTERED, in_package ^ loaded
    assert {"gemm_samples", "workload_runs", "opencl_launches", "gemm_model", "memory_model"} <= {
        k.to_user_string() for k in loaded}


class StubRunner:
    def __init__(self, rows: pd.DataFrame):
        self.rows, self.sweeps, self.kwargs = rows, [], []

    def run(self, context, sweep: str, device: str, **kwargs) -> pd.DataFrame:
        self.sweeps.append((sweep, device))
        self.kwargs.append(kwargs)
        return self.rows


class StubWarehouse:
    def __init__(self, rows: pd.DataFrame | None = None):
        self.rows, self.written = rows, {}

    def replace_partition(self, table: str, device: str, rows: pd.DataFrame, scope=None) -> int:
        self.written[table, device] = rows
        return len(rows)

    def replace_partitions(self, parts: list[tuple]) -> int:
        return sum(self.replace_partition(*part) for part in parts)

    def device_rows(self, table: str, device: str, where: str = "", params=None) -> pd.DataFrame:
        if self.rows is None:
            raise DevcharError(f"table {table!r} has no rows for device {device!r}")
        return self.rows


def _materialize(asset: dg.AssetsDefinition, **stubs) -> dg.ExecuteInProcessResult:
    """`asset` for DEVICE, with the code location's resources but for `stubs`."""
    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import devices

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [DEVICE])
        return dg.materialize([asset], partition_key=DEVICE, instance=instance, raise_on_error=False,
                              resources={**defs.resources, **stubs})


def _checks(result) -> dict:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _metadata(result) -> dict:
    return result.get_asset_materialization_events()[0].materialization.metadata


def test_a_sample_asset_runs_its_sweep_stores_the_rows_and_reports_them():
    @sample_asset(sweep="workloads", checks=timing_checks("measured_ms"))
    def workload_runs(df, device):
        """The docstring is the asset's description."""
        return {"device_seen": device}

    assert workload_runs.key == dg.AssetKey("workload_runs")
    assert workload_runs.descriptions_by_key[workload_runs.key] == "The docstring is the asset's description."
    assert {s.name for s in workload_runs.check_specs} == {"finite_positive"}  # noise: sweep_quality
    rows = pd.DataFrame({"device": DEVICE, "measured_ms": [1.0, 2.0, 3.0], "cv": [0.01, 0.02, 0.5]})
    runner, warehouse = StubRunner(rows), StubWarehouse()
    result = _materialize(workload_runs, device_runner=runner, warehouse=warehouse)
    assert result.success
    assert runner.sweeps == [("workloads", DEVICE)]
    assert list(warehouse.written) == [("workload_runs", DEVICE)]  # the table of the asset's name
    meta = _metadata(result)
    assert list(meta) == ["rows", "device_seen", "dagster/row_count"]
    assert meta["rows"].value == 3 and meta["dagster/row_count"].value == 3 and meta["device_seen"].text == DEVICE
    assert _checks(result) == {"finite_positive": True}


def test_the_workload_runs_asset_hands_the_runner_its_calibrations_usual_probes():
    """The stored gemm_samples' probe readings reach the workloads sweep (assets/common.calibration_usual);
    another sweep's asset gets none."""
    @sample_asset(sweep="workloads", checks=timing_checks("measured_ms"))
    def workload_runs(df, device):
        """Workload runs."""
        return {}

    @sample_asset(sweep="memory")
    def memory_samples(df, device):
        """Memory kernels."""
        return {}

    stored = pd.DataFrame({"device": DEVICE, "median_us": 1.0, "probe_us": [20.0 + i for i in range(40)],
                           "host_probe_us": 3.0, "measured_ms": 1.0, "run_id": "r1"})
    for asset, expected in ((workload_runs, {"usual_probes": (29.75, 3.0)}), (memory_samples, {})):
        runner = StubRunner(stored)
        assert _materialize(asset, device_runner=runner, warehouse=StubWarehouse(stored)).success
        assert runner.kwargs == [expected]


def test_a_sample_asset_with_a_bad_timing_fails_its_blocking_check():
    @sample_asset(sweep="memory")
    def memory_samples(df, device):
        """Memory kernels."""
        return {}

    rows = pd.DataFrame({"device": DEVICE, "median_us": [1.0, 0.0], "cv": [0.01, 0.01]})
    result = _materialize(memory_samples, device_runner=StubRunner(rows), warehouse=StubWarehouse())
    assert not result.success
    assert _checks(result) == {"finite_positive": False, "drift": True}


class ScaleModel:
    """predicted_us = scale x k: a stand-in for a fitted predictor."""

    def __init__(self, scale: float):
        self.scale = scale

    @classmethod
    def fit(cls, train: pd.DataFrame) -> "ScaleModel":
        return cls(float((train["median_us"] / train["k"]).mean()))


def predict(model: ScaleModel, held: pd.DataFrame) -> pd.DataFrame:
    return held.assign(predicted_us=model.scale * held["k"])


class StubStore:
    def __init__(self, root: Path):
        self.root, self.saved = root, {}

    def save(self, device, name, model, meta, version) -> Path:
        self.saved[name, version] = (model, meta)
        path = self.root / device / name / version
        path.mkdir(parents=True)
        (path / "model.json").write_text("{}")
        return path

    def load(self, device, name, version=None):
        return self.saved[name, version][0]


class StubTracking:
    def __init__(self):
        self.registered = []

    def log_fit(self, name, device, params, metrics, tags, artifacts, **registration) -> str:
        self.registered.append(registration)  # store_version, store_path, passed (resources/tracking.py)
        return "mlflow-run"

    def run_url(self, run_id: str) -> str:
        return f"http://mlflow.test/#/experiments/0/runs/{run_id}"


def _model_rows(held_scale: float) -> pd.DataFrame:
    k = [1.0, 2.0, 4.0, 8.0]
    return pd.DataFrame({"device": DEVICE, "op": "mm", "dtype": "float32", "k": k * 2,
                         "median_us": [2 * x for x in k] + [held_scale * x for x in k],
                         "held_out": [False] * 4 + [True] * 4})


@pytest.mark.parametrize("held_scale, passes", [(2.0, True), (20.0, False)])
def test_a_model_asset_fits_scores_saves_and_checks(devchar_home, tmp_path, held_scale, passes):
    seen = []

    def table_iv(model, held):
        seen.append((model.scale, len(held)))
        return pd.DataFrame({"kernel": ["mm"], "gmae": [0.0]})

    asset = model_asset(FittedModel("gemm_model", samples="gemm_samples", fit=ScaleModel.fit, predict=predict,
                                    doc="A stand-in.", table_iv=table_iv))
    assert asset.key == dg.AssetKey("gemm_model") and asset.descriptions_by_key[asset.key] == "A stand-in."
    assert {d.asset_key for d in asset.specs_by_key[asset.key].deps} == {dg.AssetKey("gemm_samples")}
    store, tracking = StubStore(tmp_path / "store"), StubTracking()
    result = _materialize(asset, warehouse=StubWarehouse(_model_rows(held_scale)), model_store=store,
                          tracking=tracking)
    assert result.success == passes
    assert _checks(result) == {"heldout_error": passes}
    meta = _metadata(result)  # materialized and reported either way, the failed fit included
    assert {"version", "path", "mlflow_run_id", "heldout_errors", "predicted_vs_measured", "table_iv"} <= set(meta)
    assert "probe_scaling" not in meta and "probe_beta" not in store.saved[next(iter(store.saved))][1]  # not asked for
    ((_, version),) = store.saved
    assert meta["version"].text == version and store.saved["gemm_model", version][1]["heldout_check_passed"] == passes
    # Dagster-native: the held-out errors a table (relative errors in %), the MLflow run a link
    assert meta["mlflow_run"].url == "http://mlflow.test/#/experiments/0/runs/mlflow-run"
    (row,) = [r.data for r in meta["heldout_errors"].records]
    assert row["op"] == "mm" and row["dtype"] == "float32" and row["n"] == 4
    assert row["mean_rel_err %"] == pytest.approx(0.0 if passes else 90.0, abs=0.01)
    assert meta["heldout_mean_rel_err"].value == pytest.approx(0.0 if passes else 0.9)
    assert [c.name for c in meta["table_iv"].schema.columns] == ["kernel", "gmae"]
    # registered as that store version, champion only if it passed
    assert [(r["store_version"], r["passed"]) for r in tracking.registered] == [(version, passes)]
    assert seen == [(2.0, 4)]  # Table IV of the version just saved, on the held-out rows


class TablesWarehouse:
    """device_rows from a dict of frames by table name."""

    def __init__(self, frames: dict):
        self.frames = frames

    def device_rows(self, table: str, device: str, where: str = "", params=None) -> pd.DataFrame:
        return self.frames[table]


def test_accuracy_report_shows_its_tables_as_dagster_tables_and_a_plot(devchar_home):
    from assets.predictions import accuracy_report

    errors = pd.DataFrame({"model": ["devchar", "roofline"], "layer_type": "MM", "dtype": "float32",
                           "mean_rel_err": [0.2, 0.6]})
    pred = pd.DataFrame({"workload": "gpt2", "config": "gpt2-1l-128", "batch": [1, 4], "seq": 128,
                         "predictor": "e2e_shared", "predicted_ms": [20.0, 90.0], "measured_ms": [22.0, 95.0]})
    pred["rel_err"] = pred["predicted_ms"] / pred["measured_ms"] - 1
    result = _materialize(accuracy_report, warehouse=TablesWarehouse({"model_errors": errors, "predictions": pred}))
    meta = _metadata(result)
    table_ii = meta["table_ii_per_layer"]
    assert isinstance(table_ii, dg.TableMetadataValue)
    assert table_ii.records[0].data["devchar %"] == 20.0  # errors as percentages
    assert isinstance(meta["table_iv_per_workload"], dg.TableMetadataValue)
    assert "data:image/png;base64," in meta["predicted_vs_measured"].value
    assert (devchar_home / "plots" / DEVICE / "accuracy_predicted_vs_measured.png").exists()


def test_a_probe_scaled_model_asset_fits_with_the_beta_cross_validation_chose_and_says_which(devchar_home, tmp_path):
    from pipeline.predict.probe_scaling import choose_beta, scaled
    from test_probe_scaling import PerK, predict_per_k  # a table of cells, each a few rows

    rng = np.random.default_rng(0)
    k = np.arange(120) % 25 + 1.0
    slow = rng.uniform(1.0, 1.5, 120)  # the probe reads the machine: a slow spell slows both
    rows = pd.DataFrame({"device": DEVICE, "op": "mm", "dtype": "float32", "k": k, "median_us": 2.0 * k * slow,
                         "probe_us": 20.0 * slow, "held_out": np.arange(120) >= 100})
    train = rows[~rows["held_out"]]
    expected = choose_beta(train, PerK.fit, predict_per_k)
    asset = model_asset(FittedModel("gemm_model", samples="gemm_samples", fit=PerK.fit, predict=predict_per_k,
                                    doc="A stand-in.", probe_scaled=True))
    store = StubStore(tmp_path / "store")
    result = _materialize(asset, warehouse=StubWarehouse(rows), model_store=store, tracking=StubTracking())
    assert result.success
    assert _metadata(result)["probe_scaling"].text == expected.summary() and expected.beta > 0
    ((model, meta),) = store.saved.values()
    assert (meta["probe_beta"], meta["probe_beta_by"]) == (expected.beta, "cross-validation")
    assert meta["probe_reference_us"] == expected.reference_us
    assert model.table.equals(PerK.fit(scaled(train, expected.beta, expected.reference_us)).table)
