"""How a workload's captured GEMMs compare with the same shapes timed hot and right after a
cache flush (issue 14's "what the micro-benchmarks miss inside a real model"): a measurement to
run, not a model.

    DEVCHAR_HOME=... .venv/bin/python scripts/probe_gemm_after_flush.py [--workload dlrm]
        [--device SLUG] [--flush-mb 64] [--ops]

For every priced mm / linear / bmm op of the warehouse's captures of the workload it times the
op's shape alone on this machine, as the GEMM sweep calls it (sweeps/gemm.py gemm_callable, in
the capture's dtype): hot, back to back, and right after writing one element per 64-byte line
over --flush-mb MB (the write's own time is outside the timed call). It prints, per capture,
the traced GEMM time beside the model's price, the hot sum and the flushed sum (and with --ops
every op). On the Zen 5 EPYC VM (2026-11-30) the flushed sums came to 0.80-1.09 of DLRM's
traced GEMM time, the hot ones 0.52-0.93; for GPT-2's forward hot and flushed both read
0.84-1.10 where the model priced 0.73-0.99 (one capture read 1.5 all three ways;
docs/methods.md). Run it on the machine the warehouse calibrated, idle: it is a timing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(fn, reps: int, before=None) -> float:
    """Median microseconds of `fn` over `reps` calls, `before` run untimed ahead of each."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="dlrm")
    ap.add_argument("--device", default=None, help="the warehouse's device (default: its first)")
    ap.add_argument("--flush-mb", type=int, default=64)
    ap.add_argument("--ops", action="store_true", help="print every op, not only the sums per capture")
    args = ap.parse_args(argv)
    if args.flush_mb < 1:
        ap.error(f"--flush-mb must be positive, got {args.flush_mb}")

    import pandas as pd
    import torch

    from pipeline.analysis.captures import priced_captures
    from pipeline.core.config import duckdb_path
    from pipeline.sweeps.gemm import gemm_callable

    db = str(duckdb_path())
    found = priced_captures(db, args.workload, args.device)
    if found is None:
        raise SystemExit(f"probe_gemm_after_flush: no warehouse at {db}; set DEVCHAR_HOME")
    device, captures = found
    if not captures:
        raise SystemExit(f"probe_gemm_after_flush: no {args.workload!r} captures of {device} in {db}")
    flush = torch.zeros(args.flush_mb << 18)  # float32: 4 bytes each
    stride = 16  # one element per 64-byte line

    def evict():
        flush[::stride].add_(1.0)

    cache, rows = {}, []
    for g, ops in captures:
        gemms = ops[ops["model_op"].isin(["mm", "linear", "bmm"]) & (ops["status"] == "priced")]
        for r in gemms.itertuples():
            key = (r.model_op, tuple(r.dims), g["dtype"])
            if key not in cache:
                m, n, k, batch = (list(r.dims) + [1])[:4]
                fn = gemm_callable(r.model_op, g["dtype"], batch, m, n, k, "cpu")  # as the sweep times it
                cache[key] = (_timed(fn, 30), _timed(fn, 15, evict))
            hot, flushed = cache[key]
            rows.append(dict(config=g["config"], batch=g["batch"], op=r.name, model_op=r.model_op,
                             dims="x".join(str(d) for d in r.dims), traced_us=r.measured_us,
                             priced_us=r.predicted_us, hot_us=hot, flushed_us=flushed))
        print(f"{g['config']} batch {g['batch']}: {len(gemms)} GEMMs timed", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    sums = df.groupby(["config", "batch"])[["traced_us", "priced_us", "hot_us", "flushed_us"]].sum()
    for col in ("priced_us", "hot_us", "flushed_us"):
        sums[col.replace("_us", "/traced")] = sums[col] / sums["traced_us"]
    print(f"{device}, {args.workload}: GEMM time per capture (µs), traced vs priced, hot and after a "
          f"{args.flush_mb} MB write")
    print(sums.round(2).to_string())
    if args.ops:
        print(df.round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
