"""Host overheads T1–T5 (DLRM paper §III-C, Fig. 6): extraction from Chrome traces and the model.

Labels are the paper's: T2 before the first launch, T3 after the last launch, T4 the launch
call itself, T5 between launches (or the whole CPU time of an op that launches nothing).
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.overheads import (
    PAPER_CPU_EVENT_OVERHEAD_US, T5_NO_KERNELS, OverheadError, OverheadModel, extract_overheads,
    load_trace, op_durations, remove_outliers)

FIXTURES = Path(__file__).parent / "fixtures"
GPU_TRACE = FIXTURES / "gpu_style_trace.json"
CPU_TRACE = FIXTURES / "cpu_mlp_trace.json"


def record_cpu_mlp_trace(path=CPU_TRACE):  # pragma: no cover - how the CPU fixture was made
    """Re-record tests/fixtures/cpu_mlp_trace.json (torch; not run by the tests)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.randn(32, 64)
    with torch.no_grad():
        for _ in range(3):
            m(x)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(10):
                m(x)
    p.export_chrome_trace(str(path))
    d = json.loads(Path(path).read_text())
    d.pop("deviceProperties", None)
    Path(path).write_text(json.dumps(d, separators=(",", ":")))


def rows(df):
    return sorted(map(tuple, df[["op", "type", "us"]].itertuples(index=False)))


# ---- the synthetic GPU-style trace: every value below is read off the fixture by hand ----
# top-level ops: linear 100-140, relu 150-170, view 175-179, to 185-210 (one thread)
# linear: launches 110-116 and 121-126 (nested aten::t@102, aten::addmm@106 before them)
# relu:   cudaGetDevice@152 (no device event: plain CPU time), launch 158-165
# view:   no launches -> one T5 = its duration
# to:     _to_copy@186, copy_@187, cudaMemcpyAsync 190-202
# the cudaDeviceSynchronize@212 lies outside every op and is ignored.
GPU_RAW = sorted([
    ("aten::linear", "T2", 10.0), ("aten::linear", "T4", 6.0), ("aten::linear", "T4", 5.0),
    ("aten::linear", "T5", 5.0), ("aten::linear", "T3", 14.0),
    ("aten::relu", "T1", 10.0), ("aten::relu", "T2", 8.0), ("aten::relu", "T4", 7.0), ("aten::relu", "T3", 5.0),
    ("aten::view", "T1", 5.0), ("aten::view", "T5", 4.0),
    ("aten::to", "T1", 6.0), ("aten::to", "T2", 5.0), ("aten::to", "T4", 12.0), ("aten::to", "T3", 8.0),
])


def test_gpu_style_trace_hand_computed():
    assert rows(extract_overheads(GPU_TRACE)) == GPU_RAW


def test_gpu_style_trace_profiler_overhead_subtraction():
    # 1 µs per recorded CPU event, charged to the interval the event starts in:
    # T1 and T4 lose 1 each (the next op's / the launch's own record); linear T2 loses 2
    # (aten::t, aten::addmm start before its first launch), relu T2 loses 1 (cudaGetDevice),
    # to T2 loses 2 (_to_copy, copy_); the T3/T5 intervals and view hold no nested starts.
    assert rows(extract_overheads(GPU_TRACE, 1.0)) == sorted([
        ("aten::linear", "T2", 8.0), ("aten::linear", "T4", 5.0), ("aten::linear", "T4", 4.0),
        ("aten::linear", "T5", 5.0), ("aten::linear", "T3", 14.0),
        ("aten::relu", "T1", 9.0), ("aten::relu", "T2", 7.0), ("aten::relu", "T4", 6.0), ("aten::relu", "T3", 5.0),
        ("aten::view", "T1", 4.0), ("aten::view", "T5", 4.0),
        ("aten::to", "T1", 5.0), ("aten::to", "T2", 3.0), ("aten::to", "T4", 11.0), ("aten::to", "T3", 8.0),
    ])
    # never negative, even with a large per-event cost
    assert (extract_overheads(GPU_TRACE, 50.0)["us"] >= 0).all()


def test_trace_accepts_path_dict_and_list():
    d = json.loads(GPU_TRACE.read_text())
    assert rows(extract_overheads(d)) == rows(extract_overheads(d["traceEvents"])) == GPU_RAW
    with pytest.raises(OverheadError, match="traceEvents"):
        load_trace({"events": []})
    with pytest.raises(OverheadError, match="cpu_event_overhead_us"):
        extract_overheads(d, -1.0)


