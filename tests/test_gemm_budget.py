"""The CPU GEMM sweep's call budget: points a dtype cannot time in budget (its rate at 512^3,
then each point's first calls) are left out and said."""
import numpy as np


def test_points_over_the_call_budget_at_their_dtypes_rate_are_left_out():
    from pipeline.sweeps.gemm_points import GemmPoint, within_call_budget

    pts = [GemmPoint("mm", dt, 1, 1000, 1000, k, False) for dt in ("float32", "bfloat16", "float16")
           for k in (1, 100, 1000)]  # 2e6, 2e8, 2e9 FLOPs
    kept, dropped = within_call_budget(pts, {"float32": 1e11, "bfloat16": 1e9}, 0.5)
    assert [(p.dtype, p.k) for p in kept] == [("float32", 1), ("float32", 100), ("float32", 1000),
                                              ("bfloat16", 1), ("bfloat16", 100),  # 0.2 s a call
                                              ("float16", 1), ("float16", 100), ("float16", 1000)]  # no rate
    assert [(p.dtype, p.k) for p in dropped] == [("bfloat16", 1000)]
    assert within_call_budget(pts, {}, 0.5) == (pts, [])


def test_a_line_base_is_left_out_with_its_twin_not_kept_alone():
    """A line base (grid line_n) has one column fewer than its twin, so a base just under the cap
    would be kept while its twin was dropped, costing a call near the cap and pairing with nothing."""
    from pipeline.predict.gemm_grids import LINE_BASE_GRID, TWIN_N_GRID
    from pipeline.sweeps.gemm_points import GemmPoint, within_call_budget

    base = GemmPoint("linear", "float32", 1, 1000, 1000, 1000, False, LINE_BASE_GRID)  # 2e9 FLOPs
    twin = GemmPoint("linear", "float32", 1, 1000, 1001, 1000, False, TWIN_N_GRID)
    plain = GemmPoint("linear", "float32", 1, 1000, 1000, 1000, False, "aspect")
    rate = 2.001e9 / 1.0  # the base and the plain cell fit in 1 s, the twin does not
    kept, dropped = within_call_budget([plain, base, twin], {"float32": rate}, 1.0)
    assert kept == [plain] and dropped == [base, twin]


def test_the_cpu_sweep_leaves_out_what_a_dtype_run_in_software_cannot_time_in_budget(cpu, monkeypatch):
    """bf16 on a CPU without bf16 instructions ran 110x slower than float32 (AMD EPYC family 25
    model 1): the sweep measures each dtype's rate and leaves its over-budget points out, saying so."""
    from dataclasses import replace

    from pipeline.harness.timer import Measurement
    from pipeline.sweeps import gemm
    from pipeline.sweeps.profiles import get_profile

    timed, said = [], []
    monkeypatch.setattr(gemm, "measure", lambda fn, *a, **k: Measurement(times_us=np.ones(3), cpu_util=1.0))
    monkeypatch.setattr(gemm, "cpu_kernel_name", lambda fn: "cpu-kernel")
    monkeypatch.setattr(gemm, "_fault_from", lambda log=None: {})  # no child probe for a fake sweep
    monkeypatch.setattr(gemm, "cpu_tiles", lambda dev, profile, log=None: {})

    def fake_callable(op, dtype, b, m, n, k, device):
        timed.append((dtype, 2 * b * m * n * k))
        return lambda: None

    monkeypatch.setattr(gemm, "gemm_callable", fake_callable)
    readings = {"float32": iter([5e10, 1e11]), "bfloat16": iter([1e6, 5e5])}  # the quicker of two is the rate
    monkeypatch.setattr(gemm, "peak_matmul_flops", lambda dev, dt, size: next(readings[dt]))
    profile = replace(get_profile("tiny", "cpu"), gemm_max_call_s=0.01)  # bf16: 1e4 FLOPs a call
    rows = gemm.sweep_gemm(cpu, profile, log=said.append)
    every = gemm.sweep_points(cpu, profile, {})
    big_bf16 = [p for p in every if p.dtype == "bfloat16" and 2 * p.batch * p.m * p.n * p.k > 1e4]
    assert big_bf16 and len(rows) == len(every) - len(big_bf16)
    assert all(f <= 1e4 for dt, f in timed if dt == "bfloat16") and any(dt == "bfloat16" for dt, _ in timed)
    assert sum(1 for r in rows if r["dtype"] == "float32") == sum(1 for p in every if p.dtype == "float32")
    held = sum(p.held_out for p in big_bf16)
    assert f"{len(big_bf16)} bfloat16 points over 0.01 s a call left out: {len(big_bf16) - held} of the grids " \
           f"(filled at fit time), {held} held-out (not scored)" in said
    assert any(s.startswith("matmul rates at 512^3, the quicker of two readings: float32 100 GFLOP/s") for s in said)


