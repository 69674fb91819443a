"""Bytes moved and flops of the memory-bound ops, the proxies PM2Lat regresses latency on.

Counted from what each op must read and write at least once; per-element flop counts are
nominal (one per add/mul, a handful for transcendental activations and normalizations).
"""
from __future__ import annotations

import numpy as np

from pipeline.core.ops import UTILITY_OPS

# op: (input tensors read of the full size, outputs written, flops per element, per-row params read)
_PROFILE = {
    "relu": (1, 1, 1, 0),
    "gelu": (1, 1, 8, 0),
    "silu": (1, 1, 5, 0),
    "add": (2, 1, 1, 0),
    "mul": (2, 1, 1, 0),
    "dropout": (1, 1, 3, 0),  # also writes a one-byte mask, added below
    "softmax": (1, 1, 5, 0),
    "layernorm": (1, 1, 8, 2),  # weight and bias, cols each
    "rmsnorm": (1, 1, 4, 1),
    "embedding": (1, 1, 0, 0),  # gathers rows x cols from the table; int64 indices below
    "copy": (1, 1, 0, 0),
    "copy_rows": (1, 1, 0, 0),
    "copy_bcast": (0, 1, 0, 1),  # reads one row of cols (the broadcast source), writes them all
}
assert set(_PROFILE) == set(UTILITY_OPS)


def utility_traffic(op: str, rows, cols, elem_bytes: int):
    """(bytes_read, bytes_written, flops) for arrays of rows and cols."""
    reads, writes, fpe, params = _PROFILE[op]
    rows, cols = np.asarray(rows, dtype=np.float64), np.asarray(cols, dtype=np.float64)
    numel = rows * cols
    bytes_read = reads * numel * elem_bytes + params * cols * elem_bytes
    bytes_written = writes * numel * elem_bytes
    if op == "dropout":
        bytes_written = bytes_written + numel
    if op == "embedding":
        bytes_read = bytes_read + rows * 8
    return bytes_read, bytes_written, fpe * numel
