"""Kernel time on CUDA: CUDA-graph replay, or a spin kernel holding the stream when an op
cannot be captured. Never one event pair per call.

Why: a host that needs ~20 us to launch one PyTorch op records the start event long before
a 4 us kernel is queued, so per-call events time the host (on the H100 VM 1408x1536x32 bf16
read 66 us by events, 4.2 us by graph replay, 4.35 us by CUPTI;
../shared/calibrations/h100-event-timing-2026-11-23/).

- graph: capture R calls (each after the L2 flush when the spec asks for a cold cache) in one
  CUDA graph; a replay launches them back to back with no host in between. Time each replay
  with one event pair, divide by R, and subtract a graph of the R flushes alone.
- spin: hold the stream with a spin kernel long enough for the host to queue R calls behind
  it, then one event pair around them. If the host was slower than the spin, the spin is
  doubled and the repetition taken again; a host that still outruns it is recorded as such
  (`cuda_events_host_bound`, flagged noisy), never passed off as kernel time.

The CUDA calls sit behind `CudaBackend` (four methods), so the logic is tested on a machine
without a GPU with a simulated device (tests/test_cuda_timer.py).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Protocol

import numpy as np

GRAPH = "cuda_graph"
SPIN = "cuda_spin"
HOST_BOUND = "cuda_events_host_bound"
SPIN_RETRIES = 3  # doublings of the spin before a host-bound repetition is accepted as such
GRAPH_HOLD_US = 50.0  # first spin before a replay; doubled while the host's graph launch outlasts it


class CudaBackend(Protocol):
    def synchronize(self) -> None: ...

    def capture(self, work: Callable[[], None]) -> Callable[[], None]:
        """A replay function of `work` captured as one CUDA graph; raises if it cannot be captured."""

    def time_us(self, work: Callable[[], None], hold_us: float = 0.0) -> tuple[float, float]:
        """(device us between an event before and after `work`, host us spent enqueuing `work`);
        with hold_us > 0 a spin kernel of about that long runs before the first event."""

    def release(self) -> None:
        """Drop captured graphs (their memory pools)."""


def _repeat(fn: Callable[[], object], flush: Callable[[], None] | None, calls: int) -> Callable[[], None]:
    def work() -> None:
        for _ in range(calls):
            if flush is not None:
                flush()
            fn()
    return work


def calls_per_replay(per_call_us: float, replay_us: float, min_calls: int, max_calls: int) -> int:
    """Calls captured in one graph: enough that a replay lasts about replay_us of device time."""
    want = math.ceil(replay_us / max(per_call_us, 1e-3))
    return int(min(max(want, min_calls), max_calls))


def replays_for(budget_us: float, replay_us: float, min_reps: int, max_reps: int) -> int:
    if budget_us <= 0:
        return min_reps
    return int(min(max(int(budget_us / max(replay_us, 1e-3)), min_reps), max_reps))


class HeldStream:
    """Times work queued behind a spin kernel, so the start event fires only once the host has
    queued everything (a graph's launch costs the host ~10 us too). The spin doubles while the
    host outlasts it; after SPIN_RETRIES doublings `host_bound` is set instead."""

    def __init__(self, backend: CudaBackend, hold_us: float):
        self.backend, self.hold_us, self.host_bound = backend, hold_us, False

    def __call__(self, work: Callable[[], None]) -> float:
        for _ in range(SPIN_RETRIES + 1):
            device_us, host_us = self.backend.time_us(work, hold_us=self.hold_us)
            if host_us < 0.8 * self.hold_us:
                return device_us
            self.hold_us *= 2
        self.host_bound = True
        return device_us


def time_by_graph(backend: CudaBackend, fn, spec, flush=None) -> np.ndarray:
    """Per-call kernel time of each replay (us), flush time subtracted. Raises if fn cannot be captured."""
    probe_calls = spec.min_calls
    held = HeldStream(backend, GRAPH_HOLD_US)
    try:
        probe = backend.capture(_repeat(fn, flush, probe_calls))
        probe()  # the first replay uploads the graph
        backend.synchronize()
        per_call = float(np.median([held(probe) for _ in range(3)])) / probe_calls
        calls = calls_per_replay(per_call, spec.replay_s * 1e6, spec.min_calls, spec.max_calls)
        graph = probe if calls == probe_calls else backend.capture(_repeat(fn, flush, calls))
        flushes = backend.capture(_repeat(flush, None, calls)) if flush is not None else None
        reps = replays_for(spec.budget_s * 1e6, per_call * calls, spec.min_reps, spec.max_reps)
        graph()
        if flushes is not None:
            flushes()
        backend.synchronize()
        total, base = np.empty(reps), np.zeros(reps)
        for i in range(reps):  # interleaved, so a clock or thermal drift hits both alike
            total[i] = held(graph)
            if flushes is not None:
                base[i] = held(flushes)
        return (total - np.median(base)) / calls
    finally:
        backend.release()


def time_by_spin(backend: CudaBackend, fn, spec, flush=None, host_per_call_us: float = 20.0) -> tuple[np.ndarray, str]:
    """(per-call kernel times, method): the stream is held while R calls are queued behind the spin."""
    calls = spec.min_calls
    work = _repeat(fn, flush, calls)
    only = _repeat(flush, None, calls) if flush is not None else None
    held = HeldStream(backend, 2.0 * calls * host_per_call_us + 50.0)
    held(work)  # warm: sizes the spin to this host
    total = np.array([held(work) for _ in range(spec.min_reps)])
    base = np.array([held(only) for _ in range(spec.min_reps)]) if only is not None else np.zeros(spec.min_reps)
    return (total - np.median(base)) / calls, HOST_BOUND if held.host_bound else SPIN


class TorchCudaBackend:
    """The real backend: torch.cuda graphs, events and the `_sleep` spin kernel."""

    _cycles_per_us: float | None = None  # per process: the spin's clock is measured once

    def __init__(self):
        import torch

        self.torch = torch
        self.graphs: list = []

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def capture(self, work):
        torch = self.torch
        side = torch.cuda.Stream()  # warm-up off the default stream, as graph capture requires
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            work()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            work()
        self.graphs.append(g)
        return g.replay

    def time_us(self, work, hold_us: float = 0.0) -> tuple[float, float]:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold_us > 0:
            torch.cuda._sleep(int(hold_us * self.cycles_per_us()))
        t0 = time.perf_counter()
        start.record()
        work()
        end.record()
        host_us = (time.perf_counter() - t0) * 1e6
        end.synchronize()
        return start.elapsed_time(end) * 1e3, host_us

    def cycles_per_us(self) -> float:
        """The spin kernel counts clock cycles: measured once, not taken from a datasheet."""
        if TorchCudaBackend._cycles_per_us is None:
            torch = self.torch
            cycles = 10_000_000
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            TorchCudaBackend._cycles_per_us = cycles / max(start.elapsed_time(end) * 1e3, 1.0)
        return TorchCudaBackend._cycles_per_us

    def release(self) -> None:
        self.graphs.clear()


def measure_cuda(fn, spec, backend: CudaBackend, flush=None, log=None) -> tuple[np.ndarray, str]:
    """(per-call kernel times in us, timing method): graph replay, or the spin when capture fails.
    fn has been warmed up by the caller (timer.measure_once)."""
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):  # the host's enqueue cost per call, which the spin must outlast
        if flush is not None:
            flush()
        fn()
    host_per_call_us = (time.perf_counter() - t0) * 1e6 / 3
    backend.synchronize()
    try:
        return time_by_graph(backend, fn, spec, flush), GRAPH
    except Exception as exc:  # noqa: BLE001 - torch raises plain RuntimeErrors for uncapturable ops
        if log is not None:
            log(f"graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timing with a spin kernel")
        backend.synchronize()
        return time_by_spin(backend, fn, spec, flush, host_per_call_us)
