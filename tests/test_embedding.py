"""embedding_samples sweep (tiny, CPU) and its model: the DLRM paper's embedding heuristic with the
L2 hit-rate term."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError, MissingModelError, UnknownDtypeError
from pipeline.predict.embedding import EmbeddingModel, embedding_traffic, hit_rate, table_iv_rows


def test_embedding_sweep_tiny(cpu):
    from pipeline.sweeps.embedding import sweep_embedding

    df = pd.DataFrame(sweep_embedding(cpu, "tiny", log=lambda m: None))
    assert set(df["direction"]) == {"forward", "backward"}
    assert (df["median_us"] > 0).all() and (df["bytes"] > 0).all()
    assert set(df["held_out"]) == {False, True}
    assert {"B", "E", "T", "L", "D", "dtype", "p20_us", "p80_us", "cv", "units", "l2_bytes"} <= set(df.columns)
    back = df[df["direction"] == "backward"].iloc[0]
    assert back["bytes"] > df[(df["direction"] == "forward") & (df["shape"] == back["shape"])]["bytes"].iloc[0]
    # each backward row carries what its one backward() call cost beyond the work; forward rows none
    assert (df.loc[df["direction"] == "backward", "backward_call_us"] > 0).all()
    assert df.loc[df["direction"] == "forward", "backward_call_us"].isna().all()


def test_a_backward_rows_engine_call_is_fitted_off_and_added_back_for_the_sweeps_rows():
    """Backward rows that each paid a 30 us backward() call: the model prices a lookup inside a
    step without it (one call serves every table there), the sweep's own rows with it, and a
    calibration without the column prices as before."""
    from pipeline.predict.embedding import predict_rows

    B, E, T, L, D = _embedding_shapes().T
    plain, _ = embedding_traffic("backward", "float32", B, E, T, L, D)
    work = 4.0 + plain / 20e3
    rows = pd.DataFrame(dict(direction="backward", dtype="float32", B=B, E=E, T=T, L=L, D=D, held_out=False,
                             median_us=work + 30.0, units=2, rows_per_block=1, l2_bytes=1 << 20))
    model = EmbeddingModel.fit(rows.assign(backward_call_us=30.0))
    assert model.predict("backward", "float32", B, E, T, L, D, hit_rate=False) == pytest.approx(work, rel=1e-4)
    assert predict_rows(model, "backward", "float32", rows, hit_rate=False) == pytest.approx(work + 30.0, rel=1e-4)
    again = EmbeddingModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.backward_call_us == 30.0
    before = EmbeddingModel.fit(rows)
    assert before.backward_call_us == 0.0 and "backward_call_us" not in before.to_dict()
    assert before.predict("backward", "float32", B, E, T, L, D, hit_rate=False) == pytest.approx(work + 30, rel=1e-4)


def _embedding_shapes():
    return np.array(list(itertools.product((16, 256, 2048), (100, 10_000, 1_000_000), (1, 4), (1, 8, 32), (16, 64))))


def test_heuristic_recovers_a_known_bandwidth():
    B, E, T, L, D = _embedding_shapes().T
    plain, _ = embedding_traffic("forward", "float32", B, E, T, L, D)
    rows = pd.DataFrame(dict(direction="forward", dtype="float32", B=B, E=E, T=T, L=L, D=D, held_out=False,
                             median_us=3.0 + plain / 20e3, units=2, rows_per_block=1, l2_bytes=1 << 20))
    model = EmbeddingModel.fit(rows)
    assert model.bandwidth_gbps("forward", "float32", hit_rate=False) == pytest.approx(20.0, rel=1e-6)
    assert model.groups[("forward", "float32")]["plain"]["overhead_us"] == pytest.approx(3.0, rel=1e-6)
    # The hit-rate variant: DRAM at 10 GB/s, L2 at 100 GB/s, a 1 us call.
    dram, l2 = embedding_traffic("forward", "float32", B, E, T, L, D, 1 << 20, 2, 1)
    model = EmbeddingModel.fit(rows.assign(median_us=1.0 + dram / 10e3 + l2 / 100e3))
    assert model.bandwidth_gbps("forward", "float32", hit_rate=True) == pytest.approx(10.0, rel=1e-4)
    assert model.groups[("forward", "float32")]["hit"]["l2_us_per_byte"] == pytest.approx(1 / 100e3, rel=1e-3)
    d1, l1 = embedding_traffic("forward", "float32", 300, 5000, 3, 7, 32, 1 << 20, 2, 1)
    assert model.predict("forward", "float32", 300, 5000, 3, 7, 32) == pytest.approx(1 + d1 / 10e3 + l1 / 100e3,
                                                                                     rel=1e-4)
    again = EmbeddingModel.from_dict(json.loads(json.dumps(model.to_dict())))
    want = model.predict("forward", "float32", B, E, T, L, D)
    assert again.predict("forward", "float32", B, E, T, L, D) == pytest.approx(want)
    table = table_iv_rows(model, rows.assign(median_us=model.predict("forward", "float32", B, E, T, L, D)))
    assert list(table["kernel"]) == ["EL-F", "EL-FL", "EL-FH", "EL-FHL"]
    assert table.set_index("kernel").loc["EL-FH", "mean"] == pytest.approx(0.0, abs=1e-9)


def test_hit_rate_moves_cached_tables_off_dram():
    # B=64 bags per table, E=100 rows of D=16 float32, T=2, L=4; a 1 MiB cache, 2 units, 1 row per block.
    # Per bag: table_offsets 32 + offsets 64 + indices ceil(8*4/32)*32 = 32 + weights 4 * 64 + output 64 = 448.
    plain, none = embedding_traffic("forward", "float32", 64, 100, 2, 4, 16)
    assert plain == 128 * 448 and none == 0
    # num_tables = ceil(1 * 2 / 64) = 1, cached = min(2^20 / (1 * 16 * 4), 100) = 100 = E: p = 1, all weights hit.
    dram, l2 = embedding_traffic("forward", "float32", 64, 100, 2, 4, 16, 1 << 20, 2, 1)
    assert dram == 128 * (32 + 64) and l2 == 128 * (32 + 64 + 256)
    # A cache of 32000 bytes keeps 500 of E = 1000 rows: p = C(500, 4) / C(1000, 4).
    p = (500 * 499 * 498 * 497) / (1000 * 999 * 998 * 997)
    assert hit_rate(64, 1000, 4, 16, 4, 32000, 2, 1) == pytest.approx(p, rel=1e-9)
    dram, l2 = embedding_traffic("backward", "float32", 64, 1000, 2, 4, 16, 32000, 2, 1)
    assert dram == pytest.approx(128 * (32 + 64 + (1 - p) * 512)) and l2 == pytest.approx(128 * (96 + p * 512))
    assert hit_rate(64, 10**7, 4, 16, 4, 32000, 2, 1) == pytest.approx((500 / 1e7) ** 4, rel=1e-3)  # ~never all hits
    assert hit_rate(64, 1000, 4, 16, 4, 192, 2, 1) == 0.0  # 3 cached rows cannot hold a bag of 4


def test_the_per_row_hit_model_tells_a_table_that_mostly_fits_from_one_that_does_not():
    """Rows timed as if each looked-up row hit with cached / E and a miss cost 0.05 us: with
    the paper's all-L p, a bag of 32 rows almost never "hits" in a 1 MiB cache at E = 30 000
    (16 384 rows cached) or 1 000 000 alike; the fit keeps the per-row model (lower training error) and tells them
    apart. A saved model without the key prices with the paper's p, as before."""
    cache = 1 << 20
    assert hit_rate(256, 10_000, 32, 16, 4, cache, 2, 1, per_row=True) == 1.0  # 16384 rows cached
    assert hit_rate(256, 1_000_000, 32, 16, 4, cache, 2, 1, per_row=True) == pytest.approx(16384 / 1e6)
    assert hit_rate(256, 30_000, 32, 16, 4, cache, 2, 1, per_row=True) == pytest.approx(16384 / 30_000)
    assert hit_rate(256, 30_000, 32, 16, 4, cache, 2, 1) < 1e-8
    B, E, T, L, D = _embedding_shapes().T
    dram, l2 = embedding_traffic("backward", "float32", B, E, T, L, D, cache, 2, 1, per_row=True)
    miss = B * T * L * (1 - hit_rate(B, E, L, D, 4, cache, 2, 1, per_row=True))
    rows = pd.DataFrame(dict(direction="backward", dtype="float32", B=B, E=E, T=T, L=L, D=D, held_out=False,
                             median_us=4.0 + dram / 10e3 + l2 / 40e3 + 0.05 * miss, units=2, rows_per_block=1,
                             l2_bytes=cache))
    model = EmbeddingModel.fit(rows)
    fit = model.groups[("backward", "float32")]["hit"]
    assert fit["per_row"] is True and fit["us_per_miss"] == pytest.approx(0.05, rel=1e-3)
    dram, l2 = embedding_traffic("backward", "float32", B, E, T, L, D, cache, 2, 1)  # the paper's p
    paper = EmbeddingModel.fit(rows.assign(median_us=4.0 + dram / 10e3 + l2 / 40e3))
    assert "per_row" not in paper.groups[("backward", "float32")]["hit"]
    near, far = model.predict("backward", "float32", 2048, [30_000, 1_000_000], 1, 32, 16)
    assert far > 1.5 * near
    saved = json.loads(json.dumps(model.to_dict()))
    assert EmbeddingModel.from_dict(saved).predict("backward", "float32", 2048, 1_000_000, 1, 32, 16) == \
        pytest.approx(far)
    for g in saved["groups"]:  # a model saved before the per-row model: the paper's p
        g["hit"].pop("per_row"), g["hit"].pop("us_per_miss")
    old = EmbeddingModel.from_dict(saved).predict("backward", "float32", 2048, [30_000, 1_000_000], 1, 32, 16)
    assert old[0] == pytest.approx(old[1], rel=1e-6) and old[1] < 0.8 * far


