"""The CPU GEMM model's unaligned twins: aspect cells with N or K one more (rows that end mid
cache line), and where a cell's rows alias, its N twin's base one line wider."""
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.gemm_alias import rows_alias
from pipeline.predict.gemm_grids import LINE_BASE_GRID, line_elements


def test_unaligned_twins_price_rows_that_end_mid_cache_line(synthetic_gemm_model):
    """A made-up CPU where N one off a cache line costs 1.5x beyond the extra FLOPs at M <= 64
    (and nothing at M >= 256), K one off costs nothing, and one twin was timed in a stall: the
    fitted correction applies 1.5x to unaligned N at M = 16, leaves aligned shapes and M = 1024
    alone, ignores the stalled cell, and saves and loads back."""
    from pipeline.predict.gemm_grids import is_aligned

    table = synthetic_gemm_model.table("mm", "float32")
    sides = [16, 64, 256, 1024]
    cells = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in sides for n in sides])
    base = cells.assign(median_us=table.predict_us(cells["m"], cells["n"], cells["k"], cells["batch"]))
    cost = np.where(cells["m"] <= 64, 1.5, 1.0)
    cost[(cells["m"] == 16) & (cells["n"] == 64)] = 1e-3  # a twin far faster than its base: a stalled base
    twin_n = cells.assign(n=cells["n"] + 1, grid="unaligned_n",
                          median_us=base["median_us"] * (cells["n"] + 1) / cells["n"] * cost)
    twin_k = cells.assign(k=65, grid="unaligned_k", median_us=base["median_us"] * 65 / 64)
    fixed = table.with_aspect(base).with_alignment(base, pd.concat([twin_n, twin_k], ignore_index=True))
    assert fixed.alignment_factor(16, 257, 64) == pytest.approx(1.5)
    assert fixed.alignment_factor(16, 65, 64) == pytest.approx(1.5)  # the stalled cell outvoted
    assert fixed.alignment_factor(16, 256, 64) == pytest.approx(1.0)  # aligned: untouched
    assert fixed.alignment_factor(1024, 257, 65) == pytest.approx(1.0)  # no cost measured there
    again = GemmTable.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert again.alignment_factor(16, 257, 64) == pytest.approx(1.5)
    assert fixed.alignment_factor(16, 257, 2) == pytest.approx(1.5)  # K = 2: shorter than a line, not charged
    assert fixed.alignment_factor(16, 7, 64) == pytest.approx(1.0)  # N = 7: the grid's own sub-line sides
    assert is_aligned(16, "float32") and not is_aligned(50257, "float32") and is_aligned(32, "bfloat16")
    assert "unaligned_n_log" not in table.to_dict()


def _twin_cell_n(p) -> int:
    """The aspect cell's N of an N twin (or of its base a line wider, LINE_BASE_GRID)."""
    line = line_elements(p.dtype)
    n = p.n - (p.grid == "unaligned_n")
    return n - line if n > line and rows_alias(n - line, p.dtype) and not rows_alias(n, p.dtype) else n


