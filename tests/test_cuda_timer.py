"""The CUDA timer's logic on a simulated device (no GPU needed): a host that launches slower
than small kernels run, graphs that replay without the host, ops that cannot be captured,
and host-synchronous ops no spin can hide."""
import numpy as np
import pytest

from pipeline.harness.cuda_timer import GRAPH, HOST_BOUND, SPIN, measure_cuda, time_by_graph
from pipeline.harness.timer import Measurement, TimingSpec

SPEC = TimingSpec(warmup_s=0.0, warmup_min=2, budget_s=0.002, min_reps=5, max_reps=20, replay_s=0.0005,
                  min_calls=3, max_calls=100)


class FakeGPU:
    """One stream. The host enqueues items; the device runs each when it is queued and the
    previous one is done. Times in us on a virtual clock."""

    def __init__(self, launch_us=20.0, graph_launch_us=8.0, node_gap_us=0.3, noise=0.0, seed=0):
        self.launch_us, self.graph_launch_us, self.node_gap_us = launch_us, graph_launch_us, node_gap_us
        self.host = 0.0  # host clock
        self.device_free = 0.0  # when the device finishes what is queued
        self.capturing: list | None = None
        self.rng, self.noise = np.random.default_rng(seed), noise
        self.graphs_alive = 0

    def _enqueue(self, device_us: float) -> float:
        """Queue one item now; returns the device time it ends."""
        start = max(self.host, self.device_free)
        self.device_free = start + device_us
        return self.device_free

    def launch(self, kernel_us: float, capturable=True, host_sync=False) -> None:
        if self.capturing is not None:
            if not capturable:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.capturing.append(kernel_us)
            return
        self.host += self.launch_us
        end = self._enqueue(kernel_us * (1 + self.noise * self.rng.standard_normal()))
        if host_sync:  # e.g. a pageable copy: the host waits for the device
            self.host = max(self.host, end)

    # -- CudaBackend --
    def synchronize(self) -> None:
        self.host = max(self.host, self.device_free)

    def capture(self, work):
        self.capturing = []
        try:
            work()
            nodes = self.capturing
        finally:
            self.capturing = None
        self.graphs_alive += 1

        def replay():
            self.host += self.graph_launch_us
            jitter = 1 + self.noise * self.rng.standard_normal(len(nodes))
            self._enqueue(float(np.sum(np.array(nodes) * jitter)) + self.node_gap_us * len(nodes))
        return replay

    def time_us(self, work, hold_us=0.0):
        if hold_us > 0:
            self._enqueue(hold_us)
            self.host += 5.0
        start = self._enqueue(0.0)
        h0 = self.host
        work()
        host_us = self.host - h0
        end = self._enqueue(0.0)
        self.synchronize()
        return end - start, host_us

    def release(self) -> None:
        self.graphs_alive = 0


class FakeOp:
    def __init__(self, gpu: FakeGPU, kernel_us: float, **kw):
        self.gpu, self.kernel_us, self.kw = gpu, kernel_us, kw

    def __call__(self):
        self.gpu.launch(self.kernel_us, **self.kw)


def test_per_call_events_time_the_launch_but_a_graph_times_the_kernel():
    gpu = FakeGPU(launch_us=20.0)
    op = FakeOp(gpu, 4.0)
    # the old protocol: one event pair around one call, back to back
    per_call = [gpu.time_us(op)[0] for _ in range(20)]
    assert np.median(per_call) > 15.0  # the host's launch, not the kernel
    times, method = measure_cuda(op, SPEC, gpu)
    assert method == GRAPH
    assert np.median(times) == pytest.approx(4.0 + gpu.node_gap_us, abs=0.05)
    assert gpu.graphs_alive == 0  # graphs released after the measurement


def test_the_flush_graph_is_subtracted():
    gpu = FakeGPU(launch_us=20.0)
    times, method = measure_cuda(FakeOp(gpu, 4.0), SPEC, gpu, flush=FakeOp(gpu, 35.0))
    assert method == GRAPH
    # (flush + op) - flush: the op and its one node gap, not the 35 us flush
    assert np.median(times) == pytest.approx(4.0 + gpu.node_gap_us, abs=0.05)


