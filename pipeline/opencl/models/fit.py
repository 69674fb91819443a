"""Fit and score the three OpenCL models on one device's launches: the engine behind the
opencl_models asset (which adds the model store, MLflow and model_errors)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.opencl.models.evaluate import error_rows, ok_launches, split, summary
from pipeline.opencl.models.figures import time_over_input_size
from pipeline.opencl.models.settings import sizes_for

MODELS = ("opencl_lm", "opencl_scratch", "opencl_features")


@dataclass
class Fitted:
    name: str
    model: object
    fit_s: float
    errors: pd.DataFrame  # table_ii rows: validation + one per benchmark kernel
    summary: dict
    params: dict = field(default_factory=dict)


def _fit_one(name: str, train: pd.DataFrame, profile: str, device: str, seed: int, log):
    s = sizes_for(profile, device)
    if name == "opencl_features":
        from pipeline.opencl.models.trees import TreesModel

        return TreesModel.fit(train, max_iter=s.trees_max_iter, seed=seed), {"max_iter": s.trees_max_iter}
    if name == "opencl_lm":
        from pipeline.opencl.models.lm import LMModel

        return LMModel.fit(train, s.lm, device=device, seed=seed, log=log), dict(s.lm.__dict__)
    from pipeline.opencl.models.scratch import ScratchModel

    return ScratchModel.fit(train, s.scratch, device=device, seed=seed, log=log), dict(s.scratch.__dict__)


def fit_all(launches: pd.DataFrame, profile: str = "quick", device: str = "cpu", seed: int = 0,
            models: tuple[str, ...] = MODELS, log=print) -> tuple[dict[str, Fitted], bytes, dict]:
    """Split (kernel-disjoint), fit each model on the training launches, score it on validation
    and benchmark launches. Returns the fitted models, the Fig. 2 PNG and the split's sizes."""
    train, val, bench = split(ok_launches(launches), seed=seed)
    log(f"opencl models: {len(train)} train / {len(val)} validation launches "
        f"({val['kernel_id'].nunique()} kernels) / {len(bench)} benchmark launches")
    out, bench_pred = {}, bench.copy()
    for name in models:
        t0 = time.perf_counter()
        model, params = _fit_one(name, train, profile, device, seed, log)
        fit_s = time.perf_counter() - t0
        v = val.assign(predicted_us=model.predict(val)) if len(val) else val.assign(predicted_us=np.nan)
        b = bench.assign(predicted_us=model.predict(bench)) if len(bench) else bench.assign(predicted_us=np.nan)
        bench_pred[f"predicted_us_{name}"] = b["predicted_us"]
        errors = error_rows(name, v, b)
        out[name] = Fitted(name, model, fit_s, errors, summary(errors), {**params, "profile": profile})
        log(f"{name}: fit {fit_s:.1f} s, {out[name].summary}")
    png = time_over_input_size(bench_pred) if len(bench) else b""
    return out, png, {"train": len(train), "validation": len(val), "benchmark": len(bench),
                      "train_kernels": int(train["kernel_id"].nunique()),
                      "val_kernels": int(val["kernel_id"].nunique())}
