"""Helpers every `devchar` command shares: the state directories, the warehouse, the device slug."""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.config import dagster_home, devchar_home


def prepare_home() -> None:
    """DAGSTER_HOME lives inside DEVCHAR_HOME; its dagster.yaml turns telemetry off (no network here)."""
    os.environ.setdefault("DEVCHAR_HOME", str(devchar_home()))
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text("# written by devchar; local storage under this directory\n"
                                           "telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)


def warehouse():
    """The warehouse as the code location configures it (DEVCHAR_LOCK_WAIT_S read now)."""
    from resources.env import resolved
    from resources.warehouse import DuckDBWarehouse

    return resolved(DuckDBWarehouse)


def peer_dir() -> Path:
    """`devchar reference`'s peer files: $DEVCHAR_REFERENCE_DIR, else ../shared/reference. Read
    here, at the entry point: a folder on this machine, not configuration of a Dagster run."""
    from pipeline.analysis.reference import PEER_DIR

    return Path(os.environ.get("DEVCHAR_REFERENCE_DIR", PEER_DIR))


def local_slug(device: str | None) -> str:
    from pipeline.device.discover import identify

    return device or identify("auto").slug
