"""Execution-graph capture on the CPU (capture.py), re-pricing with devchar's models
(price.py) and the callable / HF-config predictor (predict_callable.py)."""
from __future__ import annotations

import os

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from pipeline.core.graph import ExecutionGraph, Kernel, Op  # noqa: E402
from pipeline.predict.overheads import OverheadModel, extract_overheads  # noqa: E402
from pipeline.predict.utility import UtilityModel  # noqa: E402
from pipeline.workloads.capture import capture  # noqa: E402
from pipeline.core.ops import UTILITY_OPS  # noqa: E402
from pipeline.predict.price import FREE, price_graph  # noqa: E402

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000,
             "bos_token_id": 999, "eos_token_id": 999}


def utility_model(ops=UTILITY_OPS) -> UtilityModel:
    """Made-up calibration: 1 µs per call plus 1 µs per 1000 elements."""
    rows = [dict(op=op, dtype="float32", rows=r, cols=c, median_us=1 + r * c / 1000, held_out=False)
            for op in ops for r in (1, 16, 256) for c in (64, 256, 1024)]
    return UtilityModel.fit(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def mlp_capture():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    x = torch.randn(8, 64)
    with torch.inference_mode():
        return capture(lambda: model(x), warmup=1)


def test_capture_mlp_graph(mlp_capture):
    graph, info = mlp_capture
    top = [op.name for op in graph.top_level()]
    assert top.count("aten::linear") + top.count("aten::addmm") == 2 and "aten::relu" in top
    assert graph.by_name("aten::addmm"), "the GEMMs themselves are ops of the graph"
    for op in graph:
        assert len(op.kernels) == 1 and op.kernels[0].time_us >= 0
        if op.parent is not None:  # nesting agrees with the profiler's intervals
            p, c = info["times"][op.parent], info["times"][op.id]
            assert p["ts"] <= c["ts"] and c["ts"] + c["dur"] <= p["ts"] + p["dur"] + 1e-3
            assert op.id in graph.op(op.parent).children
    leaves = [op for op in graph if not op.children]
    assert all(op.kernels[0].time_us > 0 for op in leaves)
    assert info["source"] == "execution_trace", info["notes"]
    assert info["et_parent_mismatches"] == 0  # the observer's call tree says the same
    # data deps from tensor ids: the second linear consumes relu's output
    relu = graph.by_name("aten::relu")[0]
    second = [op for op in graph.top_level() if op.name == top[-1]][-1]
    assert relu.id in second.deps
    addmm = graph.by_name("aten::addmm")[0]
    assert info["shapes"][addmm.id][1:3] == [[8, 64], [64, 128]] and info["dtypes"][addmm.id][0] == "float32"
    # the Chrome trace comes back too, in the form extract_overheads reads
    assert set(extract_overheads(info["trace"])["type"]) == {"T1"}


def test_separate_timing_run_keeps_the_graph(mlp_capture):
    graph, info = mlp_capture
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    x = torch.randn(8, 64)
    with torch.inference_mode():
        g2, info2 = capture(lambda: model(x), warmup=1, separate_timing=True)
    assert info2["times_source"] == "timing run" and info2["source"] == "execution_trace"
    assert [(o.name, o.parent, o.deps) for o in g2] == [(o.name, o.parent, o.deps) for o in graph]
    assert info2["shapes"] == info["shapes"]


def test_the_timing_run_keeps_only_its_last_call(monkeypatch):
    """The CPU timing run calls the step TIMING_WARM_CALLS more times under the profiler and
    keeps the events of the last call alone: the graph is one call's, timed warm."""
    import pipeline.workloads.capture as cap

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    x = torch.randn(8, 64)
    calls = []

    def step():
        calls.append(1)
        return model(x)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU host times one call
    with torch.inference_mode():
        monkeypatch.setattr(cap, "TIMING_WARM_CALLS", 0)
        one, _ = capture(step, warmup=1, separate_timing=True)
        calls.clear()
        monkeypatch.setattr(cap, "TIMING_WARM_CALLS", 3)
        graph, info = capture(step, warmup=1, separate_timing=True)
    # warm-up, the observer's call, three warm calls, the kept one
    assert len(calls) == 1 + 1 + 3 + 1
    assert info["times_source"] == "timing run", info["notes"]
    assert [(o.name, o.parent) for o in graph] == [(o.name, o.parent) for o in one]
    names = {e.get("name") for e in info["trace"]["traceEvents"]}
    assert cap._TIMED_MARK not in names  # the mark is not an op
    first = min(t["ts"] for t in info["times"].values())
    assert all(e["ts"] >= first for e in info["trace"]["traceEvents"] if e.get("ph") == "X")


def test_a_timing_trace_without_its_mark_falls_back_to_the_observer_run(monkeypatch):
    import pipeline.workloads.capture as cap

    with pytest.raises(cap.MarkError, match="0 marks"):
        cap._only_marked_call({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 2.0}]})

    def unmarked(trace):
        raise cap.MarkError("2 marks of its kept call, not 1")

    monkeypatch.setattr(cap, "_only_marked_call", unmarked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.inference_mode():
        graph, info = capture(lambda: model(x), warmup=1, separate_timing=True)
    assert info["times_source"] == "profiled run" and graph.by_name("aten::linear")
    assert any("timing run's trace was unusable" in n for n in info["notes"])


def test_capture_without_observer(monkeypatch):
    import torch.profiler as tp

    class Broken:
        def register_callback(self, path):
            raise RuntimeError("no observer here")

    monkeypatch.setattr(tp, "ExecutionTraceObserver", Broken)
    x = torch.randn(4, 16)
    w = torch.randn(16, 8)
    graph, info = capture(lambda: torch.mm(x, w).relu(), warmup=0)
    assert info["source"] == "profiler" and "no observer here" in " ".join(info["notes"])
    mm = graph.by_name("aten::mm")[0]
    assert info["shapes"][mm.id] == [[4, 16], [16, 8]] and all(not op.deps for op in graph)


def test_nn_linear_gemms_are_priced_by_the_linear_table(mlp_capture):
    """nn.Linear's addmm multiplies by the weight transposed: the linear table prices it where
    the calibration has one (a made-up linear twice as slow as mm), the mm table where not."""
    import pandas as pd

    from pipeline.predict.gemm import GemmModel

    rows = [dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1, m=m, n=n, k=k,
                 waves=w, median_us=(1 + k / 32) * w**0.8 * (2.0 if op == "linear" else 1.0), held_out=False)
            for op in ("mm", "linear") for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64)))
            for k in (32, 64, 128, 256)]
    model = GemmModel.fit(pd.DataFrame(rows))
    graph, info = mlp_capture
    priced, cov = price_graph(graph, info["shapes"], model, utility_model(), "float32")
    for op in graph.by_name("aten::addmm"):
        _, (m, k), (_, n) = info["shapes"][op.id][:3]
        assert priced.op(op.id).kernels[0].time_us == pytest.approx(float(model.predict("linear", "float32", m, n, k)))
        assert float(model.predict("linear", "float32", m, n, k)) > float(model.predict("mm", "float32", m, n, k))
    assert {r["model_op"] for r in cov["ops"] if r["name"] == "aten::addmm"} == {"linear"}


