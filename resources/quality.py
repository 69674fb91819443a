"""The thresholds the asset checks enforce (pipeline/analysis/quality.py), as the
`quality_gates` resource: run config, or the DEVCHAR_MAX_* variables (resources/env.py)."""
from __future__ import annotations

from typing import ClassVar

import dagster as dg
from pydantic import field_validator

from pipeline.analysis.quality import Gates
from resources.env import as_text, number

_DEFAULT = Gates()


class QualityGates(dg.ConfigurableResource):
    """Numbers as strings: an EnvVar feeds only str and int fields (resources/env.py)."""

    ENV: ClassVar[dict[str, str]] = {"max_heldout_err": "DEVCHAR_MAX_HELDOUT_ERR",
                                     "max_heldout_mean_err": "DEVCHAR_MAX_HELDOUT_MEAN_ERR",
                                     "max_noisy_share": "DEVCHAR_MAX_NOISY_SHARE",
                                     "max_opencl_val_mape": "DEVCHAR_MAX_OPENCL_VAL_MAPE",
                                     "max_drift_ratio": "DEVCHAR_MAX_DRIFT_RATIO",
                                     "max_drift_moved_share": "DEVCHAR_MAX_DRIFT_MOVED_SHARE"}

    # median held-out relative error of any (op, dtype) above which a model is blocked
    max_heldout_err: str = str(_DEFAULT.max_heldout_err)
    # mean held-out relative error over all of a model's shapes above which it is blocked
    max_heldout_mean_err: str = str(_DEFAULT.max_heldout_mean_err)
    # share of a sweep's rows still noisy after a re-measure above which sweep_noise warns
    max_noisy_share: str = str(_DEFAULT.max_noisy_share)
    # validation MAPE (a fraction) above which an OpenCL model fails validation_mape
    max_opencl_val_mape: str = str(_DEFAULT.max_opencl_val_mape)
    # drift between two calibrations: the median shift of an (op, dtype), and the share of its
    # points moved beyond their own spread, that together flag it (pipeline/analysis/drift.py)
    max_drift_ratio: str = str(_DEFAULT.max_drift_ratio)
    max_drift_moved_share: str = str(_DEFAULT.max_drift_moved_share)

    _numbers = field_validator("*", mode="before")(as_text)

    def gates(self) -> Gates:
        return Gates(**{field: number(self, field) for field in self.ENV})
