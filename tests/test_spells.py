"""The spell probes (harness/spells.py): their readings around a timing, and the wait for their usual times."""
import numpy as np
import pytest

from pipeline.harness import spells
from pipeline.harness.timer import TimingSpec

SPEC = TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=3)


def test_in_spell_needs_enough_readings_and_flags_only_slow_ones():
    from pipeline.harness.spells import MIN_READINGS, SPELL_RATIO, in_spell

    calm = np.full(MIN_READINGS, 20.0)
    assert not in_spell(calm).any() and not in_spell(calm[:-1] * np.r_[1.0, [9.0] * (MIN_READINGS - 2)]).any()
    got = in_spell(np.r_[calm, 20.0 * SPELL_RATIO * 1.01, 20.0 * SPELL_RATIO * 0.99, np.nan])
    assert got.tolist() == [False] * MIN_READINGS + [True, False, False]


def test_a_cpu_measurement_carries_both_probes_readings():
    from pipeline.harness.timer import measure

    m = measure(lambda: sum(range(100)), SPEC, "cpu")
    assert m.probe_us > 0 and m.row()["probe_us"] == m.probe_us
    assert m.host_probe_us > 0 and m.row()["host_probe_us"] == m.host_probe_us


def test_a_fresh_reading_after_one_timing_is_the_next_ones_before(monkeypatch):
    """Back to back, each timing reads the probes once (after it); the reading after the last
    timing stands for the one before the next only while it is under RECENT_S old."""
    clock = iter([0.0, 0.1, 0.1, 5.0, 5.0])  # monotonic: stamped after call 1; checked before and stamped after 2, 3
    monkeypatch.setattr(spells.time, "monotonic", lambda: next(clock))
    gemm, host = iter([30.0, 20.0, 21.0, 22.0, 23.0]), iter([9.0, 3.0, 4.0, 5.0, 2.0])
    monkeypatch.setattr(spells, "probe_us", lambda: next(gemm))
    monkeypatch.setattr(spells, "host_probe_us", lambda: next(host))
    assert spells.read_both_around(lambda: "a") == ("a", 30.0, 9.0)  # none before: read before and after
    assert spells.read_both_around(lambda: "b") == ("b", 21.0, 4.0)  # 0.1 s on: (20, 3) stands before
    assert spells.read_both_around(lambda: "c") == ("c", 23.0, 5.0)  # 4.9 s on: read before again
    assert next(gemm, None) is None and next(host, None) is None


def test_a_timing_after_a_wait_reads_its_own_before(monkeypatch):
    """A wait that finds the probes usual on its first reading does not sleep: the timing after it
    must not take the reading kept from before the wait (a spell's) as its before."""
    monkeypatch.setattr(spells.time, "sleep", lambda s: None)
    gemm = iter([20.0, 40.0, 20.0, 21.0, 22.0])  # before, after (a spell), the wait, then before and after
    monkeypatch.setattr(spells, "probe_us", lambda: next(gemm))
    monkeypatch.setattr(spells, "host_probe_us", lambda: 3.0)
    assert spells.read_both_around(lambda: "a")[1] == 40.0
    assert spells.wait_until_usual(20.0, 3.0, budget_s=10.0)[1]  # usual at once: no sleep
    assert spells.read_both_around(lambda: "b")[1] == 22.0  # 21 before and 22 after, not the 40 kept


def test_the_host_probe_reads_one_tiny_ops_time(monkeypatch):
    """A per-call time: a clock that advances 1 µs over each run of HOST_PROBE_CALLS calls reads
    1/HOST_PROBE_CALLS µs, not the run's 1 µs."""
    import torch

    clock = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(spells.time, "perf_counter_ns", lambda: next(clock))
    calls = []
    real_add = torch.add
    monkeypatch.setattr(torch, "add", lambda *a, **k: (calls.append(1), real_add(*a, **k))[1])
    got = spells.host_probe_us()
    assert got == pytest.approx(1.0 / spells.HOST_PROBE_CALLS)
    assert len(calls) == 1 + spells.HOST_PROBE_REPS * spells.HOST_PROBE_CALLS


