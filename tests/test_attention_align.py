"""Unaligned kv lengths: the period and ramp found in a scan, the twins' correction, the sweep's grids."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.predict.attention import (BASE_GRID, SCAN_GRID, TWIN_GRID, AttentionModel, attention_flops,
                                        fit_alignment)
from pipeline.predict.attention_align import find_period, fit_ramp, tail

SCAN = np.arange(63, 193)


def _kernel(s, period=16, worst=2.0, minor=None):
    """Time of a kernel whose kv tail of r elements costs (worst - 1) x r / (period - 1) more;
    `minor`: a weaker extra drop at odd multiples of period / 2."""
    s = np.asarray(s, float)
    r = s % period
    t = s ** 2 * (1 + (worst - 1) * r / (period - 1))
    if minor:
        t = t * np.where((s % (period // 2) == 0) & (r != 0), 1.0, minor)
    return t


def test_period_found_from_the_scan():
    assert find_period(SCAN, _kernel(SCAN)) == 16
    assert find_period(SCAN, _kernel(SCAN, period=8)) == 8
    assert find_period(SCAN, _kernel(SCAN, period=32, worst=1.5)) == 32
    # multiples of 8 a little faster than their neighbours: still a period of 16
    assert find_period(SCAN, _kernel(SCAN, minor=1.05)) == 16
    # time growing as s^2 alone, or a tail too cheap to see: no period
    assert find_period(SCAN, SCAN.astype(float) ** 2 + 5) is None
    assert find_period(SCAN, _kernel(SCAN, worst=1.05)) is None
    # repeated seqs are pooled by their median
    assert find_period(np.concatenate([SCAN, SCAN]), np.concatenate([_kernel(SCAN), _kernel(SCAN) * 1.01])) == 16


def test_a_period_with_one_multiple_in_the_scan_is_not_found():
    """A tiny scan, 31…49, with seq 32 alone much faster (noise or not): one multiple of 32 says
    nothing, and the fit that follows needs two; the multiples of 16 (32, 48) decide."""
    seqs = np.arange(31, 50)
    times = seqs.astype(float) ** 2
    times[seqs == 32] *= 0.5
    assert find_period(seqs, times) is None  # 48 does not drop, so 16 is not it either
    times[seqs == 48] *= 0.5
    assert find_period(seqs, times) == 16
    scan = pd.DataFrame({"backend": "flash", "dtype": "float32", "seq_kv": seqs, "median_us": times})
    assert fit_alignment(scan)[("flash", "float32")]["period"] == 16


def test_ramp_measures_the_share_of_the_worst_tail():
    t = _kernel(SCAN, worst=2.0)
    ramp = fit_ramp(SCAN, t, 16)
    assert ramp[0] == 0 and ramp[-1] == pytest.approx(1.0)
    # log(1 + r/15) / log 2: the share of the period's end excess, in log time
    np.testing.assert_allclose(ramp, np.log1p(np.arange(16) / 15) / np.log(2), atol=1e-9)
    # a stall in one period is outvoted by the others (the median over periods)
    t_stall = t.copy()
    t_stall[SCAN == 70] *= 3
    assert fit_ramp(SCAN, t_stall, 16)[70 % 16] == pytest.approx(ramp[70 % 16])
    with pytest.raises(ValueError, match="two multiples"):
        fit_ramp(np.arange(65, 80), _kernel(np.arange(65, 80)), 16)
    np.testing.assert_array_equal(tail([64, 65, 79, 80], 16), [0, 1, 15, 0])
    np.testing.assert_array_equal(tail([65, 79], None), [0, 0])


def _samples(worst: float = 2.0) -> pd.DataFrame:
    """The grid (seq 32..256), its twins at seq - 1 and a scan, from a kernel whose tail costs
    up to `worst`x; the flash float32 kernel only, both head dims and causal flags."""
    rows = []

    def add(batch, s, hd, causal, grid):
        fl = float(attention_flops(batch, 8, s, s, hd, causal))
        us = fl / (100.0 * batch) * float(_kernel(s, worst=worst)) / s ** 2
        rows.append(dict(backend="flash", dtype="float32", batch=batch, heads=8, seq_q=s, seq_kv=s, head_dim=hd,
                         causal=causal, flops=fl, median_us=us, held_out=False, grid=grid))

    for batch in (1, 2, 4):
        for s in (32, 64, 128, 256):
            for hd in (32, 128):
                for causal in (False, True):
                    add(batch, s, hd, causal, BASE_GRID)
                    add(batch, s - 1, hd, causal, TWIN_GRID)
    for s in SCAN:
        add(1, int(s), 64, False, SCAN_GRID)
    return pd.DataFrame(rows)


def _pred(m, s, batch=2, hd=32):
    return float(m.predict("flash", "float32", batch, 8, s, s, hd, False))


def test_model_charges_the_tail_it_measured():
    df = _samples()
    plain = AttentionModel.fit(df[df["grid"] == BASE_GRID])
    m = AttentionModel.fit(df)
    assert m.alignment[("flash", "float32")]["period"] == 16 and not plain.alignment
    # aligned seqs: as without twins
    for s in (48, 64, 96, 200 - 200 % 16):
        assert _pred(m, s) == pytest.approx(_pred(plain, s))
    # the period's last tail pays the twins' whole ratio (2x here), at grid seqs and between them
    assert _pred(m, 127) / _pred(plain, 127) == pytest.approx(2.0, rel=0.02)
    assert _pred(m, 95) / _pred(plain, 95) == pytest.approx(2.0, rel=0.02)
    # a tail of 5: the ramp's share of it
    assert _pred(m, 101) / _pred(plain, 101) == pytest.approx(1 + 5 / 15, rel=0.02)
    # head dims between the measured ones, and other batches, get it too
    assert _pred(m, 95, batch=3, hd=80) / _pred(plain, 95, batch=3, hd=80) == pytest.approx(2.0, rel=0.02)
    again = AttentionModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.alignment == m.alignment
    assert _pred(again, 101) == pytest.approx(_pred(m, 101))


def test_no_period_no_correction_and_old_tables_still_fit():
    df = _samples(worst=1.0)
    m = AttentionModel.fit(df)
    assert m.alignment == {}
    assert _pred(m, 101) == pytest.approx(_pred(AttentionModel.fit(df[df["grid"] == BASE_GRID]), 101))
    old = _samples().query("grid == @BASE_GRID").drop(columns="grid")  # a table from before the column
    assert AttentionModel.fit(old).alignment == {}
    with pytest.raises(ValueError, match="no rows of the attention grid"):
        AttentionModel.fit(_samples().query("grid == @SCAN_GRID"))
    assert fit_alignment(_samples().query("grid == @SCAN_GRID"))[("flash", "float32")]["period"] == 16


def test_twins_are_the_grid_at_seq_minus_one():
    from pipeline.sweeps.attention import SCAN_SEQS, scan_points, training_points, twin_points
    from pipeline.sweeps.profiles import get_profile

    train = training_points(get_profile("quick"))
    twins = twin_points(train)
    assert [(p.batch, p.seq_q + 1, p.head_dim, p.causal) for p in twins] == \
        [(p.batch, p.seq_q, p.head_dim, p.causal) for p in train]
    assert all(p.grid == TWIN_GRID and p.seq_kv == p.seq_q and not p.held_out for p in twins)
    scan = scan_points()
    assert [p.seq_kv for p in scan] == list(SCAN_SEQS) and {p.grid for p in scan} == {SCAN_GRID}
    # odd multiples of every candidate period up to 64 are in the scan
    assert {64, 192} <= set(SCAN_SEQS) and 63 in SCAN_SEQS
    assert get_profile("quick").attention_seq_scan and not get_profile("tiny").attention_seq_scan


def test_tiny_sweep_times_the_scan_and_the_twins(monkeypatch):
    from dataclasses import replace

    import pipeline.sweeps.attention as sa
    from pipeline.runner import run_sweep
    from pipeline.sweeps import profiles

    monkeypatch.setitem(profiles.PROFILES, "tiny", replace(profiles.PROFILES["tiny"], attention_seq_scan=True))
    monkeypatch.setattr(sa, "SCAN_SEQS", range(31, 50))
    periods = iter([16, None, None, None])  # the first (backend, dtype) has a period, the others not
    monkeypatch.setattr(sa, "find_period", lambda seqs, times: next(periods))
    df = pd.DataFrame(run_sweep("attention", "cpu", "tiny", run_id="t"))
    n_train = len(sa.training_points(profiles.PROFILES["tiny"]))
    per_combo = df.groupby(["backend", "dtype", "grid"]).size()
    assert (per_combo.xs(SCAN_GRID, level="grid") == 19).all()
    twins = per_combo.xs(TWIN_GRID, level="grid")
    assert len(twins) == 1 and twins.iloc[0] == n_train
    model = AttentionModel.fit(df[~df["held_out"]])
    assert all(t.unaligned_log is None for k, t in model.tables.items() if k[:2] != twins.index[0])
