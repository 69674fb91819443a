"""Where devchar keeps its state: one data directory, DEVCHAR_HOME (default ./.devchar).

Only paths are computed here; nothing is created at import time.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def devchar_home() -> Path:
    # Read from the environment, not Dagster configuration: it locates the state directory,
    # DAGSTER_HOME included, before Dagster starts, and every process of a run (Pipes runner
    # subprocesses, `dagster dev` workers) must agree on it. The pipeline's knobs (profile,
    # thresholds, lock wait) are resource configuration instead (resources/env.py).
    return Path(os.environ.get("DEVCHAR_HOME", "./.devchar")).expanduser().resolve()


def duckdb_path() -> Path:
    return devchar_home() / "devchar.duckdb"


def mlflow_uri() -> str:
    return f"sqlite:///{devchar_home() / 'mlflow.db'}"


def mlflow_artifacts() -> Path:
    return devchar_home() / "mlartifacts"


def dagster_home() -> Path:
    return devchar_home() / "dagster"


def model_store_root() -> Path:
    """Models fitted on this machine; committed reference calibrations live in REPO_ROOT/models_store."""
    return devchar_home() / "models_store"


def reference_root() -> Path:
    return REPO_ROOT / "models_store" / "reference"
