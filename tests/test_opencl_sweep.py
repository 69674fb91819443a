"""The OpenCL launch dataset: Clang parsing, Algorithm 1's size inference, the 25:60:15
sampler, IQR rebalancing, containment of hung / crashing kernels, the corpus, and the
`opencl` sweep through the runner (tiny profile, PoCL's CPU device)."""
import json
import math
import sys
from dataclasses import replace

import numpy as np
import pytest

from pipeline.opencl.sweep import corpus
from pipeline.opencl.sweep.clang_ast import KernelParseError, kernel_params, parse_kernel
from pipeline.opencl.sweep.settings import (iqr_rebalance, lsize_choices, regime_bounds, sample_work_groups,
                                              split_counts)


def _pocl_available() -> tuple[bool, str]:
    """A device that builds a probe kernel (PoCL 3.0's LLVM refuses a CPU it does not know)."""
    from pipeline.opencl.sweep.execute import opencl_unusable

    why = opencl_unusable("cpu")
    return why is None, f"no usable OpenCL device: {why}"


_OK, _WHY = _pocl_available()
needs_pocl = pytest.mark.skipif(not _OK, reason=_WHY)
STATUSES = {"ok", "build_error", "launch_error", "timeout", "crash", "invalid_args"}


@pytest.fixture(scope="module")
def runner():
    from pipeline.harness.timer import TimingSpec
    from pipeline.opencl.sweep.execute import KernelRunner, Limits

    with KernelRunner(Limits(launch_timeout_s=1.5, build_timeout_s=30),
                      TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=5)) as r:
        yield r


def test_parse_kernel_gives_params_and_clear_errors():
    _, k = parse_kernel("__kernel void f(__global const float4* a, __local int* t, uint n) { t[0] = n; }")
    assert k.spelling == "f"
    assert [(p.name, p.kind, p.element) for p in kernel_params(k)] == [
        ("a", "global", "float4"), ("t", "local", "int"), ("n", "scalar", "uint")]
    with pytest.raises(KernelParseError, match="undeclared identifier 'nope'"):
        parse_kernel("__kernel void g(__global float* a) { a[0] = nope; }")
    with pytest.raises(KernelParseError, match="no __kernel"):
        parse_kernel("void h(__global float* a) { }")


KNOWN = {  # kernel -> (scalars of the plan to look at, expected (slope, intercept) per array)
    "__kernel void a(__global float* x, __global float* y) { int i = get_global_id(0); y[i] = x[i]; }":
        ({}, {"x": (1, 0), "y": (1, 0)}),
    "__kernel void b(__global float* x, __global float* y) { int i = get_global_id(0); y[i] = x[2 * i + 1]; }":
        ({}, {"x": (2, 0), "y": (1, 0)}),  # max index 2(g-1)+1: 2g elements
    "__kernel void c(__global float* in, __global float* out, int k) { int i = get_global_id(0); float s = 0.0f;"
    " for (int j = 0; j < k; j++) { s += in[i * k + j]; } out[i] = s; }":
        ({"k": 16}, {"in": (16, 0), "out": (1, 0)}),
    "__kernel void d(__global float* in, __global float* out, int n) { int i = get_global_id(0); float s = 0.0f;"
    " for (int j = 0; j < n; j++) { s += in[j]; } out[i] = s; }":
        ({"n": 32}, {"in": (0, 32), "out": (1, 0)}),
}


@needs_pocl
@pytest.mark.parametrize("source", list(KNOWN))
def test_memory_analysis_infers_affine_array_sizes(source, runner):
    from pipeline.opencl.sweep.arguments import memory_plans

    name = source.split("void ")[1].split("(")[0]
    scalars, expected = KNOWN[source]
    plans = memory_plans(source, name, runner, (64, 128, 256), 8, 36, np.random.default_rng(0))
    plan = next(p for p in plans if p.scalars == scalars)
    assert {k: (round(c, 6), round(d, 6)) for k, (c, d) in plan.sizes.items()} == expected
    args = {a["name"]: a for a in plan.args(1024, 64)}
    for arr, (c, d) in expected.items():
        assert args[arr]["elements"] == c * 1024 + d


@needs_pocl
def test_memory_analysis_drops_size_quadratic_in_gsize(runner):
    from pipeline.opencl.sweep.arguments import memory_plans

    src = list(KNOWN)[2]  # in[i * k + j] with k = gsize: in needs gsize^2 elements, not a line
    plans = memory_plans(src, "c", runner, (64, 128, 256), 8, 36, np.random.default_rng(0))
    assert {"k": "gsize"} not in [p.scalars for p in plans] and plans


