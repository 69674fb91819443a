"""Where devchar keeps its state: one data directory, DEVCHAR_HOME (default ./.devchar).

Only paths are computed here; nothing is created at import time.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def devchar_home() -> Path:
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


def profile_name() -> str:
    return os.environ.get("DEVCHAR_PROFILE", "quick")


def lock_wait_seconds() -> float:
    """How long a warehouse connection waits for another process's lock (DEVCHAR_LOCK_WAIT_S, default 60)."""
    return float(os.environ.get("DEVCHAR_LOCK_WAIT_S", "60"))
