"""Timing harness: what to measure (TimingSpec) kept apart from what was measured (Measurement).

Follows torch.utils.benchmark (median and IQR, noisy warnings) and triton's do_bench
(repetitions chosen by a time budget, CUDA events, an L2 flush between repetitions).
On the CPU each repetition is timed with perf_counter_ns. On CUDA the kernel is timed by
CUDA-graph replay, or behind a spin kernel when it cannot be captured (cuda_timer.py): one
event pair per call would time the host's launch, not the kernel. Whole workload steps are
timed by `measure_step`: wall time with the device synchronized, what a user waits for.
Every row says how it was timed (`timing_method`).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from pipeline.harness.page_faults import minor_faults
from pipeline.harness.spells import read_both_around


# Every time budget of a sweep (warm-up, timed repetitions, cold flushes, the wait for a quiet
# machine) times this: CI's slow tier runs the quick profile's whole grids on a twentieth of its
# budgets, where it checks what a calibration fills, not how well it measures. 1 otherwise.
TIMING_SCALE_ENV = "DEVCHAR_TIMING_SCALE"


def timing_scale() -> float:
    raw = os.environ.get(TIMING_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = float("nan")
    if not 0.0 < scale < math.inf:
        from pipeline.core.errors import DevcharError

        raise DevcharError(f"{TIMING_SCALE_ENV}={raw!r}: expected a number > 0 (1: the profile's own time budgets)")
    return scale


def scaled(spec: "TimingSpec") -> "TimingSpec":
    """The spec with its warm-up and repetition budgets times timing_scale() (counts unchanged)."""
    scale = timing_scale()
    return spec if scale == 1.0 else replace(spec, warmup_s=spec.warmup_s * scale, budget_s=spec.budget_s * scale)


STALL_CPU_UTIL = 0.5  # below this the process mostly waited: another process had the cores


@dataclass(frozen=True)
class TimingSpec:
    warmup_s: float = 0.02  # warm-up runs until this much time has passed ...
    warmup_min: int = 1  # ... and at least this many calls
    budget_s: float = 0.05  # timed repetitions fill about this much time ...
    min_reps: int = 5
    max_reps: int = 200
    flush_l2: bool = False
    cv_threshold: float = 0.10  # above this a row is re-measured once, then flagged noisy
    # CPU only: one repetition runs the op back to back until it lasts at least this long,
    # and records the mean per call (torch.utils.benchmark's blocked autorange). A 2 us op
    # timed one call at a time is mostly timer and interrupt jitter.
    min_block_s: float = 0.0
    # CUDA only: a graph holds min_calls..max_calls calls, as many as make one replay last about
    # replay_s of device time; budget_s then bounds the device time of all replays together.
    replay_s: float = 0.0005
    min_calls: int = 3
    max_calls: int = 200

    @staticmethod
    def fixed(warmup: int, reps: int) -> "TimingSpec":
        """An exact protocol (PM2Lat's model runs: 5 warm-up, 25 timed)."""
        return TimingSpec(warmup_s=0.0, warmup_min=warmup, budget_s=0.0, min_reps=reps, max_reps=reps)


@dataclass
class Measurement:
    times_us: np.ndarray = field(repr=False)
    remeasured: bool = False
    method: str = "host_clock"  # how the times were taken (cuda_timer.GRAPH, SPIN, ...)
    # CPU only: process CPU seconds per wall second over the timed repetitions (about 1 for a
    # one-thread op, about the thread count for a parallel one). Far below 1 means the process
    # mostly waited for a core, a stall whose spread can be small enough to pass the cv test.
    # It does not see OpenMP's spin-waiting worker, which keeps burning CPU while its partner
    # is descheduled (the 4-8 ms stalls under co-tenant load): that case still needs an idle
    # machine (the runner warns on a high load average).
    cpu_util: float = float("nan")
    # CPU only: minor page faults per call over the timed repetitions (a fresh output above the
    # allocator's mmap threshold faults in every page; harness/page_faults.py)
    faults_per_call: float = float("nan")
    # CPU: seconds a call took in the warm-up (hot, unflushed): what a retry sizes its blocks
    # and repetitions by, as the first attempt did (not in the row)
    per_call_s: float = float("nan")
    # CPU: the slower of two readings of a tiny fixed GEMM just before and after this timing
    # (harness/spells.py; the one before is the previous timing's after when under RECENT_S
    # old): far over its usual time, the timing ran in a slow spell
    probe_us: float = float("nan")
    # CPU: the same for the host probe, a tiny op's per-call time (spells.host_probe_us): the
    # host's speed at running an op, which the GEMM probe cannot see
    host_probe_us: float = float("nan")

    @property
    def stalled(self) -> bool:
        return bool(self.cpu_util < STALL_CPU_UTIL)

    @property
    def reps(self) -> int:
        return int(self.times_us.size)

    @property
    def median_us(self) -> float:
        return float(np.median(self.times_us))

    @property
    def p20_us(self) -> float:
        return float(np.percentile(self.times_us, 20))

    @property
    def p80_us(self) -> float:
        return float(np.percentile(self.times_us, 80))

    @property
    def iqr_us(self) -> float:
        return float(np.percentile(self.times_us, 75) - np.percentile(self.times_us, 25))

    @property
    def cv(self) -> float:
        mean = float(np.mean(self.times_us))
        return float(np.std(self.times_us) / mean) if mean > 0 else math.inf

    def noisy(self, threshold: float = 0.10) -> bool:
        from pipeline.harness.cuda_timer import HOST_BOUND

        return self.cv > threshold or self.stalled or self.method == HOST_BOUND

    def row(self, threshold: float = 0.10) -> dict:
        """The columns every sample table carries."""
        return {
            "median_us": self.median_us,
            "p20_us": self.p20_us,
            "p80_us": self.p80_us,
            "cv": self.cv,
            "reps": self.reps,
            "noisy": self.noisy(threshold),
            "remeasured": self.remeasured,
            "stalled": self.stalled,
            "cpu_util": self.cpu_util,
            "timing_method": self.method,
            **({"faults_per_call": self.faults_per_call} if math.isfinite(self.faults_per_call) else {}),
            **({"probe_us": self.probe_us} if math.isfinite(self.probe_us) else {}),
            **({"host_probe_us": self.host_probe_us} if math.isfinite(self.host_probe_us) else {}),
        }


FLUSH_L2_FACTOR = 2  # a flush writes this many times the L2 size


class _L2Flusher:
    """Overwrites a buffer twice the L2 size so each repetition starts with a cold cache.
    On a CPU the pass reads and writes (add_): a large zero-fill may use streaming stores,
    which bypass the cache and evict nothing."""

    def __init__(self, l2_bytes: int, device: str):
        import torch

        n = max(int(FLUSH_L2_FACTOR * l2_bytes) // 4, 1)
        self.cpu = not device.startswith("cuda")
        self.buf = (torch.ones if self.cpu else torch.empty)(n, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.cpu:
            self.buf.add_(1.0)
        else:
            self.buf.zero_()


def _reps_for(spec: TimingSpec, per_call_s: float) -> int:
    if spec.budget_s <= 0:
        return spec.min_reps
    want = int(spec.budget_s / max(per_call_s, 1e-9))
    return int(min(max(want, spec.min_reps), spec.max_reps))


def _warmup(fn: Callable[[], object], spec: TimingSpec, sync: Callable[[], None]) -> float:
    """Runs fn until the warm-up budget is spent; returns the mean seconds per call."""
    calls, start = 0, time.perf_counter()
    while calls < spec.warmup_min or time.perf_counter() - start < spec.warmup_s:
        fn()
        sync()
        calls += 1
    return (time.perf_counter() - start) / max(calls, 1)


def _time_cpu(fn, reps: int, flush, inner: int = 1) -> np.ndarray:
    out = np.empty(reps)
    for i in range(reps):
        if flush is not None:
            flush()
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        out[i] = (time.perf_counter_ns() - t0) / 1e3 / inner
    return out


def _sync_for(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


_FLUSHER: dict[tuple[int, str], _L2Flusher] = {}


def kept_flusher(l2_bytes: int, device: str) -> _L2Flusher:
    """One flusher kept for the last (size, device) asked for: a fresh 1.9 GB buffer per
    measurement (the cold embedding timings on a VM that reports a 480 MB L3) cost its page
    faults each time, more than the flushes themselves."""
    key = (int(l2_bytes), device)
    if key not in _FLUSHER:
        _FLUSHER.clear()  # free the old buffer before the new one is allocated
        _FLUSHER[key] = _L2Flusher(l2_bytes, device)
    return _FLUSHER[key]


def release_flusher() -> None:
    """Free the kept flush buffer (a sweep calls this when its flushed timings are done)."""
    _FLUSHER.clear()


def measure_once(fn: Callable[[], object], spec: TimingSpec, device: str = "cpu", l2_bytes: int = 0,
                 warm_per_call_s: float | None = None) -> Measurement:
    """One measurement. `warm_per_call_s` (CPU): fn has just run this long a call, so it is warm
    and the warm-up is skipped (measure's second attempt: a warm-up is a quarter of the quick
    GEMM sweep, and the retry only repeats it on an op that ran a moment ago)."""
    spec = scaled(spec)
    flush = kept_flusher(l2_bytes, device) if spec.flush_l2 and l2_bytes > 0 else None
    cuda = device.startswith("cuda")
    per_call = warm_per_call_s if warm_per_call_s and not cuda else _warmup(fn, spec, _sync_for(device))
    if cuda:
        from pipeline.harness.cuda_timer import TorchCudaBackend, measure_cuda

        times, method = measure_cuda(fn, spec, TorchCudaBackend(), flush)
        return Measurement(times_us=times, method=method)
    inner = max(1, int(spec.min_block_s / max(per_call, 1e-9))) if flush is None else 1
    reps = _reps_for(spec, per_call * inner)
    wall0, cpu0, faults0 = time.perf_counter(), time.process_time(), minor_faults()
    times = _time_cpu(fn, reps, flush, inner)
    util = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    return Measurement(times_us=times, cpu_util=util, faults_per_call=(minor_faults() - faults0) / (reps * inner),
                       per_call_s=per_call)


def measure(fn: Callable[[], object], spec: TimingSpec, device: str = "cpu", l2_bytes: int = 0) -> Measurement:
    """Measure, and re-measure once when the spread is above spec.cv_threshold.

    Of the two attempts the steadier one is kept; `Measurement.noisy` then says
    whether it is still above the threshold (the caller flags the row).
    """
    def attempts() -> Measurement:
        first = measure_once(fn, spec, device, l2_bytes)
        if not first.noisy(spec.cv_threshold):
            return first
        warm = first.per_call_s if math.isfinite(first.per_call_s) else None
        second = measure_once(fn, spec, device, l2_bytes, warm_per_call_s=warm)
        best = second if second.cv < first.cv else first
        best.remeasured = True
        return best

    if device.startswith("cuda"):
        return attempts()
    best, best.probe_us, best.host_probe_us = read_both_around(attempts)
    return best


def measure_step(fn: Callable[[], object], spec: TimingSpec, device: str = "cpu") -> Measurement:
    """Wall time of whole steps (a forward pass, a training step): host clock around each call,
    the device synchronized before and after, so a GPU step counts launches, kernels and gaps."""
    sync = _sync_for(device)
    per_call = _warmup(fn, spec, sync)
    reps = _reps_for(spec, per_call)
    out = np.empty(reps)
    wall0, cpu0, faults0 = time.perf_counter(), time.process_time(), minor_faults()
    for i in range(reps):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        sync()
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    util = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    # CPU: pages a step faults in. It depends on what the process allocated before (glibc's
    # mmap and trim thresholds adapt): dlrm_default at batch 512 faulted ~1-2.5k pages a step
    # in a fresh process and ~13k after batch 128 had run, 44 against 50 ms on the Xeon VM
    faults = (minor_faults() - faults0) / reps if not device.startswith("cuda") else float("nan")
    return Measurement(times_us=out, cpu_util=util, method="wall_clock", faults_per_call=faults)
