"""Unaligned key/value lengths in fused attention, measured (no torch).

The attention grid measures seq at powers of two. On the Xeon VM's CPU flash kernel a
seq_kv that is not a multiple of 16 runs up to 2x as long as the grid's interpolation says
(bf16 seq 63: 65 us, seq 64: 31 us), rising across each period from about 1x just past a
multiple to the most just before the next: the key/value tail runs a slower path. Neither the
period nor the ramp is assumed; both come from a scan of every seq in one range
(sweeps/attention.py, grid "seq_scan") at one shape per (backend, dtype):

- `find_period`: the smallest period p whose multiples are clearly faster than one element
  fewer (a drop below DROP of the time, where the s^2 growth alone gives ~1.03) at most of
  them; None when none is, as on kernels that pad the tail for free.
- `fit_ramp`: ramp[r], r = 0 .. p-1, the share of the period's end excess (in log time over a
  smooth curve through the scan's multiples of p) a tail of r elements pays; ramp[p-1] = 1.

How large the end excess is at other shapes is what the "unaligned" twins (the attention grid
at seq - 1) measure; attention.py scales it by the ramp.
"""
from __future__ import annotations

import numpy as np

DROP = 0.9  # a multiple of p counts as aligned when it takes < 90 % of one element fewer
MOST = 0.75  # ... at this share of the multiples in the scan
MAX_RAMP = 1.5  # a ramp point above this is a stall in the scan, not the kernel


def _series(seqs, times) -> dict[int, float]:
    out = {}
    for s, t in zip(np.asarray(seqs, int), np.asarray(times, float)):
        out.setdefault(int(s), []).append(t)
    return {s: float(np.median(v)) for s, v in out.items()}


def find_period(seqs, times, max_period: int = 64) -> int | None:
    """The alignment period of the kv length in a seq scan: the smallest power of two p whose
    odd multiples, and those of every larger power up to max_period, mostly drop (a multiple
    of 16 is also one of 8, so "the multiples of 8 drop" would hold for a period of 16 too).
    A p with fewer than two multiples in the scan says nothing either way: one drop may be
    noise, and fit_ramp needs two (a tiny scan, 31…49, once "found" 32 from seq 32 alone)."""
    t = _series(seqs, times)
    period, p = None, max_period
    while p >= 2:
        new = [m for m in t if m % p == 0 and (m // p) % 2 == 1 and m - 1 in t]
        if new and sum(m % p == 0 for m in t) >= 2:
            if np.mean([t[m] < DROP * t[m - 1] for m in new]) < MOST:
                break
            period = p
        p //= 2
    return period


def fit_ramp(seqs, times, period: int) -> np.ndarray:
    """ramp[r]: median over the scan's whole periods of log(t / smooth) at a0 + r over the same
    at a0 + p - 1, where smooth interpolates the throughput (s^2 / t) of the aligned seqs."""
    t = _series(seqs, times)
    aligned = np.array(sorted(s for s in t if s % period == 0), float)
    if aligned.size < 2:
        raise ValueError(f"a seq scan needs two multiples of its period {period}; has {aligned.tolist()}")
    thr = aligned ** 2 / np.array([t[int(s)] for s in aligned])

    def excess(s: int) -> float:
        return float(np.log(t[s] / (s ** 2 / np.interp(s, aligned, thr))))

    ratios = [[] for _ in range(period)]
    for a0 in aligned[:-1].astype(int):
        end = a0 + period - 1
        if end not in t or excess(end) <= 0.05:  # no excess at this period's end: nothing to share out
            continue
        for r in range(1, period):
            if a0 + r in t:
                ratios[r].append(excess(a0 + r) / excess(end))
    ramp = np.array([np.median(v) if v else np.nan for v in ratios])
    ramp[0] = 0.0
    if np.isnan(ramp).all():
        return np.zeros(period)
    ramp = np.interp(np.arange(period), np.flatnonzero(~np.isnan(ramp)), ramp[~np.isnan(ramp)])
    return np.clip(ramp, 0.0, MAX_RAMP)


def tail(seq_kv, period: int | None) -> np.ndarray:
    """The kv tail past the last multiple of the period (0 when aligned or without a period)."""
    s = np.asarray(seq_kv, dtype=np.int64)
    return np.zeros(s.shape, np.int64) if not period else s % period
