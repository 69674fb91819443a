"""The device-side runner: CLI, output files, and the Dagster Pipes subprocess path."""
from types import SimpleNamespace

import dagster as dg
import pandas as pd
import pytest

from pipeline import runner
from pipeline.core.errors import DevcharError
from pipeline.device.discover import identify


def test_runner_writes_one_file_per_sweep(tmp_path):
    assert runner.main(["device", "utility", "--profile", "tiny", "--out", str(tmp_path), "--run-id", "abc"]) == 0
    dev = pd.read_parquet(tmp_path / "devices.parquet")
    util = pd.read_parquet(tmp_path / "utility_samples.parquet")
    assert dev["name"].iloc[0] == identify("cpu").slug
    assert dev["peak_flops_float32"].iloc[0] > 0 and dev["bandwidth_gbps"].iloc[0] > 0
    assert set(util["run_id"]) == {"abc"} and (util["median_us"] > 0).all()
    assert {"bytes_read", "bytes_written", "flops", "held_out"} <= set(util.columns)
    # a CPU sweep's rows carry the speed probe timed around it; the device row has none
    assert (util["canary_us"] > 0).all() and util["canary_us"].nunique() == 1 and "canary_us" not in dev


def test_traces_sweep_writes_graphs_and_overheads(tmp_path):
    """One capture per workload fills two tables: the graph (JSON) and its T-type overheads."""
    import json

    from pipeline.core.graph import ExecutionGraph

    assert runner.main(["traces", "--profile", "tiny", "--out", str(tmp_path), "--run-id", "t1"]) == 0
    graphs = pd.read_parquet(tmp_path / "workload_graphs.parquet")
    ovh = pd.read_parquet(tmp_path / "overhead_samples.parquet")
    assert set(graphs["workload"]) == {"gpt2", "dlrm", "mlp"} and set(ovh["workload"]) == set(graphs["workload"])
    assert set(ovh["type"]) <= {"T1", "T2", "T5"} and (ovh["us"] >= 0).all()  # CPU: no launches, no T3/T4
    assert (ovh["profiler_overhead_us"] > 0).all() and set(ovh["run_id"]) == {"t1"}
    g = ExecutionGraph.from_dict(json.loads(graphs["graph_json"].iloc[0])["graph"])
    assert len(g) == graphs["n_ops"].iloc[0] and len(g.top_level()) == graphs["n_top_level"].iloc[0]
    # the tiny profile captures once; a step's span holds its ops' time and the gaps between them
    assert (graphs["passes"] == 1).all() and (graphs["pass_spread"] == 0).all()
    assert (graphs["span_ms"] >= graphs["traced_ms"] * 0.999).all()


def test_traces_keep_each_workloads_quickest_capture(monkeypatch):
    """With two passes each workload keeps the capture whose step spanned the least, and the
    overhead samples of that capture only."""
    from dataclasses import replace

    from pipeline.sweeps import traces
    from pipeline.sweeps.catalog import WorkloadEntry
    from pipeline.sweeps.profiles import get_profile
    from pipeline.workloads import host_time

    entries = [WorkloadEntry("mlp", "a", 1, 0, "train"), WorkloadEntry("mlp", "b", 1, 0, "train")]
    spans = iter([10.0, 30.0, 12.0, 20.0])  # pass 1: a, b; pass 2: a, b
    calls = []

    def fake_capture(e, dev, profile, ovh, dtype):
        span = next(spans)
        calls.append(e.config)
        return ({"config": e.config, "span_ms": span, "n_ops": 1},
                [{"config": e.config, "op": "aten::mm", "type": "T1", "us": span}])

    monkeypatch.setattr(traces, "workload_entries", lambda profile: entries)
    monkeypatch.setattr(traces, "_capture", fake_capture)
    monkeypatch.setattr(host_time, "measure_profiler_overhead", lambda: 0.5)
    said = []
    out = traces.sweep_traces(identify("cpu"), replace(get_profile("tiny"), workload_passes=2), log=said.append)
    assert calls == ["a", "b", "a", "b"]  # a whole pass apart
    graphs = {g["config"]: g for g in out["workload_graphs"]}
    assert graphs["a"]["span_ms"] == 10.0 and graphs["b"]["span_ms"] == 20.0
    assert graphs["a"]["passes"] == 2 and graphs["a"]["pass_spread"] == pytest.approx(0.2)
    assert graphs["b"]["pass_spread"] == pytest.approx(0.5)
    assert sorted((r["config"], r["us"]) for r in out["overhead_samples"]) == [("a", 10.0), ("b", 20.0)]
    assert any("2 or more captures of each workload" in m and "at most 50.0%" in m for m in said)


