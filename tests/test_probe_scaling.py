"""pipeline/predict/probe_scaling.py: training rows scaled by the spell probe, beta chosen by
cross-validation on the training rows."""
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import MissingModelError
from pipeline.predict.probe_scaling import FOLDS, MIN_ROWS_PER_FOLD, choose_beta, fit_scaled, fold_of, scaled


def test_scaling_moves_each_row_to_the_median_reading_and_leaves_rows_without_one():
    rows = pd.DataFrame({"median_us": [10.0, 10.0, 10.0, 10.0], "p20_us": [9.0] * 4, "kept_us": [np.nan, 5.0, 5.0, 5.0],
                         "held_us": [np.nan, 8.0, 8.0, 8.0], "fault_us_per_page": [1.0] * 4, "probe_us": [20.0, 40.0, 20.0, np.nan], "k": [1, 2, 3, 4]})
    assert scaled(rows, 0.0).equals(rows.astype({"median_us": float}))
    one = scaled(rows, 1.0)  # the median reading is 20: the 40 us row ran in a spell twice as slow
    assert one["median_us"].tolist() == [10.0, 5.0, 10.0, 10.0]
    assert one["p20_us"].tolist() == [9.0, 4.5, 9.0, 9.0] and one["fault_us_per_page"].tolist() == [1.0, 0.5, 1.0, 1.0]
    assert one["kept_us"].iloc[1] == 2.5 and np.isnan(one["kept_us"].iloc[0])
    assert one["held_us"].iloc[1] == 4.0  # held less kept is a fault's cost: both in one machine state
    assert one["k"].tolist() == [1, 2, 3, 4] and one["probe_us"].equals(rows["probe_us"])  # shapes and readings kept
    assert scaled(rows, 0.5)["median_us"].iloc[1] == pytest.approx(10.0 / np.sqrt(2.0))
    assert scaled(rows, 1.0, reference_us=40.0)["median_us"].tolist() == [20.0, 10.0, 20.0, 10.0]


class PerK:
    """predicted_us = the mean time of the training rows at the same k: a table whose every
    cell is a few rows, as sensitive to one slow row as the interpolation tables are."""

    def __init__(self, table: pd.Series):
        self.table = table

    @classmethod
    def fit(cls, rows: pd.DataFrame) -> "PerK":
        return cls(rows.groupby("k")["median_us"].mean())


