"""Issue 11, clear errors, concurrency and exposure: one test per finding, each failing on the code
before the fix (a traceback, a silent prediction, a wrong verdict or a raw lock error).

Quick: no sweeps. Models are fitted on a few made-up rows; the one Dagster job is a single op.
Names added by the fix are imported inside the tests, so this file still runs (and fails)
against the code before it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from pipeline.cli.main import main as cli_main
from pipeline.core.config import REPO_ROOT
from resources.warehouse import DuckDBWarehouse
from pipeline.core.errors import WarehouseLockedError

DEVICE = "cpu-test"
TINY = ["--layers", "1", "--hidden", "64", "--heads", "2", "--vocab", "100"]


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("devchar: error: ") and "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def device_models(devchar_home):
    """gemm_model and utility_model for DEVICE: GEMMs measured up to 64 waves and K = 512 (tile
    8 x 8, 2 slots), enough for a 1-layer, 64-wide GPT-2 at batch 1 and seq 8."""
    from pipeline.core.config import model_store_root
    from pipeline.predict import store
    from pipeline.predict.gemm import GemmModel
    from pipeline.predict.utility import UtilityModel

    gemm = pd.DataFrame([dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1, m=m, n=n,
                              k=k, waves=w, median_us=(1 + k / 32) * w, held_out=False)
                         for op in ("mm", "bmm", "linear") for w, (m, n) in ((1, (8, 16)), (4, (16, 32)),
                                                                            (64, (128, 64)))
                         for k in (32, 64, 512)])
    util = pd.DataFrame([dict(op=op, dtype="float32", rows=r, cols=c, median_us=1.0 + r * c / 1e3, held_out=False)
                         for op in ("add", "mul", "softmax", "layernorm", "embedding", "copy", "gelu")
                         for r in (1, 64, 512) for c in (64, 256)])
    for name, model in (("gemm_model", GemmModel.fit(gemm)), ("utility_model", UtilityModel.fit(util))):
        store.save(model_store_root(), DEVICE, name, model, {}, "20260101T000000-x")
    return DEVICE


# -- predict --hf-config: missing, not JSON, not a causal LM, too large ---------------------------

def hf_predict(path, *more: str) -> int:
    return cli_main(["predict", "--device", DEVICE, "--hf-config", str(path), "--batch", "1", "--seq", "8", *more])


def test_hf_config_missing_file(device_models, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "config.json"
    assert hf_predict(missing) == 2
    one_line_error(capsys, str(missing), "cannot read")


@pytest.mark.parametrize("text, why", [("{not json", "not valid JSON"), ("[1, 2]", "not an object"),
                                       ('{"n_layer": 1}', "no model_type")])
def test_hf_config_that_is_not_a_config(device_models, tmp_path, capsys, text, why):
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    assert hf_predict(cfg) == 2
    one_line_error(capsys, str(cfg), why)


@pytest.mark.parametrize("config, why", [({"model_type": "no-such-model"}, "no-such-model"),
                                         ({"model_type": "vit"}, "not a causal LM")])
def test_hf_config_that_is_not_a_causal_lm(device_models, tmp_path, capsys, config, why):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    assert hf_predict(cfg) == 2
    one_line_error(capsys, str(cfg), why)


def test_hf_config_too_large_is_refused_with_the_figure_before_anything_is_built(device_models, tmp_path, capsys):
    # 8 layers of width 262,144: about 6.6 T parameters, 24 TiB in float32 (never allocated)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 8, "n_embd": 262144, "n_head": 64,
                               "n_positions": 64}))  # GPT-2's vocabulary: its bos/eos ids are inside it
    start = time.monotonic()
    assert hf_predict(cfg) == 2
    err = one_line_error(capsys, str(cfg), "too large", "B parameters", "GiB", "available")
    assert time.monotonic() - start < 60
    e = 262144  # per layer 12 e^2 + 13 e; embeddings (50257 + 64) e (the LM head is tied); ln_f 2 e
    n_params = 8 * (12 * e * e + 13 * e) + (50257 + 64) * e + 2 * e
    assert f"{n_params / 1e9:,.2f} B parameters need {n_params * 4 / 2**30:,.1f} GiB in float32" in err, err


def test_hf_config_memory_is_parameters_and_logits_against_what_is_available(tmp_path):
    from pipeline.core.errors import BadConfigError
    from pipeline.workloads.predict_callable import check_hf_config

    cfg = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 64}
    assert check_hf_config(cfg, 2, 8, available_bytes=1 << 30).model_type == "gpt2"
    with pytest.raises(BadConfigError, match="too large"):
        check_hf_config(cfg, 2, 8, available_bytes=1000)  # the ~15k parameters alone need 60 kB
    with pytest.raises(BadConfigError, match="logits at batch=1000000 seq=8"):
        check_hf_config(cfg, 1_000_000, 8, available_bytes=1 << 30)  # 3.2 GB of logits


# -- predict --module: cannot import, wrong return ------------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module `devchar_user_factories` in the current directory, as a user would write one."""
    (tmp_path / "devchar_user_factories.py").write_text(textwrap.dedent("""
        import torch

        def good():
            return torch.nn.Linear(8, 8), torch.randn(2, 8)

        def number():
            return 42

        def triple():
            return torch.nn.Linear(8, 8), 1, 2

        def not_callable():
            return "model", torch.randn(2, 8)
    """))
    monkeypatch.chdir(tmp_path)
    yield "devchar_user_factories"
    sys.modules.pop("devchar_user_factories", None)