def test_fit_on_gpu_style_trace_individual_and_shared():
    m = OverheadModel.fit(extract_overheads(GPU_TRACE))
    assert m.individual["aten::linear"] == {"T2": 10.0, "T3": 14.0, "T4": 5.5, "T5": 5.0}
    assert m.individual["aten::view"] == {"T1": 5.0, "T5": 4.0}
    assert m.counts["aten::linear"]["T4"] == 2
    assert m.shared["T1"] == pytest.approx(7.0)          # (10 + 5 + 6) / 3
    assert m.shared["T2"] == pytest.approx(23 / 3)       # (10 + 8 + 5) / 3
    assert m.shared["T3"] == pytest.approx(9.0)          # (14 + 5 + 8) / 3
    assert m.shared["T4"] == pytest.approx(7.5)          # (6 + 5 + 7 + 12) / 4
    # the two meanings of T5 are pooled apart: gaps between launches vs launch-less ops
    assert m.shared["T5"] == 5.0 and m.shared[T5_NO_KERNELS] == 4.0
    # the first op has no T1 sample: it falls back to the shared mean
    assert m.get("aten::linear", "T1") == pytest.approx(7.0)


def test_shared_fallback_for_unseen_op():
    m = OverheadModel.fit(extract_overheads(GPU_TRACE))
    unseen = m.lookup("aten::bmm", has_kernels=True)
    assert unseen == pytest.approx({"T1": 7.0, "T2": 23 / 3, "T3": 9.0, "T4": 7.5, "T5": 5.0})
    assert m.get("aten::reshape", "T5", has_kernels=False) == 4.0
    assert m.get("aten::relu", "T1") == 10.0  # seen: individual wins
    with pytest.raises(OverheadError, match="T6"):
        m.get("aten::relu", "T6")


def test_iqr_outlier_removal_planted_outlier():
    sample = [10.0, 11.0, 9.0, 10.5, 9.5, 10.0, 500.0]
    kept = remove_outliers(sample)
    assert 500.0 not in kept and len(kept) == 6
    df = pd.DataFrame({"op": "aten::relu", "type": "T1", "us": sample})
    m = OverheadModel.fit(df)
    assert m.individual["aten::relu"]["T1"] == pytest.approx(np.mean(sample[:6]))
    assert m.counts["aten::relu"]["T1"] == 6
    # per (op, type): a value normal for one op is not an outlier because of another op
    df2 = pd.concat([df, pd.DataFrame({"op": "aten::mm", "type": "T1", "us": [500.0, 510.0, 490.0]})])
    assert OverheadModel.fit(df2).individual["aten::mm"]["T1"] == pytest.approx(500.0)


def test_fit_rejects_bad_samples():
    with pytest.raises(OverheadError, match="columns"):
        OverheadModel.fit(pd.DataFrame({"op": ["a"], "us": [1.0]}))
    with pytest.raises(OverheadError, match="T9"):
        OverheadModel.fit(pd.DataFrame({"op": ["a"], "type": ["T9"], "us": [1.0]}))
    with pytest.raises(OverheadError, match="finite"):
        OverheadModel.fit(pd.DataFrame({"op": ["a"], "type": ["T1"], "us": [-1.0]}))
    with pytest.raises(OverheadError, match="no overhead samples"):
        OverheadModel.fit(pd.DataFrame({"op": [], "type": [], "us": []}))


def test_overhead_model_json_round_trip(tmp_path):
    m = OverheadModel.fit(extract_overheads(GPU_TRACE))
    path = tmp_path / "overheads.json"
    path.write_text(json.dumps(m.to_dict()))
    back = OverheadModel.from_dict(json.loads(path.read_text()))
    assert back == m
    with pytest.raises(OverheadError, match="JSON"):
        OverheadModel.from_dict({"shared": {}})


# ---- the recorded CPU trace: structure, not timings --------------------------------------

def test_cpu_trace_has_only_t1():
    df = extract_overheads(CPU_TRACE)
    assert set(df["type"]) == {"T1"}  # no launches on the CPU: no T2, T3, T4, T5
    assert set(df["op"]) == {"aten::linear", "aten::relu"}
    assert (df["us"] > 0).all()
    # 10 forward passes x 3 top-level ops -> 29 gaps between consecutive top-level ops
    assert len(df) == 29
    m = OverheadModel.fit(df)
    assert set(m.shared) == {"T1"}
    assert m.get("aten::linear", "T2") == 0.0 and m.get("aten::linear", "T4") == 0.0


def test_cpu_trace_op_durations():
    d = op_durations(CPU_TRACE)
    assert list(d["op"][:3]) == ["aten::linear", "aten::relu", "aten::linear"]
    assert len(d) == 30 and (d["us"] > 0).all()
    # nested aten::t / aten::addmm etc. are not top-level ops
    assert set(d["op"]) == {"aten::linear", "aten::relu"}
    assert (op_durations(CPU_TRACE, PAPER_CPU_EVENT_OVERHEAD_US)["us"] <= d["us"]).all()


def _gaps_after_ops(rng, n=600):
    """T1 gaps of two op types (base 2 and 6 us) that run 1x after ops under 64 us, 3x after
    ops of 64 us - 4 ms and 6x after longer ones, with 10 % noise."""
    prev = np.exp(rng.uniform(np.log(1.0), np.log(20000.0), n))
    slow = np.where(prev < 64, 1.0, np.where(prev < 4096, 3.0, 6.0))
    op = np.where(rng.random(n) < 0.5, "aten::add", "aten::mm")
    base = np.where(op == "aten::add", 2.0, 6.0)
    us = base * slow * rng.uniform(0.9, 1.1, n)
    return pd.DataFrame({"op": op, "type": "T1", "us": us, "prev_us": prev})


