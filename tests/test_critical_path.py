"""Algorithm 1 (DLRM paper §III-D) on hand-built graphs; every expected number is worked by hand.

Line 11 of Algorithm 1: a kernel starts at max(gpu_time + 1, cpu_time + T4/2).
"""

import json
from pathlib import Path

import pytest

from pipeline.predict.critical_path import critical_path, gpu_active_time
from pipeline.core.graph import ExecutionGraph, GraphError, Kernel, Op
from pipeline.predict.overheads import T5_NO_KERNELS, OverheadModel, extract_overheads

GPU_TRACE = Path(__file__).parent / "fixtures" / "gpu_style_trace.json"
OV = {"T1": 10.0, "T2": 5.0, "T3": 5.0, "T4": 4.0, "T5": 0.0}


def flat(ov=OV):
    """Every op type gets the same overheads (the shared table only)."""
    return OverheadModel(individual={}, shared=dict(ov))


def two_ops(kernel_us, **kw):
    """Fig. 4: two dependent ops, one kernel each."""
    return ExecutionGraph([Op(1, "op1", kernels=[Kernel("k1", kernel_us, **kw)]),
                           Op(2, "op2", deps=[1], kernels=[Kernel("k2", kernel_us)])])


def test_cpu_bound_fig4_left():
    # op1: cpu 10 (T1) +5 (T2) = 15; k1 starts max(0+1, 15+2) = 17, ends 19; cpu 19, +T3 -> 24
    # op2: cpu 34, 39; k2 starts max(19+1, 39+2) = 41, ends 43; cpu 43, +T3 -> 48
    r = critical_path(two_ops(2.0), flat())
    assert (r.cpu_us, r.gpu_us, r.e2e_us) == (48.0, 43.0, 48.0)
    assert r.bound == "cpu" and r.active_us == 4.0 and r.idle_us == 44.0
    assert r.timeline == ((1, "k1", 17.0, 19.0), (2, "k2", 41.0, 43.0))


def test_gpu_bound_fig4_right():
    # op1: k1 starts 17, ends 117; cpu 24.  op2: cpu 39; k2 starts max(118, 41) = 118, ends 218
    r = critical_path(two_ops(100.0), flat())
    assert (r.cpu_us, r.gpu_us, r.e2e_us) == (48.0, 218.0, 218.0)
    assert r.bound == "gpu"
    # kernel_only (sum of kernels) misses the launch latency and the 1 µs gap
    assert gpu_active_time(two_ops(100.0)) == 200.0 < r.e2e_us


def test_t5_between_launches_and_launch_less_ops():
    ov = dict(OV, T5=3.0, **{T5_NO_KERNELS: 2.0})
    g = ExecutionGraph([Op(1, "a", kernels=[Kernel("x", 1.0), Kernel("y", 1.0)]), Op(2, "view")])
    # a: cpu 10, 15; x: max(1, 17) = 17 -> 18, cpu 19, +T5 22; y: max(19, 24) = 24 -> 25, cpu 26; +T3 31
    # view (no kernels, line 19): +T1 41, + the launch-less T5 (shared T5_no_kernels) 43
    r = critical_path(g, flat(ov))
    assert (r.cpu_us, r.gpu_us, r.e2e_us) == (43.0, 25.0, 43.0)


def test_synchronous_cpu_device():
    # CPU mode: kernels run inline on the CPU clock, after their dispatch (T4).
    # op1: 10, 15, +T4 19, k1 19..21, +T3 26; op2: 36, 41, 45, k2 45..47, 52
    r = critical_path(two_ops(2.0), flat(), synchronous=True)
    assert r.e2e_us == r.cpu_us == 52.0 and r.timeline[1] == (2, "k2", 45.0, 47.0)
    # with a CPU-trace overhead model only T1 exists: E2E = sum of T1 + sum of op compute
    r = critical_path(two_ops(100.0), flat({"T1": 3.0}), synchronous=True)
    assert r.e2e_us == 3.0 + 100.0 + 3.0 + 100.0


def test_blocking_kernel_extension():
    # op1's k1 blocks: cpu waits to 117, +T3 122; op2: 132, 137; k2 starts max(118, 139) = 139 -> 239
    r = critical_path(two_ops(100.0, blocking=True), flat())
    assert (r.cpu_us, r.gpu_us) == (146.0, 239.0)


def test_empty_graph():
    r = critical_path(ExecutionGraph([]), flat())
    assert r.e2e_us == 0.0 and r.active_us == 0.0


# ---- the GPU-style fixture as a graph, with the overheads extracted from it --------------

