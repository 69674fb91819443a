"""Thresholds the asset checks enforce; overridable from the environment for noisy machines."""
from __future__ import annotations

import os


def max_heldout_err() -> float:
    """Median relative error on held-out shapes, per (op, dtype), above which a model is blocked.

    The median, not the mean: a CPU BLAS switches to another code path for tiny shapes
    (a few microseconds), which no per-kernel table sees; those rows dominate a mean but do
    not make the model bad for the shapes a workload runs. The mean is gated separately.
    """
    return float(os.environ.get("DEVCHAR_MAX_HELDOUT_ERR", "0.5"))


def max_heldout_mean_err() -> float:
    """Mean relative error over all held-out shapes of a model above which it is blocked."""
    return float(os.environ.get("DEVCHAR_MAX_HELDOUT_MEAN_ERR", "1.0"))


def max_noisy_share() -> float:
    """Share of rows still noisy (cv > 0.1 after one re-measure) above which a sweep is flagged."""
    return float(os.environ.get("DEVCHAR_MAX_NOISY_SHARE", "0.25"))
