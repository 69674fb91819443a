"""Least squares the latency models share."""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls


def nnls_relative(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative c minimising sum(((X c - y) / y)^2), and the RMS relative error it leaves.

    Relative, because a latency model is judged by relative error across sizes spanning
    decades; columns are normalised first since they span 1 ... 1e9 (a constant, bytes, flops).
    """
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    c, _ = nnls((X / scale) / y[:, None], np.ones_like(y))
    c = c / scale
    return c, float(np.sqrt(np.mean(((X @ c) - y) ** 2 / y**2)))
