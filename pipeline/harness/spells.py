"""Whether a CPU timing ran in a slow spell: a tiny fixed GEMM timed just before and just after.

A shared VM slows down in spells that no reading inside the guest shows: on the model-85 Xeon
VM (2026-11-27 18:23) a 256 x 1024 x 1024 mm ran 2.4-2.7 ms for a minute, then 3.7-3.9 ms for
26 s, then 2.4-2.6 ms again, with no steal time, no runnable process and no page fault to tell
(another guest on the core's sibling, or the host's clocks). A probe can: over four minutes of
short spells (18:25-18:29), 4 x 3235 timings of four ops (mm 256 x 1024 x 1024, mm 64 x 64 x 64,
a 512 x 4096 gelu and add), each between two readings of this probe, the slower reading more
than 1.2x the probe's usual (lower-quartile) time flagged 27-31 % of the timings and held 73-94 %
of those that read more than 1.2x the op's usual time; among the rest 1-10 % read slow, against
12-27 % overall. The probe costs ~0.5 ms a timing. The host probe below cost 2.4 ms a reading
in the host's slow state at 9 runs, two a timing (a GEMM sweep point took 268 against 254 ms,
+5.5 %, on the Zen 3 EPYC VM, 2026-11-29), so it takes HOST_PROBE_REPS runs.

`measure` (timer.py) takes a reading before and after each CPU timing (the one after the
previous timing serves as this one's before when it is fresh: RECENT_S) and the row keeps the
slower (`probe_us`, and `host_probe_us` for the second probe below); at the end of a sweep, rows
whose reading is SPELL_RATIO over the sweep's lower quartile are timed again (suspects.py). The
decision waits for the whole sweep's readings: a usual time taken from the first few would be a
spell's if the sweep began in one.

The GEMM probe does not see every kind of spell. A second probe times the host's side of an op:
a tiny `add` called HOST_PROBE_CALLS times (the interpreter, the dispatcher and the allocator, no
arithmetic to speak of). On the Zen 3 EPYC VM (2026-11-29 04:50-04:55, nothing else running,
2 threads), read
every ~1.3 s for 5 minutes (738 readings) beside 15 training steps of dlrm_ddp-cpu at batch 32
in the same process, the host probe read 3.6 µs a call for minutes at a time and 6.6-9 µs for
minutes at a time (10th and 90th percentiles of 50 calls: 182 and 410 µs), and the step ran
2.6-3.1 ms in the first state and 4.7-7.8 ms in the second. The log step time's correlation with the host probe
was 0.87; with the GEMM probe 0.14 (it read 66-92 µs in both states), with a random 128-byte row
gather from a 128 MB table 0.71 and with a 64 MB copy 0.61. A step of many small ops (DLRM at
small batch, a model's batch-1 forward) is host work. Since 2026-11-29 every CPU timing reads both
probes: kernel rows (`measure`), workload steps, trace captures and `--measure`. Whether a kernel
sweep's rows move with the host state is left to each sweep's trial (suspects.py): in the take of
2026-11-29 07:59 its re-timings paid in the utility sweep (small memory-bound ops) and not in the
GEMM, memory or attention sweeps.
"""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

PROBE_SIDE = 128  # float32 mm with its output kept: ~23 us on the model-85 Xeon VM, no page faults
PROBE_REPS = 9
SPELL_RATIO = 1.2  # a reading this many times the sweep's lower quartile was taken in a spell
USUAL_QUANTILE = 0.25  # the probe's usual time: the lower quartile of a sweep's readings
MIN_READINGS = 20  # fewer rows with readings than this: no usual time, nothing flagged

_operands = None


def probe_us() -> float:
    """The median µs of PROBE_REPS runs of the probe GEMM, now (CPU)."""
    global _operands
    import torch

    if _operands is None:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(PROBE_SIDE, PROBE_SIDE, generator=g) for _ in range(2))
        _operands = (a, b, torch.empty(PROBE_SIDE, PROBE_SIDE))
    a, b, out = _operands
    torch.mm(a, b, out=out)
    times = []
    for _ in range(PROBE_REPS):
        t0 = time.perf_counter_ns()
        torch.mm(a, b, out=out)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return float(statistics.median(times))


