"""Configuration through resources (resources/env.py): the DEVCHAR_* knobs feed resource fields as
dg.EnvVar, run config overrides them, `devchar run --profile` is run config, and the engine reads
none of them from the environment."""
import argparse
import ast
import os
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from pipeline.cli.launch import LaunchedRun
from pipeline.core.config import REPO_ROOT
from pipeline.core.errors import DevcharError
from resources.devices import DeviceRunner
from resources.env import from_env, resolved
from resources.quality import QualityGates
from resources.warehouse import DuckDBWarehouse, lock_pauses


def _seen(resource_key: str, resource, run_config: dict | None = None):
    """What a one-asset run sees of `resource` (bound under `resource_key`), after Dagster's
    config processing: EnvVars read, run config applied."""
    seen = {}

    @dg.asset(required_resource_keys={resource_key})
    def probe(context: dg.AssetExecutionContext) -> None:
        seen["value"] = getattr(context.resources, resource_key)

    assert dg.materialize([probe], resources={resource_key: resource}, run_config=run_config).success
    return seen["value"]


def test_unset_variables_leave_the_documented_defaults(monkeypatch):
    for var in (*QualityGates.ENV.values(), *DeviceRunner.ENV.values(), *DuckDBWarehouse.ENV.values()):
        monkeypatch.delenv(var, raising=False)
    assert resolved(QualityGates).gates() == QualityGates().gates()
    assert (QualityGates().gates().max_heldout_err, QualityGates().gates().max_noisy_share) == (0.5, 0.25)
    assert resolved(DeviceRunner).profile == "quick" and resolved(DuckDBWarehouse).lock_wait_s == "60"


def test_a_set_variable_is_an_env_var_read_when_the_run_starts(monkeypatch):
    monkeypatch.setenv("DEVCHAR_MAX_NOISY_SHARE", "0.4")
    gates = from_env(QualityGates)  # as pipeline/definitions.py binds it when the code location loads
    assert gates.max_noisy_share == "DEVCHAR_MAX_NOISY_SHARE"  # the variable's name, not its value
    monkeypatch.setenv("DEVCHAR_MAX_NOISY_SHARE", "0.3")  # read at run start, not at load
    assert _seen("quality_gates", gates).gates().max_noisy_share == 0.3
    run_config = {"resources": {"quality_gates": {"config": {"max_noisy_share": "0.2"}}}}
    assert _seen("quality_gates", gates, run_config).gates().max_noisy_share == 0.2  # run config wins


def test_a_threshold_that_is_not_a_number_names_its_variable(monkeypatch):
    monkeypatch.setenv("DEVCHAR_MAX_HELDOUT_ERR", "half")
    with pytest.raises(DevcharError, match=r"max_heldout_err \(\$DEVCHAR_MAX_HELDOUT_ERR\) must be a number"):
        resolved(QualityGates).gates()
    assert QualityGates(max_heldout_err=0.1).gates().max_heldout_err == 0.1  # a number in code works too


class _CannedRunner(DeviceRunner):
    """Four workload runs, one of them noisy (cv > 0.1), as if measured."""

    def run(self, context, sweep: str, device: str) -> pd.DataFrame:
        return pd.DataFrame({"workload": "gpt2", "config": "gpt2-test", "batch": 1, "seq": [8, 16, 32, 64],
                             "mode": "forward", "dtype": "float32", "measured_ms": [1.0, 2.0, 3.0, 4.0],
                             "p20_ms": [0.9, 1.9, 2.9, 3.9], "p80_ms": [1.1, 2.1, 3.1, 4.1],
                             "cv": [0.5, 0.01, 0.01, 0.01], "reps": 25, "device": device, "run_id": "r1"})


@pytest.mark.parametrize("max_noisy_share, passed", [("0.2", False), ("0.3", True)])
def test_the_sweep_noise_check_applies_the_quality_gates_resource(devchar_home, max_noisy_share, passed):
    """One verdict per device run (sweep_quality), from the tables the run wrote: here
    workload_runs, one of its four rows noisy (cv > 0.1)."""
    from assets.samples import sweep_quality, workload_runs

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("devices", ["cpu-test-2c"])
    result = dg.materialize([workload_runs, sweep_quality], partition_key="cpu-test-2c", instance=instance,
                            resources={"device_runner": _CannedRunner(), "warehouse": DuckDBWarehouse(),
                                       "quality_gates": QualityGates(max_noisy_share=max_noisy_share)})
    (noise,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "sweep_noise"]
    assert noise.passed is passed and noise.asset_key == dg.AssetKey("sweep_quality")
    assert noise.metadata["noisy_share"].value == ("none over the gate" if passed else "workload_runs 25%")


