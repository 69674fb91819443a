"""Freeing a step's output: the allocator probe (harness/free_cost.py), the returned tensors a
capture records, and the host time the graph predictors add for them (graph_predict.py)."""
import json

import pandas as pd
import pytest

from pipeline.harness.free_cost import summarize
from pipeline.predict.graph_predict import output_free_us, returned_of
from pipeline.predict.page_faults import PAGE_BYTES as PAGE

MB = 1 << 20


def test_the_probe_finds_where_frees_start_to_cost_and_what_a_page_costs():
    # glibc as on the Xeon VM: blocks under its 32 MB mmap threshold go back to the heap
    got = summarize({4 * MB: 0.004, 16 * MB: 0.001, 32 * MB: 0.13, 64 * MB: 0.17, 128 * MB: 0.167})
    assert got == {"free_us_per_page": pytest.approx(0.167), "free_from_bytes": 32 * MB}
    assert summarize({4 * MB: 0.0, 64 * MB: 0.0}) == {"free_us_per_page": None, "free_from_bytes": None}
    assert summarize({}) == {"free_us_per_page": None, "free_from_bytes": None}


def test_the_probe_runs_here():
    """A smoke test: the probe's loop runs on this machine and gives a value summarize allows."""
    pytest.importorskip("torch")
    from pipeline.harness.free_cost import free_cost

    got = free_cost(sizes_mb=(1, 8))
    assert set(got) == {"free_us_per_page", "free_from_bytes"}
    assert got["free_from_bytes"] in (None, 1 * MB, 8 * MB)
    assert got["free_us_per_page"] is None or got["free_us_per_page"] > 0


def test_only_blocks_past_the_threshold_pay_per_page():
    free = {"free_us_per_page": 0.2, "free_from_bytes": 32 * MB}
    assert output_free_us([128 * MB, 24 * MB, 4], free) == pytest.approx(128 * MB / PAGE * 0.2)
    assert output_free_us([24 * MB], free) == 0.0
    for none in (None, {}, {"free_us_per_page": None, "free_from_bytes": None},
                 {"free_us_per_page": float("nan"), "free_from_bytes": 32 * MB}):
        assert output_free_us([128 * MB], none) == 0.0  # a device row from before the probe


def test_a_capture_records_the_bytes_of_what_the_step_returns():
    torch = pytest.importorskip("torch")
    from pipeline.workloads.capture import capture, returned_bytes

    assert returned_bytes({"logits": torch.empty(4, 8), "past": (torch.empty(2), None)}) == [128, 8]
    assert returned_bytes(None) == [] and returned_bytes(torch.empty(3, dtype=torch.float64)) == [24]
    kv = torch.empty(2, 16)
    assert returned_bytes((kv[0], kv[1], kv)) == [128]  # views of one storage: freed once
    x = torch.randn(16, 32)
    _, info = capture(lambda: torch.relu(x @ x.T), warmup=1, execution_trace=False)
    assert info["returned_bytes"] == [16 * 16 * 4]
    assert returned_of(json.dumps({"graph": {}, "returned_bytes": [7, 3]})) == [7, 3]
    assert returned_of(json.dumps({"graph": {}})) == []  # captured before the field


def test_the_end_to_end_predictors_pay_the_free_and_the_kernel_sum_does_not(dlrm_captures, flat):
    from pipeline.predict.graph_predict import predict_runs
    from pipeline.predict.price_recsys import RecsysOps
    from pipeline.workloads.dlrm import TINY_CONFIGS
    from pipeline.workloads.host_time import cpu_overheads

    graphs, samples = [], []
    for b, (g, info) in dlrm_captures.items():
        key = dict(workload="dlrm", config=TINY_CONFIGS[0].name, batch=b, seq=0, mode="train", dtype="float32")
        graphs.append({**key, "graph_json": json.dumps({"graph": g.to_dict(), "shapes": info["shapes"],
                                                        "scalars": info["scalars"], "returned_bytes": [64 * MB]})})
        samples += [{**key, "op": r.op, "type": r.type, "us": r.us}
                    for r in cpu_overheads(g, info, RecsysOps()).itertuples()]
    runs = pd.DataFrame([{k: v for k, v in r.items() if k != "graph_json"} | {"measured_ms": 1.0} for r in graphs])
    models = {m: flat for m in ("gemm_model", "utility_model", "embedding_model", "memory_model")}
    args = (runs, pd.DataFrame(graphs), pd.DataFrame(samples), models, True)
    plain = predict_runs(*args).set_index(["batch", "predictor"])["predicted_ms"]
    freed = predict_runs(*args, {"free_us_per_page": 0.5, "free_from_bytes": 32 * MB}).set_index(
        ["batch", "predictor"])["predicted_ms"]
    extra_ms = 64 * MB / PAGE * 0.5 / 1e3
    for (batch, predictor), ms in freed.items():
        want = plain[(batch, predictor)] + (0.0 if predictor == "kernel_only" else extra_ms)
        assert ms == pytest.approx(want), (batch, predictor)
