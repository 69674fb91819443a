"""Issue 11, data loss and injection: one test per finding, each failing on the code before the fix.

Quick: no sweeps; every warehouse here is a few made-up rows in a fresh DEVCHAR_HOME.
Modules added by the fix are imported inside the tests, so this file still runs (and fails)
against the code before it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.cli.main import main as cli_main
from resources.warehouse import DuckDBWarehouse
from pipeline.core.errors import BadSlugError, ContractError

INJECTION = 'x" INT); DROP TABLE predictions; --'
# what dropped `predictions` before the fix: the first statement is valid, so the second runs
INJECTIONS = [INJECTION, 'kernel" FROM raw_incoming; DROP TABLE predictions; --']
VALUE = {"int": 4, "float": 2.5, "str": "x", "bool": False}


def rows_for(table: str, device: str = "cpu-x", n: int = 3) -> pd.DataFrame:
    """n valid rows of `table` with exactly its contract's required columns."""
    from pipeline.core.tables import contract

    cols = {c: [VALUE[kind]] * n for c, kind in contract(table).required.items()}
    return pd.DataFrame({**cols, "device": [device] * n, "run_id": ["r1"] * n})


def table_names() -> set[str]:
    return set(DuckDBWarehouse().query("SELECT table_name FROM information_schema.tables")["table_name"])


def columns_of(table: str) -> list[str]:
    return DuckDBWarehouse().query(f"SELECT * FROM {table} LIMIT 0").columns.tolist()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("devchar: error: ") and "\n" not in err, err
    return err


@pytest.fixture
def warehouse(devchar_home):
    """predictions and gemm_samples for cpu-x, as a real run leaves them."""
    wh = DuckDBWarehouse()
    wh.replace_partition("predictions", "cpu-x", rows_for("predictions"))
    wh.replace_partition("gemm_samples", "cpu-x", rows_for("gemm_samples", n=5))
    return wh


def write_dir(tmp_path: Path, name: str, **tables: pd.DataFrame) -> Path:
    d = tmp_path / name
    d.mkdir()
    for table, df in tables.items():
        df.to_parquet(d / f"{table}.parquet")
    return d


# -- 1. SQL injection through column names ------------------------------------------------------

def test_identifiers_are_quoted_with_embedded_quotes_doubled():
    from resources.warehouse import quote

    assert quote('a"b') == '"a""b"' and quote(INJECTION) == '"x"" INT); DROP TABLE predictions; --"'


@pytest.mark.parametrize("name", INJECTIONS)
def test_injected_column_name_drops_nothing(warehouse, name):
    bad = rows_for("gemm_samples").assign(**{name: 1})
    with pytest.raises(ContractError, match="DROP TABLE predictions"):  # refused, naming the column
        warehouse.replace_partition("gemm_samples", "cpu-x", bad)
    assert "predictions" in table_names()
    assert len(warehouse.query("SELECT * FROM predictions")) == 3
    assert len(warehouse.query("SELECT * FROM gemm_samples")) == 5 and name not in columns_of("gemm_samples")


@pytest.mark.parametrize("name", INJECTIONS)
def test_injected_column_name_through_load_drops_nothing(warehouse, tmp_path, capsys, name):
    d = write_dir(tmp_path, "out", gemm_samples=rows_for("gemm_samples").assign(**{name: 1}))
    assert cli_main(["load", str(d)]) == 2
    assert "gemm_samples.parquet" in one_line_error(capsys)
    assert "predictions" in table_names() and len(warehouse.query("SELECT * FROM gemm_samples")) == 5


def test_unknown_columns_are_refused_by_name(warehouse):
    with pytest.raises(ContractError, match="junk"):
        warehouse.replace_partition("gemm_samples", "cpu-x", rows_for("gemm_samples").assign(junk=1.0))
    assert "junk" not in columns_of("gemm_samples")


# -- 2. devchar load validates every file first; all or nothing ---------------------------------

def test_load_with_wrong_columns_changes_nothing(warehouse, tmp_path, capsys):
    before = warehouse.query("SELECT * FROM gemm_samples")
    junk = pd.DataFrame({"device": ["cpu-x"] * 3, "run_id": ["r2"] * 3, "foo": [1, 2, 3], "bar": ["a", "b", "c"]})
    d = write_dir(tmp_path, "out", gemm_samples=junk)
    assert cli_main(["load", str(d)]) == 2
    err = one_line_error(capsys)
    assert "gemm_samples.parquet" in err and "foo" in err
    pd.testing.assert_frame_equal(warehouse.query("SELECT * FROM gemm_samples"), before)


