"""memory_samples sweep (tiny, CPU) and its model: the DLRM paper's memory-kernel roofline and MLPs."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict.memory import OP_DIMS, MemoryModel, memory_bytes
from pipeline.predict.memory import table_iv_rows as memory_table_iv

SMALL_GRID = {"layers": [3], "neurons": [32], "solver": ["adam"], "lr": [1e-2], "epochs": 150}


def test_memory_sweep_tiny(cpu):
    from pipeline.sweeps.memory import sweep_memory

    logs = []
    df = pd.DataFrame(sweep_memory(cpu, "tiny", log=logs.append))
    assert set(df["op"]) == {"concat", "memcpy_d2d", "transpose", "tril_fwd", "tril_bwd"}
    assert any("memcpy_h2d skipped" in m for m in logs)  # no host-to-device copy on the CPU, and it says so
    assert (df["median_us"] > 0).all() and (df["bytes"] > 0).all()
    for op, g in df.groupby("op"):
        assert set(g["held_out"]) == {False, True}, op


def _memory_samples():
    rows = []
    for b, n, k in itertools.product((16, 128, 1024), (16, 64, 256), (2, 9, 27)):
        rows.append(dict(op="concat", batch=b, m=1, n=n, k=k, median_us=2.0 + 2 * b * n * k * 4 / 50e3))
    for b, m, n in itertools.product((1, 4, 16, 64), (16, 32, 64, 128, 256), (16, 32, 64, 128, 256)):
        rows.append(dict(op="transpose", batch=b, m=m, n=n, k=1, median_us=1.0 + 2e-4 * b * m * n))
    return pd.DataFrame(rows).assign(dtype="float32", held_out=False)


def test_memory_model_round_trip_and_training_points():
    df = _memory_samples()
    model = MemoryModel.fit(df, grid=SMALL_GRID)
    again = MemoryModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert model.bandwidth_gbps("concat", "float32") == pytest.approx(50.0, rel=1e-6)
    for op, g in df.groupby("op"):
        shape = {d: g[d].to_numpy() for d in OP_DIMS[op]}
        pred = again.predict(op, "float32", **shape)
        assert pred == pytest.approx(model.predict(op, "float32", **shape))
        err = np.abs(pred / g["median_us"].to_numpy() - 1)
        assert np.median(err) < (1e-6 if op == "concat" else 0.15), op
    assert np.ndim(model.predict("transpose", "float32", batch=2, m=100, n=50)) == 0
    table = memory_table_iv(model, df)
    assert set(table["kernel"]) == {"concat", "transpose"} and (table["n"] > 0).all()


def test_memory_fit_refuses_held_out_rows():
    with pytest.raises(ValueError, match="held-out"):
        MemoryModel.fit(_memory_samples().assign(held_out=True))


def test_memory_bad_input_names_the_value():
    mem = MemoryModel.fit(_memory_samples()[lambda d: d["op"] == "concat"])
    with pytest.raises(BadShapeError, match="k=0"):
        mem.predict("concat", "float32", batch=4, n=8, k=0)
    with pytest.raises(BadShapeError, match="missing"):
        mem.predict("concat", "float32", batch=4, n=8)
    with pytest.raises(BadShapeError, match="m=3"):
        mem.predict("concat", "float32", batch=4, n=8, k=2, m=3)
    with pytest.raises(BadShapeError, match="permute"):
        mem.predict("permute", "float32", batch=4)
    with pytest.raises(BadShapeError, match="n=1"):
        memory_bytes("tril_fwd", 4, batch=4, n=1)
    with pytest.raises(MissingModelError, match="transpose"):
        mem.predict("transpose", "float32", batch=1, m=2, n=2)


def test_concat_pays_per_input_and_goes_parallel_past_a_size():
    """ATen's CPU cat copies input by input, and a large copy forks a parallel region: both are
    fitted, and where the fork starts is learned from the rows."""
    rows = []
    for b, n, k in itertools.product((16, 128, 1024, 4096), (16, 64, 256), (2, 9, 27)):
        nbytes = 2 * b * n * k * 4
        us = 1.0 + 0.5 * k + (nbytes / 20e3 if nbytes < 1 << 20 else 8.0 + nbytes / 100e3)
        rows.append(dict(op="concat", batch=b, m=1, n=n, k=k, median_us=us))
    model = MemoryModel.fit(pd.DataFrame(rows).assign(dtype="float32", held_out=False))
    assert model.roofline[("concat", "float32")]["split"]["on"] == "bytes"
    for b, n, k in ((50, 30, 5), (3000, 200, 7)):
        nbytes = 2 * b * n * k * 4
        want = 1.0 + 0.5 * k + (nbytes / 20e3 if nbytes < 1 << 20 else 8.0 + nbytes / 100e3)
        assert model.predict("concat", "float32", batch=b, n=n, k=k) == pytest.approx(want, rel=0.02)
    assert model.bandwidth_gbps("concat", "float32") == pytest.approx(100.0, rel=0.02)  # the large regime's
    assert model.method("concat", "float32") == "heuristic"  # an exact law validates better than any MLP


def _one_thread_by_slice(b, n, k):
    """ATen's cat as a CPU runs it: each input's copy forks threads only past a grain of elements
    of its own slice (batch x n), whatever the total: no one law of bytes fits both sides."""
    nbytes = 2.0 * np.asarray(b) * n * k * 4
    return 2.0 + 0.3 * k + nbytes / np.where(np.asarray(b) * n < 32768, 3e3, 60e3)


def test_concat_goes_to_an_mlp_where_the_heuristic_validates_worse():
    from pipeline.predict.memory import _fit_heuristic

    rows = [dict(op="concat", batch=b, m=1, n=n, k=k, median_us=float(_one_thread_by_slice(b, n, k)))
            for b, n, k in itertools.product((16, 128, 1024, 4096), (16, 40, 64, 100, 256), (2, 5, 9, 17, 27))]
    df = pd.DataFrame(rows).assign(dtype="float32", held_out=False)
    model = MemoryModel.fit(df, grid="reduced")
    assert model.method("concat", "float32") == "mlp"
    params = model.nets[("concat", "float32")]
    assert params["val_rel_err"] < params["heuristic_val_rel_err"]
    with pytest.raises(MissingModelError, match="MLP"):
        model.bandwidth_gbps("concat", "float32")
    again = MemoryModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.method("concat", "float32") == "mlp"

    dims = {d: df[d].to_numpy(float) for d in ("batch", "n", "k")}
    law = MemoryModel({("concat", "float32"): _fit_heuristic("concat", "float32", dims, df["median_us"].to_numpy(), 0)}, {})
    rng = np.random.default_rng(1)  # shapes off the grid
    b, n, k = rng.integers(16, 4096, 60), rng.integers(16, 256, 60), rng.integers(2, 27, 60)
    want = _one_thread_by_slice(b, n, k)
    err = {name: np.mean(np.abs(m.predict("concat", "float32", batch=b, n=n, k=k) / want - 1))
           for name, m in (("mlp", again), ("heuristic", law))}
    assert err["mlp"] < err["heuristic"], err


def test_a_memory_model_saved_before_regimes_still_loads():
    old = {"kind": "memory_model", "nets": [],
           "roofline": [{"op": "concat", "dtype": "float32", "overhead_us": 2.0, "us_per_byte": 1e-4, "n": 9}]}
    model = MemoryModel.from_dict(old)
    assert model.predict("concat", "float32", batch=4, n=8, k=2) == pytest.approx(2.0 + 2 * 4 * 8 * 2 * 4 * 1e-4)