def test_embedding_fit_refuses_held_out_rows():
    B, E, T, L, D = _embedding_shapes()[:4].T
    rows = pd.DataFrame(dict(direction="forward", dtype="float32", B=B, E=E, T=T, L=L, D=D, median_us=5.0,
                             held_out=[False, True, False, False], units=2, rows_per_block=1, l2_bytes=1 << 20))
    with pytest.raises(ValueError, match="held-out"):
        EmbeddingModel.fit(rows)


def test_embedding_bad_input_names_the_value():
    B, E, T, L, D = _embedding_shapes().T
    plain, _ = embedding_traffic("backward", "float32", B, E, T, L, D)
    emb = EmbeddingModel.fit(pd.DataFrame(dict(direction="backward", dtype="float32", B=B, E=E, T=T, L=L, D=D,
                                               held_out=False, median_us=2.0 + plain / 5e3, units=2,
                                               rows_per_block=1, l2_bytes=1 << 20)))
    with pytest.raises(BadShapeError, match="E=0"):
        emb.predict("backward", "float32", 8, 0, 1, 1, 16)
    with pytest.raises(BadShapeError, match="D=-4"):
        emb.predict("backward", "float32", 8, 10, 1, 1, [16, -4])
    with pytest.raises(BadShapeError, match="sideways"):
        emb.predict("sideways", "float32", 8, 10, 1, 1, 16)
    with pytest.raises(UnknownDtypeError, match="int4"):
        emb.predict("backward", "int4", 8, 10, 1, 1, 16)
    with pytest.raises(MissingModelError, match="forward"):
        emb.predict("forward", "float32", 8, 10, 1, 1, 16)


