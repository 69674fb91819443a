"""Utility regression (predict/utility.py) and its byte accounting (predict/traffic.py)."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError, MissingModelError, UnknownDtypeError
from pipeline.predict.traffic import utility_traffic
from pipeline.predict.utility import UtilityModel


def test_traffic_counts_bytes_of_each_op():
    assert utility_traffic("add", 4, 8, 4) == (2 * 32 * 4, 32 * 4, 32)
    br, bw, _ = utility_traffic("layernorm", 4, 8, 2)
    assert br == 32 * 2 + 2 * 8 * 2 and bw == 32 * 2  # input plus weight and bias
    assert utility_traffic("dropout", 1, 10, 4)[1] == 40 + 10  # output plus a byte mask


def test_regression_recovers_a_linear_law(linear_utility_samples):
    model = UtilityModel.fit(linear_utility_samples())
    br, bw, _ = utility_traffic("relu", 300, 700, 4)
    assert model.predict("relu", "float32", 300, 700) == pytest.approx(3.0 + (br + bw) / 10e3, rel=1e-3)
    again = UtilityModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.predict("relu", "float32", 5, 5) == pytest.approx(model.predict("relu", "float32", 5, 5))


def test_a_kernel_switch_becomes_two_regimes(linear_utility_samples):
    """Softmax on the CPU: below 16 columns a scalar kernel, 15x slower per element."""
    rows, cols = (a.ravel() for a in np.meshgrid([1, 16, 128, 1024, 4096], [1, 4, 8, 16, 64, 256, 1024]))
    br, bw, _ = utility_traffic("softmax", rows, cols, 4)
    per_byte = np.where(cols < 16, 15e-4, 1e-4)
    df = pd.DataFrame(dict(op="softmax", dtype="float32", rows=rows, cols=cols, held_out=False,
                           median_us=2.0 + (br + bw) * per_byte))
    model = UtilityModel.fit(df)
    assert model.regimes[("softmax", "float32")]["split"] == {"on": "cols", "at": 16.0}
    for r, c in ((700, 12), (700, 40), (3, 2000)):
        br, bw, _ = utility_traffic("softmax", r, c, 4)
        want = 2.0 + (br + bw) * (15e-4 if c < 16 else 1e-4)
        assert model.predict("softmax", "float32", r, c) == pytest.approx(want, rel=1e-3)
    assert UtilityModel.fit(linear_utility_samples()).regimes[("relu", "float32")]["split"] is None  # one law: no split
    again = UtilityModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict("softmax", "float32", rows, cols), model.predict("softmax", "float32",
                                                                                                rows, cols))


def test_utility_model_saved_before_regimes_still_loads():
    old = {"kind": "utility_model", "coefs": [{"op": "relu", "dtype": "float32", "coef": [3.0, 1e-4, 0.0, 0.0]}]}
    br, bw, _ = utility_traffic("relu", 10, 10, 4)
    assert UtilityModel.from_dict(old).predict("relu", "float32", 10, 10) == pytest.approx(3.0 + (br + bw) * 1e-4)


def test_utility_bad_input(linear_utility_samples):
    model = UtilityModel.fit(linear_utility_samples())
    with pytest.raises(BadShapeError, match="rows=0"):
        model.predict("relu", "float32", 0, 5)
    with pytest.raises(UnknownDtypeError, match="int4"):
        model.predict("relu", "int4", 1, 5)
    with pytest.raises(MissingModelError, match="gelu"):
        model.predict("gelu", "float32", 1, 5)


def test_a_row_wise_op_that_forks_once_it_has_rows_becomes_two_regimes():
    """Layernorm on a 16-thread CPU: one row runs on one thread; from two rows on, the rows are
    shared out and every call pays the parallel region's fork (~8 µs there)."""
    rows, cols = (a.ravel() for a in np.meshgrid([1, 2, 16, 128, 1024], [1, 4, 16, 64, 256, 1024, 4096, 16384]))
    br, bw, _ = utility_traffic("layernorm", rows, cols, 4)
    df = pd.DataFrame(dict(op="layernorm", dtype="float32", rows=rows, cols=cols, held_out=False,
                           median_us=np.where(rows < 2, 1.0, 8.0) + (br + bw) / 20e3))
    model = UtilityModel.fit(df)
    assert model.regimes[("layernorm", "float32")]["split"] == {"on": "rows", "at": 2.0}
    for r, c in ((1, 3000), (7, 13), (300, 77)):
        br, bw, _ = utility_traffic("layernorm", r, c, 4)
        assert model.predict("layernorm", "float32", r, c) == pytest.approx((1.0 if r < 2 else 8.0) + (br + bw) / 20e3,
                                                                             rel=1e-3)
