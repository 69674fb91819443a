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


@pytest.fixture(autouse=True)
def _no_probe_reading_carried_over():
    """Each test starts without a recent probe reading (spells.RECENT_S): one left by the test
    before would stand in for its first reading, and a test that fakes the probes would see it."""
    from pipeline.harness import spells

    spells.forget_reading()


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


@pytest.fixture(scope="session")
def cpu():
    """This machine's CPU as devchar identifies it (the sweeps' device argument)."""
    from pipeline.device.discover import identify_cpu

    return identify_cpu()


@pytest.fixture(scope="session")
def dlrm_captures():
    """Execution graphs of the tiny DLRM training step at batch 4, 8 and 16: captured once for
    every test that prices, predicts or transforms them (each capture runs the model), from the
    step the traces sweep captures (built_step: a pool of batches)."""
    from pipeline.workloads.capture import capture
    from pipeline.workloads.dlrm import TINY_CONFIGS
    from pipeline.workloads.dlrm_run import built_step

    spec = TINY_CONFIGS[0]
    return {b: capture(built_step(spec, b), warmup=1) for b in (4, 8, 16)}


class FlatKernelModel:
    """A made-up kernel model: 1 µs per call, whatever the op."""

    def predict(self, *args, **kw):
        return 1.0


@pytest.fixture
def flat():
    return FlatKernelModel()


@pytest.fixture
def linear_utility_samples():
    """utility_samples rows that follow one linear law: 3 µs per call plus bytes at 10 GB/s."""
    import numpy as np
    import pandas as pd

    from pipeline.predict.traffic import utility_traffic

    def make(op="relu", dtype="float32"):
        rows, cols = np.meshgrid([1, 16, 256, 1024], [64, 512, 4096])
        rows, cols = rows.ravel(), cols.ravel()
        br, bw, _ = utility_traffic(op, rows, cols, 4)
        us = 3.0 + (br + bw) / 10e3
        return pd.DataFrame(dict(op=op, dtype=dtype, rows=rows, cols=cols, median_us=us, held_out=False))

    return make
