"""Fresh-output page faults: counted per call by the harness, costed by a probe, taken off the
GEMM tables and charged back by output size (harness/page_faults.py, predict/page_faults.py)."""
import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.harness.page_faults import fault_us_per_page, minor_faults
from pipeline.harness.timer import TimingSpec, measure
from pipeline.predict.gemm import GemmModel
from pipeline.predict.page_faults import PAGE_BYTES, OutputFaults, without_faults

US_PER_PAGE = 1.0


def _rows(faulting_from_bytes: float) -> pd.DataFrame:
    """A whole-wave grid on 2 slots whose kernel runs 1 FLOP/ps, plus the faults of every output
    at or above `faulting_from_bytes` (1 us per 4 KiB page), as the sweep would count them."""
    rows = []
    for w, (m, n) in enumerate(((64, 64), (256, 256), (1024, 1024), (4096, 4096)), start=1):
        for k in (32, 64, 128):
            out = m * n * 4
            pages = np.ceil(out / PAGE_BYTES)
            faults = pages if out >= faulting_from_bytes else 0.0
            rows.append(dict(op="mm", dtype="float32", kernel="cpu", tile_m=1, tile_n=1, slots=2, batch=1, m=m, n=n,
                             k=k, waves=m * n // 2, median_us=2.0 * m * n * k / 1e6 + faults * US_PER_PAGE,
                             p20_us=2.0 * m * n * k / 1e6 + faults * US_PER_PAGE,
                             p80_us=2.0 * m * n * k / 1e6 + faults * US_PER_PAGE, held_out=False,
                             faults_per_call=faults, fault_us_per_page=US_PER_PAGE))
    return pd.DataFrame(rows)


def test_faults_are_taken_off_the_tables_and_charged_by_output_size():
    rows = _rows(faulting_from_bytes=32 << 20)  # only the 64 MB outputs fault
    model = GemmModel.fit(rows)
    compute = lambda m, n, k: 2.0 * m * n * k / 1e6  # noqa: E731
    # a 4 MB output (1024 x 1024) is the kernel alone; a 64 MB one pays 16384 pages
    assert model.predict("mm", "float32", 1024, 1024, 64) == pytest.approx(compute(1024, 1024, 64), rel=1e-6)
    assert model.predict("mm", "float32", 4096, 4096, 64) == pytest.approx(compute(4096, 4096, 64) + 16384, rel=1e-6)
    # between the grid's outputs the table interpolates the kernel only: a 16 MB output (2048^2,
    # in the class of the 4 MB ones, which did not fault) is not charged the big cell's faults
    mid = float(model.predict("mm", "float32", 2048, 2048, 64))
    assert mid == pytest.approx(compute(2048, 2048, 64), rel=0.05)
    # saved and loaded, the same
    again = GemmModel.from_dict(model.to_dict())
    assert again.predict("mm", "float32", 4096, 4096, 64) == pytest.approx(model.predict("mm", "float32", 4096, 4096, 64))


def test_the_ladder_probe_charges_large_outputs_the_sweep_heap_served_without_faults():
    """Rows whose large outputs the sweep's heap served fault-free (none counted) still price an
    output past the ladder's `fault_from_bytes` with every page, as a step's process faults it;
    the classes below it keep the rows' own counts."""
    rows = _rows(faulting_from_bytes=np.inf).assign(fault_from_bytes=float(32 << 20))
    model = GemmModel.fit(rows)
    compute = lambda m, n, k: 2.0 * m * n * k / 1e6  # noqa: E731
    assert model.predict("mm", "float32", 4096, 4096, 64) == pytest.approx(compute(4096, 4096, 64) + 16384, rel=1e-6)
    # 100 MB, in the 64 MiB rows' class (which counted none): every page
    assert model.faults.fault_us([100e6])[0] == pytest.approx(np.ceil(100e6 / PAGE_BYTES) * US_PER_PAGE)
    # under it (a 16 MB output) the rows' own count: none
    assert model.predict("mm", "float32", 2048, 2048, 64) == pytest.approx(compute(2048, 2048, 64), rel=0.05)
    without = GemmModel.fit(rows.drop(columns=["fault_from_bytes"]))
    assert without.predict("mm", "float32", 4096, 4096, 64) == pytest.approx(compute(4096, 4096, 64), rel=1e-6)