def test_work_group_sampler_keeps_25_60_15():
    draws = sample_work_groups(80, 1000, np.random.default_rng(0), full_k=40)
    bounds = regime_bounds(80, 40)
    counts = {r: sum(1 for _, reg in draws if reg == r) for r in ("idle", "under", "full")}
    assert counts == {"idle": 250, "under": 600, "full": 150}
    for n, reg in draws:
        assert bounds[reg][0] <= n <= bounds[reg][1]
    assert split_counts(7) == [2, 4, 1] and sum(split_counts(13)) == 13
    one_cu = sample_work_groups(1, 20, np.random.default_rng(0))  # no idle range on one compute unit
    assert all(reg != "idle" for _, reg in one_cu) and len(one_cu) == 20
    ls = lsize_choices(32, 1024, 4, np.random.default_rng(0))
    assert len(ls) == 4 and all(x % 32 == 0 and 32 <= x <= 1024 for x in ls)


def test_iqr_rebalance_fills_the_missing_time_range():
    n = np.array([1, 2, 3, 4, 5, 6, 7, 8, 100])
    t = 10.0 * n  # time grows with N_WG; the samples crowd at the short end
    new = iqr_rebalance(n, t, 5)
    assert new and all(8 < v < 100 for v in new)
    gap_before = np.diff(np.sort(t)).max()
    gap_after = np.diff(np.sort(np.concatenate([t, 10.0 * np.array(new)]))).max()
    assert gap_after < gap_before
    assert iqr_rebalance(n, t[::-1], 5) == []  # time does not grow with N_WG: nothing to aim at
    even = np.arange(1, 41)
    assert iqr_rebalance(even, 10.0 * even, 4) == []  # balanced already
    assert iqr_rebalance([1, 2], [1.0, 2.0], 3) == []


@needs_pocl
def test_hung_and_crashing_kernels_are_contained(runner):
    from pipeline.opencl.sweep.execute import Launch

    args = [{"name": "a", "type": "__global float *", "kind": "global", "element": "float", "elements": 8192}]
    hang = "__kernel void f(__global float* a) { int i = get_global_id(0); while (a[i] >= 0.0f) { a[i] += 1.0f; } }"
    crash = ("__kernel void f(__global float* a) { __global float* p = (__global float*)(0xdead0000UL"
             " + (ulong)get_global_id(0) * 4096); p[0] = a[0]; }")
    ok = "__kernel void f(__global float* a) { int i = get_global_id(0); a[i] = sqrt(a[i]); }"
    bad = "__kernel void f(__global float* a) { a[0] = nope; }"
    launches = [Launch(4096, 64, args), Launch(8192, 64, args)]
    import time

    t0 = time.perf_counter()
    hung = runner.run(hang, "f", launches)
    assert hung[0].status == "timeout" and hung[1].status == "not_run"
    assert time.perf_counter() - t0 < 15
    assert runner.run(crash, "f", launches)[0].status in ("crash", "launch_error")
    assert [r.status for r in runner.run(bad, "f", launches)] == ["build_error"] * 2
    done = runner.run(ok, "f", launches)  # a fresh worker carries on
    assert [r.status for r in done] == ["ok", "ok"] and all(np.all(r.times_us > 0) for r in done)


@needs_pocl
def test_memory_limit_turns_a_huge_buffer_into_a_launch_error():
    from pipeline.harness.timer import TimingSpec
    from pipeline.opencl.sweep.execute import KernelRunner, Launch, Limits

    ok = "__kernel void f(__global float* a) { int i = get_global_id(0); a[i] = sqrt(a[i]); }"
    huge = [{"name": "a", "type": "__global float *", "kind": "global", "element": "float", "elements": 1 << 30}]
    with KernelRunner(Limits(launch_timeout_s=5, mem_limit_mb=1024), TimingSpec(budget_s=0.0, min_reps=3)) as r:
        res = r.run(ok, "f", [Launch(1024, 64, huge)])
    assert res[0].status == "launch_error" and "Memory" in res[0].error


def test_corpus_is_deterministic_and_distinct():
    a, b = corpus.generate(60, seed=3), corpus.generate(60, seed=3)
    assert [k.source for k in a] == [k.source for k in b]
    assert [k.kernel_id for k in a] != [k.kernel_id for k in corpus.generate(60, seed=4)]
    every = corpus.generate(corpus.corpus_size())
    assert len(every) >= 2000
    assert len({k.source_hash for k in every}) == len(every) == len({k.kernel_id for k in every})
    assert all(len(k.source_hash) == 16 for k in a) and {k.family for k in a} == set(corpus.FAMILIES)
    for k in a:  # every template instance parses as OpenCL C 1.2
        parse_kernel(k.source, k.name)