def test_t1_after_a_long_op_is_fitted_from_the_previous_ops_duration():
    from pipeline.predict.overheads import AfterOp

    samples = _gaps_after_ops(np.random.default_rng(0))
    model = OverheadModel.fit(samples)
    a = model.t1_after
    assert isinstance(a, AfterOp) and a.slowdown[0] == 1.0 and np.all(np.diff(a.slowdown) >= 0)
    assert a.factor(2.0) == pytest.approx(1.0, rel=0.1)
    assert a.factor(1000.0) == pytest.approx(3.0, rel=0.15) and a.factor(15000.0) == pytest.approx(6.0, rel=0.15)
    # the op's own T1 is its gap after a short op; lookup scales it by the previous op
    assert model.get("aten::mm", "T1") == pytest.approx(6.0, rel=0.1)
    assert model.get("aten::mm", "T1", prev_us=15000.0) == pytest.approx(36.0, rel=0.2)
    assert model.get("aten::unseen", "T1", prev_us=1.0) == pytest.approx(model.shared["T1"])
    assert 2.0 < model.shared["T1"] < 6.0
    # without prev_us (a GPU capture, an older calibration) T1 stays one mean per op
    plain = OverheadModel.fit(samples.drop(columns="prev_us"))
    assert plain.t1_after is None and plain.get("aten::mm", "T1", prev_us=15000.0) == plain.get("aten::mm", "T1")


def test_t1_after_round_trips_and_older_models_load(tmp_path):
    model = OverheadModel.fit(_gaps_after_ops(np.random.default_rng(1)))
    back = OverheadModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert back == model and back.t1_after.factor(5000.0) == model.t1_after.factor(5000.0)
    assert back.get("aten::add", "T1", prev_us=300.0) == model.get("aten::add", "T1", prev_us=300.0)
    old = {k: v for k, v in model.to_dict().items() if k != "t1_after"}
    assert OverheadModel.from_dict(old).t1_after is None


def test_critical_path_charges_the_gap_by_the_previous_ops_time():
    from pipeline.core.graph import ExecutionGraph, Kernel, Op
    from pipeline.predict.critical_path import critical_path

    model = OverheadModel.fit(_gaps_after_ops(np.random.default_rng(2)))

    def graph(first_us):
        ops = [Op(0, "aten::mm", kernels=(Kernel("mm", first_us, launch="inline"),)),
               Op(1, "aten::add", kernels=(Kernel("add", 1.0, launch="inline"),))]
        return ExecutionGraph(ops)

    short, long = (critical_path(graph(us), model, synchronous=True) for us in (2.0, 15000.0))
    gap = lambda e, first: e.e2e_us - first - 1.0 - model.get("aten::mm", "T1") - 2 * model.get("x", "T2")  # noqa: E731
    assert gap(short, 2.0) == pytest.approx(model.get("aten::add", "T1", prev_us=2.0 + model.get("x", "T2")))
    assert gap(long, 15000.0) == pytest.approx(model.t1_after.factor(15000.0) * model.get("aten::add", "T1"), rel=1e-6)
    assert gap(long, 15000.0) > 4 * gap(short, 2.0)


def test_t1_after_keeps_the_gaps_after_the_few_long_ops_an_op_follows():
    """An op that follows a long op only 10 % of the time: filtered per op alone, those gaps sit
    past its upper quartile and would be dropped as outliers, and the slowdown with them."""
    rng = np.random.default_rng(3)
    n = 2000
    long = rng.random(n) < 0.1
    prev = np.where(long, rng.uniform(1000, 10000, n), rng.uniform(1, 4, n))
    us = np.where(long, 30.0, 2.0) * rng.uniform(0.95, 1.05, n)
    model = OverheadModel.fit(pd.DataFrame({"op": "aten::add", "type": "T1", "us": us, "prev_us": prev}))
    assert model.t1_after.factor(5000.0) == pytest.approx(15.0, rel=0.1)
    assert model.get("aten::add", "T1", prev_us=2.0) == pytest.approx(2.0, rel=0.1)


def test_t1_after_with_zero_gaps_after_short_ops():
    """T1 is clipped at 0: a first bin of zeros still leaves the next bin's slowdown at 1."""
    prev = np.r_[np.full(40, 1.0), np.geomspace(100, 10000, 60)]
    us = np.r_[np.zeros(40), np.full(60, 5.5)]
    model = OverheadModel.fit(pd.DataFrame({"op": "aten::mm", "type": "T1", "us": us, "prev_us": prev}))
    a = model.t1_after
    assert a.slowdown[0] <= 1e-3 and a.slowdown[1] == pytest.approx(1.0)
    assert model.get("aten::mm", "T1", prev_us=5000.0) == pytest.approx(5.5, rel=0.05)
    assert model.get("aten::mm", "T1", prev_us=1.0) == pytest.approx(0.0, abs=0.01)
