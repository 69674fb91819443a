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
