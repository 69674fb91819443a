"""The CPU timing harness (harness/timer.py): statistics, repetitions by budget, noisy and stalled rows."""
import numpy as np
import pytest

from pipeline.harness.timer import Measurement, TimingSpec, measure, measure_once


def test_statistics_of_a_known_sample():
    m = Measurement(times_us=np.array([10.0, 20.0, 30.0, 40.0, 50.0]))
    assert m.median_us == 30.0
    assert m.p20_us == pytest.approx(18.0)
    assert m.p80_us == pytest.approx(42.0)
    assert m.cv == pytest.approx(np.std([10, 20, 30, 40, 50]) / 30.0)
    assert m.reps == 5
    assert m.noisy(0.1)
    row = m.row()
    assert set(row) >= {"median_us", "p20_us", "p80_us", "cv", "reps", "noisy", "remeasured"}


def test_fixed_protocol_runs_exactly_warmup_plus_reps():
    calls = []
    m = measure_once(lambda: calls.append(1), TimingSpec.fixed(warmup=5, reps=25))
    assert len(calls) == 30
    assert m.reps == 25


def test_budget_bounds_repetitions():
    spec = TimingSpec(warmup_s=0.0, budget_s=1.0, min_reps=3, max_reps=7)
    m = measure_once(lambda: None, spec)
    assert m.reps == 7  # a no-op would fill the budget many times over: capped at max_reps
    slow = TimingSpec(warmup_s=0.0, budget_s=1e-9, min_reps=4, max_reps=100)
    assert measure_once(lambda: sum(range(1000)), slow).reps == 4


def test_the_timing_scale_shrinks_the_budgets_not_the_counts(monkeypatch):
    from pipeline.harness.timer import TIMING_SCALE_ENV, scaled

    spec = TimingSpec(warmup_s=0.04, budget_s=0.2, min_reps=5, max_reps=100)
    monkeypatch.delenv(TIMING_SCALE_ENV, raising=False)
    assert scaled(spec) is spec  # unset: the profile's own budgets
    monkeypatch.setenv(TIMING_SCALE_ENV, "0.25")
    got = scaled(spec)
    assert (got.warmup_s, got.budget_s, got.min_reps, got.max_reps) == pytest.approx((0.01, 0.05, 5, 100))
    # an op of ~1 ms: about 0.2 s of repetitions unscaled would be ~200; a quarter of the budget, ~50
    import time

    m = measure_once(lambda: time.sleep(0.001), TimingSpec(warmup_s=0.0, budget_s=0.2, min_reps=3, max_reps=1000))
    assert m.reps <= 60


@pytest.mark.parametrize("raw", ["0", "-1", "fast", "inf"])
def test_a_bad_timing_scale_is_one_clear_error(monkeypatch, raw):
    from pipeline.core.errors import DevcharError
    from pipeline.harness.timer import TIMING_SCALE_ENV, timing_scale

    monkeypatch.setenv(TIMING_SCALE_ENV, raw)
    with pytest.raises(DevcharError, match=TIMING_SCALE_ENV):
        timing_scale()


def test_noisy_rows_are_remeasured_once_and_flagged():
    state = {"n": 0}

    def erratic():
        state["n"] += 1
        if state["n"] % 3 == 0:  # every third call is 2 ms slower: cv far above 0.1
            import time

            time.sleep(0.002)

    spec = TimingSpec(warmup_s=0.0, budget_s=0.0, min_reps=9, max_reps=9)
    m = measure(erratic, spec)
    assert m.remeasured
    assert m.noisy(spec.cv_threshold)
    assert state["n"] == 1 + 9 + 9  # warm-up + reps, then the reps again: the op is warm already


def test_an_op_known_warm_skips_the_warm_up():
    """measure's retry passes the per-call time it just measured: no second warm-up on the CPU."""
    calls = []
    spec = TimingSpec(warmup_s=0.0, warmup_min=3, budget_s=0.0, min_reps=2, max_reps=2)
    measure_once(lambda: calls.append(1), spec, warm_per_call_s=1e-6)
    assert len(calls) == 2  # warm already: no warm-up calls
    measure_once(lambda: calls.append(1), spec, warm_per_call_s=None)
    assert len(calls) == 2 + 3 + 2