def test_an_n_twin_of_an_aliasing_cell_pairs_with_its_base_one_line_wider(synthetic_gemm_model):
    """A made-up CPU where rows of a 4 KiB multiple (N = 1024, 4096 in float32) run 2x, one line
    wider they do not, and a row ending mid line costs 1.2x: an odd N is priced 1.2x its aligned
    neighbour, not 1.2x less the aliasing (0.6x), which a twin beside the aliasing base measures.
    The line-wider bases never enter the table (GemmModel.fit routes them to the twins)."""
    table = synthetic_gemm_model.table("mm", "float32")
    cells = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in (16, 64, 256, 1024) for n in (1024, 4096)])

    def timed(df, factor):
        return df.assign(median_us=table.predict_us(df["m"], df["n"], df["k"], df["batch"]) * factor)

    base = timed(cells, 2.0)
    wider = timed(cells.assign(n=cells["n"] + 16), 1.0).assign(grid=LINE_BASE_GRID)
    # each twin's time is its base's, scaled by its extra column's FLOPs, times its own cost
    twin = wider.assign(n=wider["n"] + 1, grid="unaligned_n", median_us=wider["median_us"] * (wider["n"] + 1) / wider["n"] * 1.2)
    # a K twin still pairs with the aliasing cell itself: K one off costs 1.1x there
    twin_k = base.assign(k=65, grid="unaligned_k", median_us=base["median_us"] * 65 / 64 * 1.1)
    fixed = table.with_aspect(base).with_alignment(base, pd.concat([wider, twin, twin_k], ignore_index=True))
    assert fixed.alignment_factor(64, 2049, 64) == pytest.approx(1.2, rel=1e-3)
    assert fixed.alignment_factor(64, 2048, 64) == pytest.approx(1.0)
    assert fixed.alignment_factor(64, 2048, 65) == pytest.approx(1.1, rel=1e-3)
    assert fixed.alignment_factor(64, 2049, 65) == pytest.approx(1.32, rel=1e-3)
    # an old calibration's twin one past the aliasing N still pairs with it (the seven references)
    old = base.assign(n=base["n"] + 1, grid="unaligned_n", median_us=base["median_us"] * (base["n"] + 1) / base["n"] * 0.6)
    assert table.with_aspect(base).with_alignment(base, old).alignment_factor(64, 2049, 64) == pytest.approx(0.6, rel=1e-3)
    rows = pd.concat([base.assign(grid="aspect"), wider, twin], ignore_index=True).assign(
        op="mm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, waves=1, held_out=False)
    waves_rows = rows.iloc[:1].assign(m=8, n=16, k=32, grid="waves", median_us=10.0)
    fitted = GemmModel.fit(pd.concat([waves_rows, rows], ignore_index=True)).table("mm", "float32")
    assert fitted.ks.tolist() == [32]  # the whole-wave row's K alone: the K = 64 rows stayed out
    assert fitted.alignment_factor(64, 2049, 64) > 1.1  # the fit paired the twins with their bases


def test_a_bfloat16_twin_pairs_with_its_base_32_elements_wider(synthetic_gemm_model):
    """bfloat16's line is 32 elements: its aliasing cells (N = 2048, 8192) pair their twins at
    N + 33 with bases at N + 32, filed under N."""
    table = replace(synthetic_gemm_model.table("mm", "float32"), dtype="bfloat16")
    cells = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in (16, 64, 256, 1024) for n in (2048, 8192)])
    base = cells.assign(median_us=table.predict_us(cells["m"], cells["n"], cells["k"], cells["batch"]) * 2.0)
    wider = cells.assign(n=cells["n"] + 32, grid=LINE_BASE_GRID,
                         median_us=table.predict_us(cells["m"], cells["n"] + 32, cells["k"], cells["batch"]))
    twin = wider.assign(n=wider["n"] + 1, grid="unaligned_n", median_us=wider["median_us"] * (wider["n"] + 1) / wider["n"] * 1.3)
    fixed = table.with_aspect(base).with_alignment(base, pd.concat([wider, twin], ignore_index=True))
    assert fixed.alignment_factor(64, 4001, 64) == pytest.approx(1.3, rel=1e-3)


