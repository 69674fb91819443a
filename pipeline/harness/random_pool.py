"""Random inputs for the sweeps without drawing fresh random numbers for every point.

A CPU draws normal samples at ~5 ns an element (torch.randn, 33M float32 in 0.18 s on the
Xeon VM), and the quick GEMM sweep creates inputs for ~3000 points: py-spy put 11 % of its
time in randn alone. `randn_like_pool` copies a slice of one pool of normal samples per
(dtype, device) instead, a memcpy at a tenth of that cost. The values keep randn's
distribution (timing does not depend on which normal samples they are, only on there being
no zeros, denormals or NaNs to take a fast or slow path), and each tensor is a fresh copy:
two inputs of one GEMM never share memory, so neither reads the other's cache lines.
"""
from __future__ import annotations

import math

_POOLS: dict[tuple[str, str], object] = {}  # (dtype, device) -> 1-D tensor of normal samples
MIN_POOL = 1 << 20  # elements: small requests share one pool instead of growing it step by step


def randn(*shape: int, dtype=None, device="cpu"):
    """A tensor of `shape` holding normal samples, like torch.randn(*shape, dtype=, device=)."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    numel = math.prod(shape)
    pool = _pool(numel, dtype, str(device))
    return pool[:numel].view(shape).clone()


def _pool(numel: int, dtype, device: str):
    import torch

    key = (str(dtype), device)
    pool = _POOLS.get(key)
    if pool is None or pool.numel() < numel:
        _POOLS.pop(key, None)  # free the smaller pool before the larger one is drawn
        gen = torch.Generator(device=device).manual_seed(0)
        pool = torch.randn(max(numel, MIN_POOL), generator=gen, dtype=dtype, device=device)
        _POOLS[key] = pool
    return pool


def release() -> None:
    """Free the pools (a sweep calls this when done: the largest holds its largest input)."""
    _POOLS.clear()
