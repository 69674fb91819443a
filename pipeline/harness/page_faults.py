"""What a fresh allocation costs on a CPU: the page faults of its first write.

glibc serves a large allocation (above its mmap threshold, at most 32 MB by default) with a
fresh mmap, so every call that allocates such an output faults in each of its pages. On the
Xeon VM of 2026-11-25 F.linear of 512 x 50257 x 128 float32 took 42 ms allocating its output
and 23 ms writing into a kept one (25 129 faults, 0.76 us each). The GEMM sweep
counts the faults of every row (harness/timer.py) and this probe measures the cost of one,
so the GEMM model can fit the kernel without them and charge them by output size.
"""
from __future__ import annotations

import resource
import time

import numpy as np

PROBE_BYTES = 64 << 20  # above glibc's largest dynamic mmap threshold: a fresh mapping each call
PROBE_K = 64  # enough work per output that the GEMM is a GEMM, little enough that faults stand out


def minor_faults() -> int:
    """Minor page faults of this process so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fault_us_per_page(nbytes: int = PROBE_BYTES, k: int = PROBE_K, reps: int = 7) -> float:
    """Extra microseconds per minor fault of a GEMM that allocates its output (`nbytes`, float32,
    2 x 1 in shape), against the same GEMM writing into a kept output; 0 when fresh allocations
    do not fault (an allocator that keeps its memory). On the idle Xeon VM: 0.41-0.58 us a page
    for outputs of 33-256 MB, the same as a fill of a fresh buffer. GPT-2's LM head
    (512 x 50257 x 128, linear) paid 0.76 in the same comparison: this probe under-prices it."""
    import torch

    n = max(int((nbytes // 4 // 2) ** 0.5), 1)
    a, b = torch.randn(2 * n, k), torch.randn(k, n)
    kept = torch.empty(2 * n, n)
    torch.mm(a, b, out=kept)
    warm, fresh, faults = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=kept)
        warm.append(time.perf_counter() - t0)
        f0, t0 = minor_faults(), time.perf_counter()
        x = torch.mm(a, b)
        fresh.append(time.perf_counter() - t0)
        faults.append(minor_faults() - f0)
        del x
    per_call = float(np.median(faults))
    if per_call < 1:
        return 0.0
    return max(float(np.median(fresh) - np.median(warm)) * 1e6 / per_call, 0.0)
