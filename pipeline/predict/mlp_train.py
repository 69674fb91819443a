"""Minibatch training of a small relu MLP in numpy: what the baselines' grid search runs.

It follows scikit-learn's MLPRegressor (which the baselines used before): Glorot-uniform
initial weights, relu hidden layers and an identity output, squared loss with an L2 penalty
of 1e-4, reshuffled minibatches, Adam (beta 0.9 / 0.999) or SGD with Nesterov momentum 0.9,
and a stop once the training loss has not improved by `tol` for over `patience` epochs.

Why not sklearn: its step costs ~1.3 ms in Python on the Zen 3 VM, ~2.5 times this loop's,
so both baselines' reduced-grid searches on the Zen 3 EPYC reference took ~72 s in one process
(~29 s here), in every fit, reference replays included. Here the weights live in one
flat vector: the optimiser's update is a handful of array operations instead of one per layer.
"""
from __future__ import annotations

import numpy as np

ALPHA = 1e-4  # L2 penalty, sklearn's default
BETAS = (0.9, 0.999)
EPS = 1e-8
MOMENTUM = 0.9


def loss_and_grad(W: list[np.ndarray], B: list[np.ndarray], X: np.ndarray, y: np.ndarray,
                  gW: list[np.ndarray], gB: list[np.ndarray]) -> float:
    """sklearn's loss of one minibatch (half the mean squared error, plus the L2 penalty of the
    weights over the batch size); its gradient is written into gW and gB."""
    acts = [X]
    for i in range(len(W)):
        z = acts[-1] @ W[i] + B[i]
        acts.append(np.maximum(z, 0.0) if i < len(W) - 1 else z)
    delta = acts[-1] - y
    k = len(y)
    loss = (0.5 * float(np.vdot(delta, delta)) + 0.5 * ALPHA * sum(float(np.vdot(w, w)) for w in W)) / k
    for i in range(len(W) - 1, -1, -1):
        np.matmul(acts[i].T, delta, out=gW[i])
        gW[i] += ALPHA * W[i]
        gW[i] /= k
        np.add.reduce(delta, axis=0, out=gB[i])  # not .mean(): its Python wrapper was a fifth of a step
        gB[i] /= k
        if i:
            delta = (delta @ W[i].T) * (acts[i] > 0)
    return loss


class DivergedError(ValueError):
    """The loss or the weights stopped being finite (too high a learning rate)."""


def _layout(sizes: list[int]) -> list[tuple[slice, tuple[int, int], slice]]:
    """(weight slice, weight shape, bias slice) per layer within one flat vector."""
    out, at = [], 0
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = slice(at, at + fan_in * fan_out)
        at = w.stop
        out.append((w, (fan_in, fan_out), slice(at, at + fan_out)))
        at += fan_out
    return out


def fit_mlp(X: np.ndarray, y: np.ndarray, hidden: tuple[int, ...], solver: str, lr: float, epochs: int,
            batch_size: int, seed: int = 0, tol: float = 1e-6, patience: int = 15
            ) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """(weights, biases, epochs run) of a relu MLP fitted to y (n,) from X (n, d), both
    already standardised. Raises DivergedError when training blows up."""
    if solver not in ("adam", "sgd"):
        raise ValueError(f"unknown solver {solver!r}; expected 'adam' or 'sgd'")
    X, y = np.asarray(X, float), np.asarray(y, float).reshape(-1, 1)
    n = len(y)
    rng = np.random.default_rng(seed)
    layers = _layout([X.shape[1], *hidden, 1])
    theta = np.zeros(layers[-1][2].stop)
    for w, shape, _ in layers:  # Glorot uniform, biases too (as sklearn)
        bound = np.sqrt(6.0 / sum(shape))
        theta[w.start:w.stop + shape[1]] = rng.uniform(-bound, bound, w.stop - w.start + shape[1])
    W = [theta[w].reshape(shape) for w, shape, _ in layers]
    B = [theta[b] for _, _, b in layers]
    grad = np.zeros_like(theta)
    gW = [grad[w].reshape(shape) for w, shape, _ in layers]
    gB = [grad[b] for _, _, b in layers]
    m1, m2 = np.zeros_like(theta), np.zeros_like(theta)
    best, stale, t, epoch = np.inf, 0, 0, 0
    bs = max(1, min(batch_size, n))
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            total += len(idx) * loss_and_grad(W, B, X[idx], y[idx], gW, gB)
            t += 1
            if solver == "adam":
                m1 *= BETAS[0]
                m1 += (1 - BETAS[0]) * grad
                m2 *= BETAS[1]
                m2 += (1 - BETAS[1]) * grad * grad
                step = lr * np.sqrt(1 - BETAS[1] ** t) / (1 - BETAS[0] ** t)
                theta -= step * m1 / (np.sqrt(m2) + EPS)
            else:  # Nesterov momentum, sklearn's form
                m1 *= MOMENTUM
                m1 -= lr * grad
                theta += MOMENTUM * m1 - lr * grad
        loss = total / n
        if not (np.isfinite(loss) and np.isfinite(theta).all()):
            raise DivergedError(f"training diverged at epoch {epoch} (solver {solver}, lr {lr})")
        stale = stale + 1 if loss > best - tol else 0
        best = min(best, loss)
        if stale > patience:  # as sklearn: more than `patience` epochs
            break
    return [w.copy() for w in W], [b.copy() for b in B], epoch
