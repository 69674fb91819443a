"""gemm_config_model: PM2Lat at the granularity of cuBLASLt configurations (CUDA only).

One GemmModel per (op, layout, bias) problem: a throughput table per configuration (its own
tile and split-K, from gemm_config_samples) and a selector that learned, from
gemm_config_choices, which configuration the device's heuristic picks for a shape. So a
prediction needs neither the device nor cuBLASLt. The CPU has one BLAS path per op and dtype;
gemm_model is its model, and this one is not fitted there.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.errors import MissingModelError
from pipeline.predict.gemm import GemmModel
from pipeline.predict.selector import selection_accuracy


def problem_key(op: str, layout: str, bias: bool = False) -> str:
    """'linear:TN+bias', as the sweep's gemm_config_ops name a problem."""
    return f"{op}:{layout}{'+bias' if bias else ''}"


def _keys(df: pd.DataFrame) -> pd.Series:
    bias = df["bias"].eq(True) if "bias" in df else pd.Series(False, index=df.index)  # None/NaN: no bias
    return pd.Series([problem_key(o, lay, b) for o, lay, b in zip(df["op"], df["layout"], bias)], index=df.index)


class GemmConfigModel:
    name = "gemm_config_model"

    def __init__(self, models: dict[str, GemmModel]):
        self.models = models

    @staticmethod
    def fit(samples: pd.DataFrame, choices: pd.DataFrame | None = None) -> "GemmConfigModel":
        """Training rows of gemm_config_samples, and the heuristic's choices to learn selection from."""
        if not len(samples):
            raise MissingModelError("gemm_config_samples has no training rows to fit")
        skeys = _keys(samples)
        ckeys = _keys(choices) if choices is not None and len(choices) else None
        models = {}
        for key, g in samples.groupby(skeys):
            c = choices[ckeys == key] if ckeys is not None else None
            models[key] = GemmModel.fit(g, c)
        return GemmConfigModel(models)

    def model(self, op: str, layout: str, bias: bool = False) -> GemmModel:
        key = problem_key(op, layout, bias)
        if key not in self.models:
            raise MissingModelError(f"no cuBLASLt configuration calibration for {key!r}; have {sorted(self.models)}")
        return self.models[key]

    def predict(self, op: str, layout: str, dtype: str, m, n, k, batch=1, bias: bool = False,
                kernel: str | None = None) -> np.ndarray:
        return self.model(op, layout, bias).predict(op, dtype, m, n, k, batch, kernel=kernel)

    def evaluate(self, held: pd.DataFrame) -> pd.DataFrame:
        """Held-out rows with `predicted_us` (selector's configuration), `selected` (its name)
        and `selector_agrees` (it names the heuristic's choice, the configuration timed)."""
        parts = []
        for key, g in held.groupby(_keys(held)):
            if key not in self.models:
                continue
            mdl = self.models[key]
            for (op, dtype), h in g.groupby(["op", "dtype"]):
                if (op, dtype) not in mdl.selector.trees:
                    continue
                args = [h[c].to_numpy() for c in ("m", "n", "k", "batch")]
                picked = mdl.selector.predict(op, dtype, *args)
                parts.append(h.assign(problem=key, predicted_us=mdl.predict(op, dtype, *args), selected=picked,
                                      selector_agrees=picked == h["kernel"].astype(str).to_numpy()))
        if not parts:
            return held.iloc[:0].assign(problem=[], predicted_us=[], selected=[], selector_agrees=[])
        return pd.concat(parts, ignore_index=True)

    def selection_accuracy(self, choices: pd.DataFrame) -> dict[str, float]:
        """Share of the heuristic's choices the selector reproduces, per problem and dtype; a
        choice of a configuration that was not swept counts as a miss. Pass choices it was not
        fitted on."""
        out = {}
        for key, g in choices.groupby(_keys(choices)):
            if key in self.models:
                out.update({f"{key}_{k}": v for k, v in selection_accuracy(self.models[key].selector, g).items()})
        return out

    def to_dict(self) -> dict:
        return {"kind": "gemm_config_model", "models": {k: m.to_dict() for k, m in self.models.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "GemmConfigModel":
        return cls({k: GemmModel.from_dict(m) for k, m in d["models"].items()})
