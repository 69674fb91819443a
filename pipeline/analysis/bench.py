"""Prediction speed (PM2Lat IV-D2: 0.045 ms per prediction; NeuSight 6.5 ms): predictions per
second of devchar's vectorized GEMM predictor, of a one-call-per-shape loop, and of baselines.

Everything runs on one CPU core (BLAS thread pools limited to 1), on shapes drawn from
PM2Lat's Linear range (M, N <= 8192, K <= 2000).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np


def random_shapes(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 8193, n), rng.integers(1, 8193, n), rng.integers(1, 2001, n), np.ones(n, np.int64)


def rate(fn: Callable[[], object], n: int, min_s: float = 0.5) -> float:
    """Predictions per second: best of repeated runs lasting at least min_s in total (after one warm-up)."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_s:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return n / best


# Shapes per measurement in model_evaluation's speed metadata, by sweep profile: a rate is per
# prediction, so the tiny profile's tests (two runs in the fast tier) need not price 2M shapes.
EVALUATION_SIZES = {"tiny": dict(n_vector=100_000, n_loop=1_000, n_baseline=10_000)}
# The loop's rate is per call (~1.6 ms each on the Zen 3 VM): 1000 calls give it as well as the
# 5000 did, which made ~8 s of every model_evaluation, reference replays included.
DEFAULT_EVALUATION_SIZES = dict(n_vector=2_000_000, n_loop=1_000, n_baseline=200_000)


def evaluation_sizes(profile: str) -> dict[str, int]:
    return EVALUATION_SIZES.get(profile, DEFAULT_EVALUATION_SIZES)


def bench_predict(gemm, baselines: dict, n_vector: int = 10_000_000, n_loop: int = 20_000, n_baseline: int = 1_000_000,
                  op: str = "linear", dtype: str = "float32") -> dict[str, float]:
    from threadpoolctl import threadpool_limits

    m, n, k, b = random_shapes(n_vector)
    results = {}
    with threadpool_limits(1):
        results["devchar_vectorized"] = rate(lambda: gemm.predict(op, dtype, m, n, k, b), n_vector)
        shapes = [(int(m[i]), int(n[i]), int(k[i])) for i in range(n_loop)]
        results["devchar_loop"] = rate(lambda: [gemm.predict(op, dtype, *s) for s in shapes], n_loop)
        for name, model in baselines.items():
            sl = slice(0, n_baseline)
            results[name] = rate(lambda: model.predict_gemm(op, dtype, m[sl], n[sl], k[sl], b[sl]), n_baseline)
    return results
