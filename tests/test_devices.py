"""`devchar run --device <slug>`: a committed calibration replayed without measuring anything."""
import types

import pandas as pd
import pytest

import resources.devices as devices_mod
from pipeline.runner import SWEEPS, tables_of
from pipeline.core.errors import UnknownDeviceError


def _calibration(root, slug, sweeps):
    folder = root / slug
    folder.mkdir(parents=True)
    for sweep in sweeps:
        for table in tables_of(sweep):
            pd.DataFrame({"device": [slug], "x": [1.0]}).to_parquet(folder / f"{table}.parquet")
    return folder


def test_plan_skips_what_the_calibration_lacks(tmp_path, monkeypatch, devchar_home):
    from pipeline.cli.run_plan import reference_plan

    monkeypatch.setattr(devices_mod, "reference_root", lambda: tmp_path)
    _calibration(tmp_path, "cuda-some-gpu", [s for s in SWEEPS if s != "opencl"])
    slug, keys = reference_plan("cuda-some-gpu")
    names = {k.to_user_string() for k in keys}
    assert slug == "cuda-some-gpu"
    assert {"device_spec", "gemm_model", "utility_model", "transformer_predictions", "accuracy_report",
            "gemm_config_model"} <= names
    assert not names & {"opencl_launches", "opencl_models"}


def test_unknown_slug_is_one_clear_error(tmp_path, monkeypatch, devchar_home, capsys):
    from pipeline.cli import main as cli

    monkeypatch.setattr(devices_mod, "reference_root", lambda: tmp_path)
    _calibration(tmp_path, "cpu-some-cpu-2c", ["device"])
    assert cli.main(["run", "--device", "cuda-not-committed"]) == 2
    err = capsys.readouterr().err
    assert "cuda-not-committed" in err and "cpu-some-cpu-2c" in err and "Traceback" not in err


def test_reference_source_loads_the_calibration_even_for_a_local_device(tmp_path, monkeypatch):
    from pipeline.device.discover import identify

    local = identify("cpu").slug
    monkeypatch.setattr(devices_mod, "reference_root", lambda: tmp_path)
    _calibration(tmp_path, local, ["gemm"])
    ctx = types.SimpleNamespace(log=types.SimpleNamespace(info=lambda msg: None))
    got = devices_mod.DeviceRunner(source="reference").run(ctx, "gemm", local)
    assert list(got["x"]) == [1.0] and list(got["device"]) == [local]  # the file's rows, nothing measured
    with pytest.raises(UnknownDeviceError, match="reference calibration"):
        devices_mod.DeviceRunner(source="reference").run(ctx, "utility", local)
