"""How much memory a CPU flush must sweep before an op really starts cold.

Inside a model an op rarely finds its operands in cache: DLRM's eight embedding tables
(102 MB in the quick config) and everything between two lookups of one table evict it. A
micro-benchmark that repeats one lookup keeps its table hot; on the 2-thread EPYC VM one
lookup (B 512, L 100, a 12.8 MB table) took 88 us hot and ~470 us cold, and traced inside the
DLRM step it took 344 us. The cache to evict is not always what the OS reports: the same VM
reports a 32 MB L3, yet the lookup kept slowing as the flush grew to 64 and 128 MB
(243, 315, 455, 469 us after 32, 64, 128, 256 MB). So the flush size is measured: the
smallest multiple of the reported last-level cache after which a cold gather is within 10 %
of the slowest seen.
"""
from __future__ import annotations

import os
import time

import numpy as np

PROBE_ROWS, PROBE_DIM, PROBE_GATHERS = 100_000, 32, 51_200  # a 12.8 MB float32 table, 51 200 random rows
MAX_DOUBLINGS = 4


def cpu_flush(nbytes: int):
    """A callable that evicts about `nbytes` of cache: a read-modify-write pass over a buffer
    (a large zero-fill may use streaming stores that bypass the cache and evict nothing)."""
    import torch

    buf = torch.ones(max(int(nbytes) // 4, 1), dtype=torch.float32)
    return lambda: buf.add_(1.0)


def _cold_gather_us(flush_bytes: int, reps: int = 9) -> float:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    table = torch.randn(PROBE_ROWS, PROBE_DIM, generator=g)
    idx = torch.randint(0, PROBE_ROWS, (PROBE_GATHERS,), generator=g)
    offsets = torch.arange(0, PROBE_GATHERS, 100)
    flush = cpu_flush(flush_bytes)
    times = []
    with torch.no_grad():
        for _ in range(reps):
            flush()
            t0 = time.perf_counter_ns()
            F.embedding_bag(idx, table, offsets, mode="sum")
            times.append((time.perf_counter_ns() - t0) / 1e3)
    return float(np.median(times))


def cpu_llc_bytes() -> int | None:
    """Size of the highest-level data/unified cache of cpu0, from sysfs (None when unreadable)."""
    path = "/sys/devices/system/cpu/cpu0/cache"
    best = (0, 0)
    try:
        for idx in (i for i in os.listdir(path) if i.startswith("index")):
            with open(f"{path}/{idx}/type") as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(f"{path}/{idx}/level") as f:
                level = int(f.read().strip())
            with open(f"{path}/{idx}/size") as f:
                size = f.read().strip().upper()
            mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
            best = max(best, (level, int(size.rstrip("KMG")) * mult))
    except (OSError, ValueError):
        return None
    return best[1] or None


def available_bytes() -> int | None:
    """Memory the OS says is available now (Linux /proc/meminfo), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def effective_flush_bytes(reported_llc: int, log=None, gather_us=_cold_gather_us,
                          memory_bytes: int | None = None) -> int:
    """The smallest flush, of the reported last-level cache times 1, 2, 4 ... 16, after which a
    cold gather takes at least 90 % of the slowest one seen. Every size is timed: a doubling
    that stops at the first step under +10 % let one noisy step end it early (the EPYC VM's
    probe said 32, 64 and 128 MB in three runs). No size takes more than a quarter of the
    available memory (`memory_bytes`, default: what the OS says now): a Xeon VM reports its
    host's 480 MB L3, and 16x that is a 7.7 GB buffer on a 24 GB machine."""
    memory_bytes = available_bytes() if memory_bytes is None else memory_bytes
    sizes = [int(reported_llc) << i for i in range(MAX_DOUBLINGS + 1)]
    if memory_bytes:
        sizes = [s for s in sizes if s <= memory_bytes // 4] or sizes[:1]
    times = [gather_us(size) for size in sizes]
    size = next(s for s, t in zip(sizes, times) if t >= 0.9 * max(times))
    if log:
        log(f"cache probe: a cold gather needs a {size / 2**20:.0f} MB flush (the OS reports a "
            f"{reported_llc / 2**20:.0f} MB last-level cache; gather after each flush: "
            f"{', '.join(f'{t:.0f}' for t in times)} us)")
    return size


def flush_seconds(flush, reps: int = 3) -> float:
    """Median time of one call of `flush` (what each cold repetition adds to a sweep)."""
    flush()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        flush()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