def test_price_gemms_exactly_and_views_zero(mlp_capture, synthetic_gemm_model):
    graph, info = mlp_capture
    priced, cov = price_graph(graph, info["shapes"], synthetic_gemm_model, utility_model(), "float32")
    for op in graph.by_name("aten::addmm"):
        _, (m, k), (_, n) = info["shapes"][op.id][:3]
        want = float(synthetic_gemm_model.predict("mm", "float32", m, n, k, 1))
        assert priced.op(op.id).kernels[0].time_us == want
    for op in priced:
        if op.name in FREE or op.name == "aten::linear":  # views; linear's GEMM is its addmm
            assert op.kernels == ()  # 0 µs and nothing launched
    relu = priced.by_name("aten::relu")[0]  # CPU relu runs as clamp_min: priced once, there
    assert relu.kernels == () and priced.op(relu.children[0]).kernels[0].time_us > 0
    assert cov["priced_share"] > 0 and cov["unmapped"] == {}
    assert cov["measured_us"] == pytest.approx(sum(k.time_us for k in graph.kernels()))


def test_price_ignores_measured_times_of_mapped_ops(mlp_capture, synthetic_gemm_model):
    graph, info = mlp_capture
    um = utility_model()
    a, _ = price_graph(graph, info["shapes"], synthetic_gemm_model, um, "float32")
    slower = graph.with_kernel_times(lambda op, k: k.time_us * 10 + 5)
    b, _ = price_graph(slower, info["shapes"], synthetic_gemm_model, um, "float32")
    assert [k.time_us for k in a.kernels()] == [k.time_us for k in b.kernels()]


def test_coverage_reports_unmapped_and_missing(synthetic_gemm_model):
    g = ExecutionGraph([Op(0, "aten::foo", kernels=[Kernel("aten::foo", 30.0)]),
                        Op(1, "aten::view", kernels=[Kernel("aten::view", 5.0)]),
                        Op(2, "aten::copy_", kernels=[Kernel("aten::copy_", 15.0)]),
                        Op(3, "aten::mm", kernels=[Kernel("aten::mm", 50.0)])])
    shapes = {0: [[4, 4]], 1: [[4, 4], None], 2: [[4, 8], [4, 8], None], 3: [[8, 32], [32, 16]]}
    um = utility_model(ops=("relu",))  # no copy calibration
    dropped, cov = price_graph(g, shapes, synthetic_gemm_model, um, "float32")
    assert set(cov["unmapped"]) == {"aten::foo", "aten::copy_"}
    assert cov["unmapped"]["aten::copy_"]["why"].startswith("no calibration")
    assert cov["dropped_us"] == 45.0 and cov["free_us"] == 5.0 and cov["priced_us"] == 50.0
    assert cov["priced_share"] == pytest.approx(0.5)
    assert [k.time_us for k in dropped.kernels()][:2] == [0.0, 0.0] and dropped.op(1).kernels == ()
    kept, cov = price_graph(g, shapes, synthetic_gemm_model, um, "float32", keep_unmapped=True)
    assert [k.time_us for k in kept.kernels()][:2] == [30.0, 15.0] and cov["kept_share"] == pytest.approx(0.45)
    assert kept.op(3).kernels[0].time_us == float(synthetic_gemm_model.predict("mm", "float32", 8, 16, 32))