def test_the_cpu_sweep_has_unaligned_twins_of_the_aspect_cells(cpu):
    from pipeline.sweeps.gemm_points import TWO, sweep_points
    from pipeline.sweeps.profiles import get_profile

    profile = get_profile("quick", "cpu")
    pts = sweep_points(cpu, profile, {})
    cells = {(p.op, p.dtype, p.m, p.n, p.k) for p in pts
             if p.grid == "aspect" and p.k == profile.gemm_twin_k and TWO not in (p.m, p.n)}
    twins_n = {(p.op, p.dtype, p.m, _twin_cell_n(p), p.k) for p in pts if p.grid == "unaligned_n"}
    twins_k = {(p.op, p.dtype, p.m, p.n, p.k - 1) for p in pts if p.grid == "unaligned_k"}
    within = {c for c in cells if c[2] * c[3] <= profile.max_gemm_outputs}
    assert within and cells <= twins_n and within <= twins_k
    # a cell whose rows alias (4 KiB multiples) has its N twin one past a base a line wider, both
    # timed; no twin sits one past an aliasing N
    line_bases = {(p.op, p.dtype, p.m, p.n, p.k) for p in pts if p.grid == LINE_BASE_GRID}
    offset = {(p.op, p.dtype, p.m, p.n - 1, p.k) for p in pts if p.grid == "unaligned_n" and _twin_cell_n(p) != p.n - 1}
    assert offset and offset == line_bases
    assert not [p for p in pts if p.grid == "unaligned_n" and rows_alias(p.n - 1, p.dtype)]
    assert {(p.dtype, p.n - _twin_cell_n(p)) for p in pts if p.grid == LINE_BASE_GRID} == {("float32", 16), ("bfloat16", 32)}
    assert all(m * n <= profile.max_gemm_outputs for _, _, m, n, _ in twins_k)  # none past the cap
    # the twins sit at the profile's twin K only, whatever other K the aspect grid has
    assert {p.k for p in pts if p.grid in ("unaligned_n", LINE_BASE_GRID)} == {profile.gemm_twin_k} != set(profile.gemm_aspect_k)


def test_the_aspect_grid_reaches_past_the_whole_wave_cap_at_the_twin_k_alone(cpu):
    """The output class an LM head at batch 8 falls in (1024 x 50257) is past the whole-wave
    grid's cap: the aspect grid times it up to max_aspect_outputs, at the twin K only, whatever
    the FLOP cap says, with N twins; without max_aspect_outputs nothing past the cap is timed."""
    from pipeline.sweeps.gemm_points import sweep_points
    from pipeline.sweeps.profiles import get_profile

    profile = get_profile("quick", "cpu")
    assert profile.max_aspect_outputs > profile.max_gemm_outputs
    pts = sweep_points(cpu, profile, {})
    past = [p for p in pts if p.grid in ("aspect", "unaligned_n", "unaligned_k", LINE_BASE_GRID)
            and p.batch * p.m * _twin_cell_n(p) > profile.max_gemm_outputs]
    assert {(p.op, p.m, p.n) for p in past if p.grid == "aspect"} >= {("linear", 1024, 65536), ("mm", 65536, 1024)}
    assert {p.k for p in past} == {profile.gemm_twin_k}
    assert all(p.batch * p.m * _twin_cell_n(p) <= profile.max_aspect_outputs for p in past)
    assert {p.grid for p in past} == {"aspect", "unaligned_n", LINE_BASE_GRID}
    assert max(p.flops for p in past) > (profile.max_aspect_flops or profile.max_point_flops)
    without = sweep_points(cpu, replace(profile, max_aspect_outputs=None), {})
    assert not [p for p in without if p.grid in ("aspect", "unaligned_n") and p.batch * p.m * p.n > profile.max_gemm_outputs]


def test_the_twins_smoothing_ignores_the_rows_and_columns_of_two_that_have_no_twins():
    """Row M = 1 with two slow twins (0.8) among 0.05s: its 3 x 3 median is 0.05 on the powers of
    4 alone, and must stay so when the untwinned rows and columns of 2 sit between it and M = 4
    (they would leave M = 1 its own row only); those get their neighbours' values."""
    from pipeline.predict.gemm_grids import median_on_measured, neighbourhood_median

    pow4 = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0])
    cells = np.full((6, 6), 0.05)
    cells[0, 3] = cells[0, 4] = 0.8
    plain = neighbourhood_median(cells)
    np.testing.assert_allclose(median_on_measured(cells, pow4, pow4), plain)  # as before on powers of 4
    sides = np.array([1.0, 2.0, 4.0, 16.0, 64.0, 256.0, 1024.0])
    with_two = np.full((7, 7), np.nan)
    keep = [0, 2, 3, 4, 5, 6]
    with_two[np.ix_(keep, keep)] = cells
    got = median_on_measured(with_two, sides, sides)
    np.testing.assert_allclose(got[np.ix_(keep, keep)], plain)
    assert np.allclose(got[1, keep], (plain[0] + plain[1]) / 2)  # M = 2: halfway in log2 between 1 and 4
    assert np.allclose(got[keep, 1], (plain[:, 0] + plain[:, 1]) / 2)


