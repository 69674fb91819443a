"""The CPU GEMM model's alias correction: short-K shapes whose output rows are not a multiple of
4 KiB, priced from twins of the whole-wave cells whose rows are (predict/gemm_alias.py)."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_alias import ALIAS_GRID, rows_alias, short_k
from pipeline.predict.geometry import whole_wave_shape

KS = (2, 4, 64)


def _sweep(twin_speed: float | None, outlier: float | None = None, classes: dict | None = None) -> pd.DataFrame:
    """A made-up CPU (1 x 1 tile, 2 slots): time linear in waves and K; twins one line wider at
    the short K of the cells whose rows alias, `twin_speed` x their base beyond the extra FLOPs;
    `classes`: more twins, {elements wider: speed}."""
    rows = []
    for w in (4 ** i for i in range(12)):
        m, n = whole_wave_shape(w, 1, 1, 2)
        for k in KS:
            rows.append(dict(op="mm", dtype="float32", kernel="cpu", tile_m=1, tile_n=1, slots=2, batch=1, m=m,
                             n=n, k=k, waves=w, median_us=1.0 + 1e-4 * w * k, held_out=False, grid="waves"))
    base = pd.DataFrame(rows)
    if twin_speed is None:
        return base
    pick = base[short_k(base["k"], "float32") & rows_alias(base["n"], "float32")]
    speed = np.full(len(pick), twin_speed)
    if outlier is not None:  # one twin, at K = 2 of the second aliasing row, timed apart from the rest
        speed[np.flatnonzero(pick["k"].to_numpy() == 2)[1]] = outlier
    twins = [pick.assign(n=pick["n"] + step, grid=ALIAS_GRID,
                         median_us=pick["median_us"] * (pick["n"] + step) / pick["n"] * sp)
             for step, sp in {16: speed, **(classes or {})}.items()]
    return pd.concat([base, *twins], ignore_index=True)


def test_short_k_shapes_whose_rows_do_not_alias_take_the_twins_speed():
    plain, fixed = GemmModel.fit(_sweep(None)), GemmModel.fit(_sweep(0.25))
    assert len(_sweep(0.25)) > len(_sweep(None))  # the made-up sweep has aliasing cells

    def ratio(m, n, k):
        return float(fixed.predict("mm", "float32", m, n, k)) / float(plain.predict("mm", "float32", m, n, k))

    assert ratio(882, 1973, 2) == pytest.approx(0.25)  # between two aliasing rows, not aliasing itself
    assert ratio(1000, 1536, 2) == pytest.approx(0.25)  # line twins alone: every class takes theirs
    assert ratio(1024, 2048, 2) == pytest.approx(1.0)  # rows of 8 KiB: the table's own shapes
    assert ratio(1024, 3072, 4) == pytest.approx(1.0)  # 12 KiB rows alias too
    assert ratio(882, 1973, 64) == pytest.approx(1.0)  # K past a line: not twinned, not corrected
    assert 0.25 < ratio(882, 1973, 16) < 1.0  # fades out between the last short K and the next
    assert ratio(8, 12, 2) == pytest.approx(1.0)  # few outputs: the table was timed on rows that do not alias
    table = fixed.table("mm", "float32")
    again = GemmModel.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert float(again.predict("mm", "float32", 882, 1973, 2)) == pytest.approx(float(fixed.predict("mm", "float32", 882, 1973, 2)))
    assert table.alias_log is not None and "alias_log" not in plain.table("mm", "float32").to_dict()


def test_each_class_of_row_length_takes_its_own_twins_speed():
    """Twins 1 KiB and 2 KiB wider as well (float32: 256 and 512 elements): rows of an odd
    multiple of 2 KiB alias every second row, of 1 KiB every fourth; each prices its own class."""
    plain = GemmModel.fit(_sweep(None))
    fixed = GemmModel.fit(_sweep(0.25, classes={256: 0.5, 512: 0.75}))

    def ratio(m, n, k=2):
        return float(fixed.predict("mm", "float32", m, n, k)) / float(plain.predict("mm", "float32", m, n, k))

    assert ratio(1000, 1536) == pytest.approx(0.75)  # 6 KiB rows: the 2 KiB class
    assert ratio(1000, 2560) == pytest.approx(0.75)  # 10 KiB
    assert ratio(1000, 1280) == pytest.approx(0.5)  # 5 KiB: the 1 KiB class
    assert ratio(1000, 1152) == pytest.approx(0.25 ** 0.25 * 0.5 ** 0.75)  # 512 B: between line and 1 KiB, in log2
    assert ratio(882, 1973) == pytest.approx(0.25)  # rows ending mid line: the line class
    assert ratio(1024, 2048) == pytest.approx(1.0)  # 4 KiB multiples: the table's own
    table = fixed.table("mm", "float32")
    assert table.alias_bytes.tolist() == [64.0, 1024.0, 2048.0] and table.alias_log.shape[0] == 3
    again = GemmModel.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert float(again.predict("mm", "float32", 1000, 1280, 2)) == pytest.approx(float(fixed.predict("mm", "float32", 1000, 1280, 2)))


def test_a_model_saved_with_line_twins_alone_loads_and_prices_as_before():
    fixed = GemmModel.fit(_sweep(0.25))
    d = json.loads(json.dumps(fixed.to_dict()))
    for t in d["tables"]:  # as saved before the classes: one (waves x K) grid, no alias_bytes
        if "alias_log" in t:
            t["alias_log"], _ = t["alias_log"][0], t.pop("alias_bytes")
    old = GemmModel.from_dict(d)
    plain = GemmModel.fit(_sweep(None))
    table = old.table("mm", "float32")
    assert table.alias_bytes.tolist() == [64.0] and table.alias_log.ndim == 3
    for n in (1973, 1152, 1280, 1536):  # every class prices as the line class, as before the classes
        assert float(old.predict("mm", "float32", 1000, n, 2)) / float(plain.predict("mm", "float32", 1000, n, 2)) \
            == pytest.approx(0.25)
        assert float(old.predict("mm", "float32", 1000, n, 2)) == pytest.approx(float(fixed.predict("mm", "float32", 1000, n, 2)))


def test_a_class_not_twinned_at_one_k_takes_the_nearest_class_there():
    plain = GemmModel.fit(_sweep(None))
    whole = _sweep(0.25, classes={256: 0.5, 512: 0.75})
    n = whole["n"].to_numpy()
    lost = (whole["grid"] == ALIAS_GRID) & (whole["k"] == 4) & ((n * 4) % 4096 == 2048)  # the 2 KiB twins at K = 4
    fixed = GemmModel.fit(whole[~lost])

    def ratio(n, k):
        return float(fixed.predict("mm", "float32", 1000, n, k)) / float(plain.predict("mm", "float32", 1000, n, k))

    assert ratio(1536, 4) == pytest.approx(0.5)  # the 1 KiB class's, not the aliasing base's rate
    assert ratio(1536, 2) == pytest.approx(0.75)


def test_a_table_with_classes_but_no_class_sizes_is_refused():
    d = GemmModel.fit(_sweep(0.25, classes={256: 0.5})).to_dict()
    for t in d["tables"]:
        t.pop("alias_bytes", None)
    with pytest.raises(ValueError, match="alias_bytes"):
        GemmModel.from_dict(json.loads(json.dumps(d)))


def test_one_twin_off_its_neighbours_or_slower_than_its_base_does_not_price_alone():
    """A twin 8x slower than its base (a stall, or another effect): outvoted by its neighbours in
    waves; twins all slower than their bases correct nothing (a wider row does not alias more)."""
    plain = GemmModel.fit(_sweep(None))
    for fixed in (GemmModel.fit(_sweep(0.25, outlier=8.0)), GemmModel.fit(_sweep(1.3))):
        grid = fixed.table("mm", "float32").alias_log
        assert (grid <= 0).all()
    mixed = GemmModel.fit(_sweep(0.25, outlier=8.0))
    ratio = [float(mixed.predict("mm", "float32", m, n, 2)) / float(plain.predict("mm", "float32", m, n, 2))
             for m, n in ((1000, 2000), (2000, 4000))]
    assert ratio == pytest.approx([0.25, 0.25])
    assert float(GemmModel.fit(_sweep(1.3)).predict("mm", "float32", 1000, 2000, 2)) == pytest.approx(
        float(plain.predict("mm", "float32", 1000, 2000, 2)))


def test_the_twins_are_not_fitted_into_the_whole_wave_table():
    assert np.array_equal(GemmModel.fit(_sweep(0.25)).table("mm", "float32").thr,
                          GemmModel.fit(_sweep(None)).table("mm", "float32").thr)


def test_the_cpu_sweep_twins_short_k_cells_whose_rows_alias(cpu):
    from pipeline.sweeps.gemm_points import sweep_points
    from pipeline.sweeps.profiles import get_profile

    profile = get_profile("quick", "cpu")
    tiles = {(op, dt): (1, 1) for op in ("mm", "bmm", "linear") for dt in ("float32", "bfloat16")}
    pts = sweep_points(cpu, profile, tiles)
    twins = [p for p in pts if p.grid == ALIAS_GRID]
    bases = {(p.op, p.dtype, p.batch, p.m, p.n, p.k) for p in pts if p.grid == "waves"}
    assert twins and all(short_k(p.k, p.dtype) and not rows_alias(p.n, p.dtype) for p in twins)
    steps = {"float32": (16, 256, 512), "bfloat16": (32, 512, 1024)}  # a line, 1 KiB, 2 KiB
    for dtype, wider in steps.items():
        of_dtype = [p for p in twins if p.dtype == dtype]
        per_step = [sum((p.op, p.dtype, p.batch, p.m, p.n - step, p.k) in bases for p in of_dtype) for step in wider]
        assert per_step == [len(of_dtype) // len(wider)] * len(wider) and len(of_dtype) % len(wider) == 0
    assert {p.k for p in twins if p.dtype == "float32"} == {1, 2, 4, 8, 16}