def test_waiting_for_a_core_is_flagged_as_a_stall():
    import time

    import subprocess
    import sys

    spec = TimingSpec(warmup_s=0.0, budget_s=0.0, min_reps=5, max_reps=5)
    # In a process of its own, idle for a moment first: the CPU use measured is the process's, and
    # numpy's BLAS threads spin for tens of ms after its import or a call (util 0.75 for a sleeping
    # op right after `import numpy` on the EPYC VM, 0.64 once in a full test run, after other tests).
    code = ("import time; from pipeline.harness.timer import TimingSpec, measure_once; time.sleep(0.3); "
            f"m = measure_once(lambda: time.sleep(0.002), {spec!r}); "  # wall time passes, no CPU is used
            "print(m.stalled, m.noisy(1e9), m.cpu_util)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["True", "True"] and float(out[2]) < 0.5

    def busy():  # 10 ms a call: one host preemption of a few ms cannot take half of the 50 ms
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.010:
            pass

    working = measure_once(busy, spec)
    assert not working.stalled and working.cpu_util > 0.5
    assert working.row()["stalled"] is False


def test_a_step_counts_the_pages_it_faults_in():
    import mmap

    def fresh_pages():  # an anonymous mapping is fresh every call: each page written faults once
        m = mmap.mmap(-1, 64 * 4096)
        for i in range(64):
            m[i * 4096] = 1
        m.close()

    from pipeline.harness.timer import measure_step

    m = measure_step(fresh_pages, TimingSpec.fixed(warmup=1, reps=5))
    assert 60 <= m.faults_per_call <= 80
    assert measure_step(lambda: None, TimingSpec.fixed(warmup=1, reps=5)).faults_per_call < 5
    assert "faults_per_call" in m.row()


def test_the_timing_scale_shortens_a_profile_but_keeps_its_grids(monkeypatch):
    from pipeline.harness.timer import TIMING_SCALE_ENV
    from pipeline.sweeps.profiles import get_profile

    monkeypatch.delenv(TIMING_SCALE_ENV, raising=False)
    plain = get_profile("quick")
    monkeypatch.setenv(TIMING_SCALE_ENV, "0.25")
    short = get_profile("quick")
    assert (short.k_values, short.gemm_aspect_k, short.workload_batches) == (
        plain.k_values, plain.gemm_aspect_k, plain.workload_batches)
    assert short.stall_wait_s == pytest.approx(plain.stall_wait_s / 4)
    assert 3 <= short.workload_reps < plain.workload_reps and 1 <= short.workload_warmup <= plain.workload_warmup
    assert short.workload_passes == 1 < plain.workload_passes  # a test's run times its workloads once
    assert short.tile_probe_rounds == 1 < plain.tile_probe_rounds  # and probes the tile once
    # the points past a quarter of the FLOP caps are skipped (a point's counts do not scale)
    assert (short.max_point_flops, short.max_wave_flops, short.max_aspect_flops) == pytest.approx(
        (plain.max_point_flops / 4, plain.max_wave_flops / 4, plain.max_aspect_flops / 4))
    monkeypatch.setenv(TIMING_SCALE_ENV, "2")  # more repetitions, never a larger grid
    assert get_profile("quick").max_point_flops == plain.max_point_flops
    assert get_profile("quick").tile_probe_rounds == plain.tile_probe_rounds  # an odd count: no ties


def test_a_shortened_profile_drops_only_the_gemm_points_past_its_caps(monkeypatch):
    from pipeline.device.discover import identify
    from pipeline.harness.timer import TIMING_SCALE_ENV
    from pipeline.sweeps.gemm_points import aspect_points, batch_points
    from pipeline.sweeps.profiles import get_profile

    dev = identify("cpu")
    monkeypatch.delenv(TIMING_SCALE_ENV, raising=False)
    plain = get_profile("quick")
    full = set(aspect_points(dev, plain) + batch_points(dev, plain))
    monkeypatch.setenv(TIMING_SCALE_ENV, "0.25")
    short = get_profile("quick")
    kept = set(aspect_points(dev, short) + batch_points(dev, short))
    assert kept < full
    flops = lambda p: 2 * p.batch * p.m * p.n * p.k  # noqa: E731
    assert all(flops(p) > min(short.max_aspect_flops, short.max_point_flops) for p in full - kept)
    assert {(p.op, p.dtype, p.k) for p in kept} == {(p.op, p.dtype, p.k) for p in full}  # every K still timed
    # the cells past the whole-wave outputs, which no FLOP cap bounds, are left out too
    assert any(p.batch * p.m * p.n > plain.max_gemm_outputs for p in full)
    assert not [p for p in kept if p.batch * p.m * p.n > short.max_gemm_outputs]
