"""Where fitted predictors are saved, per device and version (see pipeline/predict/store.py)."""
from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipeline.core.config import model_store_root
from pipeline.predict import store


class ModelStore(dg.ConfigurableResource):
    root: str = ""  # empty: $DEVCHAR_HOME/models_store

    def root_path(self) -> Path:
        return Path(self.root) if self.root else model_store_root()

    def save(self, device: str, model_name: str, model, meta: dict, version: str) -> Path:
        return store.save(self.root_path(), device, model_name, model, meta, version)

    def load(self, device: str, model_name: str, version: str = "latest"):
        return store.load(self.root_path(), device, model_name, version)
