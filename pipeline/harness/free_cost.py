"""What freeing a step's output costs the host (CPU): a probe of the allocator, not of a model.

A measured step drops what it returns before the next call: GPT-2's logits (100-200 MB at
batch 4-8) are freed inside the timed loop, after the last op, where no op's time and no
gap between ops holds them. glibc serves a block of at least its mmap threshold with its own
mapping and returns it with munmap, which walks every page; below, a freed block goes back to
the heap for almost nothing. The threshold starts at 128 KiB and rises to the size of each
mapped block freed, up to 32 MiB on 64-bit: in a loop of steps, blocks under 32 MiB stop
paying. Another allocator (jemalloc, tcmalloc) pays what it pays; the probe measures it.
On the Xeon VM (2026-11-26) a 128 MB tensor freed in 5.5 ms (0.17 µs a 4 KiB page), a 24 MB
one in 6 µs; GPT-2 1l b4 ran 53.9 ms a step dropping its logits and 49.6 ms keeping them.

So the probe frees written tensors of a ladder of sizes in steady state (the allocator has
seen each size before, as in a loop of steps) and reports the per-page cost of the sizes
that pay it and the smallest such size. Both are the machine's (and its libc's), measured.
"""
from __future__ import annotations

import time

import numpy as np

PAGE = 4096  # the page the per-page cost is per: predict.page_faults.PAGE_BYTES, which prices it
SIZES_MB = (4, 8, 16, 32, 64, 128)
REPS, KEPT = 6, 3  # frees per size; the medians of the last KEPT (the first ones move the threshold)
PAYS = 0.5  # a size pays the per-page cost when it pays at least this share of the largest size's


def free_cost(sizes_mb=SIZES_MB) -> dict[str, float | int | None]:
    """{"free_us_per_page", "free_from_bytes"} of this machine (summarize)."""
    import torch

    per_page = {}
    for mb in sizes_mb:
        n = mb << 20
        took = []
        for _ in range(REPS):
            t = torch.empty(n // 4, dtype=torch.float32)
            t.fill_(1.0)  # written, by the op's threads, as an output is
            t0 = time.perf_counter()
            del t
            took.append(time.perf_counter() - t0)
        per_page[n] = float(np.median(took[-KEPT:])) * 1e6 / (n / PAGE)
    return summarize(per_page)


def summarize(per_page: dict[int, float]) -> dict[str, float | int | None]:
    """µs per page to free a block of free_from_bytes or more: the median over the sizes that pay
    at least PAYS of the largest size's cost, from the smallest of them. None where nothing was
    measured or the largest size's free cost nothing."""
    largest = per_page[max(per_page)] if per_page else 0.0
    if not largest > 0:
        return {"free_us_per_page": None, "free_from_bytes": None}
    paying = sorted(n for n, c in per_page.items() if c >= PAYS * largest)
    return {"free_us_per_page": float(np.median([per_page[n] for n in paying])), "free_from_bytes": int(paying[0])}
