"""Prediction-speed bench (analysis/bench.py)."""
import numpy as np
import pytest

from pipeline.analysis.bench import bench_predict


@pytest.fixture
def model(synthetic_gemm_model):
    return synthetic_gemm_model


def test_bench_reports_a_rate_per_predictor(model):
    class Baseline:
        def predict_gemm(self, op, dtype, m, n, k, b):
            return np.asarray(m, float) * n * k

    rates = bench_predict(model, {"toy": Baseline()}, n_vector=20_000, n_loop=200, n_baseline=1000, op="mm")
    assert set(rates) == {"devchar_vectorized", "devchar_loop", "toy"}
    assert all(r > 0 for r in rates.values())
