"""The CPU GEMM model's extra grids: the aspect correction (skinny and wide shapes against the
whole-wave table's square ones) and the unaligned twins (rows that end mid cache line)."""
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.gemm_alias import rows_alias
from pipeline.predict.gemm_grids import LINE_BASE_GRID, line_elements


def test_the_aspect_grid_corrects_skinny_shapes_and_leaves_square_ones(synthetic_gemm_model):
    """A made-up CPU where shapes with M = 1 run twice as slow as the table's near-square
    ones: the fitted correction doubles them, leaves M = N alone, and saves and loads back."""
    table = synthetic_gemm_model.table("mm", "float32")
    sides = [1, 4, 16, 64]
    shapes = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in sides for n in sides])
    base = table.predict_us(shapes["m"], shapes["n"], shapes["k"], shapes["batch"])
    rows = shapes.assign(median_us=base * np.where(shapes["m"] == 1, 2.0, 1.0))
    fixed = table.with_aspect(rows)
    got = fixed.predict_us(np.array([1, 16]), np.array([64, 16]), np.array([64, 64]), np.array([1, 1]))
    want = table.predict_us(np.array([1, 16]), np.array([64, 16]), np.array([64, 64]), np.array([1, 1]))
    assert got == pytest.approx(want * [2.0, 1.0])
    again = GemmTable.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert again.predict_us(np.array([1]), np.array([64]), np.array([64]), np.array([1])) == pytest.approx(got[:1])
    assert "aspect_log" not in table.to_dict()  # a table without one saves as before


def test_a_wide_cell_past_its_rows_largest_measured_n_runs_as_that_cell_linear_in_n(synthetic_gemm_model):
    """A made-up CPU where M = 4 shapes run 2x the table and the caps stopped each row at 256
    outputs: 4 x 256 is priced as the measured 4 x 64 cell times 4, not as the table at its
    size times the 4 x 64 cell's correction (the table is not linear in waves there)."""
    table = synthetic_gemm_model.table("mm", "float32")
    sides = [1, 4, 16, 64, 256]
    shapes = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in sides for n in sides if m * n <= 256])
    base = table.predict_us(shapes["m"], shapes["n"], shapes["k"], shapes["batch"])
    fixed = table.with_aspect(shapes.assign(median_us=base * np.where(shapes["m"] == 4, 2.0, 1.0)))
    measured = 2.0 * float(table.predict_us(4, 64, 64, 1))
    assert float(fixed.predict_us(4, 64, 64, 1)) == pytest.approx(measured)  # a measured cell as before
    assert float(fixed.predict_us(4, 256, 64, 1)) == pytest.approx(4 * measured)
    assert 4 * measured != pytest.approx(2.0 * float(table.predict_us(4, 256, 64, 1)), rel=0.05)  # the old price
    assert float(fixed.predict_us(16, 16, 64, 1)) == pytest.approx(float(table.predict_us(16, 16, 64, 1)))
    # near-square cells past the caps keep their row's last correction: the table prices them
    assert float(fixed.predict_us(16, 64, 64, 1)) == pytest.approx(float(table.predict_us(16, 64, 64, 1)))


def test_the_extension_starts_from_the_measured_time_or_for_a_batched_grid_its_relative_cell(synthetic_gemm_model):
    """With the square cell of the anchor's size 1.5x the table, the extension still starts from
    the measured 4 x 64 time. A grid timed at batch 4 (bmm's) that runs 2x the table everywhere,
    the batch's effect, which the batch correction prices (gemm_batch.py): its relative cells
    are 0, and the extension starts from them, so the batch is not counted twice."""
    table = synthetic_gemm_model.table("mm", "float32")
    sides = [1, 4, 16, 64, 256]
    shapes = pd.DataFrame([dict(m=m, n=n, k=64, batch=1) for m in sides for n in sides if m * n <= 256])
    base = table.predict_us(shapes["m"], shapes["n"], shapes["k"], shapes["batch"])
    slow = np.where(shapes["m"] == 4, 2.0, 1.0) * np.where((shapes["m"] == 16) & (shapes["n"] == 16), 1.5, 1.0)
    fixed = table.with_aspect(shapes.assign(median_us=base * slow))
    assert float(fixed.predict_us(4, 256, 64, 1)) == pytest.approx(8 * float(table.predict_us(4, 64, 64, 1)))
    at4 = shapes.assign(batch=4)
    batched = table.with_aspect(at4.assign(median_us=2.0 * table.predict_us(at4["m"], at4["n"], at4["k"], at4["batch"])))
    assert float(batched.predict_us(4, 256, 64, 4)) == pytest.approx(4 * float(table.predict_us(4, 64, 64, 4)))


