"""The model store (predict/store.py): versions, missing and corrupt models, failed checks."""
import pytest

from pipeline.core.errors import MissingModelError
from pipeline.predict import store
from pipeline.predict.utility import UtilityModel


def test_store_versions_missing_and_corrupt(tmp_path, linear_utility_samples):
    model = UtilityModel.fit(linear_utility_samples())
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


def test_latest_skips_versions_that_failed_their_check(tmp_path, linear_utility_samples):
    good, bad = UtilityModel.fit(linear_utility_samples("relu")), UtilityModel.fit(linear_utility_samples("gelu"))
    store.save(tmp_path, "d", "utility_model", good, {"heldout_check_passed": True}, "20260101T000000-a")
    store.save(tmp_path, "d", "utility_model", bad, {"heldout_check_passed": False}, "20260102T000000-b")
    assert set(store.load(tmp_path, "d", "utility_model").regimes) == {("relu", "float32")}
    assert set(store.load(tmp_path, "d", "utility_model", "20260102T000000-b").regimes) == {("gelu", "float32")}
    store.save(tmp_path, "e", "utility_model", bad, {"heldout_check_passed": False}, "20260102T000000-b")
    with pytest.raises(MissingModelError, match="held-out check"):
        store.load(tmp_path, "e", "utility_model")
