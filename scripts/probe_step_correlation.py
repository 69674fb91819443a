"""How far the spell probes follow a workload step's time on this machine, timed again and again.

Times one GPT-2 forward step (workloads/isolated.py's child, as `workload_runs` does: a fresh
process whose allocator has freed a block just under glibc's mmap cap) --repeats times, each
between readings of three probes: the spell probe (a 128^3 mm in cache, harness/spells.py), a
32 MB copy into a kept buffer (memory bandwidth) and a 32 MB fill of a fresh buffer (page
faults); prints each timing and the correlation of log step time with each log probe reading.

    .venv/bin/python scripts/probe_step_correlation.py [--layers 2 --embd 256 --batch 4 --seq 128 --repeats 16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE_ELEMENTS = 8 << 20  # float32: 32 MB, past the VMs' L2 and most of their L3 shares


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("layers", 2), ("embd", 256), ("batch", 4), ("seq", 128), ("repeats", 16)):
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args(argv)
    for name in ("layers", "embd", "batch", "seq"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.repeats < 2:
        ap.error(f"--repeats must be at least 2 (a correlation needs two timings), got {args.repeats}")
    return args


def main(argv: list[str]) -> int:
    args = _args(argv)
    import torch

    from pipeline.harness.spells import probe_us
    from pipeline.workloads.gpt2 import GPT2Spec
    from pipeline.workloads.isolated import measure_in_child

    spec = GPT2Spec(name=f"gpt2-{args.layers}l-{args.embd}", n_layer=args.layers, n_embd=args.embd,
                    n_head=max(args.embd // 64, 1))
    src = torch.randn(PROBE_ELEMENTS)
    dst = torch.empty_like(src)

    def ms(fn, reps: int = 5) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    probes = {"mm128_us": probe_us, "copy32MB_ms": lambda: ms(lambda: dst.copy_(src)),
              "fresh32MB_ms": lambda: ms(lambda: torch.empty(PROBE_ELEMENTS).fill_(1.0))}
    rows = []
    for i in range(args.repeats):
        before = [p() for p in probes.values()]
        m = measure_in_child("gpt2", spec, args.batch, args.seq, "float32", torch.get_num_threads(), 5, 25)
        after = [p() for p in probes.values()]
        rows.append([m.median_us / 1e3, *map(max, before, after)])
        print(f"{i:2d} step {rows[-1][0]:7.1f} ms  " + "  ".join(f"{k} {v:.2f}" for k, v in zip(probes, rows[-1][1:])),
              flush=True)
    logs = np.log(np.asarray(rows))
    for j, name in enumerate(probes, 1):
        print(f"corr(log step, log {name}) {np.corrcoef(logs[:, 0], logs[:, j])[0, 1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