def _hot_and_cold_rows(hot_gbps: float, cold_gbps: float) -> pd.DataFrame:
    B, E, T, L, D = _embedding_shapes().T
    plain, _ = embedding_traffic("forward", "float32", B, E, T, L, D)
    base = pd.DataFrame(dict(direction="forward", dtype="float32", B=B, E=E, T=T, L=L, D=D, held_out=False,
                             units=2, rows_per_block=1, l2_bytes=1 << 20, llc_bytes=32 << 20))
    return pd.concat([base.assign(cold=False, median_us=2.0 + plain / (hot_gbps * 1e3)),
                      base.assign(cold=True, median_us=2.0 + plain / (cold_gbps * 1e3))], ignore_index=True)


def test_cold_rows_fit_their_own_model_and_a_graph_blends_by_what_the_cache_holds():
    """Timed hot (the call repeated) at 40 GB/s and cold (after a flush) at 8 GB/s, the same 2 us
    per call: the model keeps both; a lookup priced with half its graph's tables cached sits
    halfway, with all of them cached it is the hot time, and a model saved without cold fits
    loads as before."""
    model = EmbeddingModel.fit(_hot_and_cold_rows(40.0, 8.0))
    assert model.bandwidth_gbps("forward", "float32") == pytest.approx(40.0, rel=1e-6)
    shape = (512, 100_000, 1, 100, 32)
    hot = model.predict("forward", "float32", *shape)
    cold = model.predict("forward", "float32", *shape, cached_share=0.0)
    assert cold > 3 * hot and model.predict_cold("forward", "float32", *shape) == pytest.approx(cold)  # same 2 us
    assert model.predict("forward", "float32", *shape, cached_share=0.5) == pytest.approx((hot + cold) / 2)
    assert model.cached_share(16 << 20) == 1.0 and model.cached_share(128 << 20) == pytest.approx(0.25)
    again = EmbeddingModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.predict("forward", "float32", *shape, cached_share=0.25) == pytest.approx(
        model.predict("forward", "float32", *shape, cached_share=0.25))
    hot_only = EmbeddingModel.fit(_hot_and_cold_rows(40.0, 8.0).query("not cold").drop(columns="cold"))
    assert "cold_groups" not in hot_only.to_dict() and hot_only.cached_share(1 << 30) is None
    assert hot_only.predict("forward", "float32", *shape, cached_share=0.0) == pytest.approx(hot)


