"""Measured peaks: matmul FLOP/s per dtype and copy bandwidth, and (CPU) what a large free costs
(harness/free_cost.py). Measured, never from a spec sheet."""
from __future__ import annotations

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import dtypes_for
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.timer import TimingSpec, measure

_SPEC = TimingSpec(warmup_s=0.05, budget_s=0.3, min_reps=5, max_reps=200)
# The CPU peak's square size doubles from 256 towards 1024 while one call at the next size (8x
# the FLOPs) would take at most this long. A dtype the CPU runs in software (bf16 on the AVX2
# EPYC, ATen's scalar loop) took 1.6 s a call at 1024^3 and device_row 31 s; it now stops at
# 256^3 (26 ms a call), which read 1.35 GFLOP/s there against 0.79 at 1024^3. Hardware float32
# reaches 1024 on every CPU seen (one call at 512^3: 2-4 ms; a spell would have to slow it ~3x
# to stop it at 512). Which size was used is not recorded in the row.
PEAK_MAX_CALL_S = 0.1


def peak_matmul_flops(dev: DeviceIdentity, dtype: str, size: int | None = None) -> float:
    """FLOP/s of a large square matmul (8192 on CUDA, 2048 on the CPU), from the median time."""
    import torch

    n = size or (8192 if dev.kind == "cuda" else 2048)
    if dev.kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.randn(n, n, dtype=torch_dtype(dtype), device=dev.torch_device)
    b = torch.randn(n, n, dtype=torch_dtype(dtype), device=dev.torch_device)
    m = measure(lambda: torch.mm(a, b), _SPEC, dev.torch_device)
    return 2.0 * n**3 / (m.median_us * 1e-6)


def cpu_peak_size(call_s, target: int = 1024, start: int = 256) -> int:
    """The largest square size, doubling from `start` to `target`, reached while one call at the
    next size would take at most PEAK_MAX_CALL_S; `call_s(n)` times one call at n."""
    n = start
    while n < target and 8 * call_s(n) <= PEAK_MAX_CALL_S:
        n = min(2 * n, target)
    return n


def _one_call_s(dev: DeviceIdentity, dtype: str, n: int) -> float:
    """Seconds of one n^3 matmul, the quicker of two calls (the first may pay a lazy init)."""
    import time

    import torch

    a = torch.randn(n, n, dtype=torch_dtype(dtype), device=dev.torch_device)
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        torch.mm(a, a)
        out.append(time.perf_counter() - t0)
    return min(out)


def copy_bandwidth_gbps(dev: DeviceIdentity, nbytes: int | None = None) -> float:
    """A device-to-device copy far larger than the last-level cache; counts bytes read plus written."""
    import torch

    nbytes = nbytes or (1 << 30 if dev.kind == "cuda" else 1 << 28)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev.torch_device).fill_(1.0)
    dst = torch.empty_like(src)
    m = measure(lambda: dst.copy_(src), _SPEC, dev.torch_device)
    return 2.0 * nbytes / (m.median_us * 1e-6) / 1e9


def device_row(dev: DeviceIdentity, quick: bool = True) -> dict:
    """The `devices` table row: identity plus measured peaks (null where a dtype does not apply)."""
    row = dev.as_row()
    row["name"] = dev.slug
    for dt in ("float32", "tf32", "bfloat16", "float16"):
        if dt not in dtypes_for(dev.kind):
            row[f"peak_flops_{dt}"] = None
            continue
        size = cpu_peak_size(lambda n: _one_call_s(dev, dt, n)) if quick and dev.kind == "cpu" else None
        row[f"peak_flops_{dt}"] = peak_matmul_flops(dev, dt, size)
    row["bandwidth_gbps"] = copy_bandwidth_gbps(dev)
    if dev.kind == "cpu":  # a GPU's caching allocator keeps freed blocks: nothing to free per step
        from pipeline.harness.free_cost import free_cost

        row.update(free_cost())
    else:
        row.update(free_us_per_page=None, free_from_bytes=None)
    return row
