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


LADDER_MB = (8, 16, 32, 64, 128)  # around glibc's 32 MiB cap on its dynamic mmap threshold
# allocations per size; each of the last KEPT must fault (the first ones move the threshold, and
# under it glibc faults some allocations and not others: 16 MB read 4096, 4096, 4096, 0, 0, 0)
LADDER_REPS, LADDER_KEPT = 10, 5


def held_output_us(fn, reps: int = 5) -> tuple[float, float]:
    """Median µs of `fn()` (a call returning a fresh tensor) while the previous call's output is
    still held, each dropped only after the next call returned, outside the timing: how an op of a
    step runs, whose output lives past it (a returned one is freed at the step's end). The
    harness's timing drops each output inside its timed loop, so a faulting row's time there also
    holds the free of a large block: on the Zen 5 EPYC VM (2026-11-30), linear float32
    512-1024 x 50257 x 128-256 paid 0.56-0.64 us a page to fault its output in, 0.32 to free it,
    and 0.90-1.03 timed the harness's way. Returns (median µs, minor faults per call): holding
    the previous output can change which calls fault (a heap block freed below a live one is
    reused), so its faults are counted here, not taken from the harness's timing. CPU only: it
    never synchronizes a device."""
    prev = fn()
    times = []
    f0 = minor_faults()
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        prev = out  # noqa: F841 - the previous output is freed here, untimed
    faults = (minor_faults() - f0) / max(1, reps)
    del prev
    return float(np.median(times)) * 1e6, float(faults)


def fault_from_bytes(adapt_bytes: int = 0, sizes_mb=LADDER_MB, timeout_s: float = 120.0) -> float | None:
    """The smallest block size from which a fresh allocation, written, faults in at least half
    its pages every time in a loop of them (the last LADDER_KEPT of LADDER_REPS), every larger
    size doing the same; None where none does (an allocator that keeps its memory). Measured in
    a fresh interpreter that first allocates and frees `adapt_bytes`, as the process each
    workload step is timed in does (workloads/isolated.py, whose child is forked from a server
    that imported torch; this one is started anew, its heap as empty of large free blocks):
    that process's faults are what the predictions are scored against.

    What the GEMM model charges a large output by (OutputFaults): the sweep's own rows say only
    what the sweep process's heap did. Once a process has freed many large blocks, its heap
    holds free chunks large enough to serve any output, and a 128 MB output faults no page. On
    the Zen 5 EPYC VM (2026-11-30) one take's rows at 32-256 MB faulted every page and the next
    take's none, while the steps scored against them faulted their 103-206 MB logits every call
    on both, and the model priced GPT-2's LM head at 62.8 ms on one take and 38.6 on the other.
    A probe in this process reads 8 MB as faulting fresh and 64 MB after ten 31 MB blocks came
    and went."""
    from pipeline.harness.child_json import ChildError, run_module_json

    args = [str(int(adapt_bytes)), *map(str, sizes_mb)]
    try:
        found = run_module_json("pipeline.harness.page_faults", args, timeout_s).get("fault_from_bytes", 0)
    except ChildError as exc:
        raise RuntimeError(f"the page-fault ladder probe: {exc}") from exc
    if found is not None and not (isinstance(found, (int, float)) and found > 0):
        raise RuntimeError(f"the page-fault ladder probe gave fault_from_bytes={found!r}, not a positive size")
    return found


def _ladder(adapt_bytes: int, sizes_mb) -> float | None:
    import torch

    if adapt_bytes:  # as workloads/isolated.py states its allocator: allocated and freed, never written
        block = torch.empty(adapt_bytes, dtype=torch.uint8)
        del block
    faulting = []
    for mb in sizes_mb:
        n = mb << 20
        counts = []
        for _ in range(LADDER_REPS):
            f0 = minor_faults()
            t = torch.empty(n // 4, dtype=torch.float32)
            t.fill_(1.0)  # written, by the op's threads, as an output is
            counts.append(minor_faults() - f0)
            del t
        faulting.append(min(counts[-LADDER_KEPT:]) >= 0.5 * n / 4096)
    from_mb = faulting_tail(list(sizes_mb), faulting)
    return float(from_mb << 20) if from_mb is not None else None


def faulting_tail(sizes: list, faulting: list[bool]):
    """The smallest of `sizes` (ascending) from which every size faulted; None if the largest did not."""
    start = None
    for size, faults in zip(reversed(sizes), reversed(faulting)):
        if not faults:
            break
        start = size
    return start


if __name__ == "__main__":  # python -m pipeline.harness.page_faults ADAPT_BYTES MB...: one JSON line
    import json
    import sys

    print(json.dumps({"fault_from_bytes": _ladder(int(sys.argv[1]), [int(a) for a in sys.argv[2:]] or LADDER_MB)}))
