"""NAS grid cache (analysis/grid_cache.py) and the vectorized predictor against the scalar one."""
import duckdb
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError
from pipeline.analysis.grid_cache import TABLE, LayerGrid, write_grid
from pipeline.predict import gemm as gemm_mod


@pytest.fixture
def model(synthetic_gemm_model):
    return synthetic_gemm_model


def test_vectorized_agrees_with_scalar_calls_including_chunked_path(model, monkeypatch):
    monkeypatch.setattr(gemm_mod, "CHUNK", 64)  # force the chunked path on a small input
    rng = np.random.default_rng(3)
    m, n, k, b = (rng.integers(1, 5000, 300) for _ in range(4))
    vec = model.predict("mm", "float32", m, n, k, b)
    one = [float(model.predict("mm", "float32", int(x), int(y), int(z), int(w))) for x, y, z, w in zip(m, n, k, b)]
    np.testing.assert_allclose(vec, one, rtol=1e-12)


def test_grid_chunks_cover_every_shape_once():
    grid = LayerGrid(features=(64, 128, 256), batch_max=5, seq_min=64, seq_max=256, seq_step=64)
    rows = pd.concat([pd.DataFrame(c) for c in grid.chunks(rows_per_chunk=7)])
    assert len(rows) == grid.rows == 3 * 3 * 5 * 4
    assert not rows.duplicated().any()
    assert set(rows["seq"]) == {64, 128, 192, 256} and set(rows["batch"]) == {1, 2, 3, 4, 5}
    with pytest.raises(BadShapeError, match="seq_min=300"):
        LayerGrid(seq_min=300, seq_max=200)


def test_write_grid_replaces_rows_atomically(model, tmp_path):
    grid = LayerGrid(features=(64, 128), batch_max=3, seq_min=64, seq_max=192, seq_step=64)
    con = duckdb.connect(str(tmp_path / "g.duckdb"))
    rows, _ = write_grid(con, model, "dev-a", grid, "mm", "float32", log=lambda _: None)
    write_grid(con, model, "dev-b", grid, "mm", "float32", log=lambda _: None)
    write_grid(con, model, "dev-a", grid, "mm", "float32", log=lambda _: None)  # again: replaces
    counts = dict(con.execute(f"SELECT device, count(*) FROM {TABLE} GROUP BY device").fetchall())
    assert counts == {"dev-a": rows, "dev-b": rows} and rows == grid.rows
    got = con.execute(f"SELECT batch, seq, in_features, out_features, predicted_us FROM {TABLE} "
                      "WHERE device = 'dev-a' LIMIT 5").fetchall()
    for b, s, fin, fout, us in got:
        assert us == pytest.approx(float(model.predict("mm", "float32", b * s, fout, fin)))

    class Failing:
        def check(self, op, dtype):
            return None

        def predict(self, *a):
            raise RuntimeError("model broke mid-grid")

    with pytest.raises(duckdb.Error, match="mid-grid"):  # the model's error, raised through the arrow scan
        write_grid(con, Failing(), "dev-a", grid, "mm", "float32", log=lambda _: None)
    assert con.execute(f"SELECT count(*) FROM {TABLE} WHERE device = 'dev-a'").fetchone()[0] == rows
