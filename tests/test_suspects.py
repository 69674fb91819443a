"""Rows off their neighbours' surface timed once more (harness/suspects.py)."""
import numpy as np
import pytest

from pipeline.harness import spells, suspects as sp
from pipeline.harness.timer import Measurement, TimingSpec

SPEC = TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=3)


def _lattice():
    """A GEMM-like surface: time proportional to m n k over powers of 4, plus a latency floor."""
    sides = [4 ** i for i in range(1, 5)]
    coords = np.array([(m, n, k, 1) for m in sides for n in sides for k in (64, 256)], float)
    us = 2.0 + coords[:, 0] * coords[:, 1] * coords[:, 2] / 2e5
    return coords, us


def test_a_smooth_surface_flags_nothing_and_a_slow_cell_is_flagged():
    coords, us = _lattice()
    groups = ["mm"] * len(us)
    assert not sp.off_surface(groups, coords, us).any()
    slow = us.copy()
    slow[21] *= 1.6  # timed in a spell through both visits
    flagged = sp.off_surface(groups, coords, slow)
    # a neighbour may be flagged with it (its plane now leans on the slow cell): a timing lost
    assert flagged[21] and flagged.sum() <= 2
    fast = us.copy()
    fast[21] /= 1.6  # a quicker cell is the machine's time, never re-timed for it
    assert not sp.off_surface(groups, coords, fast)[21]


def test_held_out_rows_and_small_groups_are_never_flagged():
    coords, us = _lattice()
    us = us.copy()
    us[5] *= 3.0
    groups = [None if i == 5 else "mm" for i in range(len(us))]
    assert not sp.off_surface(groups, coords, us)[5]
    few = sp.off_surface(["a"] * 4, coords[:4], us[:4] * np.array([1, 9, 1, 1]))
    assert not few.any()


@pytest.mark.parametrize("bad", [np.nan, 0.0, -1.0])
def test_bad_times_or_coordinates_are_refused(bad):
    coords, us = _lattice()
    us = us.copy()
    us[0] = bad
    with pytest.raises(ValueError, match="positive, finite"):
        sp.off_surface(["g"] * len(us), coords, us)
    with pytest.raises(ValueError, match="coords must be"):
        sp.off_surface(["g"] * 3, coords[:2], np.ones(3))


def test_suspect_rows_are_timed_again_and_only_a_quicker_unstalled_timing_replaces_them(monkeypatch):
    coords, us = _lattice()
    slow = us.copy()
    for i in (3, 21, 30):
        slow[i] *= 1.8
    rows = [{"median_us": float(t), "cv": 0.01, "first_us": float(t), "visits": 2} for t in slow]
    # row 3 re-times at the surface; row 21 re-times slower still; row 30's re-timing stalls
    again = {3: (float(us[3]), 2.0), 21: (float(slow[21]) * 1.1, 2.0), 30: (float(us[30]), 0.1)}
    timed = []
    flagged = set(np.flatnonzero(sp.off_surface(["mm"] * len(rows), coords, slow)))
    assert {3, 21, 30} <= flagged and len(flagged) <= 6  # a false alarm re-times at its own time

    def fake_measure(fn, spec, device, l2_bytes=0):
        i = fn()
        timed.append(i)
        t, util = again.get(i, (rows[i]["median_us"], 2.0))
        return Measurement(np.full(3, t), cpu_util=util)

    monkeypatch.setattr(sp, "measure", fake_measure)
    makers = [lambda i=i: (lambda: i) for i in range(len(rows))]
    said = []
    groups = ["mm"] * len(rows)
    assert sp.revisit_suspects(rows, makers, SPEC, "cpu", groups, coords, log=said.append) == 1
    assert sorted(timed) == sorted(flagged)
    assert rows[3]["median_us"] == pytest.approx(us[3]) and rows[3]["first_us"] == slow[3]
    assert rows[21]["median_us"] == slow[21] and rows[30]["median_us"] == slow[30]
    assert [i for i, r in enumerate(rows) if r["suspect"]] == sorted(flagged)
    assert said == [f"{len(flagged)} rows timed once more: {len(flagged)} of {len(flagged)} more than "
                    f"{sp.SUSPECT_RATIO:g}x over their {sp.NEIGHBOURS} nearest neighbours' surface, quicker for 1; 0 of "
                    "the 0 others timed in a slow spell of the GEMM probe, quicker for 0 (0 timed again after it read "
                    "usual); 0 of the 0 others timed while the host probe read slow, quicker for 0 (0 after it read "
                    "usual) (on a machine whose state never changed, 1 time in 3 after two visits); 0 s waited for the "
                    "probes' usual times"]


