"""memory_samples: the DLRM paper's memory kernels (III-B), grid plus random held-out shapes.

One row per (op, dtype, shape); the shape columns are `batch`, `m`, `n`, `k` (1 where unused):

| op         | timed call                                                        | shape                 |
|------------|-------------------------------------------------------------------|-----------------------|
| concat     | torch.cat(k tensors of (batch, n), dim=1)                         | batch, n, k           |
| memcpy_h2d | dst.copy_(pinned host src, non_blocking=True), CUDA only           | m, n                  |
| memcpy_d2d | dst.copy_(src), two (m, n) tensors on the device                   | m, n                  |
| transpose  | x.permute(0, 2, 1).contiguous(), x of (batch, m, n)                | batch, m, n           |
| tril_fwd   | Z.view(batch, n*n).index_select(1, tril), Z = X Xt of (batch, n, n) | batch, n             |
| tril_bwd   | zeros(batch, n*n).index_add_(1, tril, grad): IndexBackward         | batch, n              |

`tril` holds the flat positions i*n + j of the strictly lower triangle (j < i), the pairs
DLRM's dot interaction keeps; tril_bwd allocates and zero-fills the (batch, n*n) gradient as
autograd's IndexBackward does, then accumulates the (batch, n(n-1)/2) gradient into it.
`bytes` is what the op must move: read plus write (H2D: the bytes crossing the bus;
tril_bwd: the zero fill too). The CPU has no host-to-device copy: memcpy_h2d is skipped
there (the sweep logs it), and the other five ops are measured.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import element_bytes
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.order import interleaved
from pipeline.harness.progress import Progress
from pipeline.harness.repeat import repeat_sample, retime
from pipeline.harness.revisit import revisit
from pipeline.harness.suspects import revisit_suspects
from pipeline.harness.stalls import remeasure_stalled
from pipeline.harness.timer import TimingSpec, measure
from pipeline.predict.memory import MEMORY_OPS, OP_DIMS, memory_bytes
from pipeline.sweeps.profiles import GPU_FULL_TIMING, GPU_QUICK_TIMING, get_profile

CUDA_ONLY = ("memcpy_h2d",)


@dataclass(frozen=True)
class MemorySizes:
    batch: tuple[int, ...]  # concat rows, transpose and tril batch
    n_concat: tuple[int, ...]  # columns of each concatenated tensor
    k_concat: tuple[int, ...]  # tensors concatenated (DLRM: tables + 1)
    copy_m: tuple[int, ...]
    copy_n: tuple[int, ...]
    # m and n each. Not powers of two only: on a CPU a power-of-two row stride makes a transpose
    # several times slower (cache-set conflicts), and an MLP trained on those alone carries that
    # slowdown over to every other shape.
    transpose_mn: tuple[int, ...]
    transpose_batch: tuple[int, ...]
    tril_n: tuple[int, ...]  # features interacting (DLRM: tables + 1)
    dtypes: tuple[str, ...]
    max_elems: int  # per point: the largest tensor's element count
    heldout: int  # per (op, dtype)
    timing: TimingSpec


_TINY_TIMING = TimingSpec(warmup_s=0.0, budget_s=0.002, min_reps=3, max_reps=10)
_CPU_QUICK_TIMING = TimingSpec(warmup_s=0.003, budget_s=0.012, min_reps=5, max_reps=60, min_block_s=2e-4)

SIZES = {
    ("tiny", "cpu"): MemorySizes(batch=(4, 32), n_concat=(16,), k_concat=(2, 5), copy_m=(1, 64), copy_n=(64, 512),
                                 transpose_mn=(8, 64), transpose_batch=(1, 4), tril_n=(4, 9), dtypes=("float32",),
                                 max_elems=1 << 16, heldout=2, timing=_TINY_TIMING),
    # concat's n and k: five each, since a CPU's cat is priced by an MLP where one law of bytes
    # does not fit it (pipeline.predict.memory), and an MLP of three inputs needs more than 3 x 3
    ("quick", "cpu"): MemorySizes(batch=(16, 128, 1024, 4096), n_concat=(16, 40, 64, 100, 256),
                                  k_concat=(2, 5, 9, 17, 27),
                                  copy_m=(1, 16, 100, 256, 1000, 4096), copy_n=(64, 300, 1024, 5000, 16384),
                                  transpose_mn=(16, 40, 64, 100, 256, 600, 1024), transpose_batch=(1, 8, 64),
                                  tril_n=(4, 9, 16, 27, 48, 64), dtypes=("float32",), max_elems=1 << 22,
                                  heldout=16, timing=_CPU_QUICK_TIMING),
    ("full", "cpu"): MemorySizes(batch=(16, 64, 256, 1024, 4096), n_concat=(16, 32, 40, 64, 100, 128, 256),
                                 k_concat=(2, 5, 9, 17, 27), copy_m=(1, 16, 256, 4096, 16384),
                                 copy_n=(64, 256, 1024, 4096, 16384),
                                 transpose_mn=(16, 40, 64, 100, 128, 256, 512, 600, 1024),
                                 transpose_batch=(1, 4, 16, 64, 256), tril_n=(4, 9, 16, 27, 33, 48, 64),
                                 dtypes=("float32", "bfloat16"), max_elems=1 << 25, heldout=60,
                                 timing=TimingSpec(warmup_s=0.01, budget_s=0.05, min_reps=5, max_reps=200,
                                                   min_block_s=2e-4)),
    ("tiny", "cuda"): MemorySizes(batch=(4, 32), n_concat=(16,), k_concat=(2, 5), copy_m=(1, 64), copy_n=(64, 512),
                                  transpose_mn=(8, 64), transpose_batch=(1, 4), tril_n=(4, 9), dtypes=("float32",),
                                  max_elems=1 << 16, heldout=2, timing=_TINY_TIMING),
    ("quick", "cuda"): MemorySizes(batch=(128, 1024, 8192), n_concat=(16, 64, 256), k_concat=(2, 9, 27),
                                   copy_m=(1, 64, 1024, 16384), copy_n=(256, 4096, 65536),
                                   transpose_mn=(16, 40, 64, 100, 256, 600, 1024, 4096),
                                   transpose_batch=(1, 16, 256),
                                   tril_n=(4, 9, 16, 27, 48, 64), dtypes=("float32", "float16"),
                                   max_elems=1 << 28, heldout=40, timing=GPU_QUICK_TIMING),
    ("full", "cuda"): MemorySizes(batch=(64, 256, 1024, 4096, 16384), n_concat=(16, 32, 64, 128, 256, 512),
                                  k_concat=(2, 5, 9, 17, 27, 65), copy_m=(1, 16, 256, 4096, 65536),
                                  copy_n=(64, 1024, 4096, 16384, 65536),
                                  transpose_mn=(16, 40, 64, 100, 128, 256, 512, 600, 1024, 2048, 4096),
                                  transpose_batch=(1, 4, 16, 64, 256, 1024), tril_n=(4, 9, 16, 27, 33, 48, 64, 100),
                                  dtypes=("float32", "float16", "bfloat16"), max_elems=1 << 30, heldout=200,
                                  timing=GPU_FULL_TIMING),
}


def sizes_for(profile_name: str, kind: str) -> MemorySizes:
    get_profile(profile_name, kind)  # one clear error for an unknown profile name
    return SIZES[(profile_name, "cuda" if kind == "cuda" else "cpu")]


def ops_for(kind: str) -> tuple[str, ...]:
    return MEMORY_OPS if kind == "cuda" else tuple(op for op in MEMORY_OPS if op not in CUDA_ONLY)


def _largest(op: str, s: dict) -> int:
    """The largest tensor's element count (what the cap bounds)."""
    if op == "concat":
        return s["batch"] * s["n"] * s["k"]
    if op.startswith("memcpy"):
        return s["m"] * s["n"]
    if op == "transpose":
        return s["batch"] * s["m"] * s["n"]
    return s["batch"] * s["n"] ** 2