def test_aspect_rows_fit_the_correction_not_the_whole_wave_table(synthetic_gemm_model):
    table = synthetic_gemm_model.table("mm", "float32")
    waves_rows = pd.DataFrame([dict(op="mm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=1,
                                    m=m, n=n, k=k, waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False,
                                    grid="waves")
                               for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64)))
                               for k in (32, 64, 128, 256)])
    # two cells of one output size: 32 x 32 runs as the table says, 1 x 1024 far slower
    square = waves_rows.iloc[:1].assign(m=32, n=32, median_us=float(table.predict_us(32, 32, 32, 1)), grid="aspect")
    skinny = waves_rows.iloc[:1].assign(m=1, n=1024, waves=16, median_us=1e6, grid="aspect")
    fitted = GemmModel.fit(pd.concat([waves_rows, square, skinny], ignore_index=True)).table("mm", "float32")
    assert np.array_equal(fitted.thr, table.thr)  # the aspect row did not enter the table
    assert fitted.aspect_factor(1, 1024) > 10 and fitted.aspect_factor(32, 32) == pytest.approx(1.0)


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
    from dataclasses import replace

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


def test_the_aspect_correction_follows_k(synthetic_gemm_model):
    """A made-up CPU where M = 1 shapes run as the table says at K = 32 and 4x slower at K = 128:
    the correction is per K of the aspect grid, linear in log2 K between them, held above them
    and faded out below the smallest."""
    table = synthetic_gemm_model.table("mm", "float32")
    sides = [1, 4, 16, 64]
    shapes = pd.DataFrame([dict(m=m, n=n, k=k, batch=1) for m in sides for n in sides for k in (32, 128)])
    base = table.predict_us(shapes["m"], shapes["n"], shapes["k"], shapes["batch"])
    slow = np.where((shapes["m"] == 1) & (shapes["k"] == 128), 4.0, 1.0)
    fixed = table.with_aspect(shapes.assign(median_us=base * slow))
    assert fixed.aspect_log.shape == (4, 4, 2)
    factor = lambda k: float(fixed.aspect_factor(1, 64, k))  # noqa: E731
    assert factor(32) == pytest.approx(1.0) and factor(128) == pytest.approx(4.0)
    assert factor(64) == pytest.approx(2.0) and factor(16) == pytest.approx(1.0) and factor(512) == pytest.approx(4.0)
    # below the smallest K measured the correction fades in log2 K, to none at K = 1
    low = table.with_aspect(shapes.assign(median_us=base * np.where(shapes["m"] == 1, 4.0, 1.0)))
    assert float(low.aspect_factor(1, 64, 32)) == pytest.approx(4.0)
    assert float(low.aspect_factor(1, 64, 16)) == pytest.approx(4.0 ** 0.8)  # log2 16 / log2 32
    assert float(low.aspect_factor(1, 64, 1)) == pytest.approx(1.0)
    assert float(fixed.aspect_factor(16, 16, 128)) == pytest.approx(1.0)
    again = GemmTable.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert float(again.aspect_factor(1, 64, 64)) == pytest.approx(2.0)
    # a table saved with one correction over all K (before aspect_k) loads and prices as it did
    flat = replace(fixed, aspect_log=np.log(np.full((4, 4), 2.0)), aspect_k=None)
    assert float(GemmTable.from_dict(json.loads(json.dumps(flat.to_dict()))).aspect_factor(1, 64, 64)) == pytest.approx(2.0)


def test_aspect_cells_under_one_wave_keep_their_own_error():
    import pandas as pd

    from pipeline.predict.gemm_grids import relative_to_square

    # log ratios over M x N = (1, 4, 16) x (1, 4, 16); the 1 x 1 cell (a GEMV 4x slower than priced)
    grid = pd.DataFrame([[np.log(4), 0.5, 0.2], [0.3, 0.1, 0.0], [0.2, 0.0, 0.0]], index=[1.0, 4.0, 16.0],
                        columns=[1.0, 4.0, 16.0])
    rel = relative_to_square(grid)
    assert rel[0, 0] == 0.0  # relative to itself: the slowdown is lost
    kept = relative_to_square(grid, one_wave=8.0)
    assert kept[0, 0] == pytest.approx(np.log(4))  # 1 output < one wave of 8: its own value
    assert kept[0, 1] == pytest.approx(0.5) and kept[1, 0] == pytest.approx(0.3)  # size 4 < 8 too
    # from one wave up, relative to the most square cell of the same size, as before
    np.testing.assert_allclose(kept[1:, 1:], rel[1:, 1:])
    assert kept[0, 2] == pytest.approx(rel[0, 2])