def test_devchar_run_profile_is_run_config_not_the_environment(devchar_home, monkeypatch):
    """`devchar run --profile full`: the job gets the profile in its run config (valid for it);
    the process environment is left as it was."""
    import pipeline.cli.main as cli
    from pipeline.definitions import defs

    monkeypatch.delenv("DEVCHAR_PROFILE", raising=False)
    monkeypatch.setattr("pipeline.device.discover.identify", lambda kind: argparse.Namespace(slug="cpu-test-2c"))
    monkeypatch.setattr(cli, "summary", lambda slug, run_id=None: "")
    monkeypatch.setattr(cli, "_report_run", lambda result, slug, expected=(): 0)
    got = {}
    monkeypatch.setattr("pipeline.cli.launch.launch", lambda instance, job, **kw: got.update(
        kw, job=defs.resolve_job_def(job)) or LaunchedRun("r", True))
    assert cli.main(["run", "--profile", "full"]) == 0
    assert "DEVCHAR_PROFILE" not in os.environ
    assert got["run_config"]["resources"]["device_runner"]["config"] == {"profile": "full"}
    processed = dg.validate_run_config(got["job"], got["run_config"])
    assert processed["resources"]["device_runner"]["config"]["profile"] == "full"
    # and a device_runner bound to DEVCHAR_PROFILE still takes run config's profile
    monkeypatch.setenv("DEVCHAR_PROFILE", "tiny")
    assert _seen("device_runner", from_env(DeviceRunner), got["run_config"]).profile == "full"
    assert _seen("device_runner", from_env(DeviceRunner)).profile == "tiny"
    assert "quality_gates" in defs.resources


def test_devchar_run_without_profile_says_the_configured_one(devchar_home, monkeypatch, capsys):
    import pipeline.cli.main as cli

    monkeypatch.setenv("DEVCHAR_PROFILE", "tiny")
    monkeypatch.setattr("pipeline.device.discover.identify", lambda kind: argparse.Namespace(slug="cpu-test-2c"))
    monkeypatch.setattr(cli, "summary", lambda slug, run_id=None: "")
    monkeypatch.setattr(cli, "_report_run", lambda result, slug, expected=(): 0)
    got = {}
    monkeypatch.setattr("pipeline.cli.launch.launch", lambda instance, job, **kw: got.update(kw) or LaunchedRun("r", True))
    assert cli.main(["run"]) == 0
    assert "resources" not in got["run_config"]  # the code location's binding of DEVCHAR_PROFILE decides
    assert "profile tiny" in capsys.readouterr().out


def test_the_warehouse_is_a_duckdb_resource_with_the_lock_wait(devchar_home):
    from dagster_duckdb import DuckDBResource

    wh = DuckDBWarehouse(lock_wait_s=0.5, connection_config={"threads": 1})
    assert isinstance(wh, DuckDBResource) and wh.lock_wait_s == "0.5"
    with wh.get_connection() as con:  # DuckDBResource's API, on $DEVCHAR_HOME's file
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    assert wh.db_path() == devchar_home / "devchar.duckdb" and wh.db_path().is_file()
    assert sum(lock_pauses(60)) == pytest.approx(60) and max(lock_pauses(60)) == 2.0 and lock_pauses(0) == []
    with pytest.raises(DevcharError, match="DEVCHAR_LOCK_WAIT_S"):
        with DuckDBWarehouse(lock_wait_s="soon").connect():
            pass


def _environment_reads(path: Path) -> set[str]:
    """The names read by os.environ.get / os.environ[...] / os.getenv in one module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        arg = None
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
            arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            arg = node.slice
        if isinstance(arg, ast.Constant):
            names.add(arg.value)
    return names


def test_the_engine_reads_no_resource_setting_from_the_environment():
    """The knobs that are resource configuration reach the engine as arguments only."""
    knobs = {*QualityGates.ENV.values(), *DeviceRunner.ENV.values(), *DuckDBWarehouse.ENV.values()}
    engine = [p for pkg in ("core", "harness", "device", "predict", "workloads", "analysis", "sweeps", "opencl")
              for p in (REPO_ROOT / "pipeline" / pkg).rglob("*.py")]
    read = {str(p.relative_to(REPO_ROOT)): _environment_reads(p) & knobs for p in engine}
    assert not {p: names for p, names in read.items() if names}


def test_devchar_run_threads_is_run_config_and_valid_for_the_job(devchar_home, monkeypatch):
    import pipeline.cli.main as cli
    from pipeline.definitions import defs

    monkeypatch.setattr("pipeline.device.discover.identify", lambda kind: argparse.Namespace(slug="cpu-test-2c"))
    monkeypatch.setattr(cli, "summary", lambda slug, run_id=None: "")
    monkeypatch.setattr(cli, "_report_run", lambda result, slug, expected=(): 0)
    got = {}
    monkeypatch.setattr("pipeline.cli.launch.launch", lambda instance, job, **kw: got.update(kw) or LaunchedRun("r", True))
    assert cli.main(["run", "--threads", "1"]) == 0
    assert got["run_config"]["resources"]["device_runner"]["config"] == {"threads": 1}
    processed = dg.validate_run_config(defs.resolve_job_def("characterize_device"), got["run_config"])
    assert processed["resources"]["device_runner"]["config"]["threads"] == 1


def test_the_timing_scale_comes_from_its_variable_as_a_number(monkeypatch):
    monkeypatch.setenv("DEVCHAR_TIMING_SCALE", "0.5")
    runner = from_env(DeviceRunner)  # Dagster has no float source: the field is text
    assert _seen("device_runner", runner).scale() == 0.5
    assert DeviceRunner(timing_scale=0.25).scale() == 0.25  # a number in code works too
    monkeypatch.setenv("DEVCHAR_TIMING_SCALE", "fast")
    with pytest.raises(DevcharError, match=r"timing_scale \(\$DEVCHAR_TIMING_SCALE\) must be a number"):
        resolved(DeviceRunner).scale()