def grid_shapes(op: str, z: MemorySizes) -> list[dict]:
    if op == "concat":
        grid = [dict(batch=b, n=n, k=k) for b, n, k in itertools.product(z.batch, z.n_concat, z.k_concat)]
    elif op in ("memcpy_h2d", "memcpy_d2d"):
        grid = [dict(m=m, n=n) for m, n in itertools.product(z.copy_m, z.copy_n)]
    elif op == "transpose":
        grid = [dict(batch=b, m=m, n=n) for b, m, n in itertools.product(z.transpose_batch, z.transpose_mn,
                                                                          z.transpose_mn)]
    else:
        grid = [dict(batch=b, n=n) for b, n in itertools.product(z.batch, z.tril_n)]
    return [s for s in grid if _largest(op, s) <= z.max_elems]


def heldout_shapes(op: str, z: MemorySizes, seed: int = 4) -> list[dict]:
    """Log-uniform draws inside each dimension's grid range, under the same element cap."""
    rng = np.random.default_rng(seed + MEMORY_OPS.index(op))
    ranges = {"concat": dict(batch=z.batch, n=z.n_concat, k=z.k_concat),
              "memcpy_h2d": dict(m=z.copy_m, n=z.copy_n), "memcpy_d2d": dict(m=z.copy_m, n=z.copy_n),
              "transpose": dict(batch=z.transpose_batch, m=z.transpose_mn, n=z.transpose_mn),
              "tril_fwd": dict(batch=z.batch, n=z.tril_n), "tril_bwd": dict(batch=z.batch, n=z.tril_n)}[op]
    out = []
    for _ in range(1000 * max(z.heldout, 1)):
        if len(out) >= z.heldout:
            break
        s = {d: max(1, int(round(float(np.exp(rng.uniform(np.log(min(v)), np.log(max(v))))))))
             for d, v in ranges.items()}
        if op.startswith("tril"):
            s["n"] = max(s["n"], 2)
        if _largest(op, s) <= z.max_elems:
            out.append(s)
    return out