def test_the_ladder_starts_where_every_larger_size_faults():
    from pipeline.harness.page_faults import fault_from_bytes, faulting_tail

    assert faulting_tail([8, 16, 32, 64], [True, False, True, True]) == 32
    assert faulting_tail([8, 16, 32, 64], [True, True, True, True]) == 8
    assert faulting_tail([8, 16, 32, 64], [True, True, True, False]) is None
    # the probe itself, in a child process set up as a step's: under glibc, whose dynamic mmap
    # threshold stops at 32 MiB, a 64 MiB block is a fresh mapping every time
    import platform

    from pipeline.workloads.isolated import ADAPT_BYTES

    found = fault_from_bytes(ADAPT_BYTES, sizes_mb=(8, 64))
    if platform.libc_ver()[0] == "glibc":
        assert found in (float(8 << 20), float(64 << 20))
    else:
        assert found in (None, float(8 << 20), float(64 << 20))


def test_the_sweep_goes_on_without_the_ladder(monkeypatch):
    """A probe that fails or finds nothing leaves the column out: the rows' own counts price."""
    from pipeline.sweeps import gemm

    said = []

    def broken(adapt_bytes):
        raise RuntimeError("the page-fault ladder probe failed (exit 1): ModuleNotFoundError")

    monkeypatch.setattr(gemm, "fault_from_bytes", broken)
    assert gemm._fault_from(said.append) == {} and "ModuleNotFoundError" in said[0]
    monkeypatch.setattr(gemm, "fault_from_bytes", lambda adapt_bytes: None)
    assert gemm._fault_from(said.append) == {}
    monkeypatch.setattr(gemm, "fault_from_bytes", lambda adapt_bytes: float(32 << 20))
    assert gemm._fault_from(said.append) == {"fault_from_bytes": float(32 << 20)} and "32 MiB" in said[-1]


def test_rows_without_counts_fit_as_before():
    rows = _rows(faulting_from_bytes=np.inf).drop(columns=["faults_per_call", "fault_us_per_page"])
    model = GemmModel.fit(rows)
    assert model.faults is None and "output_faults" not in model.to_dict()
    assert without_faults(rows) is rows
    assert OutputFaults.fit(rows.assign(faults_per_call=3.0, fault_us_per_page=0.0)) is None  # free faults: none


def test_a_miscount_never_leaves_a_negative_kernel():
    rows = _rows(faulting_from_bytes=0).assign(faults_per_call=1e9)
    assert (without_faults(rows)["median_us"] > 0).all()


def test_the_harness_counts_the_faults_of_a_fresh_output():
    n = (64 << 20) // 4  # 64 MB: above glibc's mmap threshold, a fresh mapping per call
    fresh = measure(lambda: torch.empty(n).fill_(1.0), TimingSpec(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3))
    kept_buf = torch.empty(n)
    kept = measure(lambda: kept_buf.fill_(1.0), TimingSpec(warmup_s=0.0, budget_s=0.0, min_reps=3, max_reps=3))
    pages = n * 4 / PAGE_BYTES
    assert fresh.faults_per_call > 0.5 * pages and kept.faults_per_call < 0.01 * pages
    assert fresh.row()["faults_per_call"] == fresh.faults_per_call
    assert minor_faults() > 0 and fault_us_per_page(8 << 20, reps=3) >= 0.0


def test_rows_timed_into_a_kept_output_give_the_kernel_and_the_faults_cost():
    """Faulting rows also timed into a kept output: the table takes the kept time, and a fault
    costs what those pairs say (2 us a page here) rather than the probe's 1 us."""
    rows = _rows(faulting_from_bytes=32 << 20)
    compute = 2.0 * rows["m"] * rows["n"] * rows["k"] / 1e6
    big = rows["faults_per_call"] > 0
    rows.loc[big, "median_us"] = compute[big] + 2.0 * rows.loc[big, "faults_per_call"]  # the true cost: 2 us
    rows["kept_us"] = np.where(big, compute, np.nan)
    model = GemmModel.fit(rows)
    assert model.faults.us_per_page == pytest.approx(2.0)
    assert without_faults(rows).loc[big, "median_us"].to_numpy() == pytest.approx(compute[big].to_numpy())
    assert model.predict("mm", "float32", 4096, 4096, 64) == pytest.approx(2.0 * 4096 * 4096 * 64 / 1e6 + 2 * 16384,
                                                                          rel=1e-6)


