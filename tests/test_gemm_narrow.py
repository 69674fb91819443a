"""The narrow grid: every whole N under a cache line off the aspect lattice, and the correction
the GEMM model fits from it (predict/gemm_narrow.py)."""
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_narrow import NARROW_GRID, NarrowCorrection


def _waves_rows() -> pd.DataFrame:
    """The conftest's made-up whole-wave sweep, for mm and (at batch 8) bmm."""
    return pd.DataFrame([dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=b,
                              m=m, n=n, k=k, waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False, grid="waves")
                         for op, b in (("mm", 1), ("bmm", 8))
                         for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64)))
                         for k in (32, 64, 128, 256)])


def test_a_slow_n_between_lattice_columns_is_priced_at_every_m_k_and_batch():
    """A made-up CPU where N = 9 runs 3x what the lattice implies and the other narrow N as it
    implies, one cell timed in a stall, and each narrow row paying page faults besides (taken off
    before the fit): the fitted correction prices N = 9's kernel 3x at an M, K the grid never
    timed, leaves N = 8 alone, and saves and loads back."""
    fault_us, pages = 2.0, 5.0  # a row's faults: taken off before the fit, charged back by output size
    rows = _waves_rows().assign(fault_us_per_page=fault_us, faults_per_call=0.0)
    plain = GemmModel.fit(rows)
    cells = pd.DataFrame([dict(m=m, n=n, k=k) for m, k in ((64, 256), (1024, 64), (256, 32))
                          for n in (3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)])
    price = plain.predict("mm", "float32", cells["m"], cells["n"], cells["k"], 1)
    cost = np.where(cells["n"] == 9, 3.0, 1.0)
    cost[(cells["m"] == 256) & (cells["n"] == 9)] = 30.0  # one stalled timing: outvoted by the median
    narrow = rows.iloc[:1].drop(columns=["m", "n", "k", "median_us"]).merge(cells, how="cross").assign(
        grid=NARROW_GRID, median_us=price * cost + pages * fault_us, faults_per_call=pages)
    fitted = GemmModel.fit(pd.concat([rows, narrow], ignore_index=True))
    at = dict(m=np.array([16, 512]), k=np.array([100, 100]), batch=np.array([1, 1]))
    for n, want in ((9, 3.0), (8, 1.0)):
        shapes = {**at, "n": np.array([n, n])}
        kernel = fitted.predict("mm", "float32", **shapes, faults=False)
        assert kernel == pytest.approx(want * plain.predict("mm", "float32", **shapes, faults=False))
    again = GemmModel.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again.predict("mm", "float32", 16, 9, 100) == pytest.approx(fitted.predict("mm", "float32", 16, 9, 100))
    assert "narrow_corrections" not in plain.to_dict()  # a model without the grid saves as before


def test_the_correction_is_the_median_per_n_one_elsewhere_and_fades_below_the_grids_k():
    rows = pd.DataFrame({"n": [5, 5, 5, 9], "k": [64, 256, 64, 256], "median_us": [2.0, 4.0, 400.0, 10.0]})
    c = NarrowCorrection.fit("mm", "float32", rows, np.array([2.0, 2.0, 2.0, 5.0]))
    assert list(c.ns) == [5, 9] and c.k_min == 64
    assert c.factor(np.array([5, 9, 7, 4, 100]), 64) == pytest.approx([2.0, 2.0, 1.0, 1.0, 1.0])
    assert c.factor(5, 4096) == pytest.approx(2.0)  # held above the grid's K
    # below it, faded in log2 K: half of log 2 at K = 8, none at K = 1 (an outer product)
    assert c.factor(np.array([5, 5]), np.array([8, 1])) == pytest.approx([2 ** 0.5, 1.0])


def test_twins_at_a_narrow_n_join_its_rows():
    """The unaligned twin at N = 5 (the sweep times that shape once, as a twin) is fitted with the
    narrow rows; a twin at N = 17, which the narrow grid does not time for float32, is not."""
    rows = _waves_rows()
    plain = GemmModel.fit(rows)
    base = rows.iloc[:1].drop(columns=["m", "n", "k", "median_us"])

    def at(n, grid, cost, m=64, k=256):
        return base.assign(m=m, n=n, k=k, grid=grid,
                           median_us=cost * float(plain.predict("mm", "float32", m, n, k)))
    narrow = pd.concat([at(5, NARROW_GRID, 1.0, m=1024, k=64), at(7, NARROW_GRID, 1.0),
                        at(5, "unaligned_n", 4.0), at(5, "unaligned_n", 4.0, m=256), at(17, "unaligned_n", 4.0)])
    fitted = GemmModel.fit(pd.concat([rows, narrow], ignore_index=True))
    corr = fitted.narrow_corrections[("mm", "float32")]
    assert list(corr.ns) == [5, 7]
    assert corr.factor(5, 256) == pytest.approx(4.0)  # the median of 1, 4, 4
    assert corr.factor(17, 256) == 1.0


def test_the_cpu_sweep_times_every_narrow_n_off_the_lattice(cpu):
    from pipeline.sweeps.gemm_points import BMM_ASPECT_BATCH, lattice_sides, narrow_points, sweep_points
    from pipeline.sweeps.profiles import get_profile

    profile = get_profile("quick", "cpu")
    pts = narrow_points(cpu, profile)
    assert {(p.op, p.batch) for p in pts} == {("mm", 1), ("linear", 1), ("bmm", BMM_ASPECT_BATCH)}
    assert {(p.m, p.k) for p in pts} == set(profile.gemm_narrow_cells)
    ns = {d: sorted({p.n for p in pts if p.dtype == d}) for d in ("float32", "bfloat16")}
    assert ns["float32"] == [3, *range(5, 16)]  # a line holds 16 float32: 1, 2, 4 and 16 are the lattice's
    assert ns["bfloat16"] == [3, *range(5, 16), *range(17, 33)]
    assert not set(ns["bfloat16"]) & set(lattice_sides(profile.gemm_aspect_max))
    assert not any(p.held_out for p in pts)
    swept = sweep_points(cpu, profile, {})
    # a shape the twins time (N = 5 at their K on a narrow cell) is timed once, as a twin
    twins = {p.shape for p in swept if p.grid == "unaligned_n"}
    kept = [p for p in swept if p.grid == NARROW_GRID]
    assert len(kept) == len([p for p in pts if p.shape not in twins]) < len(pts)
    assert not {p.shape for p in kept} & twins
    assert narrow_points(replace(cpu, kind="cuda"), profile) == []
