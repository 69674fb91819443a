"""Which saved version of a model a prediction uses.

Every fit is saved in the JSON model store (<root>/<device>/<model>/<version>/, the artifact
format) and logged to MLflow, whose model registry holds one registered model per (model,
device), `devchar-<model>-<device>`: each fit is a version of it whose tag `store_version` names
the model-store version it was saved as, and the alias `champion` moves to a version only when
its fit passed its held-out check (resources/tracking.py). `devchar predict` loads exactly the
champion's store version; with no registry entry (no MLflow store here yet, a model store copied
from another machine, fits older than the registry) it falls back to the store's latest passing
version and says so. MLflow is imported only when there is a tracking store to ask.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from pipeline.core.config import mlflow_uri
from pipeline.predict import store

CHAMPION = "champion"
STORE_VERSION_TAG = "store_version"
STORE_PATH_TAG = "store_path"


def registered_name(model_name: str, device: str) -> str:
    return f"devchar-{model_name}-{device}"


def champion_version(model_name: str, device: str, tracking_uri: str = "") -> tuple[str | None, str]:
    """(the model-store version the registry's champion names, or None; why not, when None)."""
    uri = tracking_uri or mlflow_uri()
    name = registered_name(model_name, device)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None, f"no MLflow tracking store at {uri}"  # and asking would create one
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        return None, f"no {name}@{CHAMPION} in the MLflow registry ({exc.error_code})"
    version = mv.tags.get(STORE_VERSION_TAG)
    if not version:
        return None, f"{name}@{CHAMPION} (version {mv.version}) records no {STORE_VERSION_TAG}"
    return version, ""


def load_champion(root: Path, device: str, model_name: str, tracking_uri: str = "",
                  say: Callable[[str], None] | None = None):
    """The model the registry's champion names, exactly that store version; else the store's
    latest passing version, said through `say` (stderr by default)."""
    version, why = champion_version(model_name, device, tracking_uri)
    if version is not None:
        return store.load(root, device, model_name, version)
    latest = store.latest_passing(root, device, model_name)
    (say or _stderr)(f"devchar: note: {why}; using the model store's latest passing {model_name} "
                     f"for {device} ({latest})")
    return store.load(root, device, model_name, latest)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
