"""How much longer a small op runs right after a large one than in a hot loop (issue 14's
"what the micro-benchmarks miss inside a real model"): a measurement to run, not a model.

    python scripts/probe_after_large_op.py [--reps 2000]

The CPU sweeps time each shape in a loop of itself, so its inputs, its code and its output
stay in L1/L2. Inside a model the op before it is usually larger and streams megabytes through
the caches. This times one small op (mm 16 x 32 x 16 float32, one thread: below ATen's grain)
call by call after each of several predecessors and prints the medians. On an idle machine
only: it is a timing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000, help="timed calls per predecessor (default 2000)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be positive, got {args.reps}")

    import numpy as np
    import torch

    torch.manual_seed(0)
    a, b, out = torch.randn(16, 32), torch.randn(32, 16), torch.empty(16, 16)
    big = [torch.randn(1 << 20) for _ in range(3)]  # 4 MB each: an add streams 12 MB
    mid = [torch.randn(1 << 16) for _ in range(3)]  # 256 KB each: forks, stays in L2
    src, dst = np.random.default_rng(0).random(3 << 20, dtype=np.float32), np.empty(3 << 20, np.float32)

    def small():
        torch.mm(a, b, out=out)

    predecessors = {
        "none (the sweep's hot loop)": small,
        "a 16 x 16 add (tiny)": lambda: torch.add(out, out),
        "an add of 64K float32 (forks, in L2)": lambda: torch.add(mid[0], mid[1], out=mid[2]),
        "an add of 1M float32 (forks, 12 MB)": lambda: torch.add(big[0], big[1], out=big[2]),
        "a one-thread 12 MB copy (numpy)": lambda: np.copyto(dst, src),
    }
    for _ in range(2000):  # warm: the op's code and the allocator
        small()
    print(f"small op: mm 16 x 32 x 16 float32, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"median of {args.reps} calls, each timed alone after its predecessor", flush=True)
    for name, before in predecessors.items():
        times = []
        for _ in range(args.reps):
            before()
            t0 = time.perf_counter_ns()
            small()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        times.sort()
        print(f"after {name:40s} {statistics.median(times):8.2f} us  (p20 {times[len(times) // 5]:.2f}, "
              f"p80 {times[4 * len(times) // 5]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
