"""How much longer an op runs after the host has left the cores idle for a while than in a hot
loop (issue 14's "thread start-up and OpenMP barriers for small ops"): a measurement to run,
not a model.

    python scripts/probe_thread_wake.py [--reps 400]

The CPU sweeps call one op back to back, so ATen's OpenMP workers are always spinning when
the next call forks. Inside a model the host spends 10-20 us between ops, more around Python
code, and an OpenMP runtime lets idle workers spin for a while and then sleeps them; a fork
after that wakes them first. A shared host may also evict an idle VM's cache lines, or
deschedule its idle vCPUs. This times ops call by call after a busy-wait of each gap on the
calling thread (the workers idle, as between a model's ops) and prints the medians, with all
threads and with one: a slowdown one thread shows too is not the OpenMP pool's, and one the
L1-sized op (or a numpy read of one page) shows too is not the cache's. On an idle machine only:
it is a timing. Needs torch and numpy alone.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

GAPS_US = (0, 20, 200, 2_000, 20_000)  # host time between two calls, busy-waited


def _busy_wait(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400, help="timed calls per (op, gap) (default 400)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be positive, got {args.reps}")

    import numpy as np
    import torch

    torch.manual_seed(0)
    small = [torch.randn(1 << 12) for _ in range(3)]  # 16 KB each: below ATen's grain, in L1/L2
    x = [torch.randn(1 << 18) for _ in range(3)]  # 1 MB each: an add that forks, 3 MB in L2/L3
    a, b, out = torch.randn(256, 256), torch.randn(256, 256), torch.empty(256, 256)
    page = np.random.default_rng(0).random(1024, dtype=np.float32)  # one 4 KB page, no torch at all
    ops = {
        "numpy sum of one page": page.sum,
        "add of 4K float32": lambda: torch.add(small[0], small[1], out=small[2]),
        "add of 256K float32": lambda: torch.add(x[0], x[1], out=x[2]),
        "mm 256 x 256 x 256 float32": lambda: torch.mm(a, b, out=out),
    }
    print(f"torch {torch.__version__}; median of {args.reps} calls, each timed alone after a busy-wait "
          "of the gap", flush=True)
    for line in torch.__config__.parallel_info().splitlines():
        if "OpenMP" in line or "OMP" in line or "MKL" in line:
            print("  " + line.strip())
    for threads in dict.fromkeys((torch.get_num_threads(), 1)):
        torch.set_num_threads(threads)
        for name, op in ops.items():
            for _ in range(200):  # warm: the code, the allocator, the pool
                op()
            for gap in GAPS_US:
                times = []
                for _ in range(args.reps if gap < 20_000 else max(1, args.reps // 4)):  # the longest gap: fewer
                    _busy_wait(gap)
                    t0 = time.perf_counter_ns()
                    op()
                    times.append((time.perf_counter_ns() - t0) / 1e3)
                times.sort()
                print(f"{threads:3d} thr {name:28s} after {gap:6d} us idle: {statistics.median(times):8.2f} us "
                      f"(p20 {times[len(times) // 5]:.2f}, p80 {times[4 * len(times) // 5]:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