def test_the_full_profile_allows_ten_times_the_quick_ones_call_budget():
    from pipeline.sweeps.profiles import get_profile

    assert get_profile("quick").gemm_max_call_s == 0.5 and get_profile("full").gemm_max_call_s == 5.0


def _clocked_sweep(cpu, monkeypatch, call_s, **profile_changes):
    """sweep_gemm on the tiny profile with fake GEMMs whose calls advance a fake clock by
    call_s(dtype, m, n, calls so far of that point); returns (rows, every point, timed fns, log)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from pipeline.harness.timer import Measurement
    from pipeline.sweeps import gemm
    from pipeline.sweeps.profiles import get_profile

    clock, timed, said, shape_of = [0.0], [], [], {}

    def fake_callable(op, dtype, b, m, n, k, device, **kw):
        calls = [0]

        def fn():
            clock[0] += call_s(dtype, m, n, calls[0])
            calls[0] += 1
        shape_of[fn] = (dtype, m, n)
        return fn

    def fake_name(fn):
        fn()  # the kernel-naming call runs the GEMM once
        return "cpu-kernel"

    def fake_measure(fn, *a, **k):
        timed.append(shape_of[fn])
        return Measurement(times_us=np.ones(3), cpu_util=1.0)

    monkeypatch.setattr(gemm, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    from pipeline.harness import repeat, revisit, stalls, suspects

    for module in (gemm, revisit, suspects, stalls, repeat):  # every visit's timing, none of them real
        monkeypatch.setattr(module, "measure", fake_measure)
    monkeypatch.setattr(gemm, "cpu_kernel_name", fake_name)
    monkeypatch.setattr(gemm, "_fault_from", lambda log=None: {})  # no child probe for a fake sweep
    monkeypatch.setattr(gemm, "cpu_tiles", lambda dev, profile, log=None: {})
    monkeypatch.setattr(gemm, "gemm_callable", fake_callable)
    monkeypatch.setattr(gemm, "peak_matmul_flops", lambda dev, dt, size: 1e15)  # the rate lets every point in
    profile = replace(get_profile("tiny", "cpu"), gemm_max_call_s=0.5, **profile_changes)
    rows = gemm.sweep_gemm(cpu, profile, log=said.append)
    return rows, gemm.sweep_points(cpu, profile, {}), timed, said


def test_a_point_whose_first_two_calls_run_over_twice_the_budget_is_left_out_before_it_is_timed(cpu, monkeypatch):
    """The rate at 512^3 misjudges some shapes (the AVX2 EPYC's software bf16 ran 4 x 65536 x 1024
    at a fifth of it): a point whose first call, the kernel-naming one, and one more both take
    over twice the call budget is never timed, on any visit, and the sweep says how many."""
    def call_s(dtype, m, n, i):
        return 1.5 if dtype == "bfloat16" and m * n >= 1024 else 1e-4

    rows, every, timed, said = _clocked_sweep(cpu, monkeypatch, call_s, visits=2)
    slow = [p for p in every if p.dtype == "bfloat16" and p.m * p.n >= 1024]
    held = sum(p.held_out for p in slow)
    assert slow and held and len(rows) == len(every) - len(slow)
    assert not any(r["dtype"] == "bfloat16" and r["m"] * r["n"] >= 1024 for r in rows)
    assert timed and not any(dt == "bfloat16" and m * n >= 1024 for dt, m, n in timed)  # nor on the second visit
    assert (f"{len(slow)} bfloat16 points left out after two calls over 1 s (twice the budget; the slowest "
            f"1.5 s): {len(slow) - held} of the grids (filled at fit time), {held} held-out (not scored)") in said


def test_a_slow_first_call_followed_by_a_quick_one_keeps_its_point(cpu, monkeypatch):
    """One call in a slow spell: the second call is under the limit, so the cell is timed."""
    rows, every, _, said = _clocked_sweep(cpu, monkeypatch, lambda dt, m, n, i: 1.5 if i == 0 else 1e-4)
    assert len(rows) == len(every) and not any("left out after two calls" in s for s in said)


def test_a_first_call_under_twice_the_budget_keeps_its_point(cpu, monkeypatch):
    rows, every, _, _ = _clocked_sweep(cpu, monkeypatch, lambda dt, m, n, i: 0.9)  # over the budget, under twice it
    assert len(rows) == len(every)
