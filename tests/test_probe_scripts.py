"""The measurement scripts under scripts/ run and refuse bad arguments (their figures are not asserted)."""
import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_idle_probe_times_every_op_after_every_gap_with_all_threads_and_one(capsys):
    import torch

    probe = _load("probe_thread_wake")
    threads = torch.get_num_threads()
    try:
        assert probe.main(["--reps", "1"]) == 0
    finally:
        torch.set_num_threads(threads)  # the probe ends on one thread
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " us idle: " in ln]
    settings = len({threads, 1})
    assert len(lines) == settings * 4 * len(probe.GAPS_US)
    assert {ln.split(" idle:")[0].split("after")[1].strip() for ln in lines} == {f"{g} us" for g in probe.GAPS_US}


@pytest.mark.parametrize("name", ["probe_thread_wake", "probe_after_large_op", "probe_unaligned_n"])
def test_a_probe_refuses_a_count_below_one(name, capsys):
    with pytest.raises(SystemExit) as exc:
        _load(name).main(["--reps", "0"])
    assert exc.value.code == 2
    assert "--reps must be positive, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv,said", [(["--repeats", "1"], "--repeats must be at least 2"),
                                       (["--batch", "0"], "--batch must be positive, got 0")])
def test_the_step_correlation_refuses_what_it_cannot_time(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        _load("probe_step_correlation").main(argv)
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


def test_the_probe_scaling_ablation_refuses_a_path_that_holds_no_sample_rows(tmp_path):
    ablation = _load("probe_normalize_ablation")
    tables = "gemm_samples, utility_samples, attention_samples, embedding_samples, memory_samples"
    with pytest.raises(SystemExit, match=f"holds none of {tables}"):
        ablation.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="neither a warehouse file"):
        ablation.main([str(tmp_path / "missing.duckdb")])


def test_the_gemm_flush_probe_refuses_a_flush_of_nothing_and_a_home_without_a_warehouse(tmp_path, monkeypatch, capsys):
    probe = _load("probe_gemm_after_flush")
    with pytest.raises(SystemExit) as exc:
        probe.main(["--flush-mb", "0"])
    assert exc.value.code == 2 and "--flush-mb must be positive, got 0" in capsys.readouterr().err
    monkeypatch.setenv("DEVCHAR_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match="no warehouse at .*devchar.duckdb; set DEVCHAR_HOME"):
        probe.main([])


def test_usual_probes_prints_what_the_runner_reads_back(tmp_path, capsys):
    import json

    from pipeline.harness.spells import MIN_READINGS, usual_of_rows
    from pipeline.runner import parse_usual_probes

    rows = [{"probe_us": 20.0 + i, "host_probe_us": 2.0 + i / 10, "median_us": 5.0} for i in range(2 * MIN_READINGS)]
    path = tmp_path / "gemm_samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _load("usual_probes").main([str(path)]) == 0
    assert parse_usual_probes(capsys.readouterr().out.strip()) == usual_of_rows(rows)


def test_usual_probes_refuses_a_table_without_readings_or_a_missing_file(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    gpu = tmp_path / "gemm_samples.parquet"  # a GPU's rows carry no probe columns
    pq.write_table(pa.table({"median_us": [1.0, 2.0]}), gpu)
    script = _load("usual_probes")
    assert script.main([str(gpu)]) == 2
    assert "no probe readings" in capsys.readouterr().err
    assert script.main([str(tmp_path / "absent.parquet")]) == 2
    assert "cannot read its rows" in capsys.readouterr().err


def test_the_elb_probe_times_two_builds_and_refuses_what_it_cannot_time(tmp_path, monkeypatch, capsys):
    probe = _load("probe_elb_in_step")
    monkeypatch.setenv("DEVCHAR_HOME", str(tmp_path))  # no warehouse: timings only
    assert probe.main(["--configs", "tiny", "--batch", "4", "--rounds", "1", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "no warehouse" in out and "dlrm-tiny 4: full " in out and "-> tables " in out
    for argv, said in [(["--batch", "0"], "--batch must be positive, got 0"),
                       (["--rounds", "0"], "--rounds must be positive, got 0"),
                       (["--configs", "nope"], "unknown DLRM config set 'nope'"),
                       (["--configs", "full"], "two builds of tables of tens of GB")]:
        with pytest.raises(SystemExit) as exc:
            probe.main(argv)
        assert exc.value.code == 2 and said in capsys.readouterr().err


def test_priced_captures_names_the_warehouse_device_and_loads_no_models_without_captures(tmp_path):
    import duckdb

    from pipeline.analysis.captures import priced_captures

    db = tmp_path / "devchar.duckdb"
    assert priced_captures(str(db), "dlrm") is None
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE devices (device VARCHAR)")
        con.execute("INSERT INTO devices VALUES ('cpu-test-2c')")
        con.execute("CREATE TABLE workload_graphs (device VARCHAR, workload VARCHAR, graph_json VARCHAR)")
        con.execute("INSERT INTO workload_graphs VALUES ('cpu-test-2c', 'gpt2', '{}')")
    # no model store for the device: loading its models would fail, so none were loaded
    assert priced_captures(str(db), "dlrm") == ("cpu-test-2c", [])
    assert priced_captures(str(db), "dlrm", "cpu-other-1c") == ("cpu-other-1c", [])


def test_the_unaligned_n_probe_times_each_base_and_its_twin_at_each_m(capsys):
    assert _load("probe_unaligned_n").main(["--m", "2,3", "--k", "8", "--bases", "16,32", "--reps", "1"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("2", "16"), ("2", "32"), ("3", "16"), ("3", "32")]
    assert all(float(r[-1]) > 0 for r in rows)


@pytest.mark.parametrize("argv,said", [(["--bases", "16,x"], "--bases must be comma-separated whole numbers"),
                                       (["--m", "0"], "--m needs positive values, got '0'")])
def test_the_unaligned_n_probe_refuses_shapes_it_cannot_time(argv, said):
    with pytest.raises(SystemExit, match=said):
        _load("probe_unaligned_n").main(argv)
