"""The model store (predict/store.py): versions, missing and corrupt models, failed checks."""
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import MissingModelError
from pipeline.predict import store
from pipeline.predict.traffic import utility_traffic
from pipeline.predict.utility import UtilityModel


def _linear_samples(op="relu", dtype="float32"):
    rows, cols = np.meshgrid([1, 16, 256, 1024], [64, 512, 4096])
    rows, cols = rows.ravel(), cols.ravel()
    br, bw, _ = utility_traffic(op, rows, cols, 4)
    us = 3.0 + (br + bw) / 10e3  # 3 us per call, 10 GB/s
    return pd.DataFrame(dict(op=op, dtype=dtype, rows=rows, cols=cols, median_us=us, held_out=False))


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