def _traced(monkeypatch, capture, calibration_usual=None):
    """(sweep_traces on two fake workloads "a" and "b" over two passes, each capture's graph row
    `capture(config, captures so far)`, the probes reading 20 and 3 us between; the log)."""
    from dataclasses import replace

    from pipeline.harness import spells
    from pipeline.sweeps import traces
    from pipeline.sweeps.catalog import WorkloadEntry
    from pipeline.sweeps.profiles import get_profile
    from pipeline.workloads import host_time

    entries, taken = [WorkloadEntry("mlp", c, 1, 0, "train") for c in ("a", "b")], []

    def fake_capture(e, dev, profile, ovh, dtype):
        taken.append(e.config)
        return ({"config": e.config, "n_ops": 1, **capture(e.config, len(taken))},
                [{"config": e.config, "op": "aten::mm", "type": "T1", "us": 1.0}])

    monkeypatch.setattr(traces, "workload_entries", lambda profile: entries)
    monkeypatch.setattr(traces, "_capture", fake_capture)
    monkeypatch.setattr(host_time, "measure_profiler_overhead", lambda: 0.5)
    monkeypatch.setattr(spells, "MIN_READINGS", 4)
    monkeypatch.setattr(spells, "probe_us", lambda: 20.0)
    monkeypatch.setattr(spells, "host_probe_us", lambda: 3.0)
    said = []
    out = traces.sweep_traces(identify("cpu"), replace(get_profile("tiny"), workload_passes=2), log=said.append,
                              calibration_usual=calibration_usual)
    return taken, {g["config"]: g for g in out["workload_graphs"]}, said


def test_a_capture_that_ran_in_a_host_spell_is_taken_once_more(monkeypatch):
    """Both captures of "b" read the host probe slow: once both probes read usual again, b is
    captured a third time, and its quicker capture is kept."""
    def capture(config, n):
        slow = config == "b" and n < 5
        return {"span_ms": 30.0 if slow else 10.0, "probe_us": 20.0, "host_probe_us": 9.0 if slow else 3.0}

    taken, graphs, said = _traced(monkeypatch, capture)
    assert taken == ["a", "b", "a", "b", "b"]
    assert graphs["b"]["passes"] == 3 and graphs["b"]["host_probe_us"] == 3.0 and graphs["b"]["span_ms"] == 10.0
    assert graphs["a"]["passes"] == 2
    assert any("1 captures ran in a slow spell of a probe: 1 taken once more" in m for m in said)


@pytest.mark.parametrize("anchored", [True, False])
def test_traces_in_a_spell_as_long_as_the_sweep_are_taken_again_against_the_calibration(monkeypatch, anchored):
    """Every capture of both passes read the GEMM probe at 35 us: against the sweep's own readings
    nothing is slow; against the calibration's 23 us each workload is captured once more."""
    def capture(config, n):
        slow = n <= 4
        return {"span_ms": 15.0 if slow else 10.0, "probe_us": 35.0 if slow else 20.0, "host_probe_us": 3.0}

    taken, graphs, said = _traced(monkeypatch, capture, (23.0, None) if anchored else None)
    spans = {c: g["span_ms"] for c, g in graphs.items()}
    if anchored:
        assert taken == ["a", "b", "a", "b", "a", "b"] and spans == {"a": 10.0, "b": 10.0}
        assert any("usual times from the calibration where it read quicker: GEMM probe 23.0 us" in m for m in said)
    else:
        assert taken == ["a", "b", "a", "b"] and spans == {"a": 15.0, "b": 15.0}


def test_runner_rejects_unknown_sweep_and_device(tmp_path, capsys):
    assert runner.main(["conv3d", "--out", str(tmp_path)]) == 2
    assert "conv3d" in capsys.readouterr().err
    assert runner.main(["gemm", "--device", "cuda-h999", "--out", str(tmp_path)]) == 2
    assert "cuda-h999" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_bad_timing_scale_stops_the_runner_before_it_measures(tmp_path, capsys):
    import os

    from pipeline.harness.timer import TIMING_SCALE_ENV

    before = os.environ.get(TIMING_SCALE_ENV)
    assert runner.main(["device", "--timing-scale", "-2", "--out", str(tmp_path)]) == 2
    assert TIMING_SCALE_ENV in capsys.readouterr().err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    assert os.environ.get(TIMING_SCALE_ENV) == before  # set only for the sweeps it runs


