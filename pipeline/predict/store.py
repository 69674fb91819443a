"""Saved predictors: <root>/<device>/<model>/<version>/model.json (+ meta.json).

Models with tensors (the OpenCL prompt models) also write their weights beside model.json
(model.write_artifacts(dir)) and are loaded by a `from_dir(dict, dir)` named in DIR_LOADERS
as "module:Class": imported only when such a model is loaded, so this module imports no torch.

Versions sort by time, so `latest` is the last directory name. Written to a temporary
directory first and renamed, so a crash never leaves a half-written model behind.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.core.errors import MissingModelError
from pipeline.core.slugs import check_slug, under
from pipeline.predict.attention import AttentionModel
from pipeline.predict.baselines import BASELINES as BASELINE_CLASSES
from pipeline.predict.embedding import EmbeddingModel
from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_configs import GemmConfigModel
from pipeline.predict.memory import MemoryModel
from pipeline.predict.overheads import OverheadModel
from pipeline.predict.utility import UtilityModel

LOADERS = {"gemm_model": GemmModel.from_dict, "gemm_config_model": GemmConfigModel.from_dict, "utility_model": UtilityModel.from_dict,
           "attention_model": AttentionModel.from_dict, "embedding_model": EmbeddingModel.from_dict,
           "memory_model": MemoryModel.from_dict, "overhead_model": OverheadModel.from_dict,
           **{name: cls.from_dict for name, cls in BASELINE_CLASSES.items()}}
BASELINES = tuple(BASELINE_CLASSES)  # the comparison models mlp_baselines fits
DIR_LOADERS = {"opencl_lm": "pipeline.opencl.models.lm:LMModel",
               "opencl_scratch": "pipeline.opencl.models.scratch:ScratchModel",
               "opencl_features": "pipeline.opencl.models.trees:TreesModel"}


def new_version(data_hash: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{data_hash[:8]}"


def save(root: Path, device: str, model_name: str, model, meta: dict, version: str) -> Path:
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


def _dir_loader(model_name: str):
    module, cls = DIR_LOADERS[model_name].split(":")
    return getattr(importlib.import_module(module), cls)


def load(root: Path, device: str, model_name: str, version: str = "latest"):
    if model_name not in LOADERS and model_name not in DIR_LOADERS:
        raise MissingModelError(f"unknown model {model_name!r}; expected one of {sorted([*LOADERS, *DIR_LOADERS])}")
    found = versions(root, device, model_name)
    if not found:
        raise MissingModelError(f"no saved {model_name} for device {device!r} under {root}; run `devchar run` first")
    if version == "latest":
        good = [v for v in found if _passed(Path(root) / device / model_name / v)]
        if not good:
            raise MissingModelError(f"every saved {model_name} for device {device!r} failed its held-out check "
                                    f"({found}); re-calibrate on a quieter machine or load one by version")
        version = good[-1]
    v = version
    path = under(root, device, model_name, v, "model.json")
    if not path.is_file():
        raise MissingModelError(f"{model_name} version {v!r} for device {device!r} not found; have {found}")
    try:
        if model_name in DIR_LOADERS:
            cls = _dir_loader(model_name)
            d = json.loads(path.read_text())
            return cls.from_dir(d, path.parent) if hasattr(cls, "from_dir") else cls.from_dict(d)
        return LOADERS[model_name](json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MissingModelError(f"saved model {path} is corrupt: {exc}") from exc
