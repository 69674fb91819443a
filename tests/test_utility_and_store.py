"""Utility regression, byte accounting, the model store and the CLI's error path."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.cli.main import main as cli_main
from pipeline.core.errors import BadShapeError, MissingModelError, UnknownDtypeError
from pipeline.predict import store
from pipeline.predict.traffic import utility_traffic
from pipeline.predict.utility import UtilityModel


def test_traffic_counts_bytes_of_each_op():
    assert utility_traffic("add", 4, 8, 4) == (2 * 32 * 4, 32 * 4, 32)
    br, bw, _ = utility_traffic("layernorm", 4, 8, 2)
    assert br == 32 * 2 + 2 * 8 * 2 and bw == 32 * 2  # input plus weight and bias
    assert utility_traffic("dropout", 1, 10, 4)[1] == 40 + 10  # output plus a byte mask


def _linear_samples(op="relu", dtype="float32"):
    rows, cols = np.meshgrid([1, 16, 256, 1024], [64, 512, 4096])
    rows, cols = rows.ravel(), cols.ravel()
    br, bw, _ = utility_traffic(op, rows, cols, 4)
    us = 3.0 + (br + bw) / 10e3  # 3 us per call, 10 GB/s
    return pd.DataFrame(dict(op=op, dtype=dtype, rows=rows, cols=cols, median_us=us, held_out=False))


def test_regression_recovers_a_linear_law():
    model = UtilityModel.fit(_linear_samples())
    br, bw, _ = utility_traffic("relu", 300, 700, 4)
    assert model.predict("relu", "float32", 300, 700) == pytest.approx(3.0 + (br + bw) / 10e3, rel=1e-3)
    again = UtilityModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.predict("relu", "float32", 5, 5) == pytest.approx(model.predict("relu", "float32", 5, 5))


def test_a_kernel_switch_becomes_two_regimes():
    """Softmax on the CPU: below 16 columns a scalar kernel, 15x slower per element."""
    rows, cols = (a.ravel() for a in np.meshgrid([1, 16, 128, 1024, 4096], [1, 4, 8, 16, 64, 256, 1024]))
    br, bw, _ = utility_traffic("softmax", rows, cols, 4)
    per_byte = np.where(cols < 16, 15e-4, 1e-4)
    df = pd.DataFrame(dict(op="softmax", dtype="float32", rows=rows, cols=cols, held_out=False,
                           median_us=2.0 + (br + bw) * per_byte))
    model = UtilityModel.fit(df)
    assert model.regimes[("softmax", "float32")]["split"] == {"on": "cols", "at": 16.0}
    for r, c in ((700, 12), (700, 40), (3, 2000)):
        br, bw, _ = utility_traffic("softmax", r, c, 4)
        want = 2.0 + (br + bw) * (15e-4 if c < 16 else 1e-4)
        assert model.predict("softmax", "float32", r, c) == pytest.approx(want, rel=1e-3)
    assert UtilityModel.fit(_linear_samples()).regimes[("relu", "float32")]["split"] is None  # one law: no split
    again = UtilityModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict("softmax", "float32", rows, cols), model.predict("softmax", "float32",
                                                                                                rows, cols))


def test_utility_model_saved_before_regimes_still_loads():
    old = {"kind": "utility_model", "coefs": [{"op": "relu", "dtype": "float32", "coef": [3.0, 1e-4, 0.0, 0.0]}]}
    br, bw, _ = utility_traffic("relu", 10, 10, 4)
    assert UtilityModel.from_dict(old).predict("relu", "float32", 10, 10) == pytest.approx(3.0 + (br + bw) * 1e-4)


def test_utility_bad_input():
    model = UtilityModel.fit(_linear_samples())
    with pytest.raises(BadShapeError, match="rows=0"):
        model.predict("relu", "float32", 0, 5)
    with pytest.raises(UnknownDtypeError, match="int4"):
        model.predict("relu", "int4", 1, 5)
    with pytest.raises(MissingModelError, match="gelu"):
        model.predict("gelu", "float32", 1, 5)


def test_store_versions_missing_and_corrupt(tmp_path):
    model = UtilityModel.fit(_linear_samples())
    with pytest.raises(MissingModelError, match="dev-a"):
        store.load(tmp_path, "dev-a", "utility_model")
    store.save(tmp_path, "dev-a", "utility_model", model, {"n": 1}, "20260101T000000-aaaa")
    path = store.save(tmp_path, "dev-a", "utility_model", model, {"n": 2}, "20260102T000000-bbbb")
    assert store.versions(tmp_path, "dev-a", "utility_model") == ["20260101T000000-aaaa", "20260102T000000-bbbb"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]  # no half-written leftovers
    (path / "model.json").write_text("{not json")
    with pytest.raises(MissingModelError, match="corrupt"):
        store.load(tmp_path, "dev-a", "utility_model")
    assert store.load(tmp_path, "dev-a", "utility_model", "20260101T000000-aaaa").regimes


def test_latest_skips_versions_that_failed_their_check(tmp_path):
    good, bad = UtilityModel.fit(_linear_samples("relu")), UtilityModel.fit(_linear_samples("gelu"))
    store.save(tmp_path, "d", "utility_model", good, {"heldout_check_passed": True}, "20260101T000000-a")
    store.save(tmp_path, "d", "utility_model", bad, {"heldout_check_passed": False}, "20260102T000000-b")
    assert set(store.load(tmp_path, "d", "utility_model").regimes) == {("relu", "float32")}
    assert set(store.load(tmp_path, "d", "utility_model", "20260102T000000-b").regimes) == {("gelu", "float32")}
    store.save(tmp_path, "e", "utility_model", bad, {"heldout_check_passed": False}, "20260102T000000-b")
    with pytest.raises(MissingModelError, match="held-out check"):
        store.load(tmp_path, "e", "utility_model")


def test_cli_predict_without_models_is_one_clear_error(devchar_home, capsys):
    assert cli_main(["predict", "--device", "cpu-nowhere", "--layers", "2", "--hidden", "64", "--heads", "2"]) == 2
    err = capsys.readouterr().err
    assert "cpu-nowhere" in err and "Traceback" not in err
    assert cli_main(["predict", "--device", "cpu-nowhere", "--batch", "0"]) == 2
    assert "batch=0" in capsys.readouterr().err
