"""The MLflow model registry (issue 15): one registered model per (model, device), a version per
fit recording its model-store version, `champion` only on versions that passed their held-out
check, runs tagged with the Dagster run, the experiment opening in MLflow 3's model-training
view; `devchar predict` loads exactly the champion's store version, else the store's latest
passing version and says so. A temporary sqlite tracking store; no MLflow model is logged."""
from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
from mlflow import MlflowClient

from pipeline.analysis.champion import CHAMPION, champion_version, registered_name
from pipeline.cli.main import main as cli_main
from resources.tracking import EXPERIMENT, MLflowTracking
from test_cli import TINY, device_models  # noqa: F401 - a fixture
from test_factories import ScaleModel, StubStore, StubWarehouse, _model_rows, predict

DEVICE = "cpu-test"


@pytest.fixture
def tracking(devchar_home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return MLflowTracking(tracking_uri=uri, artifact_root=str(tmp_path / "artifacts")), uri


def _fit(t: MLflowTracking, version: str, passed: bool, tmp_path, device: str = DEVICE, run="dagster-run-1"):
    path = tmp_path / "store" / device / "gemm_model" / version
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.json").write_text("{}")
    return t.log_fit("gemm_model", device, {"version": version}, {"err": 0.1}, {}, [path / "model.json"],
                     store_version=version, store_path=path, passed=passed, dagster_run_id=run)


def test_champion_moves_only_to_versions_that_passed(tracking, tmp_path):
    t, uri = tracking
    first = _fit(t, "20260101T000000-aaaaaaaa", True, tmp_path)
    failed = _fit(t, "20260102T000000-bbbbbbbb", False, tmp_path, run="dagster-run-2")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    name = registered_name("gemm_model", DEVICE)
    assert name == "devchar-gemm_model-cpu-test"
    versions = {v.version: v for v in client.search_model_versions(f"name='{name}'")}
    assert len(versions) == 2
    champ = client.get_model_version_by_alias(name, CHAMPION)
    assert champ.run_id == first and champ.tags["store_version"] == "20260101T000000-aaaaaaaa"
    assert champ.source.startswith("file://") and champ.source.endswith("20260101T000000-aaaaaaaa")
    (bad,) = [v for v in versions.values() if v.run_id == failed]
    assert bad.tags["heldout_check"] == "failed" and bad.aliases == []
    assert client.get_run(failed).data.tags["heldout_check"] == "failed"
    assert client.get_run(failed).data.tags["dagster_run_id"] == "dagster-run-2"
    assert client.get_run(first).data.tags["heldout_check"] == "passed"
    assert champion_version("gemm_model", DEVICE, uri) == ("20260101T000000-aaaaaaaa", "")
    # a newer passing fit takes the alias
    _fit(t, "20260103T000000-cccccccc", True, tmp_path)
    assert champion_version("gemm_model", DEVICE, uri)[0] == "20260103T000000-cccccccc"
    # one registered model per (model, device)
    _fit(t, "20260104T000000-dddddddd", True, tmp_path, device="cpu-other")
    assert champion_version("gemm_model", DEVICE, uri)[0] == "20260103T000000-cccccccc"
    assert champion_version("gemm_model", "cpu-other", uri)[0] == "20260104T000000-dddddddd"
    kind = client.get_experiment_by_name(EXPERIMENT).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"


def test_no_registry_entry_is_said(devchar_home, tmp_path):
    version, why = champion_version("gemm_model", DEVICE)  # no mlflow.db under DEVCHAR_HOME
    assert version is None and "no MLflow tracking store" in why
    assert not (devchar_home / "mlflow.db").exists()  # asking created none


def test_a_model_asset_tags_its_mlflow_run_with_the_dagster_run(tracking, tmp_path):
    from assets.factories import FittedModel, model_asset
    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import devices

    t, uri = tracking
    asset = model_asset(FittedModel("gemm_model", samples="gemm_samples", fit=ScaleModel.fit, predict=predict,
                                    doc="A stand-in."))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [DEVICE])
        result = dg.materialize([asset], partition_key=DEVICE, instance=instance, resources={
            **defs.resources, "warehouse": StubWarehouse(_model_rows(2.0)),
            "model_store": StubStore(tmp_path / "store"), "tracking": t})
    assert result.success
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(meta["mlflow_run_id"].text)
    assert run.data.tags["dagster_run_id"] == result.run_id
    assert meta["mlflow_run"].url == f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert champion_version("gemm_model", DEVICE, uri)[0] == meta["version"].text


def test_predict_loads_exactly_the_champions_store_version(device_models, devchar_home, tmp_path, capsys):
    from pipeline.core.config import mlflow_uri, model_store_root
    from pipeline.predict import store

    args = ["predict", "--device", DEVICE, *TINY, "--batch", "1", "--seq", "8"]
    assert cli_main(args) == 0
    first = capsys.readouterr()
    assert "devchar: note: no MLflow tracking store" in first.err and "20260101T000000-x" in first.err
    # a newer, slower version: the store's latest passing, used while nothing is registered
    old = model_store_root() / DEVICE / "gemm_model" / "20260101T000000-x"
    slow = store.load(model_store_root(), DEVICE, "gemm_model")
    slow_dict = slow.to_dict()
    newer = "20260102T000000-y"
    store.save(model_store_root(), DEVICE, "gemm_model", type(slow).from_dict(_scaled(slow_dict, 10.0)), {},
               newer)
    assert cli_main(args) == 0
    second = capsys.readouterr()
    assert second.out != first.out and newer in second.err
    # registered: the old version is champion, the newer one failed its check
    t = MLflowTracking()  # the default store under DEVCHAR_HOME, the one predict reads
    t.log_fit("gemm_model", DEVICE, {}, {}, {}, [], store_version="20260101T000000-x", store_path=old, passed=True)
    t.log_fit("gemm_model", DEVICE, {}, {}, {}, [], store_version=newer, passed=False)
    assert champion_version("gemm_model", DEVICE, mlflow_uri())[0] == "20260101T000000-x"
    assert cli_main(args) == 0
    third = capsys.readouterr()
    assert third.out == first.out
    assert "gemm_model" not in third.err  # found in the registry: nothing said for it
    assert "utility_model" in third.err  # never registered: the store's latest, said


def _scaled(d, factor):
    """A saved GemmModel's dict with every fitted time scaled (a slower device)."""
    if isinstance(d, dict):
        return {k: _scaled(v, factor) for k, v in d.items()}
    if isinstance(d, list):
        return [_scaled(v, factor) for v in d]
    return d * factor if isinstance(d, float) else d
