"""utility_samples: memory-bound ops over a (rows, cols) grid plus random held-out shapes."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import dtypes_for, element_bytes
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.order import interleaved
from pipeline.harness.progress import Progress
from pipeline.harness.repeat import repeat_sample, retime
from pipeline.harness.revisit import revisit
from pipeline.harness.stalls import remeasure_stalled
from pipeline.harness.suspects import revisit_suspects
from pipeline.harness.timer import FLUSH_L2_FACTOR, measure, release_flusher
from pipeline.predict.traffic import utility_traffic
from pipeline.sweeps.profiles import Profile
from pipeline.core.ops import UTILITY_OPS

# Small widths too: reductions over fewer than 16 columns run a scalar kernel on the CPU
# (softmax 15x slower per element), a regime the model must see to split on it.
_COLS = (1, 4, 8, 16, 64, 256, 1024, 4096, 16384)
_ROWS = (1, 16, 128, 1024, 4096, 16384)
_EMBED_TABLE_ROWS = 50257  # a GPT-2 sized vocabulary; lookups gather from it


def grid_shapes(profile: Profile) -> list[tuple[int, int]]:
    return [(r, c) for r in _ROWS for c in _COLS if r * c <= profile.utility_max_elems]


def heldout_shapes(profile: Profile, seed: int = 1) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < profile.utility_heldout_per_op:
        r, c = (int(x) for x in np.exp(rng.uniform(0, np.log(16384), 2)).round())
        if r * c <= profile.utility_max_elems:
            out.append((max(r, 1), max(c, 1)))
    return out


def _utility_callable(op: str, dtype: str, rows: int, cols: int, device: str):
    import torch
    import torch.nn.functional as F

    from pipeline.harness.random_pool import randn

    torch.manual_seed(0)
    kw = dict(dtype=torch_dtype(dtype), device=device)
    x = randn(rows, cols, **kw)
    if op == "embedding":
        table = randn(_EMBED_TABLE_ROWS, cols, **kw) if _EMBED_TABLE_ROWS * cols <= 1 << 27 else x
        idx = torch.randint(0, table.shape[0], (rows,), device=device)
        return lambda: F.embedding(idx, table)
    if op in ("add", "mul"):
        y = randn(rows, cols, **kw)
        return (lambda: x + y) if op == "add" else (lambda: x * y)
    if op == "copy":  # a transposing copy (a key transposed for q @ k^T): every element strided
        src = randn(cols, rows, **kw).t()  # a (rows, cols) view; copy_ always moves every element
        return lambda: x.copy_(src)
    if op == "copy_rows":  # rows of `cols` contiguous elements at a stride (heads permuted, merged back)
        src = randn(rows, 2 * cols, **kw)[:, :cols]
        return lambda: x.copy_(src)
    if op == "copy_bcast":  # one row repeated (a bias copied into a GEMM's output)
        src = randn(cols, **kw).expand(rows, cols)
        return lambda: x.copy_(src)
    w, b = torch.ones(cols, **kw), torch.zeros(cols, **kw)
    table = {
        "relu": lambda: F.relu(x),
        "gelu": lambda: F.gelu(x, approximate="tanh"),
        "silu": lambda: F.silu(x),
        "dropout": lambda: F.dropout(x, p=0.1, training=True),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "layernorm": lambda: F.layer_norm(x, (cols,), w, b),
        "rmsnorm": lambda: F.rms_norm(x, (cols,), w),
    }
    return table[op]


# Twins up to this many flushes of footprint: a larger op streams past L2 hot or cold alike.
COLD_TWIN_MAX_FLUSHES = 4
COLD_TWIN_REPS = 25


def cold_twin(fn, nbytes: float, dev: DeviceIdentity, profile: Profile) -> dict:
    """CPU: the row's op timed again with L2 evicted before each call (`cold_us`), as it runs
    inside a step that streams more than L2 (predict/cache_cold.py), and the flush's size
    (`evict_bytes`); {} on a GPU, without an L2 size, where the sweep already times cold, or
    for an op too large for eviction to matter."""
    spec = profile.utility_timing
    if dev.kind != "cpu" or not dev.l2_bytes or spec.flush_l2:
        return {}
    evict = FLUSH_L2_FACTOR * dev.l2_bytes
    if nbytes > COLD_TWIN_MAX_FLUSHES * evict:
        return {}
    # one call per flush, so a few dozen calls suffice (each pays a 2 x L2 flush the clock skips)
    cold = measure(fn, replace(spec, flush_l2=True, min_block_s=0.0, max_reps=min(spec.max_reps, COLD_TWIN_REPS)),
                   dev.torch_device, dev.l2_bytes)
    return {"cold_us": cold.median_us, "evict_bytes": float(evict)}


def sweep_utility(dev: DeviceIdentity, profile: Profile, log=None) -> list[dict]:
    shapes = [(s, False) for s in grid_shapes(profile)] + [(s, True) for s in heldout_shapes(profile)]
    todo = [(dt, op, s, h) for dt in dtypes_for(dev.kind) if dt != "tf32" for op in UTILITY_OPS for s, h in shapes]
    prog = Progress("utility_samples", len(todo), log)
    rows_out: list[dict] = [{}] * len(todo)
    for i in interleaved(len(todo)):  # a slow spell of a shared machine must not land on one group
        dtype, op, (rows, cols), held = todo[i]
        fn = _utility_callable(op, dtype, rows, cols, dev.torch_device)
        meas = measure(fn, profile.utility_timing, dev.torch_device, dev.l2_bytes or 0)
        br, bw, fl = utility_traffic(op, rows, cols, element_bytes(dtype))
        rows_out[i] = {
            "op": op, "dtype": dtype, "rows": rows, "cols": cols, "shape": f"{rows}x{cols}",
            "bytes_read": float(br), "bytes_written": float(bw), "flops": float(fl), "held_out": held,
            **meas.row(profile.utility_timing.cv_threshold), **cold_twin(fn, br + bw, dev, profile),
        }
        prog.step(f"{op} {dtype} {rows}x{cols}")
    makers = [lambda a=(op, dtype, r, c): _utility_callable(*a, dev.torch_device) for dtype, op, (r, c), _ in todo]
    revisit(rows_out, makers, profile.utility_timing, dev.torch_device, profile.visits, dev.l2_bytes or 0, prog.log)
    if profile.visits > 1:  # training rows only: a held-out row's own time must not pick it
        revisit_suspects(rows_out, makers, profile.utility_timing, dev.torch_device,
                         [None if held else (op, dtype) for dtype, op, _, held in todo],
                         np.array([s for _, _, s, _ in todo], float), dev.l2_bytes or 0, prog.log,
                         stall_wait_s=profile.stall_wait_s)
    remeasure_stalled(rows_out, makers, profile.utility_timing, dev.torch_device, dev.l2_bytes or 0, prog.log,
                      profile.stall_wait_s)
    picked = repeat_sample([(op, dtype) for dtype, op, _, _ in todo], [held for *_, held in todo],
                           profile.utility_repeats_per_group)
    retime(rows_out, makers, picked, profile.utility_timing, dev.torch_device, dev.l2_bytes or 0, prog.log)
    release_flusher()  # the cold twins' flush buffer
    return rows_out