def test_jsonl_fallback_round_trips(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    path = runner.write_rows([{"device": "d", "median_us": 1.5}], tmp_path, "gemm_samples")
    monkeypatch.undo()
    from resources.devices import read_rows

    assert path.suffix == ".jsonl"
    assert read_rows(path)["median_us"].tolist() == [1.5]


def test_subprocess_mode_through_dagster_pipes(devchar_home, monkeypatch):
    from assets.samples import device_spec, utility_samples
    from pipeline.orchestration.partitions import devices
    from resources.devices import DeviceRunner
    from resources.quality import QualityGates
    from resources.warehouse import DuckDBWarehouse

    slug = identify("cpu").slug
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(devices.name, [slug])
        result = dg.materialize([device_spec, utility_samples], partition_key=slug, instance=instance,
                                resources={"device_runner": DeviceRunner(profile="tiny", mode="subprocess"),
                                           "warehouse": DuckDBWarehouse(), "quality_gates": QualityGates()})
    assert result.success
    n = DuckDBWarehouse().query("SELECT count(*) AS n FROM utility_samples WHERE device = ?", [slug])["n"].iloc[0]
    assert n > 0


def test_all_means_the_sweeps_that_apply(monkeypatch):
    import importlib.util

    assert "reference" not in runner.all_sweeps("cpu")  # peer data are H100 measurements
    assert "reference" in runner.all_sweeps("cuda")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyopencl" else real(name, *a))
    assert "opencl" not in runner.all_sweeps("cuda")  # a bare GPU node has no pyopencl


def test_all_leaves_out_an_opencl_device_that_cannot_build(monkeypatch, capsys):
    import pipeline.opencl.sweep.execute as execute

    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: f"the OpenCL {kind} device cannot build a kernel: "
                        "unknown target CPU 'generic'")
    assert "opencl" not in runner.all_sweeps("cpu")
    assert "unknown target CPU 'generic': skipping the opencl sweep" in capsys.readouterr().err
    monkeypatch.setattr(execute, "opencl_unusable", lambda kind: None)
    assert "opencl" in runner.all_sweeps("cpu")


def test_a_thread_count_the_cpu_does_not_have_is_one_clear_error(cpu):
    from pipeline.runner import with_threads

    assert with_threads(cpu, 1).threads == 1 and with_threads(cpu, 1).slug == cpu.slug
    assert with_threads(cpu, 0) is cpu
    for bad in (-1, (cpu.threads or 1) + 1):
        with pytest.raises(DevcharError, match=f"--threads {bad}: a CPU can be measured with 1 to"):
            with_threads(cpu, bad)


def test_a_column_only_later_rows_have_is_written(tmp_path):
    import pandas as pd

    from pipeline.runner import write_rows

    path = write_rows([{"a": 1}, {"a": 2, "kept_us": 3.5}], tmp_path, "gemm_samples")
    got = pd.read_parquet(path)
    assert list(got.columns) == ["a", "kept_us"] and got["kept_us"].isna().tolist() == [True, False]


def test_read_rows_gives_back_what_write_rows_wrote_in_either_format(tmp_path, monkeypatch):
    """parquet where pyarrow is installed, JSON lines on a bare node: read back the same, and
    a column asked for that the file lacks is absent, not None."""
    import builtins

    from pipeline.runner import read_rows, write_rows

    rows = [{"a": 1, "probe_us": 2.5}, {"a": 2, "probe_us": 3.5}]
    parquet = write_rows(rows, tmp_path / "pq", "gemm_samples")
    assert parquet.suffix == ".parquet" and read_rows(parquet) == rows
    assert read_rows(parquet, ("probe_us", "host_probe_us")) == [{"probe_us": 2.5}, {"probe_us": 3.5}]
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    jsonl = write_rows(rows, tmp_path / "js", "gemm_samples")
    assert jsonl.suffix == ".jsonl" and read_rows(jsonl) == rows
    assert read_rows(jsonl, ("probe_us", "host_probe_us")) == [{"probe_us": 2.5}, {"probe_us": 3.5}]