def test_predict_hf_config_tiny_gpt2(mlp_capture, synthetic_gemm_model):
    from pipeline.workloads.predict_callable import predict_hf_config

    # Host overheads from another workload's trace, never from the predicted one's.
    overheads = OverheadModel.fit(extract_overheads(mlp_capture[1]["trace"]))
    r = predict_hf_config(TINY_GPT2, 1, 8, synthetic_gemm_model, utility_model(), overheads, warmup=1)
    assert r["model_type"] == "gpt2"
    assert r["kernel_only_us"] > 0 and r["e2e_us"] >= r["kernel_only_us"]
    per_op = r["per_op"]
    assert {"id", "name", "status", "model_op", "measured_us", "predicted_us"} <= set(per_op.columns)
    gemm = per_op[per_op["name"] == "aten::addmm"]
    assert len(gemm) == 8 and (gemm["status"] == "priced").all()  # 4 Conv1D per layer
    # the synthetic GEMM model has no bmm table: attention's bmms are reported, not guessed
    assert r["coverage"]["unmapped"]["aten::bmm"]["why"].startswith("no calibration")
    assert 0 < r["coverage"]["priced_share"] <= 1


def test_cli_predicts_a_hugging_face_config_it_has_never_seen(devchar_home, tmp_path, capsys):
    """`devchar predict --hf-config`: capture, price with the device's saved models, print."""
    import json

    import pandas as pd

    from pipeline.cli.main import main as cli_main
    from pipeline.core.config import model_store_root
    from pipeline.predict import store
    from pipeline.predict.gemm import GemmModel
    from pipeline.predict.utility import UtilityModel

    rows = [dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1, m=m, n=n, k=k, waves=w,
                 median_us=(1 + k / 32) * w, held_out=False)
            for op in ("mm", "bmm", "linear") for w, (m, n) in ((1, (8, 16)), (4, (16, 32)))
            for k in (32, 64)]
    util = pd.DataFrame([dict(op=op, dtype="float32", rows=r, cols=c, median_us=1.0 + r * c / 1e3, held_out=False)
                         for op in ("add", "mul", "softmax", "layernorm", "embedding", "copy", "gelu")
                         for r in (1, 64, 512) for c in (64, 256)])
    for name, model in (("gemm_model", GemmModel.fit(pd.DataFrame(rows))), ("utility_model", UtilityModel.fit(util))):
        store.save(model_store_root(), "cpu-test", name, model, {}, "20260101T000000-x")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100,
                               "n_positions": 64}))
    assert cli_main(["predict", "--device", "cpu-test", "--hf-config", str(cfg), "--batch", "2", "--seq", "8"]) == 0
    out = capsys.readouterr().out
    assert "gpt2 from" in out and "predicted" in out and " ms" in out and "per op" not in out
    # --breakdown: where the price parts from the captured run, per op kind, largest first
    assert cli_main(["predict", "--device", "cpu-test", "--hf-config", str(cfg), "--batch", "2", "--seq", "8",
                     "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "per op (traced self time" in out and "aten::addmm" in out and "predicted_over_traced" in out
    assert cli_main(["predict", "--device", "cpu-test", "--breakdown"]) == 2  # a GPT-2 op list has no capture
    assert "--breakdown needs a captured model" in capsys.readouterr().err
    assert cli_main(["predict", "--device", "cpu-test", "--hf-config", str(cfg), "--batch", "2", "--seq", "65"]) == 2
    assert "seq=65" in capsys.readouterr().err


def test_kineto_per_trace_lines_are_silenced_on_a_cpu_unless_the_user_chose(monkeypatch):
    """torch 2.13 prints "USDT:... profiler_start/stop" on stderr for every capture (94 lines in
    one `make run`); on a CPU-only machine the capture raises kineto's level past them."""
    import torch

    from pipeline.workloads.capture import KINETO_QUIET, quiet_kineto_on_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    quiet_kineto_on_cpu()
    assert os.environ["KINETO_LOG_LEVEL"] == KINETO_QUIET
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    quiet_kineto_on_cpu()
    assert os.environ["KINETO_LOG_LEVEL"] == "2"
    monkeypatch.delenv("KINETO_LOG_LEVEL")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUPTI's errors matter there
    quiet_kineto_on_cpu()
    assert "KINETO_LOG_LEVEL" not in os.environ
