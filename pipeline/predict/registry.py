"""The predictors devchar saves, by the name each is saved under, and what saving asks of them.

A saved model is <store>/<device>/<name>/<version>/model.json (pipeline.predict.store): the
model's to_dict() wrote it, and the class registered under <name> reads it back.

Fitting and predicting are not in the interface, because they have no common shape: each
predictor is fitted from its own sample tables (GEMM sweeps, embedding bags, profiler traces,
OpenCL launches) and asked about its own kind of shape (a GEMM's m, n, k; a bag's B, E, T,
L, D), and the baselines and the overhead model have no `predict` at all (predict_gemm /
predict_utility; lookup). What every saved predictor shares is its name and its JSON.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from pipeline.core.errors import MissingModelError
from pipeline.predict.attention import AttentionModel
from pipeline.predict.baselines import BASELINES
from pipeline.predict.embedding import EmbeddingModel
from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_configs import GemmConfigModel
from pipeline.predict.memory import MemoryModel
from pipeline.predict.overheads import OverheadModel
from pipeline.predict.utility import UtilityModel


@runtime_checkable
class Predictor(Protocol):
    """A model saved as model.json alone."""

    name: ClassVar[str]  # the directory it is saved under

    def to_dict(self) -> dict: ...

    @classmethod
    def from_dict(cls, d: dict) -> Predictor: ...


@runtime_checkable
class ArtifactPredictor(Protocol):
    """A model saved as model.json plus files beside it (the OpenCL prompt models' weights)."""

    name: ClassVar[str]

    def to_dict(self) -> dict: ...

    def write_artifacts(self, directory: Path) -> None:
        """Called before to_dict, so model.json can record the files' checksums."""

    @classmethod
    def from_dir(cls, d: dict, directory: Path) -> ArtifactPredictor: ...


PREDICTORS: dict[str, type[Predictor]] = {
    cls.name: cls for cls in (GemmModel, GemmConfigModel, UtilityModel, AttentionModel, EmbeddingModel,
                              MemoryModel, OverheadModel, *BASELINES.values())}

# The OpenCL models live in pipeline.opencl, a layer above this one, and two of them need
# torch: named as "module:Class" and imported only when one is loaded, so that importing
# pipeline.predict imports neither (lint-imports checks both).
BY_PATH: dict[str, str] = {"opencl_lm": "pipeline.opencl.models.lm:LMModel",
                           "opencl_scratch": "pipeline.opencl.models.scratch:ScratchModel",
                           "opencl_features": "pipeline.opencl.models.trees:TreesModel"}

NAMES = (*PREDICTORS, *BY_PATH)


def check_name(name: str) -> str:
    if name not in PREDICTORS and name not in BY_PATH:
        raise MissingModelError(f"unknown model {name!r}; expected one of {sorted(NAMES)}")
    return name


def predictor_class(name: str) -> type:
    """The class saved under `name`; the module of one named by path is imported here."""
    if check_name(name) in PREDICTORS:
        return PREDICTORS[name]
    module, cls = BY_PATH[name].split(":")
    return getattr(importlib.import_module(module), cls)


def from_saved(name: str, d: dict, directory: Path) -> Predictor | ArtifactPredictor:
    """The model saved under `name` whose model.json held `d`, in `directory`."""
    cls = predictor_class(name)
    return cls.from_dir(d, directory) if hasattr(cls, "from_dir") else cls.from_dict(d)
