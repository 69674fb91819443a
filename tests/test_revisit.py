"""Every point timed on two visits, the quicker kept (harness/revisit.py)."""
import numpy as np
import pytest

from pipeline.harness import revisit as rv
from pipeline.harness.timer import Measurement, TimingSpec

SPEC = TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=3)


def _scripted(monkeypatch, second: dict[int, tuple[float, float]]):
    """measure() answers row i's second visit with (median, cpu_util) from `second`."""
    def fake_measure(fn, spec, device, l2_bytes=0):
        i = fn()
        t, util = second[i]
        return Measurement(np.full(3, t), cpu_util=util)

    monkeypatch.setattr(rv, "measure", fake_measure)


def test_a_quicker_second_visit_replaces_the_row_and_the_first_is_kept_beside_it(monkeypatch):
    rows = [{"median_us": m, "cv": 0.0, "remeasured": False} for m in (100.0, 100.0, 100.0)]
    makers = [lambda i=i: (lambda: i) for i in range(3)]
    # row 0 was timed in a spell; row 1's second visit lands in one; row 2's second visit stalls
    _scripted(monkeypatch, {0: (60.0, 2.0), 1: (150.0, 2.0), 2: (50.0, 0.1)})
    said = []
    assert rv.revisit(rows, makers, SPEC, "cpu", visits=2, log=said.append) == 1
    assert [r["median_us"] for r in rows] == [60.0, 100.0, 100.0]
    assert all(r["first_us"] == 100.0 and r["visits"] == 2 for r in rows)
    # the pass says where it is (the last point always), then what it replaced
    assert said[-2].startswith("[visit 2 of 2] 3/3 (100%)") and said[-1].endswith("quicker for 1/3")


def test_one_visit_or_a_gpu_times_nothing_again(monkeypatch):
    rows = [{"median_us": 100.0}]
    _scripted(monkeypatch, {0: (1.0, 2.0)})
    makers = [lambda: (lambda: 0)]
    assert rv.revisit(rows, makers, SPEC, "cpu", visits=1) == 0
    assert rv.revisit(rows, makers, SPEC, "cuda:0", visits=2) == 0
    assert rows == [{"median_us": 100.0}]
    with pytest.raises(ValueError, match="visits must be >= 1, not 0"):
        rv.revisit(rows, makers, SPEC, "cpu", visits=0)


def test_a_sweep_marks_its_rows_with_their_visits():
    """The memory sweep at the tiny profile's sizes, with two visits: every row says so."""
    from dataclasses import replace

    from pipeline.device.discover import identify
    from pipeline.sweeps import memory
    from pipeline.sweeps.profiles import get_profile

    dev = identify("cpu")
    prof = replace(get_profile("tiny"), visits=2)
    orig = memory.get_profile
    memory.get_profile = lambda name, kind="cpu": prof
    try:
        rows = memory.sweep_memory(dev, prof)
    finally:
        memory.get_profile = orig
    assert rows and all(r["visits"] == 2 and r["first_us"] > 0 for r in rows)
    # the quicker visit, unless a stalled row was then re-measured on a quiet machine
    assert all(r["median_us"] <= r["first_us"] or r["remeasured"] for r in rows)


def test_the_embedding_sweep_visits_each_group_twice(monkeypatch):
    """The embedding sweep, tiny sizes, two visits: every row (hot, both directions) timed twice,
    the quicker kept, the rows themselves unchanged in number and shape."""
    from dataclasses import replace

    from pipeline.device.discover import identify
    from pipeline.sweeps import embedding
    from pipeline.sweeps.profiles import get_profile

    dev = identify("cpu")
    once = embedding.sweep_embedding(dev, "tiny", log=lambda m: None)
    prof = replace(get_profile("tiny"), visits=2)
    monkeypatch.setattr(embedding, "get_profile", lambda name, kind="cpu": prof)
    said = []
    rows = embedding.sweep_embedding(dev, "tiny", log=said.append)
    assert sorted((r["direction"], r["shape"]) for r in rows) == sorted((r["direction"], r["shape"]) for r in once)
    assert rows and all(r["visits"] == 2 and r["first_us"] > 0 and r["median_us"] <= r["first_us"] for r in rows)
    assert "visits" not in once[0]
    assert any("every point timed on 2 visits" in m and f"/{len(rows)}" in m for m in said)
