"""Whether the N twins' penalty (a GEMM whose N ends mid cache line, against one a line wider)
depends on where N lies, not only on the (M, N) cell: a measurement to run, not a model.

    .venv/bin/python scripts/probe_unaligned_n.py [--op linear] [--dtype float32]
        [--m 128,512,1024] [--k 256] [--bases 16400,24576,49152,50256,65552] [--reps 7]

For each M and each base N (a whole number of cache lines) it times the GEMM at N and at N + 1,
as the GEMM sweep calls it (sweeps/gemm.py gemm_callable, a fresh output each call), and prints
nanoseconds a column and the twin's ratio. The sweep's N twins sit a cache line past powers of
two (16 400 / 16 401, 65 552 / 65 553); GPT-2's LM head has N = 50 257, which lies between them
and is not near a power of two. Run it on an idle machine: it is a timing.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"probe_unaligned_n: --{name} must be comma-separated whole numbers, got {text!r}")
    if not values or min(values) < 1:
        raise SystemExit(f"probe_unaligned_n: --{name} needs positive values, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="linear", choices=["linear", "mm"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--m", default="128,512,1024")
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--bases", default="16400,24576,49152,50256,65552")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    ms, bases = _ints(args.m, "m"), _ints(args.bases, "bases")
    for name in ("k", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be positive, got {getattr(args, name)}")

    from pipeline.core.dtypes import element_bytes
    from pipeline.harness.timer import TimingSpec, measure_once
    from pipeline.predict.gemm_grids import line_elements
    from pipeline.sweeps.gemm import gemm_callable

    spec = TimingSpec.fixed(1, args.reps)  # one warm-up call (first touch, the BLAS's buffers), then reps

    def median_us(m: int, n: int) -> float:
        return measure_once(gemm_callable(args.op, args.dtype, 1, m, n, args.k, "cpu"), spec).median_us

    line = line_elements(args.dtype)
    print(f"{args.op} {args.dtype}, K = {args.k}: median of {args.reps} calls, ns a column")
    print(f"{'M':>6} {'N':>7} {'N mod line':>10} {'row mod 4K':>10} {'ns/col':>9} {'N+1 ns/col':>10} {'N+1 / N':>8}")
    for m in ms:
        for n in bases:
            base, twin = median_us(m, n), median_us(m, n + 1)
            row = n * element_bytes(args.dtype) % 4096
            print(f"{m:>6} {n:>7} {n % line:>10} {row:>10} {base / n * 1e3:>9.0f} "
                  f"{twin / (n + 1) * 1e3:>10.0f} {twin / base:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
