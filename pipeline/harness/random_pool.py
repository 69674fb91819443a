"""Random inputs for the CPU sweeps without drawing fresh random numbers for every point.

A CPU draws normal samples at ~5 ns an element (torch.randn, 33M float32 in 0.18 s on the
Xeon VM), and the quick GEMM sweep creates inputs for ~3000 points: py-spy put 11 % of its
time in randn alone. `randn` here copies a slice of one pool of normal samples per dtype
instead, a memcpy at a sixth of that cost. The values keep randn's distribution (timing
depends not on which normal samples they are, only on there being no zeros, denormals or
NaNs to take a fast or slow path). Each tensor is a fresh copy, so two inputs never share
memory, and each starts at another offset of the pool, so two inputs of one point (x and y
of an add, A and B of a square GEMM) do not hold the same values, though they are not
independent draws either.

On a GPU, and for tensors past MAX_POOL elements (the full profile's largest copies), it
draws with torch.randn as before: a GPU draws fast, and a pool that size would double the
memory the largest input needs.
"""
from __future__ import annotations

import math

_POOLS: dict[str, object] = {}  # dtype -> 1-D CPU tensor of normal samples
_CALLS = [0]  # requests since the pools were released: picks each one's offset
MIN_POOL = 1 << 20  # elements: small requests share one pool instead of growing it step by step
SPARE = 1 << 20  # elements past the largest request: room for the offsets
MAX_POOL = 1 << 26  # elements (256 MB of float32); larger tensors are drawn fresh
_STRIDE = 7919  # a prime: successive offsets land far apart in the spare room


def randn(*shape: int, dtype=None, device="cpu"):
    """A tensor of `shape` holding normal samples, like torch.randn(*shape, dtype=, device=)."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    numel = math.prod(shape)
    if str(device) != "cpu" or numel > MAX_POOL:
        return torch.randn(*shape, dtype=dtype, device=device)
    pool = _pool(numel, dtype)
    _CALLS[0] += 1
    offset = (_CALLS[0] * _STRIDE) % (pool.numel() - numel + 1)
    return pool[offset:offset + numel].view(shape).clone()


def _pool(numel: int, dtype):
    import torch

    key = str(dtype)
    pool = _POOLS.get(key)
    if pool is None or pool.numel() < numel + SPARE:
        _POOLS.pop(key, None)  # free the smaller pool before the larger one is drawn
        gen = torch.Generator().manual_seed(0)
        pool = torch.randn(max(numel, MIN_POOL) + SPARE, generator=gen, dtype=dtype)
        _POOLS[key] = pool
    return pool


def release() -> None:
    """Free the pools (a sweep calls this when done: the largest holds its largest input) and
    start the offsets over, so a sweep's inputs are the same from one run to the next."""
    _POOLS.clear()
    _CALLS[0] = 0