def test_load_with_a_required_column_missing_is_refused(warehouse, tmp_path, capsys):
    d = write_dir(tmp_path, "out", gemm_samples=rows_for("gemm_samples").drop(columns=["k"]))
    assert cli_main(["load", str(d)]) == 2
    assert "'k'" in one_line_error(capsys)


@pytest.mark.parametrize("column,value", [("median_us", np.nan), ("median_us", -3.0), ("p80_us", np.inf),
                                          ("p20_us", 0.0)])
def test_load_refuses_non_finite_or_non_positive_times(warehouse, tmp_path, capsys, column, value):
    bad = rows_for("gemm_samples")
    bad.loc[1, column] = value
    d = write_dir(tmp_path, "out", gemm_samples=bad)
    assert cli_main(["load", str(d)]) == 2
    err = one_line_error(capsys)
    assert "gemm_samples.parquet" in err and column in err and repr(value) in err
    assert len(warehouse.query("SELECT * FROM gemm_samples")) == 5


def test_load_refuses_wrong_kinds_and_bad_devices(warehouse, tmp_path, capsys):
    d = write_dir(tmp_path, "kinds", gemm_samples=rows_for("gemm_samples").assign(m="many"))
    assert cli_main(["load", str(d)]) == 2
    assert "m" in one_line_error(capsys)
    d = write_dir(tmp_path, "slug", gemm_samples=rows_for("gemm_samples", device="../../x"))
    assert cli_main(["load", str(d)]) == 2
    assert "../../x" in one_line_error(capsys)


def test_failed_opencl_launches_may_have_nan_times(devchar_home, tmp_path, capsys):
    launches = rows_for("opencl_launches", device="cpu-y", n=2).assign(status=["ok", "build_error"])
    launches.loc[1, ["median_us", "p20_us", "p80_us"]] = np.nan
    assert cli_main(["load", str(write_dir(tmp_path, "ok", opencl_launches=launches))]) == 0
    launches.loc[0, "median_us"] = np.nan  # a successful launch without a time is not
    assert cli_main(["load", str(write_dir(tmp_path, "bad", opencl_launches=launches))]) == 2


def test_load_is_all_or_nothing(warehouse, tmp_path, capsys):
    good = rows_for("gemm_samples", n=2).assign(run_id="r2")
    bad = rows_for("utility_samples").assign(median_us=-1.0)
    d = write_dir(tmp_path, "out", gemm_samples=good, utility_samples=bad)
    assert cli_main(["load", str(d)]) == 2
    assert "utility_samples.parquet" in one_line_error(capsys)
    assert warehouse.query("SELECT DISTINCT run_id FROM gemm_samples")["run_id"].tolist() == ["r1"]
    assert "utility_samples" not in table_names()


def test_load_rolls_back_every_table_when_one_insert_fails(warehouse, monkeypatch):
    calls = []
    real = DuckDBWarehouse._replace

    def fail_second(con, i, *args):
        calls.append(i)
        if i == 1:
            raise RuntimeError("disk full")
        return real(con, i, *args)

    monkeypatch.setattr(DuckDBWarehouse, "_replace", staticmethod(fail_second))
    with pytest.raises(RuntimeError, match="disk full"):
        warehouse.replace_partitions([("gemm_samples", "cpu-x", rows_for("gemm_samples", n=1)),
                                      ("utility_samples", "cpu-x", rows_for("utility_samples"))])
    assert calls == [0, 1]
    assert len(warehouse.query("SELECT * FROM gemm_samples")) == 5 and "utility_samples" not in table_names()


def test_good_load_replaces_and_says_what_it_loaded(warehouse, tmp_path, capsys):
    d = write_dir(tmp_path, "out", gemm_samples=rows_for("gemm_samples", n=2).assign(run_id="r2"),
                  devices=pd.concat([rows_for("devices", "cpu-x", 1), rows_for("devices", "cuda-z", 1)]))
    (d / "checkpoint-opencl.jsonl").write_text("{}\n")  # the runner's resume file: passed over
    (d / "README.md").write_text("notes\n")
    assert cli_main(["load", str(d)]) == 0
    out = capsys.readouterr().out
    assert "loaded gemm_samples: 2 rows for cpu-x" in out and "loaded devices: 1 rows for cuda-z" in out
    assert warehouse.query("SELECT DISTINCT run_id FROM gemm_samples")["run_id"].tolist() == ["r2"]


