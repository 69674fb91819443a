"""Thresholds the asset checks enforce. Values come from the `quality_gates` resource
(resources/quality.py: run config, or DEVCHAR_MAX_* environment variables); the defaults
here are the documented ones."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gates:
    # Median relative error on held-out shapes, per (op, dtype), above which a model is blocked.
    # The median, not the mean: a CPU BLAS switches to another code path for tiny shapes (a few
    # microseconds), which no per-kernel table sees; those rows dominate a mean but do not make
    # the model bad for the shapes a workload runs. The mean is gated separately.
    max_heldout_err: float = 0.5
    # Mean relative error over all held-out shapes of a model above which it is blocked.
    max_heldout_mean_err: float = 1.0
    # Share of rows still noisy (cv > 0.1 after one re-measure) above which a sweep is flagged.
    max_noisy_share: float = 0.25
    # Validation MAPE (a fraction) above which an OpenCL model fails its check; the paper's
    # best is 0.24 on 400K launches, a quick CPU sweep has a few hundred.
    max_opencl_val_mape: float = 1.0
    # Drift between two calibrations of one device (pipeline/analysis/drift.py): an (op, dtype)
    # whose median time moved by more than this fraction, with at least max_drift_moved_share
    # of its points moved beyond their own measured spread, is flagged.
    max_drift_ratio: float = 0.2
    max_drift_moved_share: float = 0.5