def test_rows_timed_in_a_spell_are_timed_again_held_out_ones_too(monkeypatch):
    """The probe test reads no row's own time: a held-out row whose probe read slow is re-timed,
    after the probe has read its usual time again."""
    n = 40
    rows = [{"median_us": 50.0, "cv": 0.01, "probe_us": 23.0} for _ in range(n)]
    rows[4]["probe_us"] = rows[9]["probe_us"] = 40.0  # both ran in a spell; row 9 is held out
    readings = iter([40.0, 23.0, 23.0])  # the first wait sees the spell once, then its end
    monkeypatch.setattr(spells, "probe_us", lambda: next(readings, 23.0))
    monkeypatch.setattr(spells.time, "sleep", lambda s: None)
    monkeypatch.setattr(sp, "measure", lambda fn, spec, device, l2_bytes=0: Measurement(np.full(3, 30.0 + fn()),
                                                                                           cpu_util=2.0))
    makers = [lambda i=i: (lambda: i) for i in range(n)]
    groups = [None if i == 9 else "g" for i in range(n)]
    coords = np.array([(i + 1, 1) for i in range(n)], float)
    rows_median = [r["median_us"] for r in rows]
    assert sp.revisit_suspects(rows, makers, SPEC, "cpu", groups, coords) == 2
    assert [i for i, r in enumerate(rows) if r["suspect"]] == [4, 9]
    assert rows[4]["median_us"] == 34.0 and rows[9]["median_us"] == 39.0
    assert [r["median_us"] for i, r in enumerate(rows) if i not in (4, 9)] == [m for i, m in enumerate(rows_median)
                                                                            if i not in (4, 9)]


def _spell_rows(n_spell: int, n_calm: int = 100, column: str = "probe_us"):
    usual, slow = {"probe_us": (23.0, 40.0), "host_probe_us": (3.6, 7.5)}[column]
    rows = [{"median_us": 50.0, "cv": 0.01, column: usual, "visits": 2} for _ in range(n_calm)]
    rows += [{"median_us": 50.0, "cv": 0.01, column: slow, "visits": 2} for _ in range(n_spell)]
    return rows, [lambda i=i: (lambda: i) for i in range(len(rows))]


@pytest.mark.parametrize("column, name", [("probe_us", "GEMM probe's"), ("host_probe_us", "host probe's")])
@pytest.mark.parametrize("quicker_every", [1, 3])
def test_each_probe_is_judged_on_its_first_spell_rows(monkeypatch, quicker_every, column, name):
    """Spell rows of either probe whose third timing beats the kept one no more often than chance
    (1 in 3 after two visits) stop that probe's re-timings after TRIAL of them; where it mostly
    does, every spell row is timed again."""
    rows, makers = _spell_rows(n_spell=2 * sp.TRIAL, column=column)
    monkeypatch.setattr(spells, "host_probe_us", lambda: 3.6)
    timed = []

    def fake_measure(fn, spec, device, l2_bytes=0):
        timed.append(fn())
        quick = len(timed) % quicker_every == 0  # every row, or one in three
        return Measurement(np.full(3, 40.0 if quick else 60.0), cpu_util=2.0)

    monkeypatch.setattr(sp, "measure", fake_measure)
    monkeypatch.setattr(spells, "probe_us", lambda: 23.0)
    said = []
    replaced = sp.revisit_suspects(rows, makers, SPEC, "cpu", [None] * len(rows), None, log=said.append)
    trusted = quicker_every == 1
    assert len(timed) == (2 * sp.TRIAL if trusted else sp.TRIAL) and min(timed) >= 100
    assert sum(r["suspect"] for r in rows) == len(timed) and replaced == len(timed) // quicker_every
    assert (f"the {name} rows beat that by too little (10 of the first 30): it told nothing on this machine now, "
            "and its other 30 rows keep their timing" in said[0]) != trusted


def test_beats_chance_counts_one_visit_rows_as_an_even_chance():
    assert sp.beats_chance(20, [1 / 3] * 30) and not sp.beats_chance(15, [1 / 3] * 30)
    assert not sp.beats_chance(20, [1 / 2] * 30)  # after one visit a second timing wins half the time
    assert sp.beats_chance(0, [])


