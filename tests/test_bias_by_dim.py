"""Held-out GEMM error by dimension band (compare.bias_by_dim)."""
import numpy as np
import pandas as pd
import pytest

from pipeline.predict.compare import bias_by_dim, dim_band
from pipeline.predict.metrics import rel_err


def _pred(n_bias: float) -> pd.DataFrame:
    """Every (m, n, k) of a small lattice, priced exactly except N under 4, priced n_bias x."""
    sizes = [1, 3, 5, 20, 70, 300]
    m, n, k = (a.ravel() for a in np.meshgrid(sizes, sizes, sizes, indexing="ij"))
    measured = (m * n * k).astype(float) + 10.0
    predicted = measured * np.where(n < 4, n_bias, 1.0)
    return pd.DataFrame({"layer_type": "MM", "dtype": "float32", "m": m, "n": n, "k": k,
                         "predicted_us": predicted, "median_us": measured,
                         "rel_err": rel_err(predicted, measured)})


def test_a_bias_in_narrow_n_shows_in_its_band_alone():
    t = bias_by_dim(_pred(0.5)).set_index(["dim", "band"])
    assert t.loc[("n", "1-3"), "ratio_geomean"] == pytest.approx(0.5)
    assert t.loc[("n", "1-3"), "mean_abs_err"] == pytest.approx(0.5)
    others = t.drop(index=("n", "1-3"))
    # M and K bands mix both halves of N: a third of their rows under by half
    assert np.allclose(others.loc["n", "ratio_geomean"], 1.0)
    assert (others.loc[["m", "k"], "ratio_geomean"] < 1.0).all()
    assert t.loc[("n", "1-3"), "n"] == 2 * 36 and t.xs("m", level="dim")["n"].sum() == 216


def test_cold_rows_keep_their_layer_and_other_layers_are_left_out():
    cold = _pred(1.0).assign(layer_type="Linear cold")
    vector = _pred(1.0).assign(layer_type="Vector")
    t = bias_by_dim(pd.concat([_pred(2.0), cold, vector]))
    assert set(t["layer_type"]) == {"MM", "Linear cold"}
    assert np.allclose(t.loc[t["layer_type"] == "Linear cold", "ratio_geomean"], 1.0)


def test_bands_are_powers_of_four_from_one():
    assert list(dim_band([1, 3, 4, 15, 16, 63, 64, 255, 256, 10**6]).astype(str)) == [
        "1-3", "1-3", "4-15", "4-15", "16-63", "16-63", "64-255", "64-255", "256+", "256+"]


def test_the_pivot_has_a_column_per_band_and_a_row_per_dim():
    from pipeline.predict.compare import bias_pivot

    p = bias_pivot(bias_by_dim(_pred(0.5)))
    assert list(p.columns) == ["layer_type", "dtype", "dim", "1-3", "4-15", "16-63", "64-255", "256+"]
    assert list(p["dim"]) == ["k", "m", "n"]
    assert p.loc[p["dim"] == "n", "1-3"].item() == pytest.approx(0.5)