HOST_PROBE_CALLS = 32  # calls of a 16-float add per run: ~0.1 ms a run in the quick state above
# runs per reading: fewer than the GEMM probe's, since every kernel row read it twice (a
# fresh clone's fast test tier took 646 s at 9 runs and 589 s at 5, against 494 s before the kernel
# rows read it, 2026-11-29; the replays, which time nothing, also ran ~25 % longer in the first);
# the two states are ~2x apart. Since ca2eea6 a row timed right after another reads it once (RECENT_S)
HOST_PROBE_REPS = 5
_host_operands = None


def host_probe_us() -> float:
    """The median µs per call of a tiny `add` over HOST_PROBE_REPS runs of HOST_PROBE_CALLS calls,
    now (CPU): the host's speed at running an op, which the GEMM probe does not read (module doc)."""
    global _host_operands
    import torch

    if _host_operands is None:
        _host_operands = (torch.zeros(16), torch.empty(16))
    a, out = _host_operands
    torch.add(a, 1.0, out=out)
    times = []
    for _ in range(HOST_PROBE_REPS):
        t0 = time.perf_counter_ns()
        for _ in range(HOST_PROBE_CALLS):
            torch.add(a, 1.0, out=out)
        times.append((time.perf_counter_ns() - t0) / 1e3 / HOST_PROBE_CALLS)
    return float(statistics.median(times))


def in_spell(readings) -> np.ndarray:
    """Which rows' readings of one probe (`probe_us` or `host_probe_us`, NaN where none) are
    SPELL_RATIO over the lower quartile of all of them; none without MIN_READINGS readings."""
    r = np.asarray(readings, float)
    usual = usual_us(r)
    if usual is None:
        return np.zeros(r.size, bool)
    return np.isfinite(r) & (r > SPELL_RATIO * usual)


def usual_us(readings) -> float | None:
    """The probe's usual time: the lower quartile of the finite, positive readings; None with
    fewer than MIN_READINGS of them."""
    r = np.asarray(readings, float)
    r = r[np.isfinite(r) & (r > 0)]
    return float(np.quantile(r, USUAL_QUANTILE)) if r.size >= MIN_READINGS else None


# A reading taken after one call stands for the reading before the next when that call starts
# within RECENT_S: rows timed back to back then pay one reading each, not two. The states a probe
# tells apart last seconds to minutes (module doc); what runs between two rows (making the next
# row's operands) takes milliseconds. The probes were half the tiny utility sweep's time
# (17.0 s with them, 9.4 s without, 936 rows, Zen 3 EPYC VM, 2026-11-29).
RECENT_S = 0.25
_after: tuple[float, float, float] | None = None  # (monotonic s, GEMM probe, host probe) after the last call


def forget_reading() -> None:
    """The next timing reads its own before (read_both_around)."""
    global _after
    _after = None


def read_both_around(call):
    """(call(), the slower GEMM probe reading, the slower host probe reading), each the slower of
    a reading just before and one just after the call. The reading after the previous call is
    the one before this call when it is under RECENT_S old."""
    global _after
    recent = _after is not None and time.monotonic() - _after[0] < RECENT_S
    before = _after[1:] if recent else (probe_us(), host_probe_us())
    got = call()
    after = probe_us(), host_probe_us()
    _after = (time.monotonic(), *after)
    return got, slower(before[0], after[0]), slower(before[1], after[1])


def usual_pair(readings) -> tuple[float | None, float | None]:
    """Each probe's usual time (usual_us) over (GEMM probe, host probe) readings."""
    pairs = [tuple(r) for r in readings]
    return usual_us([r[0] for r in pairs]), usual_us([r[1] for r in pairs])


def usual_of_rows(rows) -> tuple[float | None, float | None] | None:
    """Each probe's usual time (usual_pair) over sample rows (dicts) that carry `probe_us` and
    `host_probe_us`; None where neither has readings (a GPU's rows, or a table from before the probes)."""
    usual = usual_pair((r.get("probe_us", math.nan), r.get("host_probe_us", math.nan)) for r in rows)
    return usual if any(u is not None for u in usual) else None


def anchored_usual(own: tuple[float | None, float | None],
                   calibration: tuple[float | None, float | None] | None) -> tuple[float | None, float | None]:
    """Each probe's usual time for a sweep's spell test: the lower of the sweep's own (usual_pair)
    and the device calibration's (the GEMM sweep's readings), whichever are known (finite, > 0).
    Why: a spell that lasts the whole sweep is its own usual time, and flags nothing. On the Zen 5
    EPYC VM (2026-11-30 16:21-16:23) the GEMM probe read 35 us around every workload step, against
    23 us through the GEMM, utility and memory sweeps and the traces just before, and the steps ran
    1.3-1.6x the reference take's; the runs flagged none of them."""
    calibration = calibration or (None, None)
    return tuple(min((u for u in pair if u is not None and 0 < u < math.inf), default=None)
                 for pair in zip(own, calibration))