def test_the_wait_ends_when_both_probes_read_usual(monkeypatch):
    """Each probe reads slow until the machine has slept twice, whichever is read first; a probe
    without a usual time is not waited for; the wait never passes its budget."""
    slept = []
    monkeypatch.setattr(spells.time, "sleep", slept.append)
    monkeypatch.setattr(spells, "probe_us", lambda: 20.0 if len(slept) >= 1 else 30.0)
    monkeypatch.setattr(spells, "host_probe_us", lambda: 3.0 if len(slept) >= 2 else 9.0)
    assert spells.wait_until_usual(20.0, 3.0, budget_s=60.0)[1] and len(slept) == 2
    slept.clear()
    assert spells.wait_until_usual(None, None, budget_s=60.0) == (pytest.approx(0.0, abs=0.5), True) and not slept
    monkeypatch.setattr(spells.time, "sleep", lambda s: None)
    monkeypatch.setattr(spells, "probe_us", lambda: 99.0)
    waited, quiet = spells.wait_until_usual(20.0, None, budget_s=0.05)
    assert waited >= 0.05 and not quiet


def test_a_spell_that_outlasts_the_wait_leaves_the_spell_only_items(monkeypatch):
    """The first wait runs out in the spell: the items flagged for the spell alone are left, the
    others are done all the same, and the waits stay within the budget."""
    budgets = []

    def wait(g, h, budget_s):
        budgets.append(budget_s)
        return budget_s, False  # the spell outlasts every wait

    monkeypatch.setattr(spells, "wait_until_usual", wait)
    done = []
    waited, left = spells.again_when_usual([0, 1, 2, 3], (20.0, 3.0), 10.0, done.append, spell_only={0, 2})
    assert done == [1, 3] and left == 2 and waited == 10.0 and budgets == [10.0]
    monkeypatch.setattr(spells, "wait_until_usual", lambda g, h, budget_s: (1.0, True))  # usual at once each time
    done.clear()
    assert spells.again_when_usual([0, 1, 2], (20.0, 3.0), 10.0, done.append, spell_only={0, 1}) == (3.0, 0)
    assert done == [0, 1, 2]


def test_either_probe_can_say_spell_and_a_missing_reading_says_nothing():
    usual = (20.0, 3.0)
    assert spells.pair_in_spell(25.0, 3.0, usual) and spells.pair_in_spell(20.0, 4.0, usual)
    assert not spells.pair_in_spell(23.0, 3.5, usual)
    assert not spells.pair_in_spell(float("nan"), None, usual)
    assert not spells.pair_in_spell(99.0, 99.0, (None, None))
    assert spells.usual_pair([(20.0, float("nan"))] * spells.MIN_READINGS) == (20.0, None)


def test_a_spell_as_long_as_a_sweep_is_read_against_the_calibrations_usual_time():
    """A sweep whose every reading is a spell's has that spell as its own usual time; the lower of
    its own and the calibration's per probe flags it (the Zen 5 VM's workload runs, 2026-11-30:
    35 us through the runs, 23 us in the GEMM sweep)."""
    own, calibration = (35.0, 2.2), (23.0, 2.4)
    assert spells.anchored_usual(own, calibration) == (23.0, 2.2)  # a quicker host in the runs stays theirs
    assert spells.pair_in_spell(35.0, 2.2, spells.anchored_usual(own, calibration))
    assert not spells.pair_in_spell(35.0, 2.2, own)
    assert spells.anchored_usual(own, None) == own
    assert spells.anchored_usual((None, None), (23.0, None)) == (23.0, None)
    assert spells.anchored_usual((35.0, None), (None, None)) == (35.0, None)
