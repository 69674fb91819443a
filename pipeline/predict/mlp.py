"""A small MLP the baselines share: trained, saved and run as plain numpy.

Training (mlp_train.py) follows scikit-learn's MLPRegressor: relu hidden layers, identity
output, MSE loss. The weights and our input/output standardisation are saved as plain lists,
so a saved model predicts with one chain of matrix products and needs no pickle.

The grid search follows the DLRM paper's Table II (section III-B2): hidden layers, neurons
per layer, optimizer (SGD's learning rate scaled by 10), learning rate; the configuration
with the lowest error on a validation split carved from the *training* rows is kept and
refitted on all training rows.

The searches of one baseline's (op, dtype) groups are independent: search_all runs them in
worker processes, one per core (DEVCHAR_FIT_JOBS overrides). Training these small networks
is Python-bound on one core whatever the BLAS's thread pool, so processes are what use the
rest. Each search seeds its own split and training, so the result does not depend on the count.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from pipeline.core.cores import usable_cores
from pipeline.predict.mlp_train import DivergedError, fit_mlp

# DLRM paper, Table II.
FULL_GRID = {"layers": [3, 4, 5, 6, 7], "neurons": [128, 256, 512, 1024], "solver": ["adam", "sgd"],
             "lr": [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2], "epochs": 200}
# The CPU default: Table II's two smallest depths x two narrow widths x Adam x 2 learning rates,
# 60 epochs: all 28 (op, dtype) groups of a quick CPU sweep fit in ~6-9 s per model on 2 cores.
REDUCED_GRID = {"layers": [3, 4], "neurons": [32, 64], "solver": ["adam"], "lr": [2e-3, 1e-2], "epochs": 60}
# The tiny profile's (a smoke test of the pipeline, whose baselines' errors nobody reads): one
# configuration of the reduced grid, 20 epochs. The search still runs; it just has one candidate.
TINY_GRID = {"layers": [3], "neurons": [32], "solver": ["adam"], "lr": [1e-2], "epochs": 20}
GRIDS = {"full": FULL_GRID, "reduced": REDUCED_GRID, "tiny": TINY_GRID}


@dataclass(frozen=True)
class MLPConfig:
    layers: int
    neurons: int
    solver: str
    lr: float  # as listed in Table II; SGD trains with 10x this
    epochs: int


def configs(grid: str | dict) -> list[MLPConfig]:
    if isinstance(grid, str) and grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; expected one of {sorted(GRIDS)}")
    g = GRIDS[grid] if isinstance(grid, str) else grid
    return [MLPConfig(nl, nn, s, lr, int(g["epochs"]))
            for nl, nn, s, lr in itertools.product(g["layers"], g["neurons"], g["solver"], g["lr"])]


def _standardise(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = a.mean(axis=0), a.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


def train(X: np.ndarray, y: np.ndarray, cfg: MLPConfig, seed: int = 0) -> dict:
    """Fit the MLP of `cfg` on standardised X and y (mlp_train.fit_mlp); returns its params dict.
    Raises ValueError (DivergedError) when the run diverges."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    x_mean, x_std = _standardise(X)
    y_mean, y_std = _standardise(y[:, None])
    with np.errstate(all="ignore"):  # a diverging run overflows on its way to DivergedError
        coefs, intercepts, _ = fit_mlp((X - x_mean) / x_std, (y - y_mean[0]) / y_std[0], (cfg.neurons,) * cfg.layers,
                                       cfg.solver, cfg.lr * (10.0 if cfg.solver == "sgd" else 1.0), cfg.epochs,
                                       batch_size=64, seed=seed)
    return {"x_mean": x_mean.tolist(), "x_std": x_std.tolist(), "y_mean": float(y_mean[0]),
            "y_std": float(y_std[0]), "coefs": [c.tolist() for c in coefs],
            "intercepts": [b.tolist() for b in intercepts],
            "config": {"layers": cfg.layers, "neurons": cfg.neurons, "solver": cfg.solver, "lr": cfg.lr,
                       "epochs": cfg.epochs}}