def tril_positions(n: int, device: str = "cpu"):
    """Flat positions i*n + j of the strictly lower triangle of an (n, n) matrix, row by row."""
    import torch

    li, lj = torch.tril_indices(n, n, offset=-1, device=device)
    return li * n + lj


def _callable(op: str, dtype: str, s: dict, device: str):
    import torch

    torch.manual_seed(0)
    kw = dict(dtype=torch_dtype(dtype), device=device)
    if op == "concat":
        parts = [torch.randn(s["batch"], s["n"], **kw) for _ in range(s["k"])]
        return lambda: torch.cat(parts, dim=1)
    if op == "memcpy_h2d":
        src = torch.randn(s["m"], s["n"], dtype=kw["dtype"]).pin_memory()
        dst = torch.empty(s["m"], s["n"], **kw)
        return lambda: dst.copy_(src, non_blocking=True)
    if op == "memcpy_d2d":
        src, dst = torch.randn(s["m"], s["n"], **kw), torch.empty(s["m"], s["n"], **kw)
        return lambda: dst.copy_(src)
    if op == "transpose":
        x = torch.randn(s["batch"], s["m"], s["n"], **kw)
        return lambda: x.permute(0, 2, 1).contiguous()
    b, n = s["batch"], s["n"]
    idx = tril_positions(n, device)
    if op == "tril_fwd":
        x = torch.randn(b, n, 16, **kw)
        zflat = torch.bmm(x, x.transpose(1, 2)).view(b, n * n)
        return lambda: zflat.index_select(1, idx)
    grad = torch.randn(b, idx.numel(), **kw)
    return lambda: torch.zeros(b, n * n, **kw).index_add_(1, idx, grad)


def sweep_memory(dev: DeviceIdentity, profile_name, log=None) -> list[dict]:
    import torch

    name = getattr(profile_name, "name", profile_name)  # a Profile works too
    z = sizes_for(name, dev.kind)
    ops = ops_for(dev.kind)
    todo = [(op, dt, s, held) for dt in z.dtypes for op in ops
            for shapes, held in ((grid_shapes(op, z), False), (heldout_shapes(op, z), True)) for s in shapes]
    prog = Progress("memory_samples", len(todo), log)
    if dev.kind != "cuda":
        prog.log(f"[memory_samples] {', '.join(CUDA_ONLY)} skipped: the CPU has no host-to-device copy")
    timed, skipped = [], 0
    for i in interleaved(len(todo)):  # a slow spell of a shared machine must not land on one group
        op, dtype, s, held = todo[i]
        full = {d: int(s.get(d, 1)) for d in ("batch", "m", "n", "k")}
        try:
            meas = measure(_callable(op, dtype, s, dev.torch_device), z.timing, dev.torch_device, dev.l2_bytes or 0)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            skipped += 1
            prog.step(f"{op} {dtype} {s}: out of memory, skipped")
            continue
        row = {
            "op": op, "dtype": dtype, **full, "shape": "x".join(f"{d}{s[d]}" for d in OP_DIMS[op]),
            "bytes": float(memory_bytes(op, element_bytes(dtype), **{d: s[d] for d in OP_DIMS[op]})),
            "held_out": held, **meas.row(z.timing.cv_threshold),
        }
        timed.append((i, row, lambda a=(op, dtype, s): _callable(*a, dev.torch_device)))
        prog.step(f"{op} {dtype} {s}")
    timed.sort(key=lambda t: t[0])  # rows in list order
    rows, makers = [t[1] for t in timed], [t[2] for t in timed]
    profile = get_profile(name, dev.kind)
    revisit(rows, makers, z.timing, dev.torch_device, profile.visits, dev.l2_bytes or 0, prog.log)
    if profile.visits > 1:  # rows whose probe read a slow spell (harness/spells.py)
        revisit_suspects(rows, makers, z.timing, dev.torch_device, [None] * len(rows), None, dev.l2_bytes or 0,
                         prog.log, stall_wait_s=profile.stall_wait_s)
    remeasure_stalled(rows, makers, z.timing, dev.torch_device, dev.l2_bytes or 0, prog.log, profile.stall_wait_s)
    picked = repeat_sample([(r["op"], r["dtype"]) for r in rows], [r["held_out"] for r in rows],
                           profile.utility_repeats_per_group)
    retime(rows, makers, picked, z.timing, dev.torch_device, dev.l2_bytes or 0, prog.log)
    if skipped:
        prog.log(f"[memory_samples] {skipped} points ran out of device memory: not recorded")
    return rows
