"""GEMMs with their weights read from memory: the rotation harness, the probe of the weight
cache, the cold twins of the CPU sweep, the correction the GEMM model fits from them, and the
share of a graph's weights it is charged on (harness/weight_rotation.py, sweeps/gemm_points.py,
predict/gemm_table.py, predict/price.py, predict/workload.py)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.harness.weight_rotation import MAX_COPIES, WeightPool, knee, probe_sizes, rotating_gemm, weight_cache_bytes
from pipeline.predict.evaluate import error_table, gemm_predictions
from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.gemm_grids import hot_rows

MB = 1 << 20


def test_the_knee_is_where_the_time_crosses_half_way():
    sizes = [MB << i for i in range(8)]  # 1 ... 128 MB
    times = [100, 101, 99, 100, 104, 130, 150, 151]
    # half-way from 100.5 to 150.5 is 125.5: 0.83 of the way from 16 MB (104) to 32 MB (130), in log2
    assert knee(sizes, times) == pytest.approx(16 * MB * 2 ** ((125.5 - 104) / 26), rel=1e-6)
    # a step between 32 and 64 MB: its geometric middle
    assert knee(sizes, [100, 100, 100, 100, 100, 100, 200, 200]) == pytest.approx(32 * MB * 2 ** 0.5, rel=1e-6)
    assert knee(sizes, [100] * 8) is None  # no cache the probe could see past
    assert knee(sizes[:3], [100, 200, 300]) is None  # too few sizes to tell hot from cold


def test_a_pool_past_the_knee_as_quick_as_the_cache_makes_it_noise():
    """The Zen 3 EPYC VM's probe in a noisy spell (1 ... 256 MB): its two largest pools read 11 %
    over its two smallest, yet 16 MB read quicker than either; no cache lies at 3 MB."""
    sizes = [MB << i for i in range(9)]
    assert knee(sizes, [2597, 2579, 2956, 2759, 2459, 2894, 2551, 2702, 3040]) is None
    # the model-85 Xeon VM's (2026-11-26): 340-350 us to 64 MB, 385 at 128, 450-495 from 256 MB
    assert 64 * MB < knee(sizes, [345, 342, 348, 340, 350, 344, 347, 385, 470]) < 256 * MB
    # the 16-core host's, a contrast of only ~7 %: 124-132 us to 128 MB, 139-141 us from 256 MB
    sizes = [MB << i for i in range(10)]  # its 480 MB L3: pools up to 512 MB
    assert 128 * MB < knee(sizes, [126, 124, 130, 132, 128, 125, 131, 129, 140, 141]) < 256 * MB


def test_probe_sizes_stay_within_a_quarter_of_memory():
    sizes = probe_sizes(32 * MB, memory_bytes=1 << 40)  # 4x the cache, but never under 256 MB
    assert sizes[0] == MB and sizes[-1] == 256 * MB and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert probe_sizes(480 * MB, memory_bytes=1 << 40)[-1] == 1024 * MB
    assert probe_sizes(480 * MB, memory_bytes=2048 * MB)[-1] == 512 * MB


def test_the_pool_gives_distinct_views_within_its_bounds():
    pool = WeightPool(4 * MB)
    ws = pool.weights("float32", (256, 256))  # 256 KB each: 16 copies
    assert len(ws) == 16 and len({w.data_ptr() for w in ws}) == 16
    assert all(w.shape == (256, 256) and w.dtype == torch.float32 for w in ws)
    assert len(pool.weights("bfloat16", (4, 4))) == MAX_COPIES  # capped
    assert len(pool.weights("float32", (1024, 768))) == 2  # 3 MB: two, the second overlapping the first
    assert len(pool.weights("float32", (256, 256), nbytes=MB)) == 4  # only the first MB of the pool
    with pytest.raises(ValueError, match="does not fit"):
        pool.weights("float32", (2048, 1024))


@pytest.mark.parametrize("op", ["mm", "linear"])
def test_a_rotated_gemm_computes_what_the_hot_one_does(op):
    pool = WeightPool(MB)
    fn = rotating_gemm(op, "float32", 8, 64, 32, pool)
    w = pool.weights("float32", (32, 64) if op == "mm" else (64, 32))[0]
    torch.manual_seed(0)
    a = torch.randn(8, 32)
    want = a @ w if op == "mm" else a @ w.t()  # bias-free, as the CPU's linear table is timed
    assert torch.allclose(fn(), want) and torch.allclose(fn(), want)
    with pytest.raises(ValueError, match="bmm"):
        rotating_gemm("bmm", "float32", 8, 64, 32, pool)


def test_the_probe_finds_a_made_up_cache(monkeypatch):
    """A made-up machine whose rotated GEMM runs 1.5x as long once its weights span over 8 MB."""
    import pipeline.harness.weight_rotation as wr

    class FakePool:
        def __init__(self, nbytes):
            self.nbytes = nbytes

    monkeypatch.setattr(wr, "WeightPool", FakePool)
    monkeypatch.setattr(wr, "rotating_gemm", lambda op, dtype, m, n, k, pool, nbytes: nbytes)
    found, pool = weight_cache_bytes(32 * MB, lambda span: 150.0 if span > 8 * MB else 100.0)
    assert found == pytest.approx(8 * MB * 2 ** 0.5, rel=1e-6)  # a step between 8 and 16 MB
    assert pool.nbytes == probe_sizes(32 * MB)[-1]


def _lattice_rows(table: GemmTable, slow_at_m: dict[int, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hot aspect cells priced as the table says, and their cold twins `slow_at_m[m]` times slower."""
    sides = [1, 4, 16, 64]
    cells = pd.DataFrame([dict(op="mm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1,
                               m=m, n=n, k=64, waves=1, held_out=False) for m in sides for n in sides])
    hot = cells.assign(median_us=table.predict_us(cells["m"], cells["n"], cells["k"], cells["batch"]), grid="aspect")
    cold = hot.assign(median_us=hot["median_us"] * hot["m"].map(slow_at_m), grid="cold_weights")
    return hot, cold