def test_held_out_cold_rows_are_scored_against_the_cold_fit():
    from pipeline.predict.evaluate import embedding_predictions

    rows = _hot_and_cold_rows(40.0, 8.0)
    model = EmbeddingModel.fit(rows)
    scored = embedding_predictions(model, rows.assign(held_out=True))
    assert scored["rel_err"].abs().max() < 1e-6


def test_the_recsys_pricer_blends_by_the_graphs_tables():
    from pipeline.predict.price_recsys import RecsysOps

    model = EmbeddingModel.fit(_hot_and_cold_rows(40.0, 8.0))
    ops = RecsysOps(model)
    for _ in range(8):  # eight 100k x 32 float32 tables: 102 MB against the 32 MB cache
        op, dims = ops.map("aten::_embedding_bag", [[100_000, 32], [51_200], [512]], None)
    share = (32 << 20) / (8 * 100_000 * 32 * 4)
    want = model.predict("forward", "float32", *dims, cached_share=share)
    assert ops.predict(op, dims, "float32") == pytest.approx(want)
    small = RecsysOps(model)
    op, dims = small.map("aten::_embedding_bag", [[1000, 32], [512], [512]], None)
    assert small.predict(op, dims, "float32") == pytest.approx(model.predict("forward", "float32", *dims))


def test_the_recsys_pricer_blends_by_the_steps_footprint_against_the_measured_cache():
    """Between two lookups of one table a training step runs everything else: the share priced
    hot is the measured cache over the bytes the step's ops span, not over the tables alone
    (a VM's reported last level can be 3x what its probe finds holding data)."""
    from pipeline.predict.price_recsys import RecsysOps

    model = EmbeddingModel.fit(_hot_and_cold_rows(40.0, 8.0))  # reported last level: 32 MB
    ops = RecsysOps(model)
    op, dims = ops.map("aten::_embedding_bag", [[1000, 32], [51_200], [512]], None)  # a 128 kB table
    hot = model.predict("forward", "float32", *dims)
    assert ops.predict(op, dims, "float32") == pytest.approx(hot)
    ops.observe(64 << 20, 16 << 20)  # the step spans 64 MB; the probe found 16 MB
    assert ops.predict(op, dims, "float32") == pytest.approx(
        model.predict("forward", "float32", *dims, cached_share=0.25))
    for unmeasured in (None, float("nan"), 0.0):  # no probe: the reported 32 MB
        ops.observe(64 << 20, unmeasured)
        assert ops.predict(op, dims, "float32") == pytest.approx(
            model.predict("forward", "float32", *dims, cached_share=0.5))