def test_calls_per_graph_follow_the_replay_target():
    gpu = FakeGPU()
    op = FakeOp(gpu, 2.0)
    captured = []

    def call():
        if gpu.capturing is not None:
            captured.append(1)
        op()
    time_by_graph(gpu, call, SPEC)
    # a probe graph of min_calls=3, then ceil(500 us / 2.3 us) = 218 calls, capped at max_calls=100
    assert len(captured) == 3 + 100


def test_an_op_that_cannot_be_captured_is_timed_behind_a_spin():
    gpu = FakeGPU(launch_us=20.0)
    logged = []
    times, method = measure_cuda(FakeOp(gpu, 4.0, capturable=False), SPEC, gpu, log=logged.append)
    assert method == SPIN
    assert np.median(times) == pytest.approx(4.0, abs=0.05)
    assert logged and "spin" in logged[0]


def test_a_host_synchronous_op_is_recorded_as_host_bound_and_noisy():
    gpu = FakeGPU(launch_us=20.0)
    times, method = measure_cuda(FakeOp(gpu, 4.0, capturable=False, host_sync=True), SPEC, gpu)
    assert method == HOST_BOUND
    m = Measurement(times_us=times, method=method)
    assert m.noisy(1e9) and m.row()["timing_method"] == HOST_BOUND


def test_noise_is_kept_in_the_spread():
    gpu = FakeGPU(noise=0.3)
    times, _ = measure_cuda(FakeOp(gpu, 50.0), SPEC, gpu)
    assert times.size >= SPEC.min_reps and Measurement(times_us=times).cv > 0.01


def _x(name, cat, ts, dur, corr=None, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": {} if corr is None else {"correlation": corr}}


def test_kernels_belong_to_the_marker_around_their_launch():
    from pipeline.harness.kernel_names import MARK, kernels_by_marker

    trace = {"traceEvents": [
        _x(f"{MARK}0", "user_annotation", 0, 30),
        _x("cudaLaunchKernel", "cuda_runtime", 5, 20, corr=11),
        _x(f"{MARK}1", "user_annotation", 40, 30),
        _x("cuLaunchKernelEx", "cuda_driver", 45, 10, corr=12),  # cuBLAS through the driver API
        _x("cudaLaunchKernel", "cuda_runtime", 58, 10, corr=13),
        _x("cudaLaunchKernel", "cuda_runtime", 80, 5, corr=14),  # outside every marker (a flush)
        # device side: the first kernel runs after marker 1 has opened: it is still marker 0's
        _x("sm90_xmma_gemm_128x128", "kernel", 42, 4.35, corr=11, tid=7),
        _x("cutlass_80_tensorop_gemm_64x64", "kernel", 60, 6.0, corr=12, tid=7),
        _x("vectorized_elementwise_kernel", "kernel", 67, 1.0, corr=13, tid=7),
        _x("FillFunctor", "kernel", 90, 30.0, corr=14, tid=7),
        _x("orphan", "kernel", 95, 1.0, corr=99, tid=7),
    ]}
    got = kernels_by_marker(trace)
    assert got == {0: [("sm90_xmma_gemm_128x128", 4.35)],
                   1: [("cutlass_80_tensorop_gemm_64x64", 6.0), ("vectorized_elementwise_kernel", 1.0)]}


def test_gemm_kernel_is_picked_among_a_calls_kernels():
    from pipeline.harness.kernel_names import pick_gemm_kernel

    assert pick_gemm_kernel(["Memcpy DtoD", "vectorized_elementwise_kernel", "sm90_xmma_gemm_bf16"]) == \
        "sm90_xmma_gemm_bf16"
    assert pick_gemm_kernel(["reduce_kernel"]) == "reduce_kernel"
    assert pick_gemm_kernel([]) == "unknown"


def test_recorder_runs_each_call_under_its_own_marker_on_the_cpu():
    import torch

    from pipeline.harness.kernel_names import record_kernels

    calls = []
    got = record_kernels(["a", "b", "c"], lambda key: (lambda: calls.append(key) or torch.ones(4).sum()), chunk=2)
    assert calls == ["a", "a", "b", "b", "c", "c"]  # once outside its marker, once inside
    assert got == {"a": [], "b": [], "c": []}  # a CPU launches no device kernels