def test_a_shape_whose_rows_do_not_alias_sheds_the_aliasing_the_lattice_ran_with(synthetic_gemm_model):
    """A made-up CPU where the aspect lattice's columns of 4 KiB rows (float32 N = 1024, 4096)
    run 2x what their bases one line wider run: an aligned N between them that does not alias
    (N = 2000) is priced at half what the aliasing N = 2048 is, as the bases say, while N = 2048
    keeps the lattice's price; a K within one line (the short-K twins' domain) and a calibration
    without line bases are left as they were, and the correction saves and loads back."""
    table = synthetic_gemm_model.table("mm", "float32")
    cells = pd.DataFrame([dict(m=m, n=n, k=k, batch=1) for m in (16, 64, 256, 1024) for n in (1024, 4096)
                          for k in (64, 256)])

    def timed(df, factor):
        return df.assign(median_us=table.predict_us(df["m"], df["n"], df["k"], df["batch"]) * factor)

    base = timed(cells, 2.0)
    wider = timed(cells.assign(n=cells["n"] + 16), 1.0).assign(grid=LINE_BASE_GRID)
    plain = table.with_aspect(base)
    fixed = plain.with_alignment(base, wider)
    odd = wider.assign(n=wider["n"] + 1, grid="unaligned_n", median_us=wider["median_us"] * (wider["n"] + 1) / wider["n"] * 1.2)
    assert plain.with_alignment(base, odd).line_log is None  # twins without line bases: as before

    def priced(t, n, k=128):
        return float(t.predict_us(np.array([64]), np.array([n]), np.array([k]), np.array([1]))[0])

    assert priced(fixed, 2048) == pytest.approx(priced(plain, 2048))  # rows of 8 KiB alias: as measured
    assert priced(fixed, 2000) == pytest.approx(priced(plain, 2000) / 2.0, rel=1e-3)
    assert priced(fixed, 2000, k=8) == pytest.approx(priced(plain, 2000, k=8))  # K within a line
    paired = plain.with_alignment(base, pd.concat([wider, odd], ignore_index=True))
    assert priced(paired, 2001) == pytest.approx(priced(plain, 2001) / 2.0 * 1.2, rel=1e-3)  # odd N: both
    again = GemmTable.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert priced(again, 2000) == pytest.approx(priced(fixed, 2000))
    assert "line_log" not in plain.to_dict()


def test_the_tables_own_shape_says_which_sizes_hold_the_square_cells_aliasing(synthetic_gemm_model):
    """With a 1 x 1 tile and one slot the whole-wave table's shape of 2^18 outputs is 512 x 512
    (float32 rows of 2 KiB: no aliasing, unlike the lattice's 256 x 1024 beside it), of 2^20
    1024 x 1024 and of 2^22 2048 x 2048 (4 and 8 KiB rows); in bfloat16 only 2048 x 2048 aliases."""
    table = replace(synthetic_gemm_model.table("mm", "float32"), tile_m=1, tile_n=1, slots=1)
    sizes = np.array([2.0 ** 18, 2.0 ** 20, 2.0 ** 22, 0.5])
    assert table._table_shape_aliases(sizes, 1).tolist() == [False, True, True, False]
    assert replace(table, dtype="bfloat16")._table_shape_aliases(sizes, 1).tolist() == [False, False, True, False]
