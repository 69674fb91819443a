"""Inside a step that streams more than L2 an op finds what it touched evicted
(predict/cache_cold.py): the utility sweep's cold twins price the extra, and the graph pricer
adds it to every utility op of a step whose footprint passes the twins' flush."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core.graph import ExecutionGraph, Kernel, Op
from pipeline.predict.cache_cold import ColdPenalty
from pipeline.predict.price import price_graph
from pipeline.predict.utility import UtilityModel

EVICT = 4 << 20
# cold extra per op: add pays 10 us a call after an eviction at any size, relu 2 us
EXTRA = {"add": 10.0, "relu": 2.0}


def _rows(with_twins: bool = True) -> pd.DataFrame:
    rows = []
    for op, extra in EXTRA.items():
        for r in (1, 16, 256):
            for c in (64, 256, 1024):
                hot = 1.0 + r * c / 1000
                nbytes = (3 if op == "add" else 2) * r * c * 4
                rows.append(dict(op=op, dtype="float32", rows=r, cols=c, median_us=hot, held_out=False,
                                 bytes_read=nbytes * 2 / 3, bytes_written=nbytes / 3,
                                 **({"cold_us": hot + extra, "evict_bytes": float(EVICT)} if with_twins else {})))
    return pd.DataFrame(rows)


def test_the_penalty_is_the_median_extra_of_each_op_by_size():
    cold = ColdPenalty.fit(_rows())
    assert cold.evict_bytes == EVICT
    assert cold.extra_us("add", "float32", [10, 1e5]) == pytest.approx([10.0] * 2)
    assert cold.extra_us("relu", "float32", 4096.0) == pytest.approx(2.0)
    # an (op, dtype) without twins of its own takes every op's, pooled
    assert 2.0 <= float(cold.extra_us("gelu", "float32", 4096.0)) <= 10.0
    assert cold.evicts(EVICT) and not cold.evicts(EVICT - 1)


def test_a_cold_twin_faster_than_its_hot_row_adds_nothing():
    rows = _rows()
    rows["cold_us"] = rows["median_us"] * 0.9
    assert ColdPenalty.fit(rows).extra_us("add", "float32", 4096.0) == 0.0


def test_without_twins_there_is_no_penalty_and_the_model_saves_as_before():
    model = UtilityModel.fit(_rows(with_twins=False))
    assert model.cold is None and "cold" not in model.to_dict()
    with_cold = UtilityModel.fit(_rows())
    back = UtilityModel.from_dict(with_cold.to_dict())
    assert back.cold.extra_us("add", "float32", 4096.0) == pytest.approx(10.0)
    assert UtilityModel.from_dict(model.to_dict()).cold is None


def _graph(first: str, first_shapes: list) -> tuple[ExecutionGraph, dict]:
    """`first` then an add of two 16 x 64 tensors."""
    ops = [Op(0, first, kernels=(Kernel("k0", 1.0),)), Op(1, "aten::add", kernels=(Kernel("k1", 1.0),))]
    return ExecutionGraph(ops), {0: first_shapes, 1: [[16, 64], [16, 64]]}


class _Gemm:
    def predict(self, op, dtype, m, n, k, batch=1, **kw):
        return 100.0


def test_every_utility_op_of_a_step_past_the_flush_is_priced_cold_and_of_a_smaller_step_hot():
    """The step's footprint decides, not the op before: an add after a small mm in a step that
    also holds a large one pays the extra (it did not while only the predecessor counted)."""
    model = UtilityModel.fit(_rows())
    hot = float(model.predict("add", "float32", 16, 64))
    big = [[1024, 1024], [1024, 1024]]  # 8 MB of operands and 4 MB out: past the 4 MB flush
    small = [[16, 64], [64, 64]]
    for first, shapes, want in (("aten::mm", big, hot + 10.0), ("aten::mm", small, hot)):
        graph, shp = _graph(first, shapes)
        priced, cov = price_graph(graph, shp, _Gemm(), model, "float32", synchronous=True)
        add = next(r for r in cov["ops"] if r["id"] == 1)
        assert add["predicted_us"] == pytest.approx(want) and add["after_evict"] == (want != hot)
    ops = [Op(0, "aten::mm", kernels=(Kernel("k", 1.0),)), Op(1, "aten::mm", kernels=(Kernel("k", 1.0),)),
           Op(2, "aten::add", kernels=(Kernel("k", 1.0),))]
    shp = {0: big, 1: small, 2: [[16, 64], [16, 64]]}
    add = price_graph(ExecutionGraph(ops), shp, _Gemm(), model, "float32", synchronous=True)[1]["ops"][2]
    assert add["predicted_us"] == pytest.approx(hot + 10.0) and add["after_evict"]
    # a large utility op makes the step pass it too; a calibration without twins prices every op hot
    graph, shp = _graph("aten::relu", [[2048, 1024]])
    assert next(r for r in price_graph(graph, shp, _Gemm(), model, "float32")[1]["ops"]
                if r["id"] == 1)["predicted_us"] == pytest.approx(hot + 10.0)
    plain = UtilityModel.fit(_rows(with_twins=False))
    graph, shp = _graph("aten::mm", big)
    assert next(r for r in price_graph(graph, shp, _Gemm(), plain, "float32")[1]["ops"]
                if r["id"] == 1)["predicted_us"] == pytest.approx(float(plain.predict("add", "float32", 16, 64)))


def test_the_sweep_times_a_cold_twin_of_small_rows_on_the_cpu_only():
    pytest.importorskip("torch")
    from dataclasses import replace

    from pipeline.device.discover import identify_cpu
    from pipeline.sweeps.profiles import PROFILES
    from pipeline.sweeps.utility import COLD_TWIN_MAX_FLUSHES, _utility_callable, cold_twin

    dev = replace(identify_cpu(), l2_bytes=1 << 20)
    profile = PROFILES["tiny"]
    fn = _utility_callable("add", "float32", 16, 64, "cpu")
    twin = cold_twin(fn, 16 * 64 * 12, dev, profile)
    assert twin["evict_bytes"] == 2 << 20 and np.isfinite(twin["cold_us"]) and twin["cold_us"] > 0
    assert cold_twin(fn, COLD_TWIN_MAX_FLUSHES * (2 << 20) + 1, dev, profile) == {}
    assert cold_twin(fn, 1024, replace(dev, l2_bytes=None), profile) == {}
    assert cold_twin(fn, 1024, dev, replace(profile, utility_timing=replace(profile.utility_timing,
                                                                            flush_l2=True))) == {}


def test_an_op_nested_in_a_gemm_is_priced_by_its_step_like_any_other():
    """addmm's bias copy (its child) in a step past the flush pays the extra as the add after the
    addmm does; with a small addmm the step stays under the flush and neither does."""
    model = UtilityModel.fit(_rows())
    hot = float(model.predict("add", "float32", 16, 64))
    big = [[1024], [1024, 1024], [1024, 1024]]  # bias, x, W: 12 MB with the output
    ops = [Op(0, "aten::relu", kernels=(Kernel("k", 1.0),)),
           Op(1, "aten::addmm", kernels=(Kernel("k", 1.0),)),
           Op(2, "aten::add", parent=1, kernels=(Kernel("k", 1.0),)),  # stands in for the bias copy
           Op(3, "aten::add", kernels=(Kernel("k", 1.0),))]
    shapes = {0: [[16, 64]], 1: big, 2: [[16, 64], [16, 64]], 3: [[16, 64], [16, 64]]}
    _, cov = price_graph(ExecutionGraph(ops), shapes, _Gemm(), model, "float32", synchronous=True)
    by_id = {r["id"]: r for r in cov["ops"]}
    assert by_id[2]["predicted_us"] == pytest.approx(hot + 10.0) and by_id[2]["after_evict"]
    assert by_id[3]["predicted_us"] == pytest.approx(hot + 10.0) and by_id[3]["after_evict"]
    shapes[1] = [[16], [16, 64], [16, 64]]  # a small addmm: the step stays under the flush
    _, cov = price_graph(ExecutionGraph(ops), shapes, _Gemm(), model, "float32", synchronous=True)
    assert [r["after_evict"] for r in cov["ops"] if r["id"] in (2, 3)] == [False, False]


def test_disturbed_twins_are_left_out_and_nothing_is_charged_past_the_largest_twin():
    import json

    rows = _rows()
    big = rows["bytes_read"] + rows["bytes_written"] == (rows["bytes_read"] + rows["bytes_written"]).max()
    rows.loc[rows["op"] == "add", "remeasured"] = False
    rows.loc[(rows["op"] == "add") & big, ["remeasured", "cold_us"]] = [True, 1e6]  # taken in a disturbance
    cold = ColdPenalty.fit(rows)
    assert cold.extra_us("add", "float32", 4096.0) == pytest.approx(10.0)
    assert float(cold.extra_us("relu", "float32", cold.max_bytes * 2)) == 0.0
    assert cold.extra_us("relu", "tf32", 4096.0) == pytest.approx(2.0)  # tf32 is float32 storage
    back = ColdPenalty.from_dict(json.loads(json.dumps(cold.to_dict())))
    assert back.extra_us("add", "float32", 4096.0) == pytest.approx(10.0) and back.max_bytes == cold.max_bytes
