"""Attention: the interpolation against hand-computed values, errors, and the tiny CPU sweep."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadShapeError, MissingModelError, UnknownDtypeError
from pipeline.predict.attention import AttentionModel, AttentionTable, attention_flops, fill_missing
from pipeline.predict.evaluate import attention_predictions

THR = [[100.0, 200.0, 300.0], [400.0, 600.0, 800.0]]  # bh (8, 32) x seq (32, 64, 128), FLOPs/us


def _model(causal_scale: float = 0.5) -> AttentionModel:
    tables = {}
    for hd, scale in ((32, 1.0), (128, 2.0)):  # head_dim 128 runs at twice the throughput of 32
        for causal in (False, True):
            thr = np.array(THR) * scale * (causal_scale if causal else 1.0)
            tables[("flash", "float32", hd, causal)] = AttentionTable("flash", "float32", hd, causal,
                                                                      np.array([8.0, 32.0]),
                                                                      np.array([32.0, 64.0, 128.0]), thr)
    return AttentionModel(tables)


def _pred(m, batch=1, heads=8, sq=64, skv=None, d=32, causal=False):
    return float(m.predict("flash", "float32", batch, heads, sq, sq if skv is None else skv, d, causal))


def test_at_and_between_grid_points():
    m = _model()
    # at a grid point: bh = 8, seq = 64 -> 200 FLOPs/us
    assert _pred(m) == pytest.approx(4 * 8 * 64 * 64 * 32 / 200.0)
    # seq 96 is halfway between 64 and 128: 250 at bh = 8
    assert _pred(m, sq=96) == pytest.approx(4 * 8 * 96 * 96 * 32 / 250.0)
    # bh = 16 is halfway in log2 between 8 and 32: mean of 250 and 700
    assert _pred(m, batch=2, sq=96) == pytest.approx(4 * 16 * 96 * 96 * 32 / 475.0)
    # heads and batch only enter as their product
    assert _pred(m, batch=4, heads=4, sq=96) == pytest.approx(_pred(m, batch=2, heads=8, sq=96))
    # causal: its own table (half the throughput here) and half the FLOPs -> the same time
    assert _pred(m, causal=True) == pytest.approx(_pred(m))


def test_across_head_dims():
    m = _model()
    # head_dim 64 is a third of the way from 32 to 128: throughput 200 * (2/3 * 1 + 1/3 * 2) at bh 8, seq 64
    assert _pred(m, d=64) == pytest.approx(4 * 8 * 64 * 64 * 64 / (200.0 * 4 / 3))
    assert _pred(m, d=128) == pytest.approx(4 * 8 * 64 * 64 * 128 / 400.0)
    # outside the measured head dims the throughput is held: time grows with head_dim
    assert _pred(m, d=256) == pytest.approx(2 * _pred(m, d=128))
    assert _pred(m, d=16) == pytest.approx(_pred(m, d=32) / 2)


def test_beyond_and_below_the_grid():
    m = _model()
    # beyond seq 128 the throughput is held: 4x the FLOPs, 4x the time
    assert _pred(m, sq=256) == pytest.approx(4 * _pred(m, sq=128))
    # below the smallest seq or bh the duration is held
    assert _pred(m, sq=8) == pytest.approx(_pred(m, sq=32))
    assert _pred(m, batch=1, heads=2) == pytest.approx(_pred(m))
    # seq_q != seq_kv: looked up at the geometric mean (32 x 128 -> 64), priced at its own FLOPs
    assert _pred(m, sq=32, skv=128) == pytest.approx(4 * 8 * 32 * 128 * 32 / 200.0)


def test_vectorized_matches_scalar_calls():
    m = _model()
    b, s, d, c = np.array([1, 2, 4]), np.array([40, 96, 200]), np.array([32, 80, 128]), np.array([False, True, False])
    got = m.predict("flash", "float32", b, 8, s, s, d, c)
    assert got.shape == (3,)
    want = [_pred(m, batch=int(b[i]), sq=int(s[i]), d=int(d[i]), causal=bool(c[i])) for i in range(3)]
    np.testing.assert_allclose(got, want)


def test_json_round_trip():
    m = _model()
    again = AttentionModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert set(again.tables) == set(m.tables)
    args = ("flash", "float32", np.array([1, 3]), np.array([8, 12]), np.array([50, 100]), np.array([50, 100]),
            np.array([64, 96]), np.array([True, False]))
    np.testing.assert_allclose(again.predict(*args), m.predict(*args))


def test_bad_input_errors():
    m = _model()
    with pytest.raises(BadShapeError, match="seq_q must be positive; got 0"):
        m.predict("flash", "float32", 1, 8, 0, 64, 64)
    with pytest.raises(BadShapeError, match="head_dim must be positive; got -64"):
        m.predict("flash", "float32", 1, 8, 64, 64, np.array([64, -64]))
    with pytest.raises(BadShapeError, match="batch"):
        m.predict("flash", "float32", 0, 8, 64, 64, 64)
    with pytest.raises(MissingModelError, match="math"):
        m.predict("math", "float32", 1, 8, 64, 64, 64)
    with pytest.raises(MissingModelError, match="bfloat16"):
        m.predict("flash", "bfloat16", 1, 8, 64, 64, 64)
    with pytest.raises(BadShapeError, match="'sparse'"):
        m.predict("sparse", "float32", 1, 8, 64, 64, 64)
    with pytest.raises(UnknownDtypeError, match="int8"):
        m.predict("flash", "int8", 1, 8, 64, 64, 64)
    only_plain = AttentionModel({k: t for k, t in m.tables.items() if not k[3]})
    with pytest.raises(MissingModelError, match="causal=True"):
        only_plain.predict("flash", "float32", 1, 8, 64, 64, 64, True)


def test_fill_missing_by_hand():
    nan = np.nan
    got = fill_missing(np.array([[100.0, 200.0, 300.0], [400.0, 600.0, nan], [nan, nan, nan]]))
    # the capped cell grows as the row below does from seq 64 to 128 (x 1.5); an empty row copies its neighbour
    np.testing.assert_allclose(got, [[100, 200, 300], [400, 600, 900], [400, 600, 900]])
    np.testing.assert_allclose(fill_missing(np.array([[nan, 2.0, nan, 4.0]])), [[2, 2, 3, 4]])


def _synthetic_samples(held_out: bool = False) -> pd.DataFrame:
    rows = []
    for batch in (1, 4):
        for s in (32, 64, 128):
            for hd in (32, 128):
                for causal in (False, True):
                    fl = float(attention_flops(batch, 8, s, s, hd, causal))
                    rows.append(dict(backend="math", dtype="float32", batch=batch, heads=8, seq_q=s, seq_kv=s,
                                     head_dim=hd, causal=causal, flops=fl, median_us=fl / (10.0 * s * batch + hd),
                                     held_out=held_out))
    return pd.DataFrame(rows)


def test_fit_refuses_heldout_and_reproduces_training_points():
    with pytest.raises(ValueError, match="held-out"):
        AttentionModel.fit(_synthetic_samples(held_out=True))
    df = _synthetic_samples()
    pred = attention_predictions(AttentionModel.fit(df), df)
    assert (pred["op"] == "math").all() and (pred["layer_type"] == "Attention").all()
    np.testing.assert_allclose(pred["predicted_us"], pred["median_us"], rtol=1e-9)


def test_tiny_sweep_on_cpu_fits_back():
    from pipeline.runner import SWEEPS, run_sweep

    assert SWEEPS["attention"] == "attention_samples"
    df = pd.DataFrame(run_sweep("attention", "cpu", "tiny", run_id="t"))
    assert set(df["backend"]) == {"flash", "math"}
    assert (df["median_us"] > 0).all() and np.isfinite(df["median_us"]).all()
    assert df["held_out"].any() and (~df["held_out"]).any()
    expect = attention_flops(df["batch"], df["heads"], df["seq_q"], df["seq_kv"], df["head_dim"], df["causal"])
    np.testing.assert_allclose(df["flops"], expect)
    train = df[~df["held_out"]]
    pred = attention_predictions(AttentionModel.fit(train), train)
    np.testing.assert_allclose(pred["predicted_us"], pred["median_us"], rtol=1e-9)
    held = attention_predictions(AttentionModel.fit(train), df[df["held_out"]])
    assert (held["predicted_us"] > 0).all()


def test_heldout_shapes_stay_in_range_and_off_the_grid():
    from pipeline.sweeps.attention import HEADS, batches, heldout_points, seqs, training_points
    from pipeline.sweeps.profiles import get_profile

    prof = get_profile("quick")
    held = heldout_points(prof)
    assert len(held) == prof.attention_heldout
    assert any(p.seq_q & (p.seq_q - 1) for p in held)  # some seq not a power of two
    assert all(seqs(prof)[0] <= p.seq_q <= seqs(prof)[-1] for p in held)
    train = training_points(prof)
    assert {p.seq_q for p in train if p.batch == 1} == set(seqs(prof))  # the smallest bh row is whole
    assert all(p.heads == HEADS and p.batch in batches(prof) for p in train)
    cuda = get_profile("quick", "cuda")
    assert seqs(cuda)[-1] == 8192


def test_the_sweep_times_every_backend_and_dtype_interleaved(monkeypatch):
    """A slow spell must land on a few points of every (backend, dtype), not on one group's
    grid: the timing order mixes the groups, while the rows keep the list order."""
    from dataclasses import replace

    import pipeline.sweeps.attention as A
    from pipeline.device.discover import identify_cpu
    from pipeline.sweeps.profiles import get_profile

    order = []
    real = A._measure

    def recording(backend, fn, dev, profile):
        meas = real(backend, fn, dev, profile)
        if meas is not None:
            order.append(backend)
        return meas

    monkeypatch.setattr(A, "_measure", recording)
    monkeypatch.setattr(A, "SCAN_SEQS", range(16, 24))  # a short kv scan, so the scan phase runs too
    profile = replace(get_profile("tiny"), attention_seq_scan=True)
    rows = A.sweep_attention(identify_cpu(), profile, log=lambda *a: None)
    n_scan = sum(r["grid"] == A.SCAN_GRID for r in rows)
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert len(set(order)) == 2 and switches > len(order) // 4
    scans = [r for r in rows[:n_scan]]  # the scans come first, each group's in ascending seq
    assert n_scan and all(r["grid"] == A.SCAN_GRID for r in scans)
    for key in {(r["backend"], r["dtype"]) for r in scans}:
        seqs = [r["seq_kv"] for r in scans if (r["backend"], r["dtype"]) == key]
        assert seqs == sorted(seqs) == list(range(16, 24))
    backends = [r["backend"] for r in rows[n_scan:]]
    assert backends == sorted(backends, key=["flash", "math"].index)  # written grouped, as listed
