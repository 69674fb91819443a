"""CPU and GPU host overheads from traces (host_time.py) and leave-one-out overhead models."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.core.graph import ExecutionGraph, Kernel, Op
from pipeline.predict.graph_predict import overheads_for
from pipeline.workloads.host_time import cpu_overheads


def _op(i, name, parent=None, us=1.0):
    return Op(i, name, parent=parent, kernels=[Kernel(name, us, launch="inline")])


def test_cpu_overheads_hand_built():
    # linear (0..100) wraps addmm (20..80, priced); view (110..115) does no work; relu (120..150) priced.
    g = ExecutionGraph([_op(0, "aten::linear"), _op(1, "aten::addmm", parent=0), _op(2, "aten::view"),
                        _op(3, "aten::relu")])
    info = {"shapes": {0: [[4, 8], [16, 8], [16]], 1: [[16], [4, 8], [8, 16]], 2: [[4, 16], None], 3: [[4, 16]]},
            "times": {0: {"ts": 0, "dur": 100}, 1: {"ts": 20, "dur": 60}, 2: {"ts": 110, "dur": 5},
                      3: {"ts": 120, "dur": 30}}}
    rows = cpu_overheads(g, info)
    got = {(r.op, r.type): r.us for r in rows.itertuples()}
    assert got == {("aten::linear", "T2"): 40.0, ("aten::view", "T1"): 10.0, ("aten::view", "T5"): 5.0,
                   ("aten::relu", "T1"): 5.0, ("aten::relu", "T2"): 0.0}
    # profiler cost: 1 µs per event outside modeled work (linear itself; view; not addmm)
    got = {(r.op, r.type): r.us for r in cpu_overheads(g, info, profiler_overhead_us=1.0).itertuples()}
    assert got[("aten::linear", "T2")] == 39.0 and got[("aten::view", "T1")] == 9.0 and got[("aten::view", "T5")] == 4.0


def test_leave_one_out_overheads_never_use_the_run_itself():
    rows = [dict(workload=w, config=c, batch=b, seq=0, op="aten::relu", type="T1", us=us)
            for w, c, b, us in [("dlrm", "a", 32, 1.0), ("dlrm", "a", 64, 2.0), ("dlrm", "b", 32, 10.0),
                                ("gpt2", "g", 1, 100.0)]]
    models = overheads_for(pd.DataFrame(rows), {"workload": "dlrm", "config": "a", "batch": 32, "seq": 0})
    assert models["e2e_individual"].get("aten::relu", "T1") == 2.0  # same config, the other batch only
    assert models["e2e_shared"].get("aten::relu", "T1") == pytest.approx(55.0)  # every other config
    alone = overheads_for(pd.DataFrame(rows[:1]), {"workload": "dlrm", "config": "a", "batch": 32, "seq": 0})
    assert alone == {"e2e_individual": None, "e2e_shared": None}


def test_gpu_trace_kernels_go_to_the_op_that_launched_them():
    """capture's graph from a GPU-style trace: device events attributed through their launch's
    correlation id to the innermost op around the launch; Algorithm 1 then spans the trace."""
    from pathlib import Path

    from pipeline.predict.critical_path import critical_path
    from pipeline.predict.overheads import OverheadModel, extract_overheads
    from pipeline.workloads.capture import _build

    trace = json.loads((Path(__file__).parent / "fixtures" / "gpu_style_trace.json").read_text())
    graph, info = _build(trace, None, None, [])
    kernels = {op.name: [k.name for k in op.kernels] for op in graph if op.kernels}
    assert kernels == {"aten::addmm": ["volta_sgemm_128x64_nn", "splitKreduce_kernel"],
                       "aten::relu": ["clamp_min_kernel"], "aten::copy_": ["Memcpy HtoD (Pageable -> Device)"]}
    assert graph.by_name("aten::copy_")[0].kernels[0].launch == "cudaMemcpyAsync"
    e2e = critical_path(graph, OverheadModel.fit(extract_overheads(trace)))
    assert e2e.active_us == 50 + 4 + 3 + 30
    assert abs(e2e.e2e_us - 130.0) / 130.0 < 0.1  # the trace spans 100 .. 230 µs