@pytest.mark.parametrize("spec, why", [("no_such_pkg_devchar.models:factory", "cannot import 'no_such_pkg_devchar"),
                                       ("justamodule", "expected pkg.module:factory"),
                                       ("json:no_such_factory", "no callable 'no_such_factory'")])
def test_module_that_cannot_be_imported(device_models, capsys, spec, why):
    assert cli_main(["predict", "--device", DEVICE, "--module", spec]) == 2
    one_line_error(capsys, spec, why)


@pytest.mark.parametrize("factory, why", [("number", "returned int 42"), ("triple", "a tuple of 3 items"),
                                          ("not_callable", "first item, a str, is not callable")])
def test_module_factory_returning_the_wrong_thing(device_models, user_module, capsys, factory, why):
    spec = f"{user_module}:{factory}"
    assert cli_main(["predict", "--device", DEVICE, "--module", spec]) == 2
    one_line_error(capsys, spec, why, "expected (module_or_callable, inputs)")


def test_module_in_the_current_directory_is_predicted(device_models, user_module, capsys):
    assert cli_main(["predict", "--device", DEVICE, "--module", f"{user_module}:good"]) == 0
    assert f"{user_module}:good on {DEVICE}: predicted" in capsys.readouterr().out


# -- predict --batch 1000000000: extrapolation is said, and how far --------------------------------

def test_gemm_model_reports_its_calibrated_range_and_how_far_shapes_reach(synthetic_gemm_model):
    # measured: waves 1, 4, 16 and K 32..256, tile 8 x 8 on 2 slots
    assert synthetic_gemm_model.calibrated_range("mm", "float32") == {"cpu": (16.0, 256.0)}
    inside = synthetic_gemm_model.beyond_range("mm", "float32", [8, 32], [16, 64], [32, 256], 1)
    assert max(inside) <= 1
    # 128 x 192 is 16 x 24 tiles = 384 blocks = 192 waves on 2 slots: 12x; K 1024 is 4x
    assert synthetic_gemm_model.beyond_range("mm", "float32", [8, 128], [16, 192], [32, 1024], 1) == (12.0, 4.0)


def test_predict_far_beyond_the_calibration_warns_once_per_op_kind(device_models, capsys):
    assert cli_main(["predict", "--device", DEVICE, *TINY, "--batch", "1000000000", "--seq", "8"]) == 0
    captured = capsys.readouterr()
    assert "predicted" in captured.out
    warnings = [line for line in captured.err.splitlines() if line.startswith("devchar: warning: ")]
    kinds = [line.split()[2].rstrip(":") for line in warnings]
    assert sorted(kinds) == ["bmm", "linear", "mm"], captured.err  # one line each
    mm = next(line for line in warnings if " mm:" in line)
    # c_fc: m = 8e9 rows (1e9 tiles of 8) x 256 columns (32 tiles) = 3.2e10 blocks on 2 slots
    # = 1.6e10 waves, against 64 measured; its K (256 at most) is inside the 512 measured
    assert "250,000,000x beyond the largest measured waves" in mm and " K" not in mm, mm


