"""scripts/export_reference.py: one device's sweep tables, one run each, into a reference folder."""
import importlib.util
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from resources.warehouse import DuckDBWarehouse

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "export_reference.py"


def _script():
    spec = importlib.util.spec_from_file_location("export_reference", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(device, run, n):
    return pd.DataFrame({"device": [device] * n, "run_id": [run] * n, "median_us": [1.0 + i for i in range(n)]})


def test_exports_only_the_named_devices_rows(devchar_home, tmp_path):
    wh = DuckDBWarehouse()
    for device, n in (("cpu-a-f6m1-2c", 3), ("cpu-b-f6m2-2c", 5)):
        wh.replace_partition("devices", device, pd.DataFrame(
            [{"device": device, "run_id": "r1", "kind": "cpu", "name": device, "bandwidth_gbps": 10.0}]))
        wh.replace_partition("gemm_samples", device, _rows(device, "r1", n))
    con = duckdb.connect(str(devchar_home / "devchar.duckdb"), read_only=True)
    counts = _script().export(con, "cpu-a-f6m1-2c", tmp_path)
    assert counts == {"devices": 1, "gemm_samples": 3}
    got = pd.read_parquet(tmp_path / "gemm_samples.parquet")
    assert set(got["device"]) == {"cpu-a-f6m1-2c"} and got["median_us"].tolist() == [1.0, 2.0, 3.0]


def test_refuses_a_table_of_two_runs(devchar_home, tmp_path):
    wh = DuckDBWarehouse()
    device = "cpu-a-f6m1-2c"
    wh.replace_partition("gemm_samples", device, pd.concat([_rows(device, "r1", 2), _rows(device, "r2", 2)]))
    con = duckdb.connect(str(devchar_home / "devchar.duckdb"), read_only=True)
    with pytest.raises(SystemExit, match="gemm_samples holds 2 runs"):
        _script().export(con, device, tmp_path)


def test_main_replaces_an_earlier_takes_tables_and_keeps_the_readme(devchar_home, tmp_path, monkeypatch):
    device = "cpu-a-f6m1-2c"
    wh = DuckDBWarehouse()
    wh.replace_partition("devices", device, pd.DataFrame(
        [{"device": device, "run_id": "r1", "kind": "cpu", "name": device, "bandwidth_gbps": 10.0}]))
    wh.replace_partition("gemm_samples", device, _rows(device, "r1", 2))
    dest = tmp_path / "reference" / device
    dest.mkdir(parents=True)
    (dest / "README.md").write_text("by hand")
    (dest / "opencl_launches.parquet").write_bytes(b"an earlier take's table")
    mod = _script()
    monkeypatch.setattr(mod, "reference_root", lambda: tmp_path / "reference")
    monkeypatch.setattr("sys.argv", ["export_reference.py"])  # the warehouse's only device
    mod.main()
    assert sorted(p.name for p in dest.iterdir()) == ["README.md", "devices.parquet", "gemm_samples.parquet"]
    assert (dest / "README.md").read_text() == "by hand"
    monkeypatch.setattr("sys.argv", ["export_reference.py", "--device", "../escape"])
    with pytest.raises(Exception, match="not a valid slug"):
        mod.main()
