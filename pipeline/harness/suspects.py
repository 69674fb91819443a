"""Rows timed once more at a sweep's end: off their neighbours' surface, or timed in a spell.

Two visits a shuffled pass apart (revisit.py) leave a point slow only when both land in a slow
spell, which is rare when spells are short and common when the machine is slow for a good part
of the sweep. Two `make run`s on the model-85 Xeon VM (2026-11-27, 14:50 and 15:45) timed the
same 2982 GEMM grid shapes; 279 read more than 1.25x slower in the second than in the first
(63 the other way round), e.g. mm float32 64 x 1024 x 256: 149 us, then 252 and 260 on the
second take's two visits; re-timed idle, 128 x 1024 x 256 ran 285 us. Such a cell priced GPT-2
4l-512's 16 addmm at 27.2 ms against 16.0 from the other take (19.1 traced).

A sweep's grid is a smooth surface almost everywhere: log time is close to linear in the log
of the shape's sides over a few neighbouring grid points. A row that sits well above the plane
its nearest neighbours span was likely timed slow; it is timed once more, the quicker timing
kept. Tried on the two takes above, rows more than 1.2x over the plane of their 6 nearest
neighbours were 13-14 % of the GEMM grids and held 134 of the 279 (and 48 of the 63) rows the
other take timed > 1.25x quicker; on the utility grids 9-12 %, holding 30 of 53 and 62 of 123.
A row flagged for a real feature (a kernel switch, a slow band) is only timed again and keeps
its time: a false alarm costs a timing, never accuracy. The test reads the row's own time, so
it is for the training grids only: a held-out row re-timed only when slow would be scored with
a bias toward the model. Rows whose probe readings (spells.py: the GEMM probe, and the host
probe that reads the host's speed at running an op) say they ran in a slow spell are timed again
too, after a wait of a few seconds at most for that probe's usual time (whatever it reads then),
held-out ones included: those tests do not read the row's own time.
Each test is judged on its first rows timed again: where they came back quicker no more often
than on a machine whose state never changed, its other rows keep their timing (beats_chance).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, ContextManager, Hashable, Sequence

import numpy as np

from pipeline.harness.order import interleaved
from pipeline.harness.spells import in_spell, usual_us, wait_until_usual
from pipeline.harness.timer import TimingSpec, measure

NEIGHBOURS = 6  # the rows whose plane a row is held against
SUSPECT_RATIO = 1.2  # a row this many times over that plane is timed again
SUSPECT_SEED = 5  # the extra visit's order (the first visit's is seed 0, the held-out repeat's 1, revisit's 2 on)
# A sweep's extra visit waits at most this long in all for a spell to pass, and no longer than
# the profile's own wait for a quiet machine (stall_wait_s, as remeasure_stalled is given): a tiny
# profile's test (2 s) spent ~30 s of its ~33 s waiting here on the Zen 3 VM.
MAX_WAIT_S = 30.0
# the probe tests (spells.py): each flags rows by one probe's reading; the test's name -> its column
PROBE_TESTS = {"spell": "probe_us", "host": "host_probe_us"}


def off_surface(groups: Sequence[Hashable | None], coords: np.ndarray, us: np.ndarray,
                neighbours: int = NEIGHBOURS, ratio: float = SUSPECT_RATIO) -> np.ndarray:
    """Which rows sit more than `ratio` times above the least-squares plane of log(us) over the
    log2 coordinates of their `neighbours` nearest rows of the same group (rows of group None,
    and groups with no more rows than `neighbours`, are never flagged). Coordinates that do not
    vary among the neighbours are left out of the plane."""
    us = np.asarray(us, float)
    logc = np.log2(np.asarray(coords, float))
    if logc.ndim != 2 or logc.shape[0] != us.size:
        raise ValueError(f"coords must be (rows, dims) for {us.size} rows, got shape {logc.shape}")
    if not np.all(np.isfinite(logc)) or not np.all(np.isfinite(us)) or (us <= 0).any():
        raise ValueError("off_surface needs positive, finite coordinates and times")
    flagged = np.zeros(us.size, bool)
    by_group: dict = {}
    for i, g in enumerate(groups):
        if g is not None:
            by_group.setdefault(g, []).append(i)
    for idx in by_group.values():
        if len(idx) <= neighbours:
            continue
        idx = np.asarray(idx)
        x, y = logc[idx], np.log(us[idx])
        for j in range(idx.size):
            d = ((x - x[j]) ** 2).sum(1)
            d[j] = np.inf
            near = np.argsort(d, kind="stable")[:neighbours]
            a = np.c_[np.ones(neighbours), x[near] - x[j]]
            a = a[:, np.r_[True, a[:, 1:].std(0) > 0]]
            coef = np.linalg.lstsq(a, y[near], rcond=None)[0]
            flagged[idx[j]] = y[j] - coef[0] > np.log(ratio)  # the plane's value at the row itself
    return flagged


def revisit_suspects(rows: list[dict], makers: list[Callable[[], Callable[[], object]]], spec: TimingSpec,
                     device: str, groups: Sequence[Hashable | None], coords: np.ndarray | None, l2_bytes: int = 0,
                     log=None, within: Callable[[int], ContextManager] | None = None,
                     stall_wait_s: float = MAX_WAIT_S) -> int:
    """Time once more, in a shuffled order, the rows off their group's surface (off_surface on
    their `median_us`; rows of group None, the held-out ones, and every row without `coords`, are
    not tested), the rows whose GEMM probe reading says they ran in a slow spell (spells.in_spell
    on `probe_us`) and the rows whose host probe reading does (`host_probe_us`; a row both probes
    flagged belongs to the GEMM probe's test): the probe tests do not read the row's own time, so
    held-out rows are tested too. The quicker timing is kept in place (a stalled one never
    replaces a row). Before a probe row's re-timing the sweep waits for that test's probe to read
    its usual time, a few seconds at most and each test's waits together within the sweep's
    budget, and then times it whatever the probe reads: left as timed, the rows of a spell that
    outlasted the wait kept their slow timing (the EPYC VM's attention sweep, 2026-11-29 07:55:
    384 rows flagged by the GEMM probe; 16 timed again within the 30 s of waiting, 13 of them
    quicker; the other 368 left as timed). The log says how many of each test's re-timings came
    after a usual reading. Once TRIAL rows a test flagged were timed again, the rest of its rows
    are left as timed unless the extra timing beat theirs more often than chance
    (`beats_chance`). Every row gets `suspect` (whether it was timed again). CPU only, as revisit
    is. Returns how many rows the extra timing replaced."""
    if device.startswith("cuda") or not rows:
        return 0
    surface = off_surface(groups, coords, [r["median_us"] for r in rows]) if coords is not None \
        else np.zeros(len(rows), bool)
    readings = {name: np.array([r.get(col, np.nan) for r in rows], float) for name, col in PROBE_TESTS.items()}
    spell = in_spell(readings["spell"])
    host = in_spell(readings["host"])
    for r in rows:
        r["suspect"] = False
    todo = np.flatnonzero(surface | spell | host)
    if not todo.size:
        return 0
    # each probe test waits for its own probe only: the host's slow state lasts minutes, and a
    # wait for both would spend the GEMM probe's rows' budget on it
    usual = {"spell": (usual_us(readings["spell"]), None), "host": (None, usual_us(readings["host"]))}
    waited, max_wait_s = {"spell": 0.0, "host": 0.0}, min(MAX_WAIT_S, stall_wait_s)
    # per test, per row timed again: (was it quicker, how often an unchanged machine's would be)
    outcomes: dict[str, list[tuple[bool, float]]] = {"surface": [], "spell": [], "host": []}
    trusted = {"surface": True, "spell": True, "host": True}
    after_usual = {"spell": 0, "host": 0}  # re-timings that followed a usual reading of their probe
    for k in interleaved(todo.size, seed=SUSPECT_SEED):
        i = int(todo[k])
        which = "surface" if surface[i] else "spell" if spell[i] else "host"
        if not trusted[which]:
            continue
        if which != "surface":
            w, quiet = _wait_for_usual(usual[which], max(max_wait_s - waited[which], 0.0))
            waited[which] += w
            after_usual[which] += quiet
        with (within(i) if within is not None else nullcontext()):
            meas = measure(makers[i](), spec, device, l2_bytes)
        rows[i]["suspect"] = True
        quicker = not meas.stalled and meas.median_us < rows[i]["median_us"]
        if quicker:
            rows[i].update(meas.row(spec.cv_threshold))  # first_us, visits and suspect stay
        mine = outcomes[which]
        mine.append((quicker, 1.0 / (int(rows[i].get("visits") or 1) + 1)))
        if len(mine) == TRIAL:
            trusted[which] = beats_chance(sum(q for q, _ in mine), [p for _, p in mine])
    tally = {which: (len(got), sum(q for q, _ in got)) for which, got in outcomes.items()}  # timed again, quicker
    if log:
        flagged = {"surface": int(surface.sum()), "spell": int((spell & ~surface).sum()),
                   "host": int((host & ~spell & ~surface).sum())}
        log(_said(tally, flagged, trusted, sum(waited.values()), after_usual))
    return sum(q for _, q in tally.values())


# A third timing of a machine whose state did not change beats the better of the first two 1 time
# in 3 (three exchangeable draws; after one visit, 1 in 2): what the extra visit of rows flagged
# for no reason scores. How often each test's rows beat it differs by machine and by day: the
# surface test's alone were quicker for 303 of 444 on the model-85 Xeon VM (17:43, 2026-11-27)
# but 87 of 413 on the EPYC VM (the 22:06 run: there its rows were mostly the surface's real features);
# the probe's were quicker for 150 of 164 attention and 45 of 72 memory rows on the EPYC VM, and
# for 15 of its first 30 GEMM rows (the GEMM rows of both tests, before the trial: 443 of 1265
# there at 21:33, 309 of 993 on model-85 at 18:33). So each test earns its extra visits per sweep.
TRIAL = 30  # rows of one test timed again before the test is judged
TRIAL_Z = 2.0  # how many standard deviations over chance the trial must score (one-sided, ~2 %)


def beats_chance(quicker: int, chances) -> bool:
    """Whether `quicker` of a test's re-timed rows beat their kept timing more often than on a
    machine whose state never changed, where row i would be quicker with probability chances[i]
    (1 / (its visits + 1)): more than that sum by TRIAL_Z standard deviations of it."""
    p = np.asarray(chances, float)
    if not p.size:
        return True
    return quicker > p.sum() + TRIAL_Z * math.sqrt(float((p * (1 - p)).sum()))


def _said(tally: dict, flagged: dict, trusted: dict, waited: float, after_usual: dict) -> str:
    (s_n, s_q), (p_n, p_q), (h_n, h_q) = tally["surface"], tally["spell"], tally["host"]
    text = (f"{s_n + p_n + h_n} rows timed once more: {s_n} of {flagged['surface']} more than {SUSPECT_RATIO:g}x over "
            f"their {NEIGHBOURS} nearest neighbours' surface, quicker for {s_q}; {p_n} of the {flagged['spell']} others "
            f"timed in a slow spell of the GEMM probe, quicker for {p_q} ({after_usual['spell']} timed again after it "
            f"read usual); {h_n} of the {flagged['host']} others timed while the host probe read slow, quicker for {h_q} "
            f"({after_usual['host']} after it read usual) (on a machine whose state never changed, 1 time in 3 after "
            "two visits)")
    for which, name in (("surface", "the surface test's"), ("spell", "the GEMM probe's"),
                        ("host", "the host probe's")):
        if not trusted[which]:
            q = tally[which][1]
            text += (f"; {name} rows beat that by too little ({q} of the first {TRIAL}): it told nothing on this "
                     f"machine now, and its other {flagged[which] - tally[which][0]} rows keep their timing")
    return text + f"; {waited:.0f} s waited for the probes' usual times"


def _wait_for_usual(usual: tuple[float | None, float | None], budget_s: float) -> tuple[float, bool]:
    """Probe until the probes with a `usual` time (GEMM, host) read within SPELL_RATIO of it or
    `budget_s` (at most 3 s; 0: one reading) ran out; (the seconds waited, whether they did)."""
    return wait_until_usual(*usual, min(budget_s, 3.0))
