"""How fast a CPU runs right now: one fixed probe, timed before and after every CPU sweep.

A shared VM's speed drifts while a calibration is taken, steadily enough that no row looks
noisy: on the Xeon VM (2026-11-26) GEMMs re-timed 40 minutes after a take's GEMM sweep ran
6 % slower, and 14 % slower than the day before; the take's GPT-2 runs, timed last, were
priced 10-15 % under while the same kernels re-timed beside them matched their prices. The
probe corrects nothing: each sweep's rows carry its time (`canary_us`, the quicker of the
readings before and after: see sweep_speed), and the summary sets the workload runs' against the GEMM sweep's, so that an error of
the drift's size is read as the machine's.

The probe is a small GEMM (compute, every thread) and a copy of a buffer past L2 (memory),
timed as the sweeps time (blocked calls, median): ~0.4 s a probe on the Xeon VM (~0.9 s the
first time in a process), twice per sweep.
"""
from __future__ import annotations

from pipeline.harness.timer import TimingSpec, measure

GEMM_SIDE = 256  # float32, output kept: no page faults in the probe
COPY_BYTES = 8 << 20
SPEC = TimingSpec(warmup_s=0.005, budget_s=0.03, min_reps=7, max_reps=100, min_block_s=2e-4)


def canary_us() -> float:
    """Microseconds of the probe (GEMM + copy medians) on the CPU, now."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(GEMM_SIDE, GEMM_SIDE, generator=g) for _ in range(2))
    out = torch.empty(GEMM_SIDE, GEMM_SIDE)
    src, dst = torch.empty(COPY_BYTES // 4), torch.empty(COPY_BYTES // 4)
    src.fill_(1.0)
    gemm = measure(lambda: torch.mm(a, b, out=out), SPEC).median_us
    copy = measure(lambda: dst.copy_(src), SPEC).median_us
    return float(gemm + copy)


# Readings further apart than this are a stalled probe, not the machine's speed: the drift seen
# on shared VMs is 6-14 % over 40 minutes, while the 16-core host once read 78 us around one
# sweep and ~6 ms in one probe around the GEMM sweep (2026-11-26, a machine 5 minutes booted).
STALLED_RATIO = 2.0


def sweep_speed(before_us: float, after_us: float) -> tuple[float, str | None]:
    """A sweep's probe time from the readings before and after it, and a warning when they
    disagree past STALLED_RATIO. The quicker reading: a stall (a descheduled thread, a page
    reclaim) can only make a ~0.4 s probe read slow, and the mean of a stalled and a sound
    reading told the summary the machine had halved its speed."""
    lo = min(before_us, after_us)
    warning = None
    if apart(before_us, after_us):
        warning = (f"the speed probe read {before_us:.0f} us before the sweep and {after_us:.0f} us after: "
                   f"one reading was stalled; the sweep's rows carry the quicker, {lo:.0f} us")
    return lo, warning


def apart(a_us: float, b_us: float) -> bool:
    """Two probe times too far apart to be the same machine drifting (STALLED_RATIO)."""
    return max(a_us, b_us) > STALLED_RATIO * min(a_us, b_us)


def drift(kernels_us: float, workloads_us: float) -> float:
    """How much slower (> 0) the machine ran the workloads than the kernel sweep, by the probe."""
    return workloads_us / kernels_us - 1.0