def test_predict_inside_the_calibration_does_not_warn(device_models, capsys):
    assert cli_main(["predict", "--device", DEVICE, *TINY, "--batch", "1", "--seq", "8"]) == 0
    assert "devchar: warning" not in capsys.readouterr().err


def test_extrapolation_warning_says_how_far():
    from pipeline.predict.workload import extrapolation_warnings

    (line,) = extrapolation_warnings({"mm": (12.0, 0.5)})
    assert line.startswith("mm: extrapolated, 12x beyond the largest measured waves") and " K" not in line
    (line,) = extrapolation_warnings({"bmm": (1.0, 2.5)})
    assert "2.5x beyond the largest measured K" in line and "waves" not in line


# -- what-if --new-batch 0 -------------------------------------------------------------------------

@pytest.mark.parametrize("new_batch", ["0", "-3"])
def test_what_if_new_batch_must_be_positive(devchar_home, capsys, new_batch):
    assert cli_main(["what-if", "--device", DEVICE, "--config", "dlrm_default-cpu", "--batch", "4",
                     "--new-batch", new_batch]) == 2
    one_line_error(capsys, f"new_batch={new_batch}", "positive")


# -- an interrupted run says "interrupted" ---------------------------------------------------------

def devchar_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("devchar:")]


def run_one_op(raises: BaseException):
    import dagster as dg

    @dg.op(name="gemm_config_sweep")
    def step():
        raise raises

    @dg.job
    def job():
        step()

    return job.execute_in_process(raise_on_error=False)


def test_interrupted_run_is_reported_as_interrupted(devchar_home, capsys):
    from pipeline.cli.main import _report_run

    assert _report_run(run_one_op(KeyboardInterrupt()), "cpu-x") == 130
    said = devchar_lines(capsys)  # Dagster's own log lines go to stderr too
    assert len(said) == 1 and "interrupted in ['gemm_config_sweep']" in said[0] and "failed" not in said[0], said


def test_a_real_failure_is_still_explained(devchar_home, capsys):
    from pipeline.cli.main import _report_run

    assert _report_run(run_one_op(ValueError("disk full")), "cpu-x") == 1
    err = capsys.readouterr().err
    said = "\n".join(line for line in err.splitlines() if line.startswith(("devchar:", "  step ", "  what to do")))
    assert "failed at ['gemm_config_sweep']" in said and "step gemm_config_sweep failed" in said, said
    assert "what to do" in said and "interrupted" not in said, said


def test_ctrl_c_outside_a_run_is_one_line(devchar_home, capsys, monkeypatch):
    import pipeline.cli.main as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_sql", interrupted)
    try:
        assert cli_main(["sql", "select 1"]) == 130
    except KeyboardInterrupt:  # escaping, it would stop pytest itself
        pytest.fail("KeyboardInterrupt escaped devchar's main (a traceback for the user)")
    assert capsys.readouterr().err.strip() == "devchar: sql interrupted"


# -- a DuckDB client left open ---------------------------------------------------------------------

def devices_row(device: str) -> pd.DataFrame:
    return pd.DataFrame({"kind": ["cpu"], "name": ["x"], "bandwidth_gbps": [1.0], "device": [device],
                         "run_id": ["r1"]})