def test_a_fault_costs_what_the_held_output_timing_says_where_the_sweep_took_one():
    """Faulting rows whose harness time also frees each output (2 us a page in all) and whose
    held-output time does not (1.5 us): a page is charged the held one, the step's own free being
    the end-to-end predictors' (graph_predict.output_free_us); rows without it as before."""
    rows = _rows(faulting_from_bytes=32 << 20)
    compute = 2.0 * rows["m"] * rows["n"] * rows["k"] / 1e6
    big = rows["faults_per_call"] > 0
    rows.loc[big, "median_us"] = compute[big] + 2.0 * rows.loc[big, "faults_per_call"]
    rows["kept_us"] = np.where(big, compute, np.nan)
    held = rows.assign(held_us=np.where(big, compute + 1.5 * rows["faults_per_call"], np.nan),
                       held_faults=np.where(big, rows["faults_per_call"], np.nan))
    assert GemmModel.fit(held).faults.us_per_page == pytest.approx(1.5)
    assert GemmModel.fit(rows).faults.us_per_page == pytest.approx(2.0)
    # half the held timings faulted every other call: their own count, not the harness's, divides
    halved = held.assign(held_us=np.where(big, compute + 0.75 * rows["faults_per_call"], np.nan),
                         held_faults=np.where(big, rows["faults_per_call"] / 2, np.nan))
    assert GemmModel.fit(halved).faults.us_per_page == pytest.approx(1.5)
    # a row without a held timing (NaN) falls back to its harness time
    mixed = held.copy()
    mixed.loc[mixed.index[big][:1], ["held_us", "held_faults"]] = np.nan
    assert GemmModel.fit(mixed).faults.us_per_page == pytest.approx(1.5)


def test_the_held_output_timing_leaves_the_previous_outputs_free_out():
    """A call whose output takes 20 ms to free: timed held, the free falls between calls; and
    during every call the previous output is alive."""
    import time

    from pipeline.harness.page_faults import held_output_us

    alive, seen = [0], []

    class SlowToFree:
        def __init__(self):
            seen.append(alive[0])  # outputs alive as this call runs
            alive[0] += 1

        def __del__(self):
            alive[0] -= 1
            time.sleep(0.02)

    us, faults = held_output_us(SlowToFree, reps=3)
    assert us < 10_000 and faults >= 0
    assert seen[0] == 0 and all(n >= 1 for n in seen[1:])


@pytest.mark.parametrize("op", ["mm", "bmm", "linear"])
def test_the_kept_output_twin_computes_what_the_sweep_timed(op):
    from pipeline.harness import random_pool
    from pipeline.sweeps.gemm import gemm_callable, output_faulted
    from pipeline.sweeps.gemm_points import GemmPoint

    random_pool.release()  # the inputs' offsets start over for each callable: the same inputs
    kept = gemm_callable(op, "float32", 2, 8, 16, 4, "cpu", kept_output=True)()
    random_pool.release()
    assert torch.allclose(kept, gemm_callable(op, "float32", 2, 8, 16, 4, "cpu")(), atol=1e-5)
    random_pool.release()
    p = GemmPoint(op, "float32", 1, 1024, 1024, 64, False)  # 4 MB: 1024 pages
    assert output_faulted(1024.0, p) and not output_faulted(10.0, p) and not output_faulted(None, p)


def test_a_cpu_linear_is_timed_bias_free_as_its_captured_gemm_runs():
    """CPU addmm broadcasts a bias in its own aten::copy_, priced apart (copy_bcast): the linear
    table holds the bare x @ W^T, fresh and kept alike (rotated twins: test_cold_weights.py)."""
    from pipeline.harness import random_pool
    from pipeline.sweeps.gemm import gemm_callable, linear_has_bias

    for kept in (False, True):
        random_pool.release()  # the offsets start over: the callable's inputs are these two
        a, w = random_pool.randn(8, 4), random_pool.randn(16, 4)
        random_pool.release()
        assert torch.allclose(gemm_callable("linear", "float32", 1, 8, 16, 4, "cpu", kept_output=kept)(), a @ w.t(),
                              atol=1e-5)
    random_pool.release()
    assert not linear_has_bias("cpu") and linear_has_bias("cuda") and linear_has_bias("cuda:1")
