"""Every point of a CPU kernel sweep timed on two visits, a shuffled pass apart; the quicker kept.

The GEMM, utility, memory and attention sweeps call it over the whole sweep; the embedding sweep
once per (D, dtype) group, whose points share one table buffer.

A shared VM slows down in spells from a fraction of a second to minutes, and a point timed inside
one reads slow with no spread to show it (every repetition was slow alike): on the model-85 Xeon
VM two `make run`s 30 minutes apart (2026-11-27 11:31 and 11:58) timed 11 % of the same 3204
GEMM shapes more than 1.5x apart, and the slow rows of the second (64 x 4096 x 1024 linear:
8.7 ms at cv 0.011, 3.9 ms in the first) priced Qwen2.5's 128 x 4864 x 896 linear 52 % over
what it ran. Timed on four visits in turn (120 mm and linear float32 shapes of that grid, the
sweep's spec, each visit in a fresh shuffled order, 12:30), two single visits disagreed by more
than 1.2x on 13 % and 27 % of the shapes, the quicker of visits 1-2 against the quicker of
visits 3-4 on 0.8 %; mean |log ratio| 0.07-0.23 against 0.02. A spell seldom lands on both of a
point's visits, so the quicker visit is the machine's time and the slower one the spell's.

The first visit's median stays in the row (`first_us`), beside how many visits it had (`visits`).
The cost is a second pass of the sweep's timings: the quick GEMM sweep took 1126 s on the Xeon
VM (12:24), against 660-720 s with one visit. A GPU's kernel time does not depend on the host's load: one visit there.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

from pipeline.harness.order import interleaved
from pipeline.harness.progress import Progress
from pipeline.harness.timer import TimingSpec, measure

REVISIT_SEED = 2  # the first visit's order is seed 0, the held-out repeat's seed 1


def revisit(rows: list[dict], makers: list[Callable[[], Callable[[], object]]], spec: TimingSpec, device: str,
            visits: int, l2_bytes: int = 0, log=None,
            within: Callable[[int], ContextManager] | None = None) -> int:
    """Time every row (makers[i] builds row i's call; `within(i)` the context it was timed in)
    `visits - 1` more times, each pass in its own shuffled order, and keep, in place, the visit
    with the quicker median (a stalled visit never replaces a timing); every row gets `first_us`
    and `visits`. Returns how many rows a later visit replaced. CPU only, and only with visits > 1."""
    if visits < 1:
        raise ValueError(f"visits must be >= 1, not {visits}")
    if device.startswith("cuda") or visits == 1 or not rows:
        return 0
    for r in rows:
        r["first_us"], r["visits"] = r["median_us"], visits
    replaced = set()
    for v in range(1, visits):
        # a pass is as long as the sweep's own (16 min of the AVX2 EPYC's GEMMs): it says where it is
        prog = Progress(f"visit {v + 1} of {visits}", len(rows), log) if log else None
        for i in interleaved(len(rows), seed=REVISIT_SEED + v - 1):
            with (within(i) if within else nullcontext()):
                meas = measure(makers[i](), spec, device, l2_bytes)
            if not meas.stalled and meas.median_us < rows[i]["median_us"]:
                rows[i].update(meas.row(spec.cv_threshold))  # first_us and visits, set above, stay
                replaced.add(i)
            if prog:
                prog.step()
    if log:
        log(f"every point timed on {visits} visits: a later visit was quicker for {len(replaced)}/{len(rows)}")
    return len(replaced)