@needs_pocl
def test_sweep_goes_on_past_bad_kernels(monkeypatch):
    from pipeline.device.discover import identify
    from pipeline.opencl.sweep import sweep
    from pipeline.sweeps.profiles import get_profile

    hang = corpus.Kernel("hang_1", "hang", "hang_1", "__kernel void hang_1(__global float* a) {"
                         " int i = get_global_id(0); while (a[i] >= 0.0f) { a[i] += 1.0f; } }")
    good = corpus.generate(1)[0]
    monkeypatch.setattr(sweep.corpus, "generate", lambda n, seed: [hang, good])
    monkeypatch.setattr(sweep.benchmarks, "BENCHMARKS", {})
    prof = replace(get_profile("tiny"), opencl_launch_timeout_s=1.0)
    rows = sweep.sweep_opencl(identify("cpu"), prof)
    by_kernel = {k: {r["status"] for r in rows if r["kernel_id"] == k} for k in ("hang_1", good.kernel_id)}
    assert by_kernel["hang_1"] <= {"timeout", "invalid_args"} and "timeout" in by_kernel["hang_1"]
    assert by_kernel[good.kernel_id] == {"ok"}


REQUIRED = {"device": str, "run_id": str, "kernel_id": str, "source_hash": str, "suite": str, "family": str,
            "kernel_name": str, "source": str, "arg_method": str, "args": str, "gsize": int, "lsize": int,
            "work_groups": int, "compute_units": int, "input_size": int, "status": str, "error": str,
            "median_us": float, "p20_us": float, "p80_us": float, "cv": float, "reps": int}


@needs_pocl
def test_runner_writes_opencl_rows_with_the_schema_and_resumes(tmp_path):
    from pipeline.runner import SWEEPS, run_sweep

    assert SWEEPS["opencl"] == "opencl_launches"
    rows = run_sweep("opencl", "cpu", "tiny", run_id="t1", out_dir=tmp_path)
    assert 20 <= len(rows) <= 200
    for r in rows:
        for col, typ in REQUIRED.items():
            assert isinstance(r[col], typ), (col, r[col])
        assert r["status"] in STATUSES and r["suite"] in ("generated", "benchmark")
        assert r["arg_method"] in ("simple", "memory") and r["run_id"] == "t1"
        assert (r["status"] == "ok") == math.isfinite(r["median_us"]) and (r["error"] == "") == (r["status"] == "ok")
        if r["status"] == "ok":
            assert 0 < r["p20_us"] <= r["median_us"] <= r["p80_us"] and r["reps"] >= 3
            assert r["gsize"] == r["work_groups"] * r["lsize"]
        for a in json.loads(r["args"]):
            assert a["kind"] in ("global", "local", "scalar") and {"name", "type"} <= set(a)
            assert ("value" in a) == (a["kind"] == "scalar") and ("elements" in a) != (a["kind"] == "scalar")
    suites = {r["suite"] for r in rows}
    assert suites == {"generated", "benchmark"}
    bench = [r for r in rows if r["suite"] == "benchmark"]
    assert len({r["kernel_id"] for r in bench}) == 10
    assert sum(r["status"] == "ok" for r in rows) >= 0.8 * len(rows)
    again = run_sweep("opencl", "cpu", "tiny", run_id="t2", out_dir=tmp_path)  # resumed: nothing re-measured
    key = lambda r: (r["kernel_id"], r["arg_method"], r["gsize"], r["lsize"], r["median_us"])  # noqa: E731
    assert sorted(map(key, again), key=str) == sorted(map(key, rows), key=str)


@needs_pocl
def test_asset_stores_the_device_rows_and_passes_its_checks(devchar_home):
    import dagster as dg

    from assets.samples import opencl_launches
    from pipeline.device.discover import identify
    from resources.devices import DeviceRunner
    from resources.quality import QualityGates
    from resources.warehouse import DuckDBWarehouse

    slug = identify("cpu").slug
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("devices", [slug])
    result = dg.materialize([opencl_launches], partition_key=slug, instance=instance,
                            resources={"device_runner": DeviceRunner(profile="tiny"), "warehouse": DuckDBWarehouse(),
                                       "quality_gates": QualityGates()})
    assert result.success
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks["finite_positive"] and checks["some_launches_ok"]
    n = DuckDBWarehouse().query("SELECT count(*) AS n FROM opencl_launches WHERE device = ?", [slug])["n"].iloc[0]
    assert n >= 20