def test_cold_twins_fit_a_correction_that_only_a_cold_share_applies(synthetic_gemm_model):
    table = synthetic_gemm_model.table("mm", "float32")
    hot, cold = _lattice_rows(table, {1: 2.0, 4: 1.5, 16: 1.2, 64: 1.0})
    cold.loc[(cold["m"] == 16) & (cold["n"] == 4), "median_us"] *= 5  # one twin in a slow spell
    cold.loc[(cold["m"] == 64) & (cold["n"] == 16), "median_us"] *= 0.5  # one faster than hot: noise
    fixed = table.with_aspect(hot).with_cold(hot, cold)
    m, n, k, b = np.array([1, 16, 64]), np.array([16, 16, 16]), np.array([64, 64, 64]), np.array([1, 1, 1])
    hot_us = fixed.predict_us(m, n, k, b)
    assert fixed.predict_us(m, n, k, b, cold=1.0) == pytest.approx(hot_us * [2.0, 1.2, 1.0])
    assert fixed.predict_us(m, n, k, b, cold=0.5) == pytest.approx(hot_us * np.sqrt([2.0, 1.2, 1.0]))
    assert fixed.predict_us(m, n, k, b, cold=None) == pytest.approx(hot_us)
    again = GemmTable.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert again.predict_us(m, n, k, b, cold=1.0) == pytest.approx(hot_us * [2.0, 1.2, 1.0])
    assert "cold_log" not in table.to_dict()  # a table without one saves as before


def test_the_model_fits_cold_rows_apart_and_charges_the_uncached_share(synthetic_gemm_model):
    base = synthetic_gemm_model.table("mm", "float32")
    hot, cold = _lattice_rows(base, {1: 2.0, 4: 2.0, 16: 2.0, 64: 2.0})
    waves = pd.DataFrame([dict(op="mm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1, m=m,
                               n=n, k=k, waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False, grid="waves")
                          for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64))) for k in (32, 64, 128, 256)])
    rows = pd.concat([waves, hot, cold], ignore_index=True).assign(weight_cache_bytes=float(64 * MB))
    model = GemmModel.fit(rows)
    assert np.array_equal(model.table("mm", "float32").thr, base.thr)  # cold rows never enter the table
    assert model.weight_cache_bytes == 64 * MB
    assert model.uncached_share(32 * MB) == 0.0 and model.uncached_share(256 * MB) == pytest.approx(0.75)
    assert float(model.predict("mm", "float32", 4, 16, 64, cold=1.0)) == pytest.approx(
        2.0 * float(model.predict("mm", "float32", 4, 16, 64)))
    again = GemmModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.uncached_share(256 * MB) == pytest.approx(0.75)
    # no twins: no share, priced hot as before
    plain = GemmModel.fit(pd.concat([waves, hot], ignore_index=True))
    assert plain.uncached_share(256 * MB) is None and "weight_cache_bytes" not in plain.to_dict()
    # held-out twins are priced cold and reported apart; hot_rows leaves them out
    held = pd.concat([hot.iloc[:4].assign(grid="heldout"), cold.iloc[:4].assign(grid="cold_heldout")]).assign(
        held_out=True)
    err = error_table(gemm_predictions(model, held), ["op", "dtype"]).set_index("op")
    assert set(err.index) == {"mm", "mm cold"} and err["max_rel_err"].max() < 1e-9
    assert gemm_predictions(model, held)["layer_type"].tolist().count("MM cold") == 4
    assert len(hot_rows(held)) == 4


