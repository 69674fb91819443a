"""How much longer an op runs with its code, or its data, or both, evicted by other work than in
a hot loop (issue 14's "what the micro-benchmarks miss inside a real model"): a measurement to
run, not a model.

    python scripts/probe_context_cold.py [--reps 200]

Between two runs of one op a training step runs every other op: other code (the autograd
engine, other kernels, the interpreter) and other data (the optimizer's pass over every
parameter). The sweeps time each shape in a loop of itself, where neither is evicted. This
times a few DLRM-sized ops call by call after each of three predecessors, none timed:
  code   the backward pass of a tiny, different model (little data, much other code);
  data   an SGD step over 6 MB of parameters (one code path, much data);
  both   the two, as a training step's backward and optimizer step are.
and prints the medians. On an idle machine only: it is a timing.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200, help="timed calls per predecessor (default 200)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be positive, got {args.reps}")

    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    tiny = nn.Sequential(nn.Conv1d(4, 4, 3), nn.GELU(), nn.LayerNorm(6), nn.Flatten(), nn.Linear(24, 3))
    xt = torch.randn(2, 4, 8)
    params = [torch.randn(512, 512) for _ in range(6)]
    grads = [torch.randn(512, 512) for _ in range(6)]

    def code():
        tiny.zero_grad()
        tiny(xt).logsumexp(-1).sum().backward()

    def data():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-0.01)

    def both():
        code()
        data()

    def median_us(fn, before) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(args.reps):
            if before is not None:
                before()
            t0 = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        return statistics.median(times)

    ops = {}
    for m, n, k in ((32, 512, 68), (32, 256, 256), (32, 1, 512), (128, 512, 512)):
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        ops[f"linear {m} x {n} x {k}"] = lambda x=x, w=w, b=b: F.linear(x, w, b)
    xr = torch.randn(128, 512)
    ops["relu 128 x 512"] = lambda: F.relu(xr)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median us of {args.reps} calls")
    print(f"{'op':24s} {'hot':>8s} {'code':>8s} {'data':>8s} {'both':>8s}")
    for name, fn in ops.items():
        cells = [median_us(fn, before) for before in (None, code, data, both)]
        print(f"{name:24s} " + " ".join(f"{c:8.1f}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
