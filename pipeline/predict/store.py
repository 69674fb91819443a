"""Saved predictors: <root>/<device>/<model>/<version>/model.json (+ meta.json).

Which class reads a model back is pipeline.predict.registry's table, by model name. Models
with tensors (the OpenCL prompt models) also write their weights beside model.json
(model.write_artifacts(dir)) and are read back by `from_dir(dict, dir)`.

Versions sort by time, so `latest` is the last directory name. Written to a temporary
directory first and renamed, so a crash never leaves a half-written model behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.core.errors import MissingModelError
from pipeline.core.slugs import check_slug, under
from pipeline.predict import registry
from pipeline.predict.baselines import BASELINES as BASELINE_CLASSES

BASELINES = tuple(BASELINE_CLASSES)  # the comparison models mlp_baselines fits


def new_version(data_hash: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{data_hash[:8]}"


def save(root: Path, device: str, model_name: str, model: registry.Predictor | registry.ArtifactPredictor, meta: dict,
         version: str) -> Path:
    final = under(root, check_slug(device), model_name, version)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
    try:
        if hasattr(model, "write_artifacts"):  # first: model.json records the artifacts' checksums
            model.write_artifacts(tmp)
        (tmp / "model.json").write_text(json.dumps(model.to_dict()))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def versions(root: Path, device: str, model_name: str) -> list[str]:
    d = under(root, check_slug(device), model_name)
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")) if d.is_dir() else []


def _passed(version_dir: Path) -> bool:
    """A version is usable by default unless its meta says it failed the held-out check."""
    try:
        return json.loads((version_dir / "meta.json").read_text()).get("heldout_check_passed", True) is not False
    except (OSError, ValueError):
        return False


def _found(root: Path, device: str, model_name: str) -> list[str]:
    found = versions(root, device, model_name)
    if not found:
        raise MissingModelError(f"no saved {model_name} for device {device!r} under {root}; run `devchar run` first")
    return found


def latest_passing(root: Path, device: str, model_name: str) -> str:
    """The newest version that did not fail its held-out check (what `latest` loads)."""
    registry.check_name(model_name)
    found = _found(root, device, model_name)
    good = [v for v in found if _passed(Path(root) / device / model_name / v)]
    if not good:
        raise MissingModelError(f"every saved {model_name} for device {device!r} failed its held-out check "
                                f"({found}); re-calibrate on a quieter machine or load one by version")
    return good[-1]


def load(root: Path, device: str, model_name: str,
         version: str = "latest") -> registry.Predictor | registry.ArtifactPredictor:
    registry.check_name(model_name)  # before any file is read: a typo is not a missing calibration
    found = _found(root, device, model_name)
    v = latest_passing(root, device, model_name) if version == "latest" else version
    path = under(root, device, model_name, v, "model.json")
    if not path.is_file():
        raise MissingModelError(f"{model_name} version {v!r} for device {device!r} not found; have {found}")
    try:
        return registry.from_saved(model_name, json.loads(path.read_text()), path.parent)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MissingModelError(f"saved model {path} is corrupt: {exc}") from exc