def hold_write_lock(path: Path, seconds: float) -> subprocess.Popen:
    """Another process with the warehouse open read-write for `seconds`, as a DuckDB shell left open."""
    code = ("import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
            "time.sleep(float(sys.argv[2])); con.close()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_held_lock_gives_one_error_naming_the_holder(devchar_home, monkeypatch, capsys):
    DuckDBWarehouse().replace_partition("devices", "cpu-a", devices_row("cpu-a"))
    holder = hold_write_lock(DuckDBWarehouse().db_path(), 60)
    try:
        with pytest.raises(WarehouseLockedError, match=f"PID {holder.pid}") as exc:
            DuckDBWarehouse(lock_wait_s=0.5).replace_partition("devices", "cpu-b", devices_row("cpu-b"))
        assert "DEVCHAR_LOCK_WAIT_S" in str(exc.value) and "read-only" in str(exc.value)
        monkeypatch.setenv("DEVCHAR_LOCK_WAIT_S", "0.5")  # the CLI's warehouse: waits as configured, one line
        start = time.monotonic()
        assert cli_main(["sql", "select count(*) from devices"]) == 2
        assert 0.5 <= time.monotonic() - start < 10
        one_line_error(capsys, f"(PID {holder.pid})", "locked by", "waited 0.5 s")
    finally:
        holder.kill()
        holder.wait()


def test_a_writer_released_during_the_wait_lets_the_write_land(devchar_home):
    DuckDBWarehouse().replace_partition("devices", "cpu-a", devices_row("cpu-a"))
    holder = hold_write_lock(DuckDBWarehouse().db_path(), 1.5)
    start = time.monotonic()
    try:
        DuckDBWarehouse(lock_wait_s=30).replace_partition("devices", "cpu-b", devices_row("cpu-b"))
    finally:
        holder.wait()
    assert time.monotonic() - start >= 1.0  # it did wait for the holder
    assert sorted(DuckDBWarehouse().query("SELECT device FROM devices")["device"]) == ["cpu-a", "cpu-b"]


def test_two_processes_writing_different_devices_both_land(devchar_home):
    code = textwrap.dedent("""
        import sys
        import pandas as pd
        from resources.warehouse import DuckDBWarehouse

        device = sys.argv[1]
        for i in range(15):
            rows = pd.DataFrame({"kind": ["cpu"] * 3, "name": [f"x{i}"] * 3, "bandwidth_gbps": [1.0] * 3,
                                 "device": [device] * 3, "run_id": [f"r{i}"] * 3})
            DuckDBWarehouse().replace_partition("devices", device, rows)
    """)
    env = {**os.environ, "DEVCHAR_LOCK_WAIT_S": "60"}
    procs = [subprocess.Popen([sys.executable, "-c", code, d], cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE,
                              text=True) for d in ("cpu-a", "cpu-b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    got = DuckDBWarehouse().query("SELECT device, run_id, count(*) AS n FROM devices GROUP BY ALL ORDER BY ALL")
    assert got.values.tolist() == [["cpu-a", "r14", 3], ["cpu-b", "r14", 3]]


# -- devchar ui --host 0.0.0.0 ---------------------------------------------------------------------

@pytest.mark.parametrize("host, warns", [("0.0.0.0", True), ("192.168.1.5", True), ("myhost.example", True),
                                         ("127.0.0.1", False), ("localhost", False), ("::1", False)])
def test_ui_on_a_network_interface_warns(devchar_home, capsys, monkeypatch, host, warns):
    import pipeline.cli.main as cli

    launched = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, **kw: launched.append(cmd) or 0)
    assert cli_main(["ui", "--host", host]) == 0
    assert launched and host in launched[0]
    err = capsys.readouterr().err
    assert ("unauthenticated" in err or "no authentication" in err) is warns, err


def test_cli_predict_without_models_is_one_clear_error(devchar_home, capsys):
    assert cli_main(["predict", "--device", "cpu-nowhere", "--layers", "2", "--hidden", "64", "--heads", "2"]) == 2
    err = capsys.readouterr().err
    assert "cpu-nowhere" in err and "Traceback" not in err
    assert cli_main(["predict", "--device", "cpu-nowhere", "--batch", "0"]) == 2
    assert "batch=0" in capsys.readouterr().err


# -- a reference committed with known failures (--expect-failing) ---------------------------------

def run_with_checks(fail: set[str]):
    """A materialization of one asset with two blocking checks; those named in `fail` fail."""
    import dagster as dg

    @dg.asset(name="utility_model")
    def model():
        return 1

    def check(name):
        @dg.asset_check(asset=model, name=name, blocking=True)
        def _check():
            return dg.AssetCheckResult(passed=name not in fail)

        return _check

    @dg.asset(name="predictions", deps=[model])
    def predictions():
        return 2

    return dg.materialize([model, predictions, check("heldout_error"), check("round_trip")], raise_on_error=False)


@pytest.mark.parametrize("fail, expected, code, says", [
    ({"heldout_error"}, {"utility_model.heldout_error"}, 0, "what depends on them did not run and is unchecked"),
    ({"heldout_error", "round_trip"}, {"utility_model.heldout_error"}, 1, "beyond its expected checks"),
    (set(), {"utility_model.heldout_error"}, 1, "now pass"),
])
def test_a_reference_known_to_fail_a_check_passes_only_when_exactly_that_fails(devchar_home, capsys, fail,
                                                                                expected, code, says):
    from pipeline.cli.main import _report_run

    assert _report_run(run_with_checks(fail), "cpu-x", expected) == code
    out = capsys.readouterr()
    assert says in out.out + out.err
