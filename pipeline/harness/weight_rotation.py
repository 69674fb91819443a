"""GEMMs whose weights come from memory, as they do inside a model (CPU).

A micro-benchmark that repeats one GEMM keeps its weights in cache; inside a model every
layer's weights pass through the cache between two uses of one of them, so a layer whose
model is larger than the cache reads its weights from memory. On the Xeon VM of 2026-11-25
Qwen2.5-0.5B's 128 x 4864 x 896 float32 projection ran 3.63 ms traced in the model and
3.12 ms timed hot. A flush before each call over-prices it (it also evicts the code, the
activations and the allocator's memory, and leaves the cache full of dirty lines: 128 x 768
x 768 took +83 % after a 1 GB flush, +20 % with its weights rotated). So the weights are
rotated instead: each call takes the next of many copies of the weight, views into one pool
larger than the cache, while the activations stay those of the previous call, hot.

How large the cache that holds weights is, is measured too (`weight_cache_bytes`): the same
VM reports its host's 480 MB L3, yet a rotated GEMM slows from a 128 MB pool on.
"""
from __future__ import annotations

import itertools

import numpy as np

from pipeline.harness.cache_probe import available_bytes

# The probe GEMM: few rows per weight element (little reuse), so a weight read from memory
# shows; float32, which every CPU runs.
PROBE_SHAPE = (32, 1024, 1024)  # (M, N, K) of F.linear
PROBE_MIN_BYTES = 1 << 20
MIN_CONTRAST = 1.05  # a pool this much slower than the smallest: the cache no longer holds it
MAX_COPIES = 4096  # views of one weight in a rotation (a smaller weight's rotation may stay in cache)
FILL_BYTE = 0x3C  # 0x3C3C3C3C as float32 and 0x3C3C as bfloat16 are both ~0.0115: normal numbers


class WeightPool:
    """One buffer that weight copies of any shape and dtype are views into (no copy per point)."""

    def __init__(self, nbytes: int):
        import torch

        self.nbytes = int(nbytes)
        self.buf = torch.full((self.nbytes,), FILL_BYTE, dtype=torch.uint8)  # written: its pages are faulted in

    def weights(self, dtype: str, shape: tuple[int, ...], nbytes: int | None = None) -> list:
        """Copies of a `shape` weight, side by side in the first `nbytes` (default: all) of the
        pool, MAX_COPIES at most; at least two, so consecutive calls never share one (two of a weight larger than
        half the pool overlap; such a weight is past any cache on its own)."""
        from pipeline.harness.dtypes import torch_dtype

        dt = torch_dtype(dtype)
        elems = int(np.prod(shape))
        flat = self.buf.view(dt)
        span = min(int(nbytes or self.nbytes), self.nbytes) // flat.element_size()
        copies = min(max(span // max(elems, 1), 2), MAX_COPIES)
        if elems > flat.numel():
            raise ValueError(f"a {shape} {dtype} weight does not fit a {self.nbytes / 2**20:.0f} MB pool")
        starts = [min(i * elems, flat.numel() - elems) for i in range(copies)]
        return [flat[s:s + elems].view(shape) for s in starts]


def rotating_gemm(op: str, dtype: str, m: int, n: int, k: int, pool: WeightPool, nbytes: int | None = None):
    """A callable running `op` (mm: A @ B, linear: x @ W^T, bias-free as the CPU's linear table is:
    sweeps/gemm.py `linear_has_bias`) with the next weight copy on each call."""
    import torch

    from pipeline.harness.dtypes import torch_dtype

    if op not in ("mm", "linear"):
        raise ValueError(f"weights rotate for mm and linear only, not {op!r}")
    torch.manual_seed(0)
    kw = dict(dtype=torch_dtype(dtype))
    a = torch.randn(m, k, **kw)
    if op == "mm":
        cycle = itertools.cycle(pool.weights(dtype, (k, n), nbytes))
        return lambda: torch.mm(a, next(cycle))
    cycle = itertools.cycle(pool.weights(dtype, (n, k), nbytes))
    return lambda: torch.nn.functional.linear(a, next(cycle))


def probe_sizes(reported_llc: int, memory_bytes: int | None = None) -> list[int]:
    """Pool sizes for the probe: 1 MB doubling to 4x the reported last-level cache (at least
    256 MB), none over a quarter of the available memory."""
    memory_bytes = available_bytes() if memory_bytes is None else memory_bytes
    top = max(4 * int(reported_llc), 256 << 20)
    if memory_bytes:
        top = min(top, memory_bytes // 4)
    sizes, s = [], PROBE_MIN_BYTES
    while s <= top:
        sizes.append(s)
        s *= 2
    return sizes or [PROBE_MIN_BYTES]


def knee(sizes: list[int], times: list[float], min_contrast: float = MIN_CONTRAST) -> int | None:
    """The pool size at which the time crosses half-way from the hot level (the two smallest
    pools) to the cold one (the two largest), log-linear between the two sizes around the
    crossing: the doubling steps alone made one VM's cache 64 MB in one sweep and 128 MB in the
    next. None when the largest pools are not `min_contrast` slower: no cache the probe saw past;
    nor when a pool past the crossing reads within `min_contrast` of the hot level: a larger
    pool cannot run as fast as the cache, so the contrast was noise (the Zen 3 EPYC VM once read
    2597, 2579, 2956, 2759, 2459, 2894, 2551, 2702, 3040 us from 1 to 256 MB, a "3 MB" cache)."""
    t = np.asarray(times, float)
    if len(t) < 4:
        return None
    hot, cold = float(np.median(t[:2])), float(np.median(t[-2:]))
    if cold < min_contrast * hot:
        return None
    mid = hot + 0.5 * (cold - hot)
    over = np.flatnonzero(t > mid)
    i = int(over[0]) if over.size else len(t) - 1
    if np.any(t[i:] < min_contrast * hot):
        return None
    if i == 0:
        return int(sizes[0])
    frac = float(np.clip((mid - t[i - 1]) / max(t[i] - t[i - 1], 1e-12), 0.0, 1.0))
    return int(round(np.exp(np.log(sizes[i - 1]) + frac * (np.log(sizes[i]) - np.log(sizes[i - 1])))))


def weight_cache_bytes(reported_llc: int, time_us, pool: WeightPool | None = None,
                       log=None) -> tuple[int | None, WeightPool]:
    """(bytes of weights the cache holds between two uses, the pool it was measured with).

    `time_us(fn)` times a callable (the sweep's harness). The probe GEMM rotates its weights
    through pools of growing size; the knee of its time is the cache. The pool is returned for
    the rotated timings that follow (allocated once: ~1 s of page faults for a GB)."""
    sizes = probe_sizes(reported_llc)
    pool = pool if pool is not None and pool.nbytes >= sizes[-1] else WeightPool(sizes[-1])
    m, n, k = PROBE_SHAPE
    times = [time_us(rotating_gemm("linear", "float32", m, n, k, pool, size)) for size in sizes]
    found = knee(sizes, times)
    if log:
        curve = ", ".join(f"{s / 2**20:g} MB {t:.0f}" for s, t in zip(sizes, times))
        said = f"{found / 2**20:.0f} MB" if found else "no knee (no cache the probe could see past)"
        log(f"weight cache probe: {said}; linear {m}x{n}x{k} float32 with weights rotated through: {curve} us "
            f"(the OS reports a {reported_llc / 2**20:.0f} MB last-level cache)")
    return found, pool
