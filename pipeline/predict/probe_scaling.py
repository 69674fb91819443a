"""Training rows put on one machine state by the spell probe, as strongly as cross-validation says.

Every CPU sample row carries `probe_us`: a 128^3 mm timed just before and after it
(harness/spells.py). A row timed while the machine ran slow tends to read a slow probe too, so
scaling each training row's times by (the training rows' median probe / the row's own) ** beta
takes some of the machine's drift out of the tables. How much of the probe's spread is the
machine's, and how much the probe's own noise, differs between machines and between takes
(docs/methods.md, "What the probe cannot do": scaling with beta = 1 helped a noisy take and hurt
quiet ones). So beta is not a constant: each fit chooses it from BETAS by k-fold
cross-validation over its training rows alone (the held-out rows stay unseen), each validation
row scored as measured, as the held-out rows are. beta = 0 is the fit as it was.

Pure pandas/numpy: the fit and predict functions are passed in (assets/factories.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from pipeline.core.errors import DevcharError
from pipeline.predict.metrics import rel_err

BETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
FOLDS = 5
# what the fits read in microseconds (fault_us_per_page: per page, subtracted per fault;
# backward_call_us: the embedding backward's call overhead, subtracted from its rows)
TIMES = ("median_us", "p20_us", "p80_us", "kept_us", "held_us", "cold_us", "fault_us_per_page", "backward_call_us")
# fewer probed training rows than this per fold and the choice is not attempted
MIN_ROWS_PER_FOLD = 10
# folds are dealt within each group a model fits apart, so each group trains in every fold
GROUPS = ("op", "backend", "dtype")
# a fixed row order first: a warehouse query and a parquet file of the same rows get the same folds
ORDER = GROUPS + ("grid", "batch", "m", "n", "k", "rows", "cols", "heads", "seq_q", "seq_kv", "head_dim",
                  "causal", "median_us")


@dataclass(frozen=True)
class ProbeChoice:
    """The beta a fit used and why: the validation error of every candidate, or the reason
    none was chosen (no probe readings: GPU rows, calibrations taken before the probe)."""
    beta: float
    reference_us: float | None = None  # the median probe reading the rows were scaled to
    cv_mean_rel_err: dict[float, float] = field(default_factory=dict)
    reason: str = ""
    scored_rows: str = ""  # "N of M" where validation scored a subset of the training rows

    @property
    def how(self) -> str:
        """'cross-validation' where the candidates were scored, else why none was."""
        return "cross-validation" if self.cv_mean_rel_err else self.reason

    def summary(self) -> str:
        if not self.cv_mean_rel_err:
            return f"beta {self.beta:g}, not scaled ({self.reason})"
        cv = ", ".join(f"{b:g}: {100 * e:.1f} %" for b, e in self.cv_mean_rel_err.items())
        scaled_to = (f"scaled to a probe of {self.reference_us:.1f} us" if self.beta else "not scaled")
        rows = f"{self.scored_rows} training rows" if self.scored_rows else "the training rows"
        return (f"beta {self.beta:g} by {FOLDS}-fold cross-validation on {rows} "
                f"(mean |error| {cv}); {scaled_to}")


def probe_factor(rows: pd.DataFrame, beta: float, reference_us: float | None = None) -> np.ndarray:
    """(reference / the row's probe reading) ** beta per row; 1 for a row without a reading.
    The reference defaults to the rows' own median reading."""
    ok = probed(rows)
    if beta == 0 or not ok.any():
        return np.ones(len(rows))
    p = rows["probe_us"].to_numpy(float)
    ref = float(np.median(p[ok])) if reference_us is None else reference_us
    return np.where(ok, (ref / np.where(ok, p, 1.0)) ** beta, 1.0)


def scaled(rows: pd.DataFrame, beta: float, reference_us: float | None = None) -> pd.DataFrame:
    """The rows with their times (TIMES, those present) multiplied by probe_factor."""
    f = probe_factor(rows, beta, reference_us)
    return rows.assign(**{c: rows[c].to_numpy(float) * f for c in TIMES if c in rows})


def probed(rows: pd.DataFrame) -> np.ndarray:
    """Which rows have a probe reading (finite, > 0)."""
    p = rows["probe_us"].to_numpy(float) if "probe_us" in rows else np.full(len(rows), np.nan)
    return np.isfinite(p) & (p > 0)


def fold_of(rows: pd.DataFrame, folds: int = FOLDS, seed: int = 0) -> np.ndarray:
    """Each row's fold (by position): the rows in ORDER, then dealt in a seeded shuffle within
    each group (GROUPS), so a group of `folds` rows or more has rows on both sides of every split."""
    frame = rows.reset_index(drop=True)
    keys = [c for c in ORDER if c in frame]
    pos = frame.sort_values(keys, kind="stable").index.to_numpy() if keys else np.arange(len(frame))
    cols = [c for c in GROUPS if c in frame]
    label = (frame.loc[pos, cols].astype(str).agg("|".join, axis=1).to_numpy() if cols
             else np.zeros(len(pos), dtype=str))
    rng, fold = np.random.default_rng(seed), np.empty(len(frame), dtype=int)
    for group in sorted(set(label)):
        members = pos[label == group]
        fold[members] = rng.permutation(len(members)) % folds
    return fold


def choose_beta(train: pd.DataFrame, fit: Callable, predict: Callable, betas=BETAS, folds: int = FOLDS,
                seed: int = 0, scored: Callable[[pd.DataFrame], np.ndarray] | None = None) -> ProbeChoice:
    """The beta in `betas` whose fits predict the left-out fold best (mean |relative error|,
    pooled over the folds; ties go to the smaller beta). `fit(rows) -> model` and
    `predict(model, rows) -> rows with predicted_us` are the model's own. Every fold is scaled to
    the whole training set's median probe, so the candidates differ only in beta.
    `scored(rows) -> bool mask` names the rows like the held-out ones (a model whose training
    rows are mostly of another kind: attention's period scan and twins); the others are dealt
    into no fold and train in every one. Default: every row is scored."""
    ok = probed(train)
    if not ok.any():
        return ProbeChoice(0.0, reason="no probe readings in the training rows")
    score = np.ones(len(train), bool) if scored is None else np.asarray(scored(train), bool)
    to_score = int((ok & score).sum())
    if to_score < folds * MIN_ROWS_PER_FOLD:
        return ProbeChoice(0.0, reason=f"{to_score} probed training rows to score, too few for {folds} folds")
    reference = float(np.median(train["probe_us"].to_numpy(float)[ok]))
    fold = np.full(len(train), -1)  # -1: in no fold's left-out part
    fold[score] = fold_of(train[score], folds, seed)
    errors = {}
    for beta in betas:
        pooled = []
        for f in range(folds):
            fitted_on, left_out = train[fold != f], train[fold == f]
            try:
                pred = predict(fit(scaled(fitted_on, beta, reference)), left_out)
            except (DevcharError, ValueError, KeyError, RuntimeError) as e:
                # a fold a group's fit cannot stand (too few of its rows left; scipy's nnls out of
                # iterations raises RuntimeError): no choice, the fit as measured
                return ProbeChoice(0.0, reason=f"cross-validation could not fit fold {f}: {e}")
            pooled.append(np.abs(rel_err(pred["predicted_us"], pred["median_us"])))
        e = np.concatenate(pooled)
        errors[float(beta)] = float(np.nanmean(e)) if np.isfinite(e).any() else float("inf")
    best = min(errors, key=lambda b: (errors[b], b))
    return ProbeChoice(best, reference, errors, scored_rows="" if score.all() else f"{int(score.sum())} of {len(train)}")


def fit_scaled(train: pd.DataFrame, fit: Callable, predict: Callable,
               scored: Callable[[pd.DataFrame], np.ndarray] | None = None):
    """(the model fitted on the training rows scaled with the beta cross-validation chose, the choice)."""
    choice = choose_beta(train, fit, predict, scored=scored)
    return fit(scaled(train, choice.beta, choice.reference_us)), choice