def sweep_usual(readings, passes: int, calibration) -> tuple[tuple[float | None, float | None], str | None]:
    """(each probe's usual time for a sweep of `passes` passes over its steps, with `readings`
    (GEMM probe, host probe) around every timing, anchored to the calibration's usual times; a line
    saying where the calibration's were the lower, else None). One pass tests no spells: the quick
    profile's passes are what give the usual time its readings, and a test's scaled run times once."""
    if passes < 2:
        return (None, None), None
    own = usual_pair(readings)
    usual = anchored_usual(own, calibration)
    lower = [f"{name} {u:.{d}f} us (the calibration's; {'-' if o is None else f'{o:.{d}f}'} us in this run)"
             for name, d, u, o in zip(("GEMM probe", "host probe"), (1, 2), usual, own) if u is not None and u != o]
    return usual, ("usual times from the calibration where it read quicker: " + ", ".join(lower)) if lower else None


def pair_in_spell(gemm: float | None, host: float | None, usual: tuple[float | None, float | None]) -> bool:
    """Whether either probe read over SPELL_RATIO times its usual time (None: no usual, no spell)."""
    return any(u is not None and r is not None and math.isfinite(r) and r > SPELL_RATIO * u
               for r, u in zip((gemm, host), usual))


def wait_until_usual(usual_gemm: float | None, usual_host: float | None, budget_s: float) -> tuple[float, bool]:
    """Probe until both probes read within SPELL_RATIO of their usual times (a None usual is not
    waited for) or `budget_s` ran out (0: one round of readings; the host probe is not read while
    the GEMM probe reads slow). Returns (the seconds waited, whether both read usual at the end)."""
    forget_reading()  # the timing after a wait reads its own before: the one kept from before it may be a spell's
    t0 = time.monotonic()

    def quiet() -> bool:
        return ((usual_gemm is None or probe_us() <= SPELL_RATIO * usual_gemm)
                and (usual_host is None or host_probe_us() <= SPELL_RATIO * usual_host))

    while not (now_quiet := quiet()) and time.monotonic() - t0 < budget_s:
        time.sleep(WAIT_STEP_S)
    return time.monotonic() - t0, now_quiet


def again_when_usual(which, usual: tuple[float | None, float | None], budget_s: float, again,
                     spell_only=frozenset()) -> tuple[float, int]:
    """again(i) for each i of `which`, each once both probes read their usual times, all the waits
    together at most `budget_s`. Once a wait runs out with the machine still in its spell (on the
    Zen 3 EPYC VM the host's slow state lasts minutes), the items of `spell_only`, flagged for the
    spell alone, are left as they were: timed again in the same spell they could tell nothing new.
    Returns (the seconds waited, how many items were left)."""
    waited, left, still = 0.0, 0, False
    for i in which:
        if not still:
            w, quiet = wait_until_usual(*usual, max(budget_s - waited, 0.0))
            waited, still = waited + w, not quiet
        if still and i in spell_only:
            left += 1
            continue
        again(i)
    return waited, left


WAIT_STEP_S = 0.25  # between two readings while waiting for a quiet machine


def slower(before: float, after: float) -> float:
    return max(before, after) if math.isfinite(before) and math.isfinite(after) else float("nan")


def spell_note(reading: float, calibration_readings, probe: str = "the spell probe") -> str | None:
    """A line for a one-off measurement (`--measure`) whose `probe` reading is SPELL_RATIO over
    the lower quartile of the calibration's readings of the same probe (`probe_us` or
    `host_probe_us` of its rows): the machine ran slower than when it was calibrated, and an error
    of about that much is the machine's. None otherwise, or without readings."""
    usual = usual_us(calibration_readings)
    if reading is None or not math.isfinite(reading) or usual is None or reading <= SPELL_RATIO * usual:
        return None
    digits = 1 if usual >= 10 else 2
    return (f"{probe} read {reading:.{digits}f} us around this timing against {usual:.{digits}f} us usual in the "
            f"calibration ({reading / usual:.2f}x): the machine ran slower than when it was calibrated, and an "
            "error of about that much is the machine's; measure again on a quieter machine")