def test_aspect_cells_past_the_tables_largest_output_keep_their_own_error():
    """Past the whole-wave table's largest measured output the table holds its throughput: a
    cell there keeps log(measured / table) rather than its size's square cell being the zero."""
    import pandas as pd

    from pipeline.predict.gemm_grids import relative_to_square

    grid = pd.DataFrame([[0.0, 0.1, 0.4], [0.1, 0.0, 0.3], [0.2, 0.25, 0.2]], index=[1.0, 4.0, 16.0],
                        columns=[1.0, 4.0, 16.0])
    rel, kept = relative_to_square(grid), relative_to_square(grid, top=16.0)
    assert rel[2, 2] == 0.0 and kept[2, 2] == pytest.approx(0.2)  # 256 outputs > 16: its own value
    assert kept[1, 2] == pytest.approx(0.3) and kept[2, 1] == pytest.approx(0.25)  # 64 > 16 too
    np.testing.assert_allclose(kept[:2, :2], rel[:2, :2])  # 16 outputs and under as before
    assert kept[0, 2] == pytest.approx(rel[0, 2]) == pytest.approx(0.4 - 0.0)


def test_aspect_correction_is_zero_at_the_square_cell_in_elements():
    import pandas as pd

    from pipeline.predict.gemm_grids import relative_to_square

    # M x N over (1, 4, 16, 64); on the size-256 anti-diagonal: 4 x 64 (+0.3), 16 x 16 (+0.1),
    # 64 x 4 (+0.2). The whole-wave table measured square shapes (in elements, whatever the
    # tile), so 16 x 16 is the zero and the others keep their difference from it.
    sides = [1.0, 4.0, 16.0, 64.0]
    grid = pd.DataFrame(np.zeros((4, 4)), index=sides, columns=sides)
    grid.loc[4.0, 64.0], grid.loc[16.0, 16.0], grid.loc[64.0, 4.0] = 0.3, 0.1, 0.2
    rel = relative_to_square(grid)
    assert rel[2, 2] == pytest.approx(0.0)
    assert rel[1, 3] == pytest.approx(0.2) and rel[3, 1] == pytest.approx(0.1)


def test_the_aspect_grid_times_two_rows_and_two_columns_without_twins(cpu):
    from pipeline.sweeps.gemm_points import TWO, aspect_points
    from pipeline.sweeps.profiles import get_profile

    quick = get_profile("quick", "cpu")
    pts = aspect_points(cpu, quick)
    cells = {(p.m, p.n) for p in pts if p.grid == "aspect"}
    assert {(TWO, 1), (1, TWO), (TWO, TWO), (TWO, 1024), (1024, TWO)} <= cells
    bases = {(p.m, p.n - (p.grid == "unaligned_n")) for p in pts if p.grid != "aspect"}
    assert not [b for b in bases if TWO in b]  # twins of the powers of 4 only
    assert len({(p.op, p.dtype, p.m, p.n, p.k, p.grid) for p in pts}) == len(pts)  # each point once


def test_a_size_with_only_skinny_cells_takes_its_reference_between_square_ones():
    """Sides (1, 2, 4, 16): the size-32 anti-diagonal holds 2 x 16 and 16 x 2 alone. Against
    themselves they would read 0; their reference is the square one between sizes 16 (4 x 4)
    and 64 (4 x 16), linear in log2 size, so a two-row slowdown the squares lack is kept."""
    from pipeline.predict.gemm_grids import relative_to_square

    sides = [1.0, 2.0, 4.0, 16.0]
    grid = pd.DataFrame(np.zeros((4, 4)), index=sides, columns=sides)
    grid.loc[4.0, 4.0], grid.loc[4.0, 16.0], grid.loc[16.0, 4.0] = 0.1, 0.3, 0.3  # sizes 16 and 64
    grid.loc[2.0, 16.0], grid.loc[16.0, 2.0] = 0.9, 0.5  # size 32
    rel = relative_to_square(grid)
    assert rel[1, 3] == pytest.approx(0.9 - 0.2) and rel[3, 1] == pytest.approx(0.5 - 0.2)
    assert rel[2, 2] == pytest.approx(0.0) and rel[2, 3] == pytest.approx(0.0)  # square-ish sizes as before
    assert rel[1, 2] == pytest.approx(0.0)  # 2 x 4 (skew 1) is its own size's square cell


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


def test_bmm_has_an_aspect_grid_of_its_own_at_one_batch_with_twins(cpu):
    """bmm's cells are timed at one batch, up to the batch grid's largest side, with rows and
    columns of two and unaligned twins as mm's, each point once."""
    from pipeline.sweeps.gemm_points import BATCH_SIDES, BMM_ASPECT_BATCH, TWO, aspect_points
    from pipeline.sweeps.profiles import get_profile

    pts = [p for p in aspect_points(cpu, get_profile("quick", "cpu")) if p.op == "bmm"]
    assert pts and all(p.op == "bmm" and p.batch == BMM_ASPECT_BATCH for p in pts)
    cells = {(p.m, p.n) for p in pts if p.grid == "aspect"}
    assert {(TWO, 64), (256, TWO), (1, 1024)} <= cells and max(max(c) for c in cells) == max(BATCH_SIDES)
    assert {p.grid for p in pts} == {"aspect", "unaligned_n", "unaligned_k", LINE_BASE_GRID}
    assert len({(p.dtype, p.m, p.n, p.k, p.grid) for p in pts}) == len(pts)


