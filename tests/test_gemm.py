"""The PM2Lat interpolation and wave arithmetic against hand-computed values."""
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError, MissingModelError, UnknownDtypeError
from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.geometry import blocks, near_square, waves, whole_wave_shape


def test_wave_counting():
    # 130 x 100 with 64 x 64 tiles: 3 x 2 = 6 tiles (partial tiles count whole)
    assert blocks(130, 100, 1, 64, 64) == 6
    # 6 tiles x batch 4 = 24 blocks on 10 slots: 3 waves (the last one partial)
    assert waves(130, 100, 4, 64, 64, 10) == 3
    assert waves(128, 128, 1, 64, 64, 4) == 1
    assert near_square(12) == (3, 4)
    assert near_square(64, 1, 16) == (32, 2)  # 32 x 32 elements, not 8 x 128
    assert near_square(7, 1, 16) == (7, 1)
    m, n = whole_wave_shape(4, 32, 32, 2)  # 8 tiles of 32 x 32
    assert (m // 32) * (n // 32) == 8


def _table(thr):
    return GemmTable("mm", "float32", "k0", 32, 32, 2, waves=np.array([1.0, 4.0]), ks=np.array([32.0, 64.0, 128.0]),
                     thr=np.array(thr, float))


def test_interpolation_matches_eq_2_by_hand():
    t = _table([[100.0, 200.0, 300.0], [400.0, 600.0, 800.0]])
    # K = 96 lies halfway between 64 and 128 at 1 wave: throughput 250
    assert t.throughput(np.array([1.0]), np.array([96.0]))[0] == pytest.approx(250.0)
    # at 2 waves: halfway in log2(waves) between 1 and 4 -> mean of 250 and 700
    assert t.throughput(np.array([2.0]), np.array([96.0]))[0] == pytest.approx(475.0)
    # duration: padded flops / throughput; 32 x 64 at batch 1 is one wave of two tiles
    flops = 2 * 1 * 2 * 32 * 32 * 96
    assert t.predict_us(32, 64, 96, 1) == pytest.approx(flops / 250.0)


def test_a_shape_between_two_rows_at_the_latency_floor_is_priced_at_the_floor():
    # both rows take the same time at each K: their throughputs are 4x apart, and a straight line
    # between the throughputs would price 2 waves at 2 / 2.5 of that time
    t = _table([[100.0, 200.0, 400.0], [400.0, 800.0, 1600.0]])
    for k in (32, 48, 96):
        floor = t.predict_us(32, 64, k, 1)  # 1 wave
        assert t.predict_us(64, 64, k, 1) == pytest.approx(floor)  # 2 waves
        assert t.predict_us(64, 128, k, 1) == pytest.approx(floor)  # 4 waves


def test_a_small_row_slower_than_a_larger_one_takes_the_larger_ones_time():
    from pipeline.predict.gemm_grids import no_faster_with_more_waves

    w, ks = np.array([1.0, 4.0, 16.0]), np.array([32.0, 64.0])
    dur = np.array([[30.0, 30.0], [20.0, 25.0], [22.0, 24.0]])
    out = w[:, None] * ks / no_faster_with_more_waves(w[:, None] * ks / dur, w, ks)
    np.testing.assert_allclose(out, [[20.0, 24.0], [20.0, 24.0], [22.0, 24.0]])


def test_beyond_the_grid_eq_1_and_small_k_floor():
    t = _table([[100.0, 200.0, 300.0], [400.0, 600.0, 800.0]])
    # beyond K = 128 throughput is held, so time grows linearly with K (eq. 1)
    assert t.predict_us(32, 64, 256, 1) == pytest.approx(2 * t.predict_us(32, 64, 128, 1))
    # below the smallest K the duration is held
    assert t.predict_us(32, 64, 8, 1) == pytest.approx(t.predict_us(32, 64, 32, 1))
    # partial tiles cost whole ones: 33 x 64 needs 2 x 2 tiles = 2 waves; at a throughput
    # that does not change with waves, that is twice the time of 32 x 64
    flat = _table([[100.0, 200.0, 300.0], [100.0, 200.0, 300.0]])
    assert flat.predict_us(33, 64, 64, 1) == pytest.approx(2 * flat.predict_us(32, 64, 64, 1))


def _samples():
    rows = []
    for w, (m, n) in ((1, (32, 64)), (4, (64, 128))):
        for k, us in ((32, 10.0), (64, 15.0), (128, 25.0)):
            rows.append(dict(op="mm", dtype="float32", kernel="cpu", tile_m=32, tile_n=32, slots=2, batch=1, m=m,
                             n=n, k=k, waves=w, median_us=us * w, held_out=False))
    return pd.DataFrame(rows)


def test_fit_reproduces_training_points_and_round_trips():
    df = _samples()
    model = GemmModel.fit(df)
    pred = model.predict("mm", "float32", df["m"], df["n"], df["k"], df["batch"])
    np.testing.assert_allclose(pred, df["median_us"], rtol=1e-9)
    again = GemmModel.from_dict(model.to_dict())
    np.testing.assert_allclose(again.predict("mm", "float32", 50, 70, 100), model.predict("mm", "float32", 50, 70, 100))


def test_a_kernel_measured_at_one_k_that_another_measured_too_gets_no_table():
    # the 16-core Xeon's bf16 bmm: oneDNN's avx512_core_bf16 kernel ran one point between other
    # kernels' points at its K, and its table priced a larger K in proportion to K (11x at 22 / 2)
    df = _samples()
    stray = pd.DataFrame([dict(df.iloc[0]) | dict(kernel="stray", m=16, n=16, k=32, median_us=3.0)])
    model = GemmModel.fit(pd.concat([df, stray], ignore_index=True))
    assert model.kernels("mm", "float32") == ["cpu"]
    np.testing.assert_allclose(model.predict("mm", "float32", 16, 16, [32, 128]),
                               GemmModel.fit(df).predict("mm", "float32", 16, 16, [32, 128]))
    # a one-K table stays where nothing else measured its K, or its K past the others' wave counts
    # (the 2-thread AMX Xeons' K = 1 column, above ATen's smaller outputs)
    for alone in (stray.assign(k=2), stray.assign(m=256, n=256, waves=16)):
        assert GemmModel.fit(pd.concat([df, alone], ignore_index=True)).kernels("mm", "float32") == ["cpu", "stray"]
    assert GemmModel.fit(stray).kernels("mm", "float32") == ["stray"]


def test_fit_refuses_held_out_rows():
    df = _samples()
    df.loc[0, "held_out"] = True
    with pytest.raises(ValueError, match="held-out"):
        GemmModel.fit(df)


@pytest.mark.parametrize("dims,needle", [((0, 8, 8, 1), "m"), ((8, -3, 8, 1), "-3"), ((8, 8, 8, 0), "batch")])
def test_bad_dimensions_name_the_value(dims, needle):
    model = GemmModel.fit(_samples())
    with pytest.raises(BadShapeError, match=needle):
        model.predict("mm", "float32", *dims)


def test_unknown_dtype_op_and_missing_calibration():
    model = GemmModel.fit(_samples())
    with pytest.raises(UnknownDtypeError, match="float8"):
        model.predict("mm", "float8", 8, 8, 8)
    with pytest.raises(BadShapeError, match="conv"):
        model.predict("conv", "float32", 8, 8, 8)
    with pytest.raises(MissingModelError, match="bfloat16"):
        model.predict("mm", "bfloat16", 8, 8, 8)


def test_capped_cells_extend_the_row_below_additively():
    from pipeline.predict.gemm_grids import fill_capped

    ks = np.array([1.0, 2.0, 4.0])
    # per-wave time of the lower row: 0.1, 0.2, 0.4 (linear in K); the upper row measured
    # 0.05 at K = 1 and then grows by the same 0.1 and 0.3: throughput K / time
    thr = np.array([[10.0, 10.0, 10.0], [20.0, np.nan, np.nan]])
    np.testing.assert_allclose(fill_capped(thr, ks)[1], [20.0, 2 / 0.15, 4 / 0.35])
    # time never shrinks as K grows, even when the lower row's timings are noisy
    noisy = np.array([[10.0, 40.0, 80.0], [20.0, np.nan, np.nan]])
    filled = fill_capped(noisy, ks)[1]
    assert (ks / filled >= ks[0] / filled[0] - 1e-12).all()
    with pytest.raises(ValueError, match="row 1"):
        fill_capped(np.array([[1.0, 2.0], [np.nan, np.nan]]), ks[:2])


def test_duration_is_held_below_the_smallest_wave_count():
    t = GemmTable("mm", "bfloat16", "k0", 1, 1, 2, waves=np.array([64.0, 256.0]), ks=np.array([1.0, 32.0]),
                  thr=np.array([[10.0, 100.0], [20.0, 200.0]]))
    # 3 x 4 outputs on 2 slots is 6 waves, below the 64 measured: it costs what 64 waves cost
    assert t.predict_us(3, 4, 16, 1) == pytest.approx(t.predict_us(8, 16, 16, 1))
    assert t.predict_us(16, 16, 16, 1) > t.predict_us(8, 16, 16, 1)  # 128 waves: more


def test_cells_below_the_first_measured_k_never_take_negative_time():
    from pipeline.predict.gemm_grids import fill_capped

    ks = np.array([1.0, 2.0, 4.0])
    # another kernel ran the small-K cells of this row; the row below says time drops faster
    # than this row's level allows, so the fill falls back to this row's throughput
    thr = np.array([[10.0, 10.0, 10.0], [np.nan, np.nan, 40.0]])
    np.testing.assert_allclose(fill_capped(thr, ks)[1], [40.0, 40.0, 40.0])
    # where the row below allows it, the fixed part of this row's time is kept
    thr = np.array([[10.0, 20.0, 40.0], [np.nan, np.nan, 20.0]])
    filled = fill_capped(thr, ks)[1]  # per-wave times: below 0.1 each; this row 0.2 at K = 4
    np.testing.assert_allclose(ks / filled, [0.2, 0.2, 0.2])


def test_granularity_finds_the_padding_step():
    from pipeline.sweeps.tile_probe import PROBE_DIMS, granularity

    xs = np.array(PROBE_DIMS)
    steps16 = 60.0 * np.ceil(xs / 16) + 8  # AVX-512 fp32: N = 2 ... 16 cost the same
    assert granularity(xs, steps16) == 16
    assert granularity(xs, 3.0 * xs + 5) == 1  # no padding: linear in the size
    assert granularity(xs, 10.0 * np.ceil(xs / 4) + 1) == 4
    noisy = steps16 * (1 + 0.03 * np.random.default_rng(0).standard_normal(xs.size))
    assert granularity(xs, noisy) == 16
    spiked = steps16.copy()
    spiked[3] *= 1.5  # one disturbed timing
    assert granularity(xs, spiked) == 16
    with pytest.raises(ValueError, match="positive"):
        granularity(xs, np.zeros(xs.size))


def test_probed_tile_lays_out_whole_waves():
    from pipeline.device.discover import identify
    from pipeline.predict.geometry import waves
    from pipeline.sweeps.gemm_points import slots_for, training_points
    from pipeline.sweeps.profiles import get_profile

    dev = identify("cpu")
    tiles = {(op, dt): (1, 16) for op in ("mm", "bmm", "linear") for dt in ("float32", "bfloat16")}
    slots = slots_for(dev)
    # bf16 also has outputs under one wave, laid out in ATen's 1 x 1 tile (the next test)
    pts = [p for p in training_points(dev, get_profile("tiny"), tiles) if p.m * p.n * p.batch >= 16 * slots]
    assert pts and all(p.n % 16 == 0 for p in pts)
    assert all(waves(p.m, p.n, p.batch, 1, 16, slots) * slots * 16 == p.m * p.n * p.batch for p in pts)


def test_granularity_on_timings_measured_here():
    """Timings taken on the development Xeon (AVX-512), M or N = 2 ... 64 at 512 x 512."""
    from pipeline.sweeps.tile_probe import PROBE_DIMS, granularity

    fp32_n = [68, 68, 68, 68, 68, 69, 61, 109, 99, 147, 211]  # flat to 16 (16 itself a little faster)
    bf16_n = [74.7, 74.7, 74.2, 74.6, 73.5, 74.5, 73.7, 123.1, 121.8, 170.2, 218.8]
    fp32_m = [[13.5, 15.9, 18.4, 13.2, 17.2, 24.3, 30.4, 62.3, 77.1, 105.9, 133.3],  # wandering, not padded
              [10.4, 11.1, 11.0, 17.0, 21.5, 24.8, 30.1, 62.3, 76.8, 105.8, 131.5]]
    assert granularity(PROBE_DIMS, fp32_n) == 16 and granularity(PROBE_DIMS, bf16_n) == 16
    assert all(granularity(PROBE_DIMS, m) == 1 for m in fp32_m)


def test_probe_survives_a_slow_spell(monkeypatch):
    """GEMMs here ran 1.5x slow for a few tenths of a second at times, which hid the step at N <= 16."""
    from pipeline.sweeps import tile_probe

    monkeypatch.setattr(tile_probe, "WARMUP_S", 0.0)  # the spell falls on the first pass itself
    calls = []

    def time_us(m, n, k):
        calls.append(n)
        x = n if m == 512 else m
        base = 60.0 * np.ceil(x / 16) if m == 512 else 3.0 * x + 5  # N padded to 16, M not
        return base * (1.5 if len(calls) <= 6 else 1.0)  # N = 2 ... 12 of the first pass are slow

    assert tile_probe.probe_tile(time_us) == (1, 16)


def test_the_cpu_sweep_measures_each_training_shape_once_and_has_an_aspect_grid(cpu):
    from pipeline.sweeps.gemm_points import ASPECT_OPS, BMM_ASPECT_BATCH, sweep_points
    from pipeline.sweeps.profiles import get_profile

    pts = sweep_points(cpu, get_profile("quick", "cpu"), {})
    train = [(p.grid, p.op, p.dtype, p.batch, p.m, p.n, p.k) for p in pts if not p.held_out]
    assert len(train) == len(set(train))
    # an aspect cell the whole-wave grid holds is read from there; a twin is timed beside its cell
    # even where a sub-wave shape is the same GEMM (bf16 1 x 2 x 256: 1 ms)
    shape = {g: {t[1:] for t in train if t[0] == g} for g in ("waves", "aspect")}
    assert shape["aspect"] and not shape["aspect"] & shape["waves"]
    aspect = [p for p in pts if p.grid == "aspect"]
    assert aspect and {p.op for p in aspect} == {*ASPECT_OPS, "bmm"}
    assert all(p.batch == (BMM_ASPECT_BATCH if p.op == "bmm" else 1) for p in aspect)


def test_the_grids_flop_caps_reach_an_lm_heads_k_at_the_largest_outputs(cpu):
    """The whole-wave and aspect grids take their own FLOP caps (an LM head's 206 MB output at
    K = 128 was priced from K <= 32 cells); other grids and a profile without them keep max_point_flops."""
    from dataclasses import replace

    from pipeline.sweeps.gemm_points import aspect_points, batch_points, training_points
    from pipeline.sweeps.profiles import get_profile

    quick = get_profile("quick", "cpu")
    tiles = {(op, dt): (1, 16) for op in ("mm", "bmm", "linear") for dt in ("float32", "bfloat16")}
    plain = replace(quick, max_wave_flops=None, max_aspect_flops=None)

    def largest_output_ks(pts):
        top = max(p.batch * p.m * p.n for p in pts)
        return {p.k for p in pts if p.batch * p.m * p.n == top}

    waves, before = training_points(cpu, quick, tiles), training_points(cpu, plain, tiles)
    assert max(largest_output_ks(before)) < 128 <= max(largest_output_ks(waves))
    assert all(2 * p.batch * p.m * p.n * p.k <= quick.max_wave_flops for p in waves)
    aspect = aspect_points(cpu, quick)
    assert set(aspect_points(cpu, plain)) < set(aspect)
    # past the whole-wave outputs the aspect grid times one K whatever its FLOPs (test_gemm_twins.py)
    assert max(2 * p.m * p.n * p.k for p in aspect if p.m * p.n <= quick.max_gemm_outputs) <= quick.max_aspect_flops
    assert batch_points(cpu, quick) == batch_points(cpu, plain)
    gpu = get_profile("quick", "cuda")
    assert gpu.max_wave_flops is None and gpu.max_aspect_flops is None


def test_the_sweep_times_points_interleaved_and_writes_them_in_order(cpu, monkeypatch):
    """A slow spell of a shared machine must not land on one block (the held-out shapes came
    last and read 1.2-1.5x slow on the EPYC VM): points are timed shuffled, rows kept in order."""
    from pipeline.harness.order import interleaved
    from pipeline.harness.timer import Measurement
    from pipeline.sweeps import gemm
    from pipeline.sweeps.profiles import get_profile

    timed = []

    def fake_measure(fn, spec, device="cpu", l2_bytes=0):
        timed.append(fn.point)
        return Measurement(times_us=np.array([1.0, 1.0, 1.0]), cpu_util=1.0)

    def fake_callable(op, dtype, b, m, n, k, device):
        fn = lambda: None  # noqa: E731
        fn.point = (op, dtype, b, m, n, k)
        return fn

    monkeypatch.setattr(gemm, "measure", fake_measure)
    monkeypatch.setattr(gemm, "gemm_callable", fake_callable)
    monkeypatch.setattr(gemm, "cpu_kernel_name", lambda fn: "cpu-kernel")
    monkeypatch.setattr(gemm, "_fault_from", lambda log=None: {})  # no child probe for a fake sweep
    monkeypatch.setattr(gemm, "cpu_tiles", lambda dev, profile, log=None: {})
    monkeypatch.setattr(gemm, "peak_matmul_flops", lambda dev, dt, size: 1e11)
    profile = get_profile("tiny", "cpu")
    rows = gemm.sweep_gemm(cpu, profile, log=lambda *_: None)
    pts = gemm.sweep_points(cpu, profile, {})
    written = [(r["op"], r["dtype"], r["batch"], r["m"], r["n"], r["k"]) for r in rows]
    assert written == [(p.op, p.dtype, p.batch, p.m, p.n, p.k) for p in pts]
    assert timed == [written[i] for i in interleaved(len(pts))] and timed != written
    held = [i for i, p in enumerate(pts) if p.held_out]
    first_held = min(timed.index(written[i]) for i in held)
    assert first_held < len(pts) // 2  # held-out shapes are no longer one block at the end
    assert interleaved(10) == interleaved(10) and sorted(interleaved(10)) == list(range(10))


def test_the_probe_keeps_the_step_found_most_often(monkeypatch):
    from pipeline.sweeps import tile_probe

    assert tile_probe.most_often([16, 1, 16]) == 16 and tile_probe.most_often([1, 1, 16]) == 1
    assert tile_probe.most_often([1, 16, 4]) == 16  # all once: the larger
    found = iter([16, 1, 1, 1, 16, 1])  # rounds alternate N, M: N 16, 1, 16; M 1, 1, 1
    monkeypatch.setattr(tile_probe, "granularity", lambda xs, ts: next(found))
    monkeypatch.setattr(tile_probe, "WARMUP_S", 0.0)
    assert tile_probe.probe_tile(lambda m, n, k: 1.0) == (1, 16)


def test_a_large_probed_tile_keeps_sub_wave_shapes_for_atens_loop(cpu):
    from pipeline.sweeps.gemm_points import training_points
    from pipeline.sweeps.profiles import get_profile

    def tiles(mm_bf16):
        return {(op, dt): mm_bf16 if (op, dt) == ("mm", "bfloat16") else ((1, 16) if dt == "float32" else (1, 1))
                for op in ("mm", "bmm", "linear") for dt in ("float32", "bfloat16")}

    big = training_points(cpu, get_profile("quick"), tiles((32, 16)))
    small = [p for p in big if (p.op, p.dtype) == ("mm", "bfloat16") and p.m * p.n < 32 * 16]
    assert small and min(p.m * p.n for p in small) == 2  # one wave of ATen's 1 x 1 tile on two threads
    same = training_points(cpu, get_profile("quick"), tiles((1, 1)))
    # float32's ATen kernel pads as probed: nothing added there, nor where the probe found 1 x 1
    assert [p for p in big if p.dtype == "float32"] == [p for p in same if p.dtype == "float32"]
    assert not [p for p in same if (p.op, p.dtype) == ("mm", "bfloat16") and p.m * p.n < 32 * 16
                and p not in big]


def test_the_probe_runs_as_many_rounds_as_the_profile_asks(monkeypatch):
    from pipeline.sweeps import tile_probe
    from pipeline.sweeps.profiles import get_profile

    monkeypatch.setattr(tile_probe, "WARMUP_S", 0.0)
    calls = []
    for rounds in (1, 3):
        calls.clear()
        tile_probe.probe_tile(lambda m, n, k: calls.append((m, n)) or float(m * n), rounds)
        assert len(calls) == rounds * 2 * 2 * len(tile_probe.PROBE_DIMS)  # M and N, each up and down
    with pytest.raises(ValueError, match="at least one round, not 0"):
        tile_probe.probe_tile(lambda m, n, k: 1.0, 0)
    assert get_profile("tiny").tile_probe_rounds == 1 and get_profile("quick").tile_probe_rounds == 3
