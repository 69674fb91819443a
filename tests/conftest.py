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
