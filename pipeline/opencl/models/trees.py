"""opencl_features: gradient-boosted trees on the static features, target log2(time in us).

Trained with scikit-learn's HistGradientBoostingRegressor; its trees are exported to plain
lists (split feature, threshold, NaN direction, children, leaf value), so a saved model is
JSON and predicts with numpy alone -- no pickle, no sklearn at predict time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.errors import MissingModelError
from pipeline.opencl.models.features import FEATURES, feature_matrix

NODE_FIELDS = ("feature_idx", "num_threshold", "missing_go_to_left", "left", "right", "is_leaf", "value")


class TreesModel:
    name = "opencl_features"

    def __init__(self, baseline: float, trees: list[dict], features: tuple[str, ...] = FEATURES,
                 config: dict | None = None):
        if tuple(features) != FEATURES:
            raise MissingModelError(f"saved {self.name} uses features {list(features)[:3]}...; this version "
                                    f"computes {list(FEATURES)[:3]}...: refit it")
        self.baseline, self.trees, self.config = float(baseline), trees, config or {}
        self._arrays = [{k: np.asarray(t[k]) for k in NODE_FIELDS} for t in trees]

    @classmethod
    def fit(cls, rows: pd.DataFrame, max_iter: int = 200, seed: int = 0) -> "TreesModel":
        from sklearn.ensemble import HistGradientBoostingRegressor

        X, y = feature_matrix(rows), np.log2(rows["median_us"].to_numpy(float))
        # Few launches (tests, a first sweep): smaller leaves, or the trees never split.
        leaf = int(max(2, min(20, len(y) // 10)))
        reg = HistGradientBoostingRegressor(max_iter=max_iter, learning_rate=0.1, min_samples_leaf=leaf,
                                            l2_regularization=1.0, random_state=seed).fit(X, y)
        trees = [{k: p.nodes[k].tolist() for k in NODE_FIELDS} for (p,) in reg._predictors]
        return cls(float(np.ravel(reg._baseline_prediction)[0]), trees, FEATURES,
                   {"max_iter": max_iter, "min_samples_leaf": leaf, "n_trees": len(trees)})

    def predict_log2(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, float)
        out = np.full(len(X), self.baseline)
        rows = np.arange(len(X))
        for t in self._arrays:
            node = np.zeros(len(X), dtype=int)
            while not t["is_leaf"][node].all():  # every sample steps down one level per pass
                x = X[rows, t["feature_idx"][node]]
                left = np.where(np.isnan(x), t["missing_go_to_left"][node].astype(bool), x <= t["num_threshold"][node])
                step = np.where(left, t["left"][node], t["right"][node])
                node = np.where(t["is_leaf"][node].astype(bool), node, step)
            out += t["value"][node]
        return out

    def predict(self, rows: pd.DataFrame) -> np.ndarray:
        """Predicted microseconds per launch."""
        return np.exp2(self.predict_log2(feature_matrix(rows)))

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "trees": self.trees, "features": list(FEATURES), "config": self.config}

    @classmethod
    def from_dict(cls, d: dict) -> "TreesModel":
        return cls(d["baseline"], d["trees"], tuple(d["features"]), d.get("config"))
