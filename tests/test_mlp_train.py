"""The baselines' numpy MLP training: its gradient, its optimisers, its failures."""
import warnings

import numpy as np
import pytest

from pipeline.predict.mlp_train import DivergedError, _layout, fit_mlp, loss_and_grad


def _views(theta, layers):
    return [theta[w].reshape(s) for w, s, _ in layers], [theta[b] for *_, b in layers]


def test_the_gradient_is_the_loss_slope():
    rng = np.random.default_rng(0)
    layers = _layout([3, 5, 4, 1])
    theta = rng.normal(size=layers[-1][2].stop)
    X, y = rng.normal(size=(7, 3)), rng.normal(size=(7, 1))
    grad = np.zeros_like(theta)
    loss_and_grad(*_views(theta, layers), X, y, *_views(grad, layers))
    scratch = np.zeros_like(theta)
    for i in range(theta.size):  # central differences, one weight or bias at a time
        hi, lo = theta.copy(), theta.copy()
        hi[i] += 1e-6
        lo[i] -= 1e-6
        slope = (loss_and_grad(*_views(hi, layers), X, y, *_views(scratch, layers))
                 - loss_and_grad(*_views(lo, layers), X, y, *_views(scratch, layers))) / 2e-6
        assert slope == pytest.approx(grad[i], rel=1e-4, abs=1e-7), i


@pytest.mark.parametrize("solver,lr", [("adam", 1e-2), ("sgd", 1e-2)])
def test_both_optimisers_fit_a_smooth_function_as_well_as_sklearn(solver, lr):
    """On the same rows and settings, the training loss ends within 2x of sklearn's
    MLPRegressor (whose semantics the trainer follows) and far below a constant's."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 3))
    y = np.sin(X @ [1.0, -0.5, 0.3]) + 0.5 * X[:, 0] ** 2
    y = (y - y.mean()) / y.std()
    W, B, _ = fit_mlp(X, y, (32, 32), solver, lr, epochs=80, batch_size=64, seed=0)
    h = X
    for i, (w, b) in enumerate(zip(W, B)):
        h = h @ w + b if i == len(W) - 1 else np.maximum(h @ w + b, 0.0)
    ours = float(np.mean((h[:, 0] - y) ** 2))
    ref = MLPRegressor(hidden_layer_sizes=(32, 32), solver=solver, learning_rate_init=lr, max_iter=80, batch_size=64, random_state=0,
                       tol=1e-6, n_iter_no_change=15)
    with warnings.catch_warnings():  # sklearn's "max_iter reached" whichever way either run ends
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref.fit(X, y)
    theirs = float(np.mean((ref.predict(X) - y) ** 2))
    assert ours < 0.1 and ours < 2 * theirs, (ours, theirs)


def test_a_diverging_run_raises_instead_of_returning_weights():
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(50, 2)) * 100, rng.normal(size=50) * 100
    with np.errstate(all="ignore"), pytest.raises(DivergedError, match="diverged"):
        fit_mlp(X, y, (16,), "sgd", 10.0, epochs=30, batch_size=16)


@pytest.mark.parametrize("patience", [3, 5])
def test_training_stops_once_the_loss_has_not_improved_for_over_patience_epochs(patience):
    """sklearn's rule: an epoch not tol better than the best counts; more than `patience` in a row
    stop. With an unreachable tol every epoch after the first counts: patience + 2 epochs."""
    rng = np.random.default_rng(4)
    _, _, epochs = fit_mlp(rng.normal(size=(40, 2)), rng.normal(size=40), (8,), "adam", 1e-3, epochs=500,
                           batch_size=64, tol=1e9, patience=patience)
    assert epochs == patience + 2


def test_an_unknown_solver_is_named():
    with pytest.raises(ValueError, match="'lbfgs'"):
        fit_mlp(np.ones((4, 1)), np.ones(4), (4,), "lbfgs", 1e-3, epochs=1, batch_size=4)


def test_the_search_refits_the_next_best_configuration_when_the_best_diverges_on_all_rows(monkeypatch):
    from pipeline.predict import mlp

    real, calls = mlp.train, []

    def train(X, y, cfg, seed=0):  # the best-scoring lr diverges only on all rows
        calls.append((len(y), cfg.lr))
        if cfg.lr == 1e-2 and len(y) == 60:
            raise DivergedError("diverged")
        return real(X, y, cfg, seed)

    monkeypatch.setattr(mlp, "train", train)
    rng = np.random.default_rng(5)
    X = rng.uniform(1, 10, size=(60, 2))
    t = X[:, 0] * X[:, 1]
    grid = {"layers": [2], "neurons": [8], "solver": ["adam"], "lr": [1e-4, 1e-2], "epochs": 40}
    params = mlp.search(X, np.log(t), lambda z, idx: np.exp(z), t, grid=grid)
    assert calls[-1] == (60, 1e-4) and (60, 1e-2) in calls  # the refit fell back
    assert params["config"]["lr"] == 1e-4 and params["val_rel_err"] is not None
    monkeypatch.setattr(mlp, "train", lambda *a, **k: (_ for _ in ()).throw(DivergedError("diverged")))
    with pytest.raises(DivergedError, match="every configuration of the MLP grid diverged on these 60"):
        mlp.search(X, np.log(t), lambda z, idx: np.exp(z), t, grid=grid)
