"""pipeline/cli/run_plan.py: which assets `devchar run` materializes (--skip, reference plans)."""
from __future__ import annotations

import pytest

from pipeline.cli.main import main as cli_main
from pipeline.cli.run_plan import skipping


def test_run_skip_leaves_out_an_asset_and_what_depends_on_it(capsys):
    keys = {k.to_user_string() for k in skipping(None, ["opencl_models"])}
    assert "opencl_models" not in keys and {"opencl_launches", "gemm_model", "accuracy_report"} <= keys
    keys = {k.to_user_string() for k in skipping(None, ["gemm_samples"])}
    assert not keys & {"gemm_samples", "gemm_model", "transformer_predictions", "accuracy_report"}
    assert "utility_model" in keys
    # within a reference's own selection, nothing it did not have comes back
    assert {k.to_user_string() for k in skipping(["gemm_samples", "gemm_model", "utility_samples"],
                                                  ["gemm_samples"])} == {"utility_samples"}
    assert "skipping gemm_model, gemm_samples" in capsys.readouterr().out


def test_run_skip_of_an_unknown_asset_is_one_error(devchar_home, capsys):
    assert cli_main(["run", "--device", "cpu", "--skip", "opencl_modelz"]) == 2
    err = capsys.readouterr().err
    assert "opencl_modelz" in err and "opencl_models" in err


def test_run_skip_on_this_machine_still_measures_it(devchar_home, monkeypatch):
    import dagster as dg

    import pipeline.cli.launch as launch_module

    class Stop(Exception):
        pass

    seen = {}

    def launch(instance, job, partition_key, run_config, asset_selection):
        seen.update(run_config=run_config, selection=set(asset_selection))
        raise Stop

    monkeypatch.setattr(launch_module, "launch", launch)
    with pytest.raises(Stop):
        cli_main(["run", "--device", "cpu", "--skip", "opencl_models"])
    runner = seen["run_config"].get("resources", {}).get("device_runner", {}).get("config", {})
    assert "source" not in runner  # measured here, not replayed from a committed calibration
    assert dg.AssetKey("opencl_models") not in seen["selection"] and dg.AssetKey("gemm_samples") in seen["selection"]


def test_run_skip_and_expect_failing_of_the_same_asset_is_one_error(devchar_home, capsys):
    assert cli_main(["run", "--device", "cpu", "--skip", "opencl_models",
                     "--expect-failing", "opencl_models.validation_mape"]) == 2
    assert "opencl_models.validation_mape" in capsys.readouterr().err
