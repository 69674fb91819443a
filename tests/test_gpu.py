"""CUDA code paths: run wherever a GPU is at hand (skipped elsewhere by conftest)."""
import pandas as pd
import pytest

from pipeline import runner


@pytest.mark.gpu
def test_tiny_sweeps_on_cuda(tmp_path):
    assert runner.main(["device", "gemm", "utility", "--device", "cuda", "--profile", "tiny", "--out",
                        str(tmp_path)]) == 0
    dev = pd.read_parquet(tmp_path / "devices.parquet")
    assert dev["kind"].iloc[0] == "cuda" and dev["sm_count"].iloc[0] > 0
    gemm = pd.read_parquet(tmp_path / "gemm_samples.parquet")
    assert set(gemm["dtype"]) == {"float32", "tf32", "bfloat16", "float16"}
    assert not gemm["kernel"].str.startswith("cpu-").any()  # the profiler's kernel names
    assert (gemm["median_us"] > 0).all()


@pytest.mark.gpu
def test_capture_on_cuda_attributes_kernels_and_extracts_t1_to_t5():
    import torch

    from pipeline.predict.critical_path import critical_path
    from pipeline.predict.overheads import OverheadModel
    from pipeline.workloads.capture import capture
    from pipeline.workloads.host_time import gpu_overheads

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda().eval()
    x = torch.randn(32, 256, device="cuda")
    with torch.inference_mode():
        graph, info = capture(lambda: model(x), warmup=2)
    kernels = graph.kernels()
    assert kernels and all(k.launch.startswith("cuda") for k in kernels)
    assert any(op.name in ("aten::addmm", "aten::mm") and op.kernels for op in graph)
    rows = gpu_overheads(info)
    assert {"T1", "T2", "T3", "T4"} <= set(rows["type"])
    e2e = critical_path(graph, OverheadModel.fit(rows))
    assert e2e.e2e_us >= e2e.active_us > 0


@pytest.mark.gpu
def test_traces_and_reference_sweeps_on_cuda(tmp_path):
    assert runner.main(["traces", "reference", "--device", "cuda", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    ovh = pd.read_parquet(tmp_path / "overhead_samples.parquet")
    assert {"T2", "T4"} <= set(ovh["type"])  # launches exist on a GPU
    ref = pd.read_parquet(tmp_path / "reference_timings.parquet")
    assert (ref["median_us"] > 0).all()