def test_the_surface_test_is_judged_on_its_first_rows_too(monkeypatch):
    """Off-surface rows whose third timing is never quicker (the surface's own features, not slow
    timings): after TRIAL of them the rest keep their timing."""
    sides = [2 ** i for i in range(2, 12)]
    coords = np.array([(m, n, 64, 1) for m in sides for n in sides], float)
    us = 2.0 + coords[:, 0] * coords[:, 1] / 100.0
    bumpy = us * np.where(np.arange(len(us)) % 2 == 0, 1.0, 1.5)  # a checkerboard: half the rows off any plane
    rows = [{"median_us": float(t), "cv": 0.01, "visits": 2} for t in bumpy]
    flagged = int(sp.off_surface(["mm"] * len(rows), coords, bumpy).sum())
    assert flagged > sp.TRIAL
    timed = []

    def same_again(fn, spec, device, l2_bytes=0):
        timed.append(fn())
        return Measurement(np.full(3, rows[timed[-1]]["median_us"] * 1.01), cpu_util=2.0)

    monkeypatch.setattr(sp, "measure", same_again)
    said = []
    makers = [lambda i=i: (lambda: i) for i in range(len(rows))]
    assert sp.revisit_suspects(rows, makers, SPEC, "cpu", ["mm"] * len(rows), coords, log=said.append) == 0
    assert len(timed) == sp.TRIAL and sum(r["suspect"] for r in rows) == sp.TRIAL
    assert (f"the surface test's rows beat that by too little (0 of the first {sp.TRIAL}): it told nothing on this "
            f"machine now, and its other {flagged - sp.TRIAL} rows keep their timing") in said[0]


def test_a_gpu_times_nothing_again(monkeypatch):
    coords, us = _lattice()
    rows = [{"median_us": float(t)} for t in us * np.where(np.arange(len(us)) == 7, 3.0, 1.0)]
    monkeypatch.setattr(sp, "measure", lambda *a, **k: pytest.fail("a GPU row is not re-timed"))
    assert sp.revisit_suspects(rows, [], SPEC, "cuda:0", ["mm"] * len(rows), coords) == 0
    assert all("suspect" not in r for r in rows)


def test_the_utility_sweep_marks_its_training_rows(monkeypatch):
    """The utility sweep at the tiny profile's sizes with two visits: every row carries both probes'
    readings and says whether it was timed a third time. Three of its 13 ops (all 13 took ~50 s
    on a 2-thread VM): the groups are per (op, dtype), the marking the same for any op."""
    from dataclasses import replace

    from pipeline.device.discover import identify
    from pipeline.sweeps import utility
    from pipeline.sweeps.profiles import get_profile

    monkeypatch.setattr(utility, "UTILITY_OPS", ("relu", "softmax", "copy_rows"))
    prof = replace(get_profile("tiny"), visits=2)
    said = []
    rows = utility.sweep_utility(identify("cpu"), prof, log=said.append)
    assert {r["op"] for r in rows} == {"relu", "softmax", "copy_rows"}
    assert rows and all(isinstance(r["suspect"], bool) and r["probe_us"] > 0 and r["host_probe_us"] > 0 for r in rows)
    flagged = sum(r["suspect"] for r in rows)
    assert flagged == 0 or any(m.startswith(f"{flagged} rows timed once more: ") for m in said)


def test_a_measure_in_a_spell_says_so_against_the_calibrations_probe():
    from pipeline.harness.spells import MIN_READINGS, spell_note

    calibration = [22.7] * MIN_READINGS + [34.0] * 5 + [float("nan")]
    note = spell_note(35.0, calibration)
    assert note is not None and "35.0 us around this timing against 22.7 us usual" in note and "1.54x" in note
    assert spell_note(24.0, calibration) is None  # the machine's usual speed
    assert spell_note(35.0, calibration[:MIN_READINGS - 1]) is None  # too few readings to say
    assert spell_note(float("nan"), calibration) is None and spell_note(None, calibration) is None  # no probe read


def test_the_spell_waits_stay_within_the_budget_the_sweep_gives(monkeypatch):
    """All spell rows together wait no longer than the profile's wait for a quiet machine
    (stall_wait_s), and never over MAX_WAIT_S; once it is spent the rows are timed at once, the
    spell still on (left as timed they would keep their slow timing)."""
    budgets = []

    def wait(usual, budget_s):  # the probe never reads its usual time: each wait spends its cap
        budgets.append(budget_s)
        return min(budget_s, 3.0), False

    monkeypatch.setattr(sp, "_wait_for_usual", wait)
    monkeypatch.setattr(sp, "measure", lambda fn, spec, device, l2_bytes=0: Measurement(np.full(3, 40.0),
                                                                                           cpu_util=2.0))
    from pipeline.sweeps.profiles import get_profile

    def first_budgets(stall_wait_s):
        budgets.clear()
        rows, makers = _spell_rows(5, n_calm=20)
        sp.revisit_suspects(rows, makers, SPEC, "cpu", [None] * 25, None, stall_wait_s=stall_wait_s)
        assert sum(r["suspect"] for r in rows) == 5 and sum(r["median_us"] == 40.0 for r in rows) == 5
        return list(budgets)

    assert first_budgets(4.0) == [4.0, 1.0, 0.0, 0.0, 0.0]  # 3 s, then the last 1 s; then a reading each
    assert first_budgets(2.0)[0] == 2.0 and first_budgets(60.0)[0] == sp.MAX_WAIT_S
    assert first_budgets(get_profile("tiny").stall_wait_s)[0] == 2.0
    assert first_budgets(get_profile("quick").stall_wait_s)[0] == sp.MAX_WAIT_S  # a calibration's, as before