def test_bmm_aspect_rows_at_their_batch_correct_batched_skinny_shapes(synthetic_gemm_model):
    """A made-up CPU where batched matrices with N = 2 run 8x the whole-wave table's time: bmm
    aspect rows timed at batch 16 fit bmm's correction, which then prices N = 2 at another
    batch 8x and leaves square matrices alone; mm's table is untouched by them."""
    from pipeline.sweeps.gemm_points import BMM_ASPECT_BATCH

    rows = pd.DataFrame([dict(op=op, dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=b,
                              m=m, n=n, k=k, waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False, grid="waves")
                         for op, b in (("mm", 1), ("bmm", 8))
                         for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64)))
                         for k in (32, 64, 128, 256)])
    plain = GemmModel.fit(rows)
    table = plain.table("bmm", "float32")
    b = BMM_ASPECT_BATCH
    cells = pd.DataFrame([dict(m=m, n=n, k=64) for m in (2, 4, 16, 64) for n in (2, 4, 16, 64)])
    base = table.predict_us(cells["m"], cells["n"], cells["k"], b)
    aspect = rows.iloc[:1].drop(columns=["m", "n", "k", "waves", "median_us", "batch"]).merge(cells, how="cross").assign(
        op="bmm", batch=b, waves=1, grid="aspect", median_us=base * np.where(cells["n"] == 2, 8.0, 1.0))
    fitted = GemmModel.fit(pd.concat([rows, aspect], ignore_index=True))
    skinny = dict(m=np.array([64]), n=np.array([2]), k=np.array([64]), batch=np.array([4]))
    square = {**skinny, "n": np.array([64])}
    assert fitted.predict("bmm", "float32", **skinny) == pytest.approx(8 * plain.predict("bmm", "float32", **skinny))
    assert fitted.predict("bmm", "float32", **square) == pytest.approx(plain.predict("bmm", "float32", **square))
    assert fitted.predict("mm", "float32", **skinny) == pytest.approx(plain.predict("mm", "float32", **skinny))


def test_bmm_squares_timed_by_the_batch_grid_join_its_aspect_lattice(synthetic_gemm_model):
    """The sweep leaves bmm's square cells at its aspect batch to the batch grid; the fit joins
    those rows to the lattice as the zero its skinny cells are measured against. A made-up CPU
    where every non-square batched matrix runs 2x the table and squares as the table: 4 x 64 is
    priced 2x, 16 x 16 (the same output size) as the table; with the squares left out, 4 x 64
    would be the most square cell of its size, its own reference, and priced 1x."""
    from pipeline.sweeps.gemm_points import BMM_ASPECT_BATCH

    b = BMM_ASPECT_BATCH
    rows = pd.DataFrame([dict(op="bmm", dtype="float32", kernel="cpu", tile_m=8, tile_n=8, slots=2, batch=8,
                              m=m, n=n, k=k, waves=w, median_us=(1 + k / 32) * w**0.8, held_out=False, grid="waves")
                         for w, (m, n) in ((1, (8, 16)), (4, (16, 32)), (16, (32, 64))) for k in (32, 64, 128, 256)])
    table = GemmModel.fit(rows).table("bmm", "float32")
    sides = (4, 16, 64)
    cells = pd.DataFrame([dict(m=m, n=n, k=64) for m in sides for n in sides])
    timed = rows.iloc[:1].drop(columns=["m", "n", "k", "waves", "median_us", "batch", "grid"]).merge(cells, how="cross")
    timed = timed.assign(batch=b, waves=1, median_us=table.predict_us(cells["m"], cells["n"], cells["k"], b)
                         * np.where(cells["m"] == cells["n"], 1.0, 2.0),
                         grid=np.where(cells["m"] == cells["n"], "batch", "aspect"))
    fitted = GemmModel.fit(pd.concat([rows, timed], ignore_index=True))
    plain = GemmModel.fit(pd.concat([rows, timed[timed["grid"] == "batch"]], ignore_index=True))
    wide = dict(m=np.array([4]), n=np.array([64]), k=np.array([64]), batch=np.array([b]))  # 16 x 16's size
    square = {**wide, "m": np.array([16]), "n": np.array([16])}
    assert fitted.predict("bmm", "float32", **wide) == pytest.approx(2 * plain.predict("bmm", "float32", **wide))
    assert fitted.predict("bmm", "float32", **square) == pytest.approx(plain.predict("bmm", "float32", **square))
