"""The order a sweep times its points in: shuffled, with a fixed seed.

A shared machine has slow spells seconds long (on the 2-thread AMD EPYC VM of issue 14 a
256^3 GEMM and a 4 MB multiply both ran ~20 % slower for 1-5 s at a time, with no steal time
reported). Timed in list order, a sweep's held-out shapes come last, as one block of ~10 s,
and one spell lands on all of them: on that VM the held-out mm float32 rows read 1.2-1.5x
slower than the same shapes re-timed later, while its training rows re-timed within 3 %, so
a held-out error of -37 % was mostly a measurement artefact. Shuffled, a spell touches a few
points of every group instead, and the fit and its check see the same machine.
Rows are still written in list order; only the timing is interleaved.
"""
from __future__ import annotations

import numpy as np


def interleaved(n: int, seed: int = 0) -> list[int]:
    """The indices 0..n-1 in a seeded random order (the same every run: drift compares runs)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n)]