def test_rows_timed_while_the_host_ran_slow_are_timed_again_once_it_runs_usual(monkeypatch):
    """The host probe flags rows on its own (a GEMM probe that read usual throughout): the re-timing
    waits for the host probe's usual time, not for the GEMM probe's; a held-out row is re-timed
    too; the log counts them apart from the GEMM probe's."""
    n = 40
    rows = [{"median_us": 50.0, "cv": 0.01, "probe_us": 23.0, "host_probe_us": 3.6} for _ in range(n)]
    for i in (4, 9, 17):
        rows[i]["host_probe_us"] = 7.5  # the slow state; row 9 is held out
    host_reads = []

    def host_probe():  # slow for the first 3 readings, usual after
        host_reads.append(1)
        return 3.6 if len(host_reads) > 3 else 8.0

    clock = iter(np.arange(0.0, 10**4, spells.WAIT_STEP_S))
    monkeypatch.setattr(spells.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(spells.time, "sleep", lambda s: None)
    monkeypatch.setattr(spells, "probe_us", lambda: pytest.fail("a host row waits for the host probe only"))
    monkeypatch.setattr(spells, "host_probe_us", host_probe)
    timed, reads_at_timing = [], []

    def fake_measure(fn, spec, device, l2_bytes=0):
        timed.append(fn())
        reads_at_timing.append(len(host_reads))
        return Measurement(np.full(3, 40.0), cpu_util=2.0)

    monkeypatch.setattr(sp, "measure", fake_measure)
    makers = [lambda i=i: (lambda: i) for i in range(n)]
    groups = [None if i == 9 else "g" for i in range(n)]
    coords = np.array([(i + 1, 1) for i in range(n)], float)
    said = []
    assert sp.revisit_suspects(rows, makers, SPEC, "cpu", groups, coords, log=said.append) == 3
    assert sorted(timed) == [4, 9, 17] and reads_at_timing == [4, 5, 6]  # each timing after a usual reading
    assert [i for i, r in enumerate(rows) if r["suspect"]] == [4, 9, 17]
    assert sum(r["median_us"] == 40.0 for r in rows) == 3
    assert "0 of the 0 others timed in a slow spell of the GEMM probe" in said[0]
    assert "3 of the 3 others timed while the host probe read slow, quicker for 3 (3 after it read usual)" in said[0]


def test_a_measure_says_which_probe_read_slow_against_the_calibrations_own(monkeypatch, capsys):
    """`--measure`'s note reads the GEMM probe against the GEMM sweep's readings and the host probe
    against the GEMM sweep's and the traces' (the overheads' source); a missing table says nothing."""
    import pandas as pd

    from pipeline.cli import predict as cli_predict
    from pipeline.core.errors import DevcharError
    from pipeline.harness.spells import MIN_READINGS

    tables = {"gemm_samples": pd.DataFrame({"probe_us": [22.7] * MIN_READINGS,
                                            "host_probe_us": [3.6] * 10 + [float("nan")] * (MIN_READINGS - 10)}),
              "workload_graphs": pd.DataFrame({"host_probe_us": [3.7] * 10, "probe_us": [9.0] * 10})}

    class Rows:
        def device_rows(self, table, device):
            if table not in tables:
                raise DevcharError(f"no {table}")
            return tables[table]

    monkeypatch.setattr(cli_predict, "warehouse", Rows)
    monkeypatch.setattr(cli_predict, "local_slug", lambda d: "cpu-x")
    cli_predict._say_spell("cpu-x", Measurement(np.ones(3), probe_us=23.0, host_probe_us=7.5))
    out = capsys.readouterr().out
    assert "the host probe (a tiny op's time a call) read 7.50 us around this timing against 3.60 us usual" in out
    assert "spell probe" not in out  # 23.0 against 22.7: the GEMM probe read its usual time
    cli_predict._say_spell("cpu-x", Measurement(np.ones(3), probe_us=40.0, host_probe_us=3.7))
    out = capsys.readouterr().out
    assert "the spell probe read 40.0 us around this timing against 22.7 us usual" in out and "host" not in out
    del tables["workload_graphs"]  # 10 host readings: too few to say
    cli_predict._say_spell("cpu-x", Measurement(np.ones(3), probe_us=23.0, host_probe_us=7.5))
    assert capsys.readouterr().out == ""
    cli_predict._say_spell("cpu-other", Measurement(np.ones(3), probe_us=99.0))  # another machine's calibration
    assert capsys.readouterr().out == ""
