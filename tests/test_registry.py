"""The predictor registry (predict/registry.py) and the JSON helpers it relies on (predict/serialize.py).

tests/fixtures/saved_models_v1.json holds a small model.json of every JSON-only predictor as
devchar wrote them before the registry: models in users' stores must keep loading, and a
model loaded and saved again must write the same bytes.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import MissingModelError
from pipeline.predict import registry, store
from pipeline.predict.overheads import OverheadError, OverheadModel

OLD = json.loads((Path(__file__).parent / "fixtures" / "saved_models_v1.json").read_text())["models"]
WEIGHTED = ("opencl_lm", "opencl_scratch")  # saved with tensor files beside model.json
VERSION = "20250101T000000-old"


def _write_old(root: Path, name: str, body: dict) -> None:
    d = root / "dev" / name / VERSION
    d.mkdir(parents=True)
    (d / "model.json").write_text(json.dumps(body))
    (d / "meta.json").write_text("{}")


def test_every_registered_name_names_a_class_saved_under_it():
    for name in registry.NAMES:
        assert registry.predictor_class(name).name == name
    assert set(OLD) == set(registry.NAMES) - set(WEIGHTED)  # the fixture covers every JSON-only predictor
    for name in WEIGHTED:
        cls = registry.predictor_class(name)
        assert callable(cls.from_dir) and callable(cls.write_artifacts)


@pytest.mark.parametrize("name", sorted(OLD))
def test_old_model_json_loads_and_saves_back_byte_for_byte(tmp_path, name):
    _write_old(tmp_path, name, OLD[name])
    model = store.load(tmp_path, "dev", name)
    assert isinstance(model, registry.Predictor)
    assert json.dumps(model.to_dict()) == json.dumps(OLD[name])
    store.save(tmp_path, "dev", name, model, {}, "20260101T000000-new")
    again = store.load(tmp_path, "dev", name)
    assert (tmp_path / "dev" / name / "20260101T000000-new" / "model.json").read_text() == json.dumps(OLD[name])
    assert type(again) is type(model)


def test_dataclass_fields_come_back_as_their_types(tmp_path):
    for name in ("gemm_model", "attention_model"):
        _write_old(tmp_path, name, OLD[name])
    gemm, attn = store.load(tmp_path, "dev", "gemm_model"), store.load(tmp_path, "dev", "attention_model")
    table = gemm.table("mm", "float32", "big")
    assert isinstance(table.thr, np.ndarray) and table.thr.dtype == float and table.split_k == 2
    (attn_table,) = attn.tables.values()
    assert type(attn_table.head_dim) is int and attn_table.causal is True and isinstance(attn_table.bh, np.ndarray)
    assert np.isfinite(gemm.predict("mm", "float32", [8, 512], 64, 100)).all()
    assert np.isfinite(attn.predict("flash", "float16", 2, 2, 256, 256, 64, causal=True))


def test_fields_saved_before_they_existed_take_their_defaults():
    gemm = json.loads(json.dumps(OLD["gemm_model"]))
    for t in gemm["tables"]:
        del t["split_k"]  # saved before cuBLASLt configurations had split-K
    assert {t.split_k for t in registry.predictor_class("gemm_model").from_dict(gemm).tables.values()} == {1}
    overheads = {k: v for k, v in OLD["overhead_model"].items() if k != "counts"}
    assert OverheadModel.from_dict(overheads).counts == {}
    with pytest.raises(OverheadError, match="individual"):
        OverheadModel.from_dict({"version": 1, "shared": {}})


def test_unknown_name_is_a_missing_model_error_naming_it(tmp_path):
    _write_old(tmp_path, "gemm_modle", OLD["gemm_model"])  # a file there does not make the name known
    with pytest.raises(MissingModelError, match="unknown model 'gemm_modle'.*gemm_model"):
        store.load(tmp_path, "dev", "gemm_modle")
    with pytest.raises(MissingModelError, match="'gemm_modle'"):
        registry.predictor_class("gemm_modle")


def test_a_weighted_model_round_trips_through_its_directory(tmp_path):
    from pipeline.opencl.models.scratch import ScratchModel, ScratchNet
    from pipeline.opencl.models.settings import ScratchSize

    size = ScratchSize(max_tokens=8, dim=8, layers=1, heads=2, vocab=5, epochs=1, batch_size=2, lr=1e-3,
                       max_train_rows=0)
    vocab = ["<pad>", "<unk>", "<cls>", "a", "b"]
    model = ScratchModel(size, vocab, ScratchNet(len(vocab), size).eval(), 3.0, 0.5)
    store.save(tmp_path, "dev", "opencl_scratch", model, {}, VERSION)
    loaded = store.load(tmp_path, "dev", "opencl_scratch")
    assert isinstance(loaded, registry.ArtifactPredictor) and not isinstance(loaded, registry.Predictor)
    assert loaded.to_dict() == model.to_dict()
    saved = dict(loaded.net.named_parameters())
    for key, tensor in model.net.named_parameters():
        assert (saved[key] == tensor).all()