def test_price_graph_tells_the_extra_ops_the_steps_footprint_and_the_measured_cache():
    """The footprint sums what each priced op spans (a GEMM's operands and output, an extra op's
    inputs); an op mapped "covered" (a table's sparse update, timed inside EL-B) is left out."""
    from pipeline.core.graph import ExecutionGraph, Kernel, Op
    from pipeline.predict.price import price_graph

    seen = []

    class Spy:
        covers = frozenset()

        def map(self, name, shapes, scalars):
            return {"aten::spy": ("spy:op", (1,)), "aten::add_": ("covered", ())}.get(name)

        def predict(self, model_op, dims, dtype):
            assert seen, "observe must come before predict"
            return 0.0 if model_op == "covered" else 1.0

        def observe(self, step_bytes, cache_bytes):
            seen.append((step_bytes, cache_bytes))

    class Gemm:
        weight_cache_bytes = 123.0

        def predict(self, op, dtype, *dims, **kw):
            return 1.0

    graph = ExecutionGraph([Op(0, "aten::spy", kernels=(Kernel("k", 5.0),)),
                            Op(1, "aten::mm", kernels=(Kernel("k", 5.0),)),
                            Op(2, "aten::add_", kernels=(Kernel("k", 5.0),))])
    shapes = {0: [[10, 10], [10, 10]], 1: [[4, 8], [8, 16]], 2: [[1000, 10], [1000, 10]]}
    price_graph(graph, shapes, Gemm(), None, "float32", extra=Spy())
    # float32: the spy's two 10 x 10 inputs, and the mm's 4 x 8, 8 x 16 and 4 x 16 output
    assert seen == [(4 * (200 + 32 + 128 + 64), 123.0)]

    class Old:  # an ExtraOps without observe still prices
        covers = frozenset()
        map, predict = Spy.map, Spy.predict

    seen.append("done")
    price_graph(graph, shapes, Gemm(), None, "float32", extra=Old())


def test_a_blended_lookup_keeps_the_hot_per_call_overhead():
    rows = _hot_and_cold_rows(40.0, 8.0)
    rows.loc[rows["cold"], "median_us"] += 48.0  # a flush leaves the call's own state cold too: 50 us a call
    model = EmbeddingModel.fit(rows)
    shape = (32, 1000, 1, 1, 64)  # a one-row lookup: nearly all overhead
    hot = model.predict("forward", "float32", *shape)
    assert model.predict("forward", "float32", *shape, cached_share=0.0) < hot + 5.0
    assert model.predict_cold("forward", "float32", *shape) > hot + 40.0


def test_cold_timings_fit_their_flush_budget_and_keep_both_held_out_and_fitting_points():
    from pipeline.sweeps.embedding import EmbeddingPoint, cold_subset

    todo = [("float32", EmbeddingPoint(B=8, E=100 + i, T=1, L=2, D=16, held_out=i % 5 == 0)) for i in range(100)]
    assert cold_subset(todo, per_point_s=0.1, budget_s=90.0) == set(range(100))  # 10 s: every point
    picked = cold_subset(todo, per_point_s=3.0, budget_s=90.0)  # 30 points fit
    assert len(picked) == 30 and picked == cold_subset(todo, per_point_s=3.0, budget_s=90.0)
    held = {i for i in picked if todo[i][1].held_out}
    assert len(held) == 6 and len(picked - held) == 24  # in proportion (20 % held out)
    assert len(cold_subset(todo, per_point_s=1000.0, budget_s=90.0)) >= 4  # never none: the cold fit needs rows