def test_graphs_and_op_lists_are_priced_with_their_weights_share(synthetic_gemm_model):
    from pipeline.core.ops import GemmOp
    from pipeline.predict.price import uncached_weights
    from pipeline.predict.workload import weights_cold

    class Probe:
        def __init__(self):
            self.asked = []

        def uncached_share(self, nbytes):
            self.asked.append(nbytes)
            return 0.5

    probe = Probe()
    classes = {0: ("priced", "linear", (128, 1024, 512, 1), ""), 1: ("priced", "bmm", (128, 128, 64, 12), ""),
               2: ("dropped", "mm", (4, 4, 4, 1), ""), 3: ("priced", "mm", (64, 256, 1024, 1), "")}
    assert uncached_weights(classes, probe, "bfloat16") == 0.5
    assert probe.asked == [(1024 * 512 + 256 * 1024) * 2]  # linear and mm weights; not bmm, not dropped
    assert uncached_weights(classes, object(), "float32") is None  # a model with no correction
    ops = [GemmOp("fc", "linear", 128, 1024, 512, count=12), GemmOp("qk", "bmm", 128, 128, 64, batch=12)]
    assert weights_cold(ops, "float32", probe) == 0.5 and probe.asked[-1] == 1024 * 512 * 12 * 4


def test_the_cpu_sweep_has_cold_twins_of_large_enough_weights(cpu):
    from dataclasses import replace

    from pipeline.predict.gemm_grids import COLD_GRID, COLD_HELDOUT
    from pipeline.sweeps.gemm_points import ASPECT_OPS, aspect_points, cold_points, sweep_points
    from pipeline.sweeps.profiles import get_profile

    profile = get_profile("quick", "cpu")
    pts = sweep_points(cpu, profile, {})
    cold = cold_points(cpu, profile, 64 * MB, [p for p in pts if p.held_out])
    grid = [p for p in cold if p.grid == COLD_GRID]
    held = [p for p in cold if p.grid == COLD_HELDOUT]
    assert grid and held and all(p.held_out for p in held) and not any(p.held_out for p in grid)
    assert {p.op for p in cold} == set(ASPECT_OPS) and {p.k for p in grid} == {max(profile.gemm_aspect_k)}
    assert all(p.n * p.k * 4 * MAX_COPIES >= 128 * MB for p in cold if p.dtype == "float32")
    aspect = {(p.op, p.dtype, p.m, p.n, p.k) for p in pts if p.grid == "aspect"}
    assert {(p.op, p.dtype, p.m, p.n, p.k) for p in grid} <= aspect | {
        (p.op, p.dtype, p.m, p.n, p.k) for p in pts if p.grid == "waves"}
    assert cold_points(cpu, profile, None, []) == [] and cold_points(cpu, get_profile("tiny", "cpu"), MB, []) == []
    # with the twin K the largest aspect K, the cells past the whole-wave outputs get no cold twins
    one_k = replace(profile, gemm_aspect_k=(256,), gemm_twin_k=256)
    assert [p for p in aspect_points(cpu, one_k) if p.m * p.n > one_k.max_gemm_outputs]
    assert cold_points(cpu, one_k, 64 * MB, []) and not [
        p for p in cold_points(cpu, one_k, 64 * MB, []) if p.m * p.n > one_k.max_gemm_outputs]


def test_drift_never_pairs_a_cold_twin_with_its_hot_shape():
    from pipeline.analysis.drift import table_drift

    key = dict(op="linear", dtype="float32", layout="TN", batch=1, m=64, n=1024, k=1024)
    prev = pd.DataFrame([dict(key, grid="aspect", median_us=100.0, p20_us=99.0, p80_us=101.0),
                         dict(key, grid="cold_weights", median_us=150.0, p20_us=149.0, p80_us=151.0)])
    drift = table_drift(prev, prev.copy(), "gemm_samples")
    assert drift["median_ratio"].tolist() and all(r == pytest.approx(1.0) for r in drift["median_ratio"])
