"""Graph predictions (graph_predict.py, predict_callable.py) and DLRM op pricing (price_recsys.py)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from pipeline.workloads.dlrm import TINY_CONFIGS
from pipeline.predict.graph_predict import predict_runs, table_v
from pipeline.workloads.host_time import cpu_overheads
from pipeline.predict.price import classify_graph, price_graph
from pipeline.predict.price_recsys import EMB_BWD, EMB_FWD, RecsysOps

SPEC = TINY_CONFIGS[0]


def test_recsys_ops_price_every_dlrm_kernel(dlrm_captures, flat):
    graph, info = dlrm_captures[8]
    extra = RecsysOps(flat, flat)
    classes = classify_graph(graph, info["shapes"], info["scalars"], extra)
    by_name = {}
    for op in graph:
        by_name.setdefault(op.name, set()).add(classes[op.id][:2])
    tables = len(SPEC.table_rows)
    fwd = [classes[o.id] for o in graph.by_name(EMB_FWD)]
    assert len(fwd) == tables and all(c[1] == "embedding:forward" for c in fwd)
    assert sorted(c[2][1] for c in fwd) == sorted(SPEC.table_rows)  # E of every table
    assert all(c[2][0] == 8 and c[2][3] == SPEC.pooling for c in fwd)  # B and L
    bwd = [classes[o.id] for o in graph.by_name(EMB_BWD)]
    assert len(bwd) == tables and sorted(c[2][1] for c in bwd) == sorted(SPEC.table_rows)
    assert ("priced", "memory:tril_fwd") in by_name["aten::index_select"]
    assert ("priced", "memory:tril_bwd") in by_name["aten::index_select_backward"]
    assert ("priced", "memory:concat") in by_name["aten::stack"] or ("priced", "memory:concat") in by_name["aten::cat"]
    # the sparse SGD step of a table is part of EL-B's timing, priced at 0
    sgd = [classes[o.id] for o in graph.by_name("aten::add_")
           if tuple(info["shapes"][o.id][0]) in {(r, SPEC.embedding_dim) for r in SPEC.table_rows}]
    assert len(sgd) == tables and all(c[1] == "covered" for c in sgd)
    priced, cov = price_graph(graph, info["shapes"], flat, flat, "float32", scalars=info["scalars"],
                              extra=extra, synchronous=True)
    # synchronous: only priced ops keep a kernel; unmapped ones are host time (overheads)
    assert all(c["status"] in ("priced",) for c in cov["ops"] if graph.op(c["id"]).kernels and
               priced.op(c["id"]).kernels)
    assert cov["dropped_share"] < 0.5


def test_predict_runs_three_predictors_and_table_v(dlrm_captures, flat):
    graphs, samples = [], []
    for b, (g, info) in dlrm_captures.items():
        key = dict(workload="dlrm", config=SPEC.name, batch=b, seq=0, mode="train", dtype="float32")
        graphs.append({**key, "graph_json": json.dumps({"graph": g.to_dict(), "shapes": info["shapes"],
                                                        "scalars": info["scalars"]})})
        samples += [{**key, "op": r.op, "type": r.type, "us": r.us}
                    for r in cpu_overheads(g, info, RecsysOps()).itertuples()]
    samples += [dict(workload="mlp", config="m", batch=1, seq=0, op="aten::relu", type="T1", us=3.0)]
    runs = pd.DataFrame([{k: v for k, v in r.items() if k != "graph_json"} | {"measured_ms": 1.0} for r in graphs])
    models = {"gemm_model": flat, "utility_model": flat, "embedding_model": flat, "memory_model": flat}
    pred = predict_runs(runs, pd.DataFrame(graphs), pd.DataFrame(samples), models, synchronous=True)
    assert set(pred["predictor"]) == {"kernel_only", "e2e_individual", "e2e_shared"}
    assert len(pred) == 9
    k = pred[pred.predictor == "kernel_only"].set_index("batch")["predicted_ms"]
    e = pred[pred.predictor == "e2e_individual"].set_index("batch")["predicted_ms"]
    assert (e >= k).all()  # overheads only add time on a synchronous device
    tv = table_v(pred)
    assert {"kernel_only", "e2e_individual", "e2e_shared"} <= set(tv["predictor"])
    assert (tv["min_abs_err"] <= tv["geomean_abs_err"] + 1e-12).all()
    assert (tv["geomean_abs_err"] <= tv["mean_abs_err"] + 1e-6).all()  # AM-GM (errors floored at 1e-6)
    assert (tv["mean_abs_err"] <= tv["max_abs_err"] + 1e-12).all()
    # the profiler's per-event cost comes off a CPU op's traced time, never off a GPU kernel's
    costly = pd.DataFrame(samples).assign(profiler_overhead_us=0.5)
    for synchronous, lower in ((True, True), (False, False)):
        plain = predict_runs(runs, pd.DataFrame(graphs), pd.DataFrame(samples), models, synchronous=synchronous)
        less = predict_runs(runs, pd.DataFrame(graphs), costly, models, synchronous=synchronous)
        assert ((less["active_measured_ms"] < plain["active_measured_ms"]).all() if lower
                else (less["active_measured_ms"] == plain["active_measured_ms"]).all())


def test_predict_module_for_a_gpu_target_walks_algorithm1_asynchronously(synthetic_gemm_model):
    """A CPU-captured module priced for a GPU target: with tiny kernels and a 10 µs launch, the
    host is the critical path (Fig. 4 left); the synchronous CPU mode would just add them up."""
    from pipeline.predict.overheads import OverheadModel
    from pipeline.predict.utility import UtilityModel
    from pipeline.core.ops import UTILITY_OPS
    from pipeline.workloads.predict_callable import predict_module

    rows = [dict(op=op, dtype="float32", rows=r, cols=c, median_us=1.0, held_out=False)
            for op in UTILITY_OPS for r in (1, 16, 256) for c in (64, 256, 1024)]
    utility = UtilityModel.fit(pd.DataFrame(rows))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval()
    gpu = OverheadModel({}, {"T1": 5.0, "T2": 2.0, "T3": 1.0, "T4": 10.0, "T5": 1.0, "T5_no_kernels": 3.0})
    x = torch.randn(4, 8)
    out = predict_module(model, x, synthetic_gemm_model, utility, gpu, synchronous=False)
    assert out["e2e"].bound == "cpu" and out["e2e_us"] > out["kernel_only_us"]
    sync = predict_module(model, x, synthetic_gemm_model, utility, gpu, synchronous=True)
    assert sync["kernel_only_us"] == pytest.approx(out["kernel_only_us"])


def test_op_breakdown_groups_traced_and_predicted_time_by_op():
    from pipeline.predict.graph_predict import op_breakdown

    cov = {"ops": [
        {"id": 1, "name": "aten::addmm", "status": "priced", "model_op": "mm", "measured_us": 100.0, "predicted_us": 80.0},
        {"id": 2, "name": "aten::addmm", "status": "priced", "model_op": "mm", "measured_us": 50.0, "predicted_us": 40.0},
        {"id": 3, "name": "aten::view", "status": "free", "model_op": None, "measured_us": 1.0, "predicted_us": 0.0},
        {"id": 4, "name": "aten::rotary", "status": "dropped", "model_op": None, "measured_us": 30.0,
         "predicted_us": 0.0},
    ]}
    t = op_breakdown(cov)
    top = t.iloc[0]
    assert (top["name"], top["count"], top["traced_us"], top["predicted_us"]) == ("aten::addmm", 2, 150.0, 120.0)
    assert abs(top["predicted_over_traced"] - 0.8) < 1e-9 and abs(t["share_of_traced"].sum() - 1) < 1e-9
    assert list(t["name"]) == ["aten::addmm", "aten::rotary", "aten::view"]


def test_active_time_takes_the_profilers_cost_of_each_nested_event_off_its_parent():
    """A priced op of 100 us self time with three events nested in it, at 4 us per event, ran
    88 us of its own; a covered one with none keeps its 10; free and dropped ops are not active
    time. The per-event cost is the one recorded with this run's trace."""
    from pipeline.core.graph import ExecutionGraph, Op
    from pipeline.predict.graph_predict import per_event_us, traced_active_us

    graph = ExecutionGraph([Op(0, "aten::addmm", children=(1, 2, 3)), Op(1, "aten::t", parent=0),
                            Op(2, "aten::view", parent=0), Op(3, "aten::copy_", parent=0),
                            Op(4, "aten::add_"), Op(5, "aten::rotary")])
    ops = [{"id": 0, "status": "priced", "measured_us": 100.0}, {"id": 1, "status": "free", "measured_us": 5.0},
           {"id": 2, "status": "free", "measured_us": 5.0}, {"id": 3, "status": "covered", "measured_us": 10.0},
           {"id": 4, "status": "covered", "measured_us": 10.0}, {"id": 5, "status": "dropped", "measured_us": 30.0}]
    assert traced_active_us(graph, ops) == pytest.approx(120.0)
    assert traced_active_us(graph, ops, 4.0) == pytest.approx(88.0 + 10.0 + 10.0)
    assert traced_active_us(graph, ops, 50.0) == pytest.approx(0.0 + 10.0 + 10.0)  # never below 0
    samples = pd.DataFrame([dict(workload="gpt2", config="a", batch=1, us=1.0, profiler_overhead_us=4.0),
                            dict(workload="dlrm", config="b", batch=8, us=1.0, profiler_overhead_us=2.5)])
    assert per_event_us(samples, {"workload": "dlrm", "config": "b", "batch": 8}) == 2.5
    assert per_event_us(samples.drop(columns="profiler_overhead_us"), {"workload": "dlrm"}) == 0.0


def test_a_concat_is_priced_as_the_row_segments_aten_copies():
    from pipeline.predict.price_recsys import concat_dims

    # DLRM's (batch, features) cats along dim 1, and a stack of 8 (32, 32) lookups along dim 1
    assert concat_dims([[32, 32], [32, 36]], 1) == (32, 34, 2)
    assert concat_dims([[32, 32]] * 8, 1, stack=True) == (32, 32, 8)
    # Llama's rotary halves (B, H, S, d/2) joined along the last dim: B*H*S segments of d/2
    assert concat_dims([[1, 9, 128, 32]] * 2, -1) == (1152, 32, 2)
    assert concat_dims([[1, 9, 128, 32]] * 2, 0) == (1, 36864, 2)  # whole tensors, one after the other
    # no recorded dim (a profiler capture), or one out of range: rows along the first dim
    assert concat_dims([[4, 10, 3]] * 3, None) == (4, 30, 3)
    assert concat_dims([[4, 10, 3]] * 3, 7) == (4, 30, 3)
