import os

import pytest


@pytest.fixture
def devchar_home(tmp_path, monkeypatch):
    """A fresh DEVCHAR_HOME per test: nothing leaks into the user's ./.devchar."""
    home = tmp_path / "devchar"
    monkeypatch.setenv("DEVCHAR_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    (home / "dagster").mkdir(parents=True)
    return home


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def synthetic_gemm_model():
    """A GemmModel fitted on a small made-up sweep (3 wave counts x 4 K values, op mm, float32)."""
    import pandas as pd

    from pipeline.predict.gemm import GemmModel

    rows = [dict(op="mm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1, m=m, n=n, k=k,
                 waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False)
            for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64))) for k in (32, 64, 128, 256)]
    return GemmModel.fit(pd.DataFrame(rows))
