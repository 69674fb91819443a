"""Execution settings (paper II-B3): work-group sizes, numbers of work-groups, and the IQR
rebalancing of execution times (Fig. 1). Pure functions of their arguments and a numpy
Generator, so they are unit-testable without a device.

Against the device's N_CU compute units (SMs on a GPU, cores for PoCL's CPU device), the
number of work-groups N_WG falls in three regimes: idle (N_WG < N_CU), under-utilized
(N_CU <= N_WG < k*N_CU) and fully utilized (N_WG >= k*N_CU, k*N_CU the paper's constant
full-utilization point). They are sampled 25 : 60 : 15. gsize = N_WG * lsize (eq. 2).
"""
from __future__ import annotations

import numpy as np

RATIO = (25, 60, 15)  # idle : under-utilized : fully utilized
REGIMES = ("idle", "under", "full")


def lsize_choices(preferred: int, max_wg: int, count: int, rng: np.random.Generator, cap: int = 1024) -> list[int]:
    """Up to `count` distinct work-group sizes: multiples of the device's preferred work-group
    size multiple (the warp size on a GPU), at most min(max work-group size, cap), ascending."""
    top = max(min(max_wg, cap) // preferred, 1)
    options = preferred * np.arange(1, top + 1)
    pick = rng.choice(options, size=min(count, options.size), replace=False)
    return sorted(int(x) for x in pick)


def split_counts(total: int, ratio: tuple[int, ...] = RATIO) -> list[int]:
    """`total` split in proportion to `ratio` (largest remainders), summing to `total`."""
    exact = np.asarray(ratio, float) * total / sum(ratio)
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return [int(c) for c in counts]


def regime_bounds(compute_units: int, full_k: int, full_span: int = 4) -> dict[str, tuple[int, int]]:
    """Inclusive N_WG range per regime; idle is empty on a one-compute-unit device."""
    cu = max(compute_units, 1)
    return {"idle": (1, cu - 1), "under": (cu, max(full_k * cu - 1, cu)),
            "full": (full_k * cu, full_span * full_k * cu)}


def sample_work_groups(compute_units: int, count: int, rng: np.random.Generator, full_k: int = 8,
                       full_span: int = 4, ratio: tuple[int, ...] = RATIO) -> list[tuple[int, str]]:
    """`count` (N_WG, regime) draws, idle : under : full = `ratio` (an empty idle range passes
    its share to under-utilized). Uniform within a regime; duplicates are possible where a
    range is narrower than its share (a 2-core CPU has one idle N_WG)."""
    bounds = regime_bounds(compute_units, full_k, full_span)
    counts = split_counts(count, ratio)
    if bounds["idle"][1] < bounds["idle"][0]:
        counts = [0, counts[0] + counts[1], counts[2]]
    out = []
    for regime, n in zip(REGIMES, counts):
        lo, hi = bounds[regime]
        out += [(int(v), regime) for v in rng.integers(lo, hi + 1, size=n)]
    return out


def iqr_rebalance(n_wg, times_us, count: int) -> list[int]:
    """New N_WG values whose predicted times fill the execution-time ranges the samples miss.

    The bulk of the times lies between the quartiles; above Q3 samples are sparse (Fig. 1a:
    most launches are short). The range (Q3, max] is cut into `count` equal bins; each bin
    holding no sample is a missing range, and its centre is mapped back to N_WG through a
    least-squares line time = a + b * N_WG fitted on the samples. Returns the new N_WG values
    (ascending, >= 1, none already sampled); [] when nothing is missing, fewer than three
    samples are given, or time does not grow with N_WG."""
    n = np.asarray(n_wg, float)
    t = np.asarray(times_us, float)
    ok = np.isfinite(t) & np.isfinite(n)
    n, t = n[ok], t[ok]
    if count <= 0 or t.size < 3 or np.ptp(n) == 0:
        return []
    q3, t_max = np.percentile(t, 75), t.max()
    if t_max <= q3:
        return []
    b, a = np.polyfit(n, t, 1)
    if b <= 0:
        return []
    edges = np.linspace(q3, t_max, count + 1)
    held = np.histogram(t, bins=edges)[0]
    centres = (edges[:-1] + edges[1:]) / 2
    new = {max(int(round((c - a) / b)), 1) for c in centres[held == 0]}
    return sorted(new - {int(v) for v in n})
