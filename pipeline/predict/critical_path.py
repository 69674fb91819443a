"""Critical-path E2E time: Algorithm 1 of the DLRM paper (§III-D), line for line.

Two clocks walk the top-level ops in program order. The CPU clock accumulates the host
overheads T1–T5 (labels as in overheads.py / the paper's Fig. 6); the GPU clock
accumulates kernel times, and a kernel cannot start before the CPU has (half) issued it,
so host overheads that are not hidden show up as device idle time (Fig. 4: CPU-bound
when they dominate, GPU-bound when kernels do). The E2E time is the later clock.

What the paper leaves out, and what we do:
- Synchronization: Algorithm 1 has no step that makes the CPU wait for the GPU, and the
  paper names none; memcpys are device work like kernels (T4 lists cudaMemcpyAsync, §III-C).
  So by default nothing blocks. `Kernel.blocking` (our extension, off by default) makes the
  CPU clock wait for that kernel's end, for synchronous copies / `.item()`.
- Streams: Algorithm 1 keeps one gpu_time, so kernels on all streams serialize here.
- The gap after a long op (our extension): where the overhead model fitted `t1_after` (CPU
  captures, overheads.AfterOp), an op's T1 is scaled by how long the op before it held the
  CPU clock.
- The CPU as the device (`synchronous=True`): no separate device clock. Each "kernel" is
  the op's inline compute and runs on the CPU clock after its dispatch (T4, 0 when no
  launch exists, as on the CPU); the device clock just follows the CPU clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.graph import ExecutionGraph
from pipeline.predict.overheads import OverheadModel

# Algorithm 1 line 11: gpu_time = max(gpu_time + 1, cpu_time + T4/2) + Tk.
KERNEL_GAP_US = 1.0  # the "+1": back-to-back kernels are at least 1 µs apart
LAUNCH_FRACTION = 0.5  # the "T4/2": a kernel can start halfway through its launch call


@dataclass(frozen=True)
class E2E:
    """The prediction and the two clocks it came from (µs)."""

    e2e_us: float
    cpu_us: float
    gpu_us: float
    active_us: float  # sum of kernel times: the paper's GPU active time / "kernel_only"
    # (op id, kernel name, start_us, end_us) per kernel, in launch order: the simulated timeline
    timeline: tuple[tuple[int, str, float, float], ...] = field(default=(), repr=False)
    # (op id, CPU-clock µs from the end of the op before to this op's end: its T1 and its own
    # time) per top-level op; in synchronous mode they add up to e2e_us
    op_cpu: tuple[tuple[int, float], ...] = field(default=(), repr=False)

    @property
    def bound(self) -> str:
        """"cpu" when host overheads are the critical path (Fig. 4 left), else "gpu"."""
        return "cpu" if self.cpu_us >= self.gpu_us else "gpu"

    @property
    def idle_us(self) -> float:
        """Device idle time inside the E2E window: what kernel_only misses."""
        return self.e2e_us - self.active_us


def gpu_active_time(graph: ExecutionGraph) -> float:
    """Sum of all kernel times (µs): GPU active time, the paper's kernel_only baseline."""
    return float(sum(k.time_us for k in graph.kernels()))


def critical_path(graph: ExecutionGraph, overheads: OverheadModel, *, synchronous: bool = False) -> E2E:
    """Algorithm 1: predicted per-iteration time of `graph` with kernel times already set.

    Kernel times are whatever the graph carries (set them with graph.with_kernel_times from
    the kernel models {M}, line 10). `synchronous=True` is the CPU-device mode.
    """
    cpu_time = 0.0  # line 3
    gpu_time = 0.0
    timeline, op_cpu = [], []
    prev_us = None  # how long the previous op held the CPU: a long one slows the gap after it
    for op in graph.top_level():  # line 4: only top-level ops are scheduled
        kernels = graph.launched_kernels(op.id)
        ov = overheads.lookup(op.name, has_kernels=bool(kernels), prev_us=prev_us)  # line 5
        before = cpu_time
        cpu_time += ov["T1"]  # line 6
        op_start = cpu_time
        if kernels:  # line 7
            cpu_time += ov["T2"]  # line 8
            for i, k in enumerate(kernels):  # line 9 (Tk = k.time_us, line 10)
                if synchronous:
                    cpu_time += ov["T4"]  # dispatch, then the work runs inline on this clock
                    start = cpu_time
                    cpu_time += k.time_us
                    gpu_time = cpu_time
                else:
                    start = max(gpu_time + KERNEL_GAP_US, cpu_time + LAUNCH_FRACTION * ov["T4"])  # line 11
                    gpu_time = start + k.time_us
                    cpu_time += ov["T4"]  # line 12
                    if k.blocking:  # extension (not in the paper): the CPU waits for the device
                        cpu_time = max(cpu_time, gpu_time)
                timeline.append((op.id, k.name, start, start + k.time_us))
                if i < len(kernels) - 1:  # line 13
                    cpu_time += ov["T5"]  # line 14
            cpu_time += ov["T3"]  # line 17
        else:
            cpu_time += ov["T5"]  # line 19: a launch-less op's whole CPU time
        prev_us = cpu_time - op_start
        op_cpu.append((op.id, cpu_time - before))
    e2e = max(gpu_time, cpu_time)  # line 22
    return E2E(e2e, cpu_time, gpu_time, gpu_active_time(graph), tuple(timeline), tuple(op_cpu))
