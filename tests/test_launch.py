"""`devchar run` launches through the code location (pipeline/cli/launch.py): the run it makes
carries the code location's origin, its partition and asset selection, and the verdict reads
its events as it would an in-process result's."""
import textwrap

import dagster as dg
import pytest

TOY = '''
import dagster as dg

devices = dg.DynamicPartitionsDefinition(name="devices")


@dg.asset(partitions_def=devices)
def samples(context):
    context.log.info(f"measuring {context.partition_key}")


@dg.asset(partitions_def=devices, deps=[samples],
          check_specs=[dg.AssetCheckSpec("heldout_error", asset="model", blocking=True)])
def model():
    yield dg.MaterializeResult(check_results=[dg.AssetCheckResult(passed=False, metadata={"worst_median": 0.5})])


@dg.asset(partitions_def=devices, deps=[model])
def report():
    pass


defs = dg.Definitions(assets=[samples, model, report],
                      jobs=[dg.define_asset_job("characterize_device", selection=dg.AssetSelection.all())],
                      executor=dg.in_process_executor)
'''


@pytest.fixture
def toy_location(tmp_path, devchar_home):
    (tmp_path / "toy_location.py").write_text(textwrap.dedent(TOY))
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("devices", ["cpu-toy-2c"])
    yield instance, tmp_path
    instance.dispose()


def launch_toy(toy_location, **kw):
    from pipeline.cli.launch import launch

    instance, where = toy_location
    return instance, launch(instance, "characterize_device", partition_key="cpu-toy-2c", run_config={},
                            module="toy_location", working_directory=where, **kw)


def test_the_run_belongs_to_the_code_location_and_its_partition(toy_location):
    instance, got = launch_toy(toy_location)
    run = instance.get_run_by_id(got.run_id)
    assert got.location == "toy_location"
    assert run.remote_job_origin.location_name == "toy_location"  # what the UI's Jobs and Re-execute match on
    assert run.tags["dagster/partition"] == "cpu-toy-2c"
    steps = {e.step_key for e in got.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {"samples"}  # the blocking check stopped model, and report never ran
    assert not got.success


def test_an_asset_selection_runs_only_those_assets(toy_location):
    instance, got = launch_toy(toy_location, asset_selection=[dg.AssetKey("samples")])
    assert got.success
    assert instance.get_run_by_id(got.run_id).asset_selection == {dg.AssetKey("samples")}


def test_the_verdict_of_a_launched_run_names_its_blocking_check(toy_location, capsys, monkeypatch):
    import pipeline.cli.main as cli

    monkeypatch.setattr("pipeline.analysis.run_report.noisy_shares", lambda wh, slug: {})
    _, got = launch_toy(toy_location)
    assert cli._report_run(got, "cpu-toy-2c") == 1
    err = capsys.readouterr().err
    assert "failed at ['model']" in err and "blocking check model.heldout_error failed: worst_median 0.5" in err, err


def test_devchar_run_and_the_ui_name_the_same_code_location():
    """The UI (`make ui`: dagster dev -w workspace.yaml) matches runs to its code location by
    name: the location `devchar run` launches from must be the one workspace.yaml serves."""
    from dagster._core.workspace.load_target import ModuleTarget, WorkspaceFileTarget

    from pipeline.cli.launch import CODE_LOCATION_MODULE
    from pipeline.core.config import REPO_ROOT

    (served,) = WorkspaceFileTarget([str(REPO_ROOT / "workspace.yaml")]).create_origins()
    (ours,) = ModuleTarget(CODE_LOCATION_MODULE, None, str(REPO_ROOT), None).create_origins()
    assert served.location_name == ours.location_name == "pipeline.definitions"