def test_load_of_jsonl_runner_output(devchar_home, tmp_path, capsys):
    d = tmp_path / "out"
    d.mkdir()
    rows_for("workload_runs").to_json(d / "workload_runs.jsonl", orient="records", lines=True)
    assert cli_main(["load", str(d)]) == 0
    assert len(DuckDBWarehouse().query("SELECT * FROM workload_runs")) == 3


@pytest.mark.parametrize("case", ["missing", "empty", "unknown", "only_notes"])
def test_load_of_nothing_is_an_error(devchar_home, tmp_path, capsys, case):
    d = tmp_path / "out"
    if case != "missing":
        d.mkdir()
    if case == "unknown":
        rows_for("gemm_samples").to_parquet(d / "gemm_samplez.parquet")
    if case == "only_notes":
        (d / "README.md").write_text("nothing here\n")
    assert cli_main(["load", str(d)]) == 2
    assert str(d) in one_line_error(capsys)
    assert not (devchar_home / "devchar.duckdb").exists()


def test_every_harness_column_is_in_the_sample_contracts():
    """A column the harness adds to every timing row must be added to the contract too."""
    from pipeline.harness.timer import Measurement
    from pipeline.core.tables import CONTRACT

    cols = set(Measurement(times_us=np.ones(5)).row())
    for table in ("gemm_samples", "utility_samples", "attention_samples", "embedding_samples", "memory_samples",
                  "reference_timings", "gemm_config_samples"):
        assert cols <= {*CONTRACT[table].required, *CONTRACT[table].optional}, table


# -- 3. devchar sql is a read-only query door ---------------------------------------------------

def test_sql_reads(warehouse, capsys):
    assert cli_main(["sql", "SELECT count(*) AS n FROM gemm_samples"]) == 0
    assert capsys.readouterr().out.split() == ["n", "5"]


@pytest.mark.parametrize("statement", [
    "COPY (SELECT 1) TO '{db}'",
    "COPY (SELECT 1) TO '{model}' (FORMAT csv)",
    "ATTACH '{other}' AS o (READ_WRITE)",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{model}')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "EXPORT DATABASE '{home}/export'",
    "SELECT 1; DROP TABLE predictions",
    "DROP TABLE predictions",
    "CREATE TABLE t AS SELECT 1",
])
def test_sql_cannot_write_or_reach_outside(warehouse, devchar_home, tmp_path, capsys, statement):
    db = devchar_home / "devchar.duckdb"
    model = devchar_home / "models_store" / "cpu-x" / "gemm_model" / "v1" / "model.json"
    model.parent.mkdir(parents=True)
    model.write_text('{"kind": "gemm"}')
    db_sha, model_sha = sha(db), sha(model)
    sql = statement.format(db=db, model=model, other=tmp_path / "other.duckdb", home=devchar_home)
    assert cli_main(["sql", sql]) == 2
    one_line_error(capsys)
    assert sha(db) == db_sha and sha(model) == model_sha
    assert not (tmp_path / "other.duckdb").exists() and not (devchar_home / "export").exists()
    assert "predictions" in table_names() and "t" not in table_names()


def test_sql_on_a_fresh_data_dir_creates_nothing(devchar_home, capsys):
    assert cli_main(["sql", "CREATE TABLE t AS SELECT 1"]) == 2
    assert "no warehouse" in one_line_error(capsys)
    assert not (devchar_home / "devchar.duckdb").exists()


@pytest.mark.parametrize("statement,needle", [("SELEC 1", "syntax error"), ("SELECT * FROM nosuch", "nosuch"),
                                              ("", "exactly one"), ("SELECT 1; SELECT 2", "exactly one")])
def test_sql_errors_are_one_line(warehouse, capsys, statement, needle):
    assert cli_main(["sql", statement]) == 2
    assert needle in one_line_error(capsys)


# -- 4. device slugs and partition keys never leave their roots ---------------------------------

@pytest.mark.parametrize("slug", ["../../x", "/etc", "a/../../b", "..", ".hidden", "Upper", "", "a" * 129,
                                  "cpu x", "x\0y"])
def test_bad_slugs_are_refused(slug):
    from pipeline.core.slugs import check_slug
    from pipeline.core.errors import BadSlugError

    with pytest.raises(BadSlugError):
        check_slug(slug)