def predict_per_k(model: PerK, rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(predicted_us=model.table.reindex(rows["k"]).to_numpy())


def _rows(n: int, probe_is_the_machine: bool, seed: int = 0) -> pd.DataFrame:
    """Rows whose time is 2 us per k, slowed by the machine's state. Where the probe reads the
    machine, a row's slowdown is its probe's; where not, the probe reads noise of its own."""
    rng = np.random.default_rng(seed)
    k = np.arange(n) % 25 + 1.0  # four rows a cell
    slow = rng.uniform(1.0, 1.5, n)
    probe = 20.0 * (slow if probe_is_the_machine else rng.uniform(1.0, 3.0, n))
    return pd.DataFrame({"k": k, "median_us": 2.0 * k * slow, "probe_us": probe})


def test_cross_validation_scales_fully_where_the_probe_reads_the_machine_and_not_where_it_reads_noise():
    # (validation rows are scored as measured, slow ones included, so full scaling need not be
    # the argmin: with other seeds 0.5 or 0.75 win where the probe reads the machine; 0 always where not)
    reads = choose_beta(_rows(100, True), PerK.fit, predict_per_k)
    assert reads.beta >= 0.5 and reads.reference_us == pytest.approx(np.median(_rows(100, True)["probe_us"]))
    assert reads.cv_mean_rel_err[reads.beta] < reads.cv_mean_rel_err[0.0]
    noise = choose_beta(_rows(100, False), PerK.fit, predict_per_k)
    assert noise.beta == 0.0 and noise.cv_mean_rel_err[0.0] < noise.cv_mean_rel_err[1.0]
    assert list(noise.cv_mean_rel_err) == [0.0, 0.25, 0.5, 0.75, 1.0]
    model, choice = fit_scaled(_rows(100, True), PerK.fit, predict_per_k)
    # every row put at the median reading: each cell is 2 us per k at that machine state
    assert choice == reads and np.allclose(model.table.to_numpy(), 2.0 * model.table.index * reads.reference_us / 20.0)
    assert f"beta {reads.beta:g} by 5-fold cross-validation" in reads.summary() and "scaled to a probe" in reads.summary()
    assert noise.summary().endswith("not scaled") and noise.how == "cross-validation"


def test_no_choice_without_readings_or_with_too_few_rows_or_a_fold_that_cannot_fit():
    rows = _rows(100, True)
    none = choose_beta(rows.drop(columns="probe_us"), PerK.fit, predict_per_k)
    assert (none.beta, none.how) == (0.0, "no probe readings in the training rows")
    assert none.summary() == "beta 0, not scaled (no probe readings in the training rows)"
    assert choose_beta(rows.assign(probe_us=np.nan), PerK.fit, predict_per_k).beta == 0.0
    few = choose_beta(rows.head(FOLDS * MIN_ROWS_PER_FOLD - 1), PerK.fit, predict_per_k)
    assert few.beta == 0.0 and "too few for 5 folds" in few.summary()

    def refuses(rows):
        raise MissingModelError("no GEMM calibration for op='bmm'")

    def runs_out(rows):  # scipy's nnls at its iteration limit
        raise RuntimeError("Maximum number of iterations reached.")

    failed = choose_beta(rows, refuses, predict_per_k)
    assert failed.beta == 0.0 and failed.reason.startswith("cross-validation could not fit fold 0: no GEMM")
    assert choose_beta(rows, runs_out, predict_per_k).reason.endswith("Maximum number of iterations reached.")
    model, choice = fit_scaled(rows.drop(columns="probe_us"), PerK.fit, predict_per_k)
    assert choice.beta == 0.0 and model.table.equals(PerK.fit(rows).table)  # fitted as measured


def test_folds_follow_the_rows_not_their_order_and_every_group_trains_in_every_fold():
    rng = np.random.default_rng(5)
    rows = pd.DataFrame({"op": ["mm"] * 30 + ["bmm"] * 7, "dtype": "float32", "m": rng.integers(1, 999, 37),
                         "n": rng.integers(1, 999, 37), "k": 64, "median_us": rng.uniform(1, 9, 37)})
    fold = fold_of(rows)
    shuffled = rows.sample(frac=1.0, random_state=1)
    again = pd.Series(fold_of(shuffled), index=shuffled.index).sort_index().to_numpy()
    assert (again == fold).all()  # a warehouse query and a parquet file of the same rows agree
    for op, n in (("mm", 30), ("bmm", 7)):  # dealt within each group: as even as its size allows
        counts = np.bincount(fold[(rows["op"] == op).to_numpy()], minlength=FOLDS)
        assert counts.sum() == n and counts.max() - counts.min() <= 1 and (counts > 0).all()


def test_cross_validation_scores_only_the_rows_named_and_trains_on_the_others_in_every_fold():
    rows = _rows(100, True).assign(grid=["scan"] * 40 + ["seq"] * 60)
    rows.index = rows.index * 3 + 7  # training rows keep the labels of the whole table's index
    left_out, trained_on = [], []

    def fit(rows):
        trained_on.append(set(rows.index))
        return PerK.fit(rows)

    def predict(model, rows):
        left_out.append(set(rows.index))
        return predict_per_k(model, rows)

    choice = choose_beta(rows, fit, predict, scored=lambda r: (r["grid"] == "seq").to_numpy())
    scan = set(rows.index[rows["grid"] == "scan"])
    assert left_out and all(not (part & scan) for part in left_out)  # scan rows are never scored
    assert all(scan <= part for part in trained_on)  # and train in every fold
    assert set().union(*left_out) == set(rows.index[rows["grid"] == "seq"])
    assert "on 60 of 100 training rows" in choice.summary()
    few = choose_beta(rows, fit, predict, scored=lambda r: (r["grid"] == "scan").to_numpy())
    assert few.beta == 0.0 and few.reason == "40 probed training rows to score, too few for 5 folds"
