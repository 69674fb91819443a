"""Which kernel runs a GEMM, learned from the sweep: per (op, dtype) a small decision tree
over log-dimensions, fitted on the kernels the sweep saw run (profiler names on CUDA,
oneDNN's verbose trace on the CPU) and saved with the calibration, so prediction needs
neither the device nor its library heuristic. Traversal is vectorized numpy.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.predict.serialize import OP_DTYPE, keyed, records

FEATURES = ("log2_m", "log2_n", "log2_k", "log2_batch", "log2_mn_batch", "log2_mnk_batch")


def features(m, n, k, batch) -> np.ndarray:
    m, n, k, b = (np.log2(np.asarray(x, dtype=float)) for x in (m, n, k, batch))
    m, n, k, b = np.broadcast_arrays(m, n, k, b)
    return np.stack([m, n, k, b, m + n + b, m + n + k + b], axis=-1)


class Tree:
    """A fitted sklearn decision tree reduced to its arrays."""

    def __init__(self, left, right, feature, threshold, leaf_class, classes):
        self.left, self.right = np.asarray(left, np.int64), np.asarray(right, np.int64)
        self.feature, self.threshold = np.asarray(feature, np.int64), np.asarray(threshold, float)
        self.leaf_class, self.classes = np.asarray(leaf_class, np.int64), list(classes)

    @staticmethod
    def fit(X: np.ndarray, labels: np.ndarray, max_depth: int = 8) -> "Tree":
        from sklearn.tree import DecisionTreeClassifier

        clf = DecisionTreeClassifier(max_depth=max_depth, random_state=0).fit(X, labels)
        t = clf.tree_
        return Tree(t.children_left, t.children_right, t.feature, t.threshold, t.value[:, 0, :].argmax(axis=1),
                    clf.classes_)

    def predict_index(self, X: np.ndarray) -> np.ndarray:
        node = np.zeros(len(X), dtype=np.int64)
        while True:
            inner = self.left[node] >= 0
            if not inner.any():
                return self.leaf_class[node]
            idx = np.flatnonzero(inner)
            go_left = X[idx, self.feature[node[idx]]] <= self.threshold[node[idx]]
            node[idx] = np.where(go_left, self.left[node[idx]], self.right[node[idx]])

    def to_dict(self) -> dict:
        return {"left": self.left.tolist(), "right": self.right.tolist(), "feature": self.feature.tolist(),
                "threshold": self.threshold.tolist(), "leaf_class": self.leaf_class.tolist(), "classes": self.classes}

    @staticmethod
    def from_dict(d: dict) -> "Tree":
        return Tree(d["left"], d["right"], d["feature"], d["threshold"], d["leaf_class"], d["classes"])


class KernelSelector:
    def __init__(self, trees: dict[tuple[str, str], Tree]):
        self.trees = trees

    @staticmethod
    def fit(samples) -> "KernelSelector":
        trees = {}
        for (op, dtype), g in samples.groupby(["op", "dtype"]):
            X = features(g["m"], g["n"], g["k"], g["batch"])
            trees[(op, dtype)] = Tree.fit(X, g["kernel"].astype(str).to_numpy())
        return KernelSelector(trees)

    def kernels(self, op: str, dtype: str) -> list[str]:
        return self.trees[(op, dtype)].classes

    def predict_index(self, op: str, dtype: str, m, n, k, batch) -> np.ndarray:
        """Index into kernels(op, dtype) for each shape."""
        tree = self.trees[(op, dtype)]
        if len(tree.classes) == 1:
            return np.zeros(np.broadcast(m, n, k, batch).size, dtype=np.int64)
        return tree.predict_index(features(m, n, k, batch).reshape(-1, len(FEATURES)))

    def predict(self, op: str, dtype: str, m, n, k, batch) -> np.ndarray:
        return np.asarray(self.kernels(op, dtype), dtype=object)[self.predict_index(op, dtype, m, n, k, batch)]

    def to_dict(self) -> dict:
        return {"features": FEATURES,
                "trees": records({key: t.to_dict() for key, t in self.trees.items()}, OP_DTYPE)}

    @classmethod
    def from_dict(cls, d: dict) -> "KernelSelector":
        return cls({key: Tree.from_dict(t) for key, t in keyed(d["trees"], OP_DTYPE).items()})


def selector_labels(samples, choices, tables):
    """The shapes the selector learns from: `choices` limited to kernels that have a table (a
    key of `tables`), and, for an (op, dtype) no usable choice covers, the training rows of every
    grid whose kernel has one. The aspect, twin and batch grids' shapes sit between the
    whole-wave points, where a library switches kernels (ATen hands bf16 GEMMs over
    M*N*K = 4096 to oneDNN; only the twins show where)."""
    def with_table(rows):
        return rows[[(o, d, str(kn)) in tables for o, d, kn in zip(rows["op"], rows["dtype"], rows["kernel"])]]

    samples = with_table(samples)
    if choices is None or not len(choices):
        return samples
    choices = with_table(choices)
    covered = set(zip(choices["op"], choices["dtype"]))
    rest = samples[[(o, d) not in covered for o, d in zip(samples["op"], samples["dtype"])]]
    cols = ["op", "dtype", "m", "n", "k", "batch", "kernel"]
    return pd.concat([choices[cols], rest[cols]], ignore_index=True)


def selection_accuracy(selector: KernelSelector, samples) -> dict[str, float]:
    """Share of shapes for which the selector names the kernel that actually ran, per op/dtype."""
    out = {}
    for (op, dtype), g in samples.groupby(["op", "dtype"]):
        picked = selector.predict(op, dtype, g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(),
                                  g["batch"].to_numpy())
        out[f"{op}_{dtype}"] = float((picked == g["kernel"].astype(str).to_numpy()).mean())
    return out