def test_good_slugs_pass():
    from pipeline.core.slugs import check_slug

    for slug in ("cpu-intel-xeon-processor-f6m167-2c", "nvidia-h100-80gb-hbm3", "cuda-nvidia-h100-80gb-hbm3", "d1"):
        assert check_slug(slug) == slug


def test_plots_stay_under_the_data_dir(devchar_home):
    from assets.common import save_plot

    with pytest.raises(BadSlugError, match=r"\.\./\.\./x"):
        save_plot(b"png", "../../x", "throughput_vs_k")
    assert not list(devchar_home.parent.rglob("*.png"))
    assert save_plot(b"png", "cpu-x", "throughput_vs_k") == devchar_home.resolve() / "plots/cpu-x/throughput_vs_k.png"


def test_model_store_stays_under_its_root(tmp_path, synthetic_gemm_model):
    from pipeline.predict import store

    root = tmp_path / "store" / "models_store"
    for device in ("../../x", "../escaped", str(tmp_path / "abs")):
        with pytest.raises(BadSlugError, match="slug"):
            store.save(root, device, "gemm_model", synthetic_gemm_model, {}, "v1")
        with pytest.raises(BadSlugError, match="slug"):
            store.load(root, device, "gemm_model")
    with pytest.raises(BadSlugError, match="plain name"):
        store.save(root, "cpu-x", "gemm_model", synthetic_gemm_model, {}, "../../../v1")
    assert not list(tmp_path.iterdir())  # nothing written anywhere, inside the root or out of it
    store.save(root, "cpu-x", "gemm_model", synthetic_gemm_model, {}, "v1")
    with pytest.raises(BadSlugError, match="plain name"):
        store.load(root, "cpu-x", "gemm_model", "../../cpu-x/gemm_model/v1")


def test_model_store_resource_refuses_a_traversal_partition(tmp_path, synthetic_gemm_model):
    from resources.model_store import ModelStore

    with pytest.raises(BadSlugError, match="slug"):
        ModelStore(root=str(tmp_path / "ms")).save("../../x", "gemm_model", synthetic_gemm_model, {}, "v1")
    assert not (tmp_path / "x").exists()


def test_predict_does_not_load_models_from_an_absolute_path(devchar_home, tmp_path, capsys, synthetic_gemm_model):
    """A model planted outside the store, named by --device as a path, must not be loaded (before
    the fix the planted gemm_model loaded and the error was about the missing utility_model)."""
    from pipeline.predict import store

    evil = tmp_path / "elsewhere" / "dev"
    store.save(evil.parent, evil.name, "gemm_model", synthetic_gemm_model, {}, "v1")
    for device in (str(evil), "../../../elsewhere/dev"):
        assert cli_main(["predict", "--device", device, "--layers", "1", "--hidden", "64", "--heads", "2",
                         "--vocab", "100", "--batch", "1", "--seq", "8"]) == 2
        assert "slug" in one_line_error(capsys)


def test_runner_refuses_a_traversal_device(tmp_path):
    from pipeline import runner

    with pytest.raises(SystemExit) as exc:
        runner.main(["device", "--device", "../../x", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and not (tmp_path / "out").exists()


def test_warehouse_refuses_a_traversal_partition(devchar_home):
    with pytest.raises(BadSlugError, match="slug"):
        DuckDBWarehouse().replace_partition("gemm_samples", "../../x", rows_for("gemm_samples", device="../../x"))


def test_debug_shows_the_traceback(warehouse):
    from pipeline.core.errors import DevcharError

    with pytest.raises(DevcharError, match="syntax error"):
        cli_main(["--debug", "sql", "SELEC 1"])


def test_reference_calibrations_are_read_only_under_their_root(tmp_path, monkeypatch):
    import resources.devices as devices_mod

    monkeypatch.setattr(devices_mod, "reference_root", lambda: tmp_path / "reference")
    (tmp_path / "x").mkdir()
    rows_for("devices", "x", 1).to_parquet(tmp_path / "x" / "devices.parquet")  # outside the root
    for device in ("../x", str(tmp_path / "x")):
        with pytest.raises(BadSlugError, match="slug"):
            devices_mod.reference_file(device, "devices")
    (tmp_path / "reference" / "cuda-y").mkdir(parents=True)
    rows_for("devices", "cuda-y", 1).to_parquet(tmp_path / "reference" / "cuda-y" / "devices.parquet")
    (tmp_path / "reference" / "README.md").write_text("notes\n")
    assert devices_mod.committed_references() == ["cuda-y"]