def test_a_dead_workers_last_words_go_into_the_crash_row_not_the_terminal(capfd):
    """A kernel that writes past its buffers makes glibc abort the worker with its own message;
    that message belongs in the crash row, not in the middle of `devchar run`'s output."""
    import sys

    from pipeline.opencl.sweep.execute import KernelRunner, Launch

    class Aborting(KernelRunner):  # a worker that dies as a heap-corrupting kernel makes it die
        @staticmethod
        def _worker_argv(fd: int) -> list[str]:
            return [sys.executable, "-c", "import os, sys, time; time.sleep(0.5); "
                    "sys.stderr.write('free(): corrupted unsorted chunks\\n'); sys.stderr.flush(); os.abort()"]

    args = [{"name": "a", "type": "__global float *", "kind": "global", "element": "float", "elements": 8}]
    with Aborting() as runner:
        got = runner.run("__kernel void f(__global float* a) {}", "f", [Launch(8, 8, args)])
    assert got[0].status == "crash"
    assert got[0].error == "worker killed by signal 6: free(): corrupted unsorted chunks during build"
    assert "corrupted" not in capfd.readouterr().err


def test_a_worker_that_dies_starting_says_why():
    """No pyopencl, no platform, a memory limit too small for the driver: the worker's own last
    line, not a bare connection reset."""
    import sys

    import pytest

    from pipeline.opencl.sweep.execute import KernelRunner

    class Broken(KernelRunner):
        @staticmethod
        def _worker_argv(fd: int) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(0.5); "
                    "raise ModuleNotFoundError(\"No module named 'pyopencl'\")"]

    with Broken() as runner, pytest.raises(RuntimeError, match="died before answering.*No module named 'pyopencl'"):
        runner.device_info()


def test_a_device_that_cannot_build_a_kernel_is_unusable_and_says_why():
    """PoCL 3.0 on a CPU its LLVM does not know: the platform and device are there, every build
    fails with "unknown target CPU 'generic'", and pyopencl's message ends with the build
    options. The device query answers with the build log's error line, and `opencl_unusable`
    returns it (the real worker's serve loop, a fake device in place of pyopencl's)."""
    import sys

    import pytest

    from pipeline.opencl.sweep.execute import KernelRunner, OpenCLUnusableError

    fake = ("import sys; from multiprocessing.connection import Connection; "
            "import pipeline.opencl.sweep.worker as w\n"
            "class Dev:\n"
            "    def __init__(self, kind): pass\n"
            "    def info(self): raise RuntimeError('clBuildProgram failed: BUILD_PROGRAM_FAILURE\\n\\n"
            "Build on <pyopencl.Device>:\\n\\nerror: unknown target CPU \\'generic\\'\\n"
            "Device failed to build the program\\n\\n(options: -I /x/pyopencl/cl)')\n"
            "w._Device = Dev\n"
            "w.serve(Connection(int(sys.argv[1])))")

    class Unbuildable(KernelRunner):
        @staticmethod
        def _worker_argv(fd: int) -> list[str]:
            return [sys.executable, "-c", fake, str(fd)]

    with Unbuildable() as runner, pytest.raises(OpenCLUnusableError) as err:
        runner.device_info()
    assert str(err.value) == "the OpenCL cpu device cannot build a kernel: unknown target CPU 'generic'"
    assert "options" not in str(err.value)


def test_build_log_errors_keeps_the_error_lines_once():
    from pipeline.opencl.sweep.worker import build_log_errors

    log = RuntimeError("BUILD_PROGRAM_FAILURE\nerror: unknown target CPU 'generic'\nerror: unknown target CPU "
                       "'generic'\n(options: -I x)")
    assert build_log_errors(log) == "unknown target CPU 'generic'"
    assert build_log_errors(ValueError("no platforms")) == "ValueError: no platforms"


def test_no_device_is_unusable_and_a_worker_that_dies_is_a_fault(monkeypatch):
    """No OpenCL device (the worker's _Device raises): the device query says so and
    `opencl_unusable` returns it. A worker that dies starting for another reason raises: a
    broken worker must not read as a machine without OpenCL."""
    import sys

    import pytest

    from pipeline.opencl.sweep import execute

    nodev = ("import sys; from multiprocessing.connection import Connection; "
             "import pipeline.opencl.sweep.worker as w\n"
             "class Dev:\n"
             "    def __init__(self, kind): raise RuntimeError('clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR')\n"
             "w._Device = Dev\n"
             "w.serve(Connection(int(sys.argv[1])))")
    monkeypatch.setattr(execute.KernelRunner, "_worker_argv", staticmethod(lambda fd: [sys.executable, "-c", nodev,
                                                                                       str(fd)]))
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    assert execute.opencl_unusable("cpu") == ("no OpenCL cpu device: RuntimeError: clGetPlatformIDs failed: "
                                              "PLATFORM_NOT_FOUND_KHR")
    monkeypatch.setattr(execute.KernelRunner, "_worker_argv", staticmethod(
        lambda fd: [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit('worker bug')"]))
    with pytest.raises(RuntimeError, match="died before answering.*worker bug"):
        execute.opencl_unusable("cpu")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert execute.opencl_unusable("cpu") == "pyopencl is not installed here"