def fixture_graph():
    """The ops of tests/fixtures/gpu_style_trace.json with their measured device times."""
    return ExecutionGraph([
        Op(1, "aten::linear"),
        Op(2, "aten::t", parent=1),
        Op(3, "aten::addmm", parent=1, kernels=[Kernel("volta_sgemm_128x64_nn", 50.0, stream=7),
                                                 Kernel("splitKreduce_kernel", 4.0, stream=7)]),
        Op(4, "aten::relu", deps=[3], kernels=[Kernel("clamp_min_kernel", 3.0, stream=7)]),
        Op(5, "aten::view", deps=[4]),
        Op(6, "aten::to"),
        Op(7, "aten::_to_copy", parent=6),
        Op(8, "aten::copy_", parent=7, kernels=[Kernel("Memcpy HtoD", 30.0, stream=7, launch="cudaMemcpyAsync")]),
    ])


def test_algorithm1_on_fixture_trace():
    m = OverheadModel.fit(extract_overheads(GPU_TRACE))
    # linear (T1 unseen -> shared 7; T2 10, T4 5.5, T5 5, T3 14): cpu 7, 17;
    #   sgemm max(1, 17+2.75) = 19.75 -> 69.75, cpu 22.5 +5 = 27.5;
    #   splitK max(70.75, 30.25) = 70.75 -> 74.75, cpu 33, +14 = 47
    # relu (10, 8, T4 7, T3 5): cpu 57, 65; max(75.75, 68.5) -> 78.75; cpu 72, 77
    # view (T1 5, launch-less T5 4): 82, 86
    # to (6, 5, T4 12, T3 8): 92, 97; memcpy max(79.75, 103) = 103 -> 133; cpu 109, 117
    r = critical_path(fixture_graph(), m)
    assert (r.cpu_us, r.gpu_us, r.e2e_us, r.active_us) == (117.0, 133.0, 133.0, 87.0)
    assert [t[2] for t in r.timeline] == [19.75, 70.75, 75.75, 103.0]
    # the trace itself spans 100 (linear starts) .. 230 (memcpy ends) = 130 µs
    assert abs(r.e2e_us - 130.0) / 130.0 < 0.05


def test_what_if_remove_and_reprice():
    m = OverheadModel.fit(extract_overheads(GPU_TRACE))
    g = fixture_graph()
    # without view: relu as before (cpu 77, gpu 78.75); to: 83, 88; memcpy max(79.75, 94) = 94 -> 124
    assert critical_path(g.remove_ops(lambda op: op.name == "aten::view"), m).e2e_us == 124.0
    faster = g.with_kernel_times(lambda op, k: k.time_us / 2)
    assert gpu_active_time(faster) == 43.5
    # halving every kernel saves only 15 of 133 µs: the memcpy waits on its launch (start 103)
    assert critical_path(faster, m).e2e_us == 118.0


# ---- the graph data model ----------------------------------------------------------------

def test_graph_lookups():
    g = fixture_graph()
    assert [op.id for op in g.top_level()] == [1, 4, 5, 6]
    assert g.op(1).children == (2, 3) and g.op(6).children == (7,)
    assert [k.name for k in g.launched_kernels(1)] == ["volta_sgemm_128x64_nn", "splitKreduce_kernel"]
    assert [k.launch for k in g.launched_kernels(6)] == ["cudaMemcpyAsync"]
    assert g.by_name("aten::relu")[0].deps == (3,)
    assert [o.id for o in g.descendants(6)] == [7, 8]
    with pytest.raises(GraphError, match="99"):
        g.op(99)


def test_remove_ops_drops_subtree_and_deps():
    g = fixture_graph().remove_ops(lambda op: op.name == "aten::linear")
    assert [op.id for op in g] == [4, 5, 6, 7, 8]
    assert g.op(4).deps == ()  # depended on addmm, which went with linear


def test_graph_json_round_trip(tmp_path):
    g = fixture_graph()
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(g.to_dict()))
    assert ExecutionGraph.from_dict(json.loads(path.read_text())) == g


def test_graph_rejects_bad_input():
    with pytest.raises(GraphError, match="duplicate op id 1"):
        ExecutionGraph([Op(1, "a"), Op(1, "b")])
    with pytest.raises(GraphError, match="unknown parent 7"):
        ExecutionGraph([Op(1, "a", parent=7)])
    with pytest.raises(GraphError, match="unknown op 5"):
        ExecutionGraph([Op(1, "a", deps=[5])])
    with pytest.raises(GraphError, match="disagree"):
        ExecutionGraph([Op(1, "a", children=[3]), Op(2, "b", parent=1)])
    with pytest.raises(GraphError, match="cycle"):
        ExecutionGraph([Op(1, "a", parent=2), Op(2, "b", parent=1)])
    with pytest.raises(GraphError, match="time_us=-1"):
        Kernel("k", -1.0)
    with pytest.raises(GraphError, match="ops"):
        ExecutionGraph.from_dict({"nodes": []})