def test_the_calibrations_usual_probes_reach_the_runs_and_traces_alone(monkeypatch, tmp_path):
    """--usual-probes reaches the sweeps that test spells against the calibration (runner.SPELL_ANCHORED);
    `all` takes them from its own GEMM sweep's rows when none are given."""
    got = {}

    def fake(name, rows=()):
        def sweep(dev, profile, log=None, **kw):
            got[name] = kw
            return [dict(r) for r in rows] or [{"median_us": 1.0}]
        return sweep

    gemm_rows = [{"median_us": 1.0, "probe_us": 20.0 + i, "host_probe_us": 3.0} for i in range(40)]
    monkeypatch.setattr(runner, "_canary", lambda dev, sweep: None)
    fakes = {"gemm": fake("gemm", gemm_rows), "utility": fake("utility"), "workloads": fake("workloads"),
             "traces": fake("traces")}

    def import_module(module):
        return SimpleNamespace(**{f: fakes[s] for s, (m, f) in runner.SWEEP_FUNCS.items() if s in fakes and m == module})

    monkeypatch.setattr(runner, "importlib", SimpleNamespace(import_module=import_module))
    assert runner.main(["utility", "workloads", "traces", "--device", "cpu", "--profile", "tiny", "--out",
                        str(tmp_path), "--usual-probes", "23.5,"]) == 0
    assert got == {"utility": {}, "workloads": {"calibration_usual": (23.5, None)},
                   "traces": {"calibration_usual": (23.5, None)}}
    got.clear()
    assert runner.main(["gemm", "workloads", "--device", "cpu", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    assert got["gemm"] == {} and got["workloads"] == {"calibration_usual": (29.75, 3.0)}  # their lower quartiles
    got.clear()
    assert runner.main(["workloads", "--device", "cpu", "--profile", "tiny", "--out", str(tmp_path),
                        "--usual-probes", ","]) == 0  # no times given: none passed on
    assert got == {"workloads": {}}


def test_usual_probes_round_trip_through_the_runners_arguments():
    for usual in ((23.5, None), (None, 2.25), (23.5, 2.25)):
        assert runner.parse_usual_probes(runner.usual_probes_args(usual)[1]) == usual
    assert runner.usual_probes_args(None) == [] and runner.parse_usual_probes(None) is None


@pytest.mark.parametrize("text", ["abc", "23", "23,4,5", "-1,2", "0,", ",inf"])
def test_bad_usual_probes_stop_the_runner_before_it_measures(tmp_path, capsys, text):
    assert runner.main(["device", f"--usual-probes={text}", "--out", str(tmp_path)]) == 2
    assert f"--usual-probes {text!r}" in capsys.readouterr().err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_asset_reads_the_calibrations_usual_probes_from_its_gemm_rows():
    from assets.common import calibration_usual

    class Warehouse:
        def __init__(self, rows):
            self.rows = rows

        def device_rows(self, table, device):
            assert (table, device) == ("gemm_samples", "d")
            if self.rows is None:
                raise DevcharError(f"table {table!r} does not exist yet")
            return self.rows

    rows = pd.DataFrame({"probe_us": [20.0 + i for i in range(40)], "host_probe_us": float("nan")})
    assert calibration_usual(Warehouse(rows), "d", "workloads") == {"usual_probes": (29.75, None)}
    assert calibration_usual(Warehouse(rows), "d", "traces") == {"usual_probes": (29.75, None)}
    assert calibration_usual(Warehouse(rows), "d", "utility") == {}
    assert calibration_usual(Warehouse(None), "d", "workloads") == {}
    assert calibration_usual(Warehouse(pd.DataFrame({"median_us": [1.0] * 40})), "d", "workloads") == {}  # a GPU's


def test_the_subprocess_runner_passes_the_usual_probes_on(monkeypatch):
    import resources.devices as devices_mod
    from resources.devices import DeviceRunner

    cmds = []

    class Client:
        def __init__(self, **kw):
            pass

        def run(self, command, context):
            cmds.append(command)
            return SimpleNamespace(get_custom_messages=lambda: [])

    monkeypatch.setattr(devices_mod.dg, "PipesSubprocessClient", Client)
    monkeypatch.setattr(devices_mod, "read_results", lambda messages, out, sweep: {})
    context = SimpleNamespace(run=SimpleNamespace(run_id="r" * 20))
    import pipeline.device.discover as discover

    monkeypatch.setattr(discover, "local_devices", lambda: ["cpu-x"])
    runner_ = DeviceRunner(profile="tiny", mode="subprocess")
    runner_.run_tables(context, "workloads", "cpu-x", (23.5, None))
    runner_.run_tables(context, "utility", "cpu-x")
    assert cmds[0][-2:] == ["--usual-probes", "23.5,"] and "--usual-probes" not in cmds[1]
