"""Thresholds the asset checks enforce; overridable from the environment for noisy machines."""
from __future__ import annotations

import os


def max_heldout_err() -> float:
    """Mean relative error on held-out shapes above which a model blocks the predictions downstream."""
    return float(os.environ.get("DEVCHAR_MAX_HELDOUT_ERR", "0.5"))


def max_noisy_share() -> float:
    """Share of rows still noisy (cv > 0.1 after one re-measure) above which a sweep is flagged."""
    return float(os.environ.get("DEVCHAR_MAX_NOISY_SHARE", "0.25"))
