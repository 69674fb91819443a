"""How well a machine repeats its own timings: held-out rows timed a second time, minutes later.

A held-out error is measured against one timing of each shape. On a quiet machine that timing
repeats to a few percent, and the error is the model's. On a shared VM it may not: on the
model-85 Xeon VM (2026-11-27), 24 training cells of the committed take's mm float32 grid,
re-timed a day later within one minute, came back at 0.54x to 1.45x their first timing
(median 1.08x), each with a within-timing cv under 0.2. No model of shapes can be scored below
that spread, and only measuring it says which part of an error is the machine's.

So at the end of the GEMM, utility and memory sweeps a fixed-seed sample of their held-out rows is timed again, in shuffled
order, with the sweep's own spec, and each keeps the second median as `repeat_us`. The fit
never reads it; the summary sets the sample's mean |repeat / first - 1| beside the model's
held-out error (pipeline/analysis/repeat.py).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pipeline.harness.order import interleaved
from pipeline.harness.timer import TimingSpec, measure


def repeat_sample(groups: Sequence, eligible: Sequence[bool], per_group: int, seed: int = 0) -> list[int]:
    """Indices of up to `per_group` eligible rows per group (any hashable label), drawn with a
    fixed seed: the same rows every run of the same grid, so runs compare."""
    if per_group < 0:
        raise ValueError(f"per_group must be >= 0, not {per_group}")
    rng = np.random.default_rng(seed)
    by_group: dict = {}
    for i, (g, ok) in enumerate(zip(groups, eligible)):
        if ok:
            by_group.setdefault(g, []).append(i)
    picked = []
    for g in sorted(by_group, key=str):
        idx = by_group[g]
        picked += sorted(int(i) for i in rng.choice(idx, size=min(per_group, len(idx)), replace=False))
    return sorted(picked)


def retime(rows: list[dict], makers: list[Callable[[], Callable[[], object]]], picked: Sequence[int],
           spec: TimingSpec, device: str, l2_bytes: int = 0, log=None) -> int:
    """Time rows[i] (i in `picked`) again, in a seeded shuffled order, and set its `repeat_us`
    (its `repeat_stalled` when the second timing stalled: a stall is not the machine's repeat).
    Returns how many rows were re-timed."""
    picked = list(picked)
    for j in interleaved(len(picked), seed=1):
        i = picked[j]
        fn = makers[i]()
        fn()  # one untimed call first: the GEMM sweep runs each point once (naming its kernel) before timing it
        meas = measure(fn, spec, device, l2_bytes)
        rows[i]["repeat_us"] = meas.median_us
        rows[i]["repeat_stalled"] = bool(meas.stalled)
    if picked and log:
        log(f"{len(picked)} held-out rows timed a second time: how well this machine repeats itself")
    return len(picked)