class Net:
    """The numpy forward pass of exported params: relu hidden layers, identity output."""

    def __init__(self, params: dict):
        self.params = params
        self.x_mean = np.array(params["x_mean"], float)
        self.x_std = np.array(params["x_std"], float)
        self.W = [np.array(w, float) for w in params["coefs"]]
        self.b = [np.array(b, float) for b in params["intercepts"]]

    def raw(self, X: np.ndarray) -> np.ndarray:
        """Network output in standardised units (what training fitted)."""
        h = (np.asarray(X, float) - self.x_mean) / self.x_std
        for W, b in zip(self.W[:-1], self.b[:-1]):
            h = np.maximum(h @ W + b, 0.0)
        return (h @ self.W[-1] + self.b[-1])[..., 0]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.raw(X) * self.params["y_std"] + self.params["y_mean"]


def validation_split(n: int, seed: int = 0, val_frac: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(validation rows, training rows) of n, seeded: the split search() scores on, so another
    model fitted on the same training rows is scored on the same validation rows. Under 5 rows:
    no validation rows."""
    perm = np.random.default_rng(seed).permutation(n)
    n_val = max(1, int(round(val_frac * n))) if n >= 5 else 0
    return perm[:n_val], perm[n_val:]


def search(X: np.ndarray, y: np.ndarray, decode: Callable[[np.ndarray, np.ndarray], np.ndarray],
           t_meas: np.ndarray, grid: str | dict = "reduced", seed: int = 0, val_frac: float = 0.2) -> dict:
    """Grid search: train each configuration on a split of the training rows, score it by the mean
    relative error of the decoded times on the rest, refit the best one on all rows.

    decode(net_output, row_index) -> predicted microseconds for those rows.
    """
    X, y, t_meas = np.asarray(X, float), np.asarray(y, float), np.asarray(t_meas, float)
    n = len(y)
    if n < 2:
        raise ValueError(f"need at least 2 training rows to fit an MLP; got {n}")
    val, tr = validation_split(n, seed, val_frac)
    cands = configs(grid)
    errs = {}  # candidate index -> validation error; one candidate is scored too: its val_rel_err
    if len(val):  # is what a caller compares with another model's
        for i, cfg in enumerate(cands):
            try:
                p = train(X[tr], y[tr], cfg, seed)
            except DivergedError:  # too high a learning rate
                continue
            with np.errstate(all="ignore"):
                err = float(np.mean(np.abs(decode(Net(p)(X[val]), val) - t_meas[val]) / t_meas[val]))
            if np.isfinite(err):
                errs[i] = err
    # the best scored first, then the rest in grid order: on all rows the best may still diverge
    order = sorted(errs, key=errs.get) + [i for i in range(len(cands)) if i not in errs]
    for i in order:
        try:
            params = train(X, y, cands[i], seed)
        except DivergedError:
            continue
        params["val_rel_err"] = errs.get(i)
        return params
    raise DivergedError(f"every configuration of the MLP grid diverged on these {n} training rows")


def fit_jobs() -> int:
    """Worker processes for search_all: DEVCHAR_FIT_JOBS, else the cores this process may run on."""
    raw = os.environ.get("DEVCHAR_FIT_JOBS", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"DEVCHAR_FIT_JOBS must be a whole number >= 1, not {raw!r}")
        return int(raw)
    return usable_cores()


def search_all(tasks: dict[Hashable, tuple], grid: str | dict = "reduced", seed: int = 0) -> dict:
    """search() for each task {key: (X, y, decode, t_meas)}, in fit_jobs() worker processes;
    {key: params} in the tasks' order. One job, or one task: in this process."""
    keys = list(tasks)
    jobs = min(fit_jobs(), len(keys))
    if jobs <= 1:
        return {k: search(*tasks[k], grid=grid, seed=seed) for k in keys}
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    # loky's workers get decode closures by cloudpickle; one numpy/BLAS thread each, so that
    # jobs x threads never exceeds the cores
    try:
        out = Parallel(n_jobs=jobs, backend="loky", inner_max_num_threads=1)(
            delayed(search)(*tasks[k], grid=grid, seed=seed) for k in keys)
    finally:
        # loky keeps idle workers for 300 s, and the process that started them waits for them
        # at exit: dagster's run worker, and with it the code server, outlived `devchar run`
        # by 5 minutes. A later call starts new ones (~0.1 s against a search's seconds).
        get_reusable_executor(reuse=True).shutdown(wait=True)
    return dict(zip(keys, out))
