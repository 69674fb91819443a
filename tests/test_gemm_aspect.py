"""The CPU GEMM model's aspect correction: skinny and wide shapes against the whole-wave table's
square ones, on mm's, linear's and bmm's lattices (the unaligned twins: test_gemm_twins.py)."""
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.gemm_grids import LINE_BASE_GRID


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
