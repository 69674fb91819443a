"""bmm's batch correction: fitted from the batch grid per kernel, applied by batch, side and K."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_batch import BATCH_GRID, BatchCorrection, fill_cells

BATCHES, SIDES, KS = (1, 4, 16, 64), (4, 16, 64), (16, 64, 256)


def _slowdown(batch):
    """A made-up per-matrix cost: 1x at batch <= 4, then up to 3x at 64 (log-linear)."""
    return np.exp(np.log(3.0) * np.clip((np.log2(np.asarray(batch, float)) - 2) / 4, 0, 1))


def _waves_rows(op="bmm"):
    return [dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=8 if op == "bmm" else 1,
                 m=m, n=n, k=k, waves=w, median_us=(1 + k / 32) * w ** 0.8, held_out=False, grid="waves")
            for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64)), (64, (64, 128))) for k in (16, 64, 256)]


def _model_with_batch_grid(kernel="cpu"):
    waves = pd.DataFrame(_waves_rows() + _waves_rows("mm"))
    plain = GemmModel.fit(waves)
    grid = [(b, s, k) for b in BATCHES for s in SIDES for k in KS]
    b, s, k = (np.array(x) for x in zip(*grid))
    base = plain.predict("bmm", "float32", s, s, k, b)
    rows = pd.DataFrame(dict(op="bmm", dtype="float32", kernel=kernel, tile_m=8, tile_n=8, slots=2, batch=b, m=s,
                             n=s, k=k, waves=1, median_us=base * _slowdown(b), held_out=False, grid=BATCH_GRID))
    return plain, GemmModel.fit(pd.concat([waves, rows], ignore_index=True))


def test_the_batch_grid_corrects_bmm_by_batch_and_leaves_the_table_alone():
    plain, model = _model_with_batch_grid()
    assert np.array_equal(model.table("bmm", "float32").thr, plain.table("bmm", "float32").thr)
    assert set(model.batch_corrections) == {("bmm", "float32", "cpu")}

    def ratio(m, n, k, b):
        return float(model.predict("bmm", "float32", m, n, k, b)) / float(plain.predict("bmm", "float32", m, n, k, b))

    assert ratio(16, 16, 64, 64) == pytest.approx(3.0)
    assert ratio(16, 16, 64, 4) == pytest.approx(1.0)
    # between grid batches: linear in log2 batch (16 is half-way from 4 to 64 in log2: sqrt(3))
    assert ratio(16, 16, 64, 16) == pytest.approx(np.sqrt(3.0))
    assert ratio(16, 16, 64, 32) == pytest.approx(_slowdown(32))
    # beyond the grid (batch, side, K) the edge's correction is held; non-square matrices by sqrt(M N)
    assert ratio(16, 16, 64, 512) == pytest.approx(3.0)
    assert ratio(1000, 1000, 4096, 64) == pytest.approx(3.0)
    assert ratio(4, 64, 64, 64) == pytest.approx(3.0)
    # mm has no batch: untouched
    assert float(model.predict("mm", "float32", 16, 32, 64)) == float(plain.predict("mm", "float32", 16, 32, 64))
    again = GemmModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert float(again.predict("bmm", "float32", 16, 16, 64, 32)) == pytest.approx(
        float(model.predict("bmm", "float32", 16, 16, 64, 32)))
    assert "batch_corrections" not in plain.to_dict()


def test_a_kernel_without_a_table_gets_no_correction():
    _, model = _model_with_batch_grid(kernel="onednn-unseen")
    assert model.batch_corrections == {}


def test_cells_the_caps_skipped_are_filled_along_k_then_side():
    nan = np.nan
    cells = np.array([[[0.1, 0.2, nan], [nan, nan, nan]], [[nan, nan, nan], [nan, nan, nan]]])
    got = fill_cells(cells, np.log2([16.0, 64.0, 256.0]), np.log2([4.0, 16.0]))
    np.testing.assert_allclose(got[0], [[0.1, 0.2, 0.2], [0.1, 0.2, 0.2]])
    np.testing.assert_allclose(got[1], 0.0)  # a batch with nothing measured: no correction


def test_one_slow_cell_does_not_price_its_shapes_alone():
    rows = pd.DataFrame([dict(batch=b, m=s, n=s, k=k, median_us=2.0) for b in (1, 4) for s in SIDES for k in KS])
    slow = (rows["batch"] == 4) & (rows["m"] == 16) & (rows["k"] == 64)
    rows.loc[slow, "median_us"] = 20.0
    corr = BatchCorrection.fit("bmm", "float32", "cpu", rows, np.ones(len(rows)))
    assert float(corr.factor(16, 16, 64, 4)) == pytest.approx(2.0)


def test_the_cpu_sweep_has_a_batch_grid_within_its_caps(cpu):
    from pipeline.sweeps.gemm_points import BATCH_SIDES, BATCH_SIZES, batch_points, sweep_points
    from pipeline.sweeps.profiles import get_profile

    quick = get_profile("quick")
    pts = batch_points(cpu, quick)
    assert pts and {p.op for p in pts} == {"bmm"} and {p.grid for p in pts} == {BATCH_GRID}
    assert {p.batch for p in pts} == set(BATCH_SIZES) and {p.m for p in pts} == set(BATCH_SIDES)
    assert all(p.m == p.n and not p.held_out for p in pts)
    assert all(2 * p.batch * p.m * p.n * p.k <= quick.max_point_flops for p in pts)
    assert not batch_points(cpu, get_profile("tiny"))
    assert len([p for p in sweep_points(cpu, quick) if p.grid == BATCH_GRID]) == len(pts)
