"""The DuckDB warehouse resource: atomic and scoped partition replacement, the devices table."""
import pandas as pd
import pytest

from resources.warehouse import DuckDBWarehouse
from pipeline.core.errors import ContractError, DevcharError


def test_replace_partition_is_atomic(devchar_home):
    wh = DuckDBWarehouse()
    good = pd.DataFrame({"device": ["d1", "d1"], "run_id": ["r", "r"], "median_us": [1.0, 2.0]})
    wh.replace_partition("gemm_samples", "d1", good)
    bad = pd.DataFrame({"device": ["d1"], "run_id": ["r2"], "median_us": ["not a number"]})
    with pytest.raises(ContractError):
        wh.replace_partition("gemm_samples", "d1", bad)
    assert wh.query("SELECT median_us FROM gemm_samples WHERE device = 'd1'")["median_us"].tolist() == [1.0, 2.0]
    with pytest.raises(DevcharError, match="d2"):
        wh.replace_partition("gemm_samples", "d2", good)  # rows name d1, not the partition d2
    with pytest.raises(DevcharError, match="zero rows"):
        wh.replace_partition("gemm_samples", "d1", good.iloc[:0])


def test_scoped_replace_spares_other_writers_rows(devchar_home):
    """model_errors has several writers: each replaces only its own models' rows."""
    wh = DuckDBWarehouse()
    rows = lambda model, err: pd.DataFrame({"device": ["d1"], "run_id": ["r"], "model": [model],  # noqa: E731
                                            "mean_rel_err": [err]})
    wh.replace_partition("model_errors", "d1", pd.concat([rows("devchar", 0.1), rows("roofline", 0.5)]),
                         scope="model")
    wh.replace_partition("model_errors", "d1", rows("opencl_lm", 0.3), scope="model")
    wh.replace_partition("model_errors", "d1", rows("opencl_lm", 0.2), scope="model")
    got = wh.query("SELECT model, mean_rel_err FROM model_errors ORDER BY model")
    assert got.values.tolist() == [["devchar", 0.1], ["opencl_lm", 0.2], ["roofline", 0.5]]
    with pytest.raises(DevcharError, match="scope"):
        wh.replace_partition("model_errors", "d1", rows("x", 0.1), scope="no_such_column")


def test_devices_table_takes_cpu_then_gpu_rows(devchar_home):
    """A CPU row (NULL CUDA fields) first must not fix those columns to a type GPU values break."""
    wh = DuckDBWarehouse()
    cpu = pd.DataFrame([{"device": "cpu-x", "run_id": "r", "kind": "cpu", "cuda_version": None,
                         "driver_version": None, "sm_count": None, "peak_flops_tf32": None}])
    gpu = pd.DataFrame([{"device": "cuda-y", "run_id": "r", "kind": "cuda", "cuda_version": "12.8",
                         "driver_version": "570.86.15", "sm_count": 132, "peak_flops_tf32": 4.9e14}])
    wh.replace_partition("devices", "cpu-x", cpu)
    wh.replace_partition("devices", "cuda-y", gpu)
    got = wh.query("SELECT * FROM devices WHERE device = 'cuda-y'").iloc[0]
    assert got["driver_version"] == "570.86.15" and got["peak_flops_tf32"] == 4.9e14 and got["sm_count"] == 132
