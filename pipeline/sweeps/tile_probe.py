"""The CPU's effective GEMM tile, measured: the padding step of M and of N.

A CPU GEMM has no thread-block tile the model can read off a kernel name, but its
micro-kernel computes whole register blocks: on AVX-512 a row-major output is produced 16
columns at a time, so N = 2 costs what N = 16 costs (and 24 what 32 does), while M pads by 1.
The step is a partial tile in PM2Lat's sense (III-C), so the tables count padded tiles the
same way a GPU's do. Measured per (op, dtype) by timing M and N over small values at a fixed
other size and finding the step g for which time ~ a + b * ceil(x / g) fits best.
"""
from __future__ import annotations

import time

import numpy as np

PROBE_DIMS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # 1 is left out: M or N = 1 is a GEMV path
PROBE_OTHER = 512  # the fixed M (or N) and K while the other dimension varies: large enough
# that a step of padding (N 16 -> 24: +50 %) stands well above timing noise
STEPS = (1, 2, 4, 8, 16, 32)
# The best-fitting step is taken only if it cuts the squared relative error of "no padding"
# (step 1) at least 3x. Real padding is plain (N on this AVX-512 Xeon: 5-15x at step 16);
# M's timings wander with the BLAS's own blocking and threading, which some step may fit
# somewhat better by chance (up to 2.2x seen).
BETTER = 1 / 3
# This VM has slow spells: GEMMs run ~1.5x slow for a few tenths of a second, often right
# after a process starts. A spell over the first few sizes hides the step, so the probe warms
# up, then times the sizes twice, ascending and descending, and keeps each size's faster time.
WARMUP_S = 0.3
# A shape between two behaviours (mm float32 on the Xeon VM: flat to N = 16, then ~linear)
# fits a step only just better or worse than none, and one probe said 16 in one sweep and 1 in
# the next, which re-laid the whole-wave grid. The probe runs this many times; the step found
# most often is kept (the larger on a tie). The profile says how many (Profile.tile_probe_rounds).


def granularity(xs, ts) -> int:
    """The padding step of a dimension from times `ts` at sizes `xs`: the step for which
    time = a + b * ceil(x / step) fits best, if it fits clearly better than no padding. The
    worst point is left out of each fit's error, so one disturbed timing cannot decide."""
    xs, ts = np.asarray(xs, float), np.asarray(ts, float)
    if xs.shape != ts.shape or xs.size < 4 or not np.all(np.isfinite(ts) & (ts > 0)):
        raise ValueError(f"granularity needs >= 4 positive finite times, one per size; got {ts}")
    errors = {}
    for step in STEPS:
        design = np.stack([np.ones_like(xs), np.ceil(xs / step)], axis=1) / ts[:, None]  # relative residuals
        coef, *_ = np.linalg.lstsq(design, np.ones_like(ts), rcond=None)
        errors[step] = float(np.sort((design @ coef - 1) ** 2)[:-1].sum())
    best = min(errors, key=errors.get)
    return best if errors[best] < BETTER * errors[1] else 1


def probe_tile(time_us, rounds: int = 3) -> tuple[int, int]:
    """(tile_m, tile_n) for one op and dtype; time_us(m, n, k) times a GEMM of that shape."""
    if rounds < 1:
        raise ValueError(f"the tile probe needs at least one round, not {rounds}")
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_S:
        time_us(PROBE_OTHER, PROBE_DIMS[0], PROBE_OTHER)
    found_m, found_n = [], []
    for _ in range(rounds):
        found_n.append(granularity(PROBE_DIMS, _fastest_of_two_passes(lambda n: time_us(PROBE_OTHER, n, PROBE_OTHER))))
        found_m.append(granularity(PROBE_DIMS, _fastest_of_two_passes(lambda m: time_us(m, PROBE_OTHER, PROBE_OTHER))))
    return most_often(found_m), most_often(found_n)


def most_often(steps: list[int]) -> int:
    """The step found most often; the larger of those found equally often."""
    return max(set(steps), key=lambda s: (steps.count(s), s))


def _fastest_of_two_passes(time_at) -> list[float]:
    up = [time_at(x) for x in PROBE_DIMS]
    down = [time_at(x) for x in reversed(PROBE_DIMS)][::-1]
    return [min(a, b) for a, b in zip(up, down)]
