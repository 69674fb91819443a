"""One workload step measured in a Python process of its own (CPU).

A CPU step's time depends on the C allocator's state: glibc serves an allocation from its heap
or maps fresh pages (a page fault each) depending on what earlier allocations and frees left
it, and its mmap threshold only rises. Measured one after another in one process, DLRM-default
at batch 512 faulted ~1-2.5k pages a step when it ran first and ~13k after batch 128 ran
before it (44 against 50 ms on the Xeon VM), and its measured step moved 43-61 ms between
calibrations. A user's training or serving process runs its one model, so each (config, batch)
is timed in a fresh interpreter, as that process would run it: the same protocol (warm-up,
timed steps, median), the same thread count, nothing inherited from the workloads before it.

Run as `python -m pipeline.workloads.isolated ARGS`: it prints one JSON line with the step
times, the CPU use and the page faults a step. torch and numpy only (the device side).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import numpy as np

from pipeline.core.errors import DevcharError
from pipeline.harness.timer import Measurement

# A step of the full profile's largest workload runs seconds; a child that has not answered in
# this long is hung (a deadlocked OpenMP pool, a swapping machine), not slow.
TIMEOUT_S = 900.0


def measure_in_child(workload: str, spec, batch: int, seq: int, dtype: str, threads: int, warmup: int, reps: int,
                     timeout_s: float = TIMEOUT_S) -> Measurement:
    """The step of one workload (`spec`: a GPT2Spec or a DLRMSpec), timed in a fresh
    interpreter; raises DevcharError naming it when the child fails or hangs."""
    args = [sys.executable, "-m", "pipeline.workloads.isolated", "--workload", workload,
            "--spec", json.dumps(dataclasses.asdict(spec)), "--batch", str(batch), "--seq", str(seq),
            "--dtype", dtype, "--threads", str(threads), "--warmup", str(warmup), "--reps", str(reps)]
    what = f"{workload} {spec.name} batch={batch} seq={seq}"
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise DevcharError(f"measuring {what} in its own process: no answer in {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]  # the exception's own line
        raise DevcharError(f"measuring {what} in its own process failed (exit {done.returncode}): {last}")
    try:
        out = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise DevcharError(f"measuring {what} in its own process: no result line in {done.stdout[-200:]!r}") from exc
    return Measurement(np.asarray(out["times_us"], float), method=out["method"], cpu_util=out["cpu_util"],
                       faults_per_call=out["faults_per_call"])


def _spec(workload: str, fields: dict):
    from pipeline.workloads.dlrm import DLRMSpec
    from pipeline.workloads.gpt2 import GPT2Spec

    cls = {"gpt2": GPT2Spec, "dlrm": DLRMSpec}.get(workload)
    if cls is None:
        raise DevcharError(f"unknown workload {workload!r}; expected gpt2 or dlrm")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})  # JSON gives lists


def _measure(a: argparse.Namespace) -> Measurement:
    import torch

    from pipeline.workloads.dlrm_run import measure_training_step
    from pipeline.workloads.gpt2_run import measure_forward

    torch.set_num_threads(a.threads)
    spec = _spec(a.workload, json.loads(a.spec))
    if a.workload == "gpt2":
        return measure_forward(spec, a.batch, a.seq, a.dtype, "cpu", a.warmup, a.reps)
    return measure_training_step(spec, a.batch, "cpu", a.warmup, a.reps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.workloads.isolated")
    for name in ("workload", "spec", "dtype"):
        p.add_argument(f"--{name}", required=True)
    for name in ("batch", "seq", "threads", "warmup", "reps"):
        p.add_argument(f"--{name}", type=int, required=True)
    m = _measure(p.parse_args(argv))
    print(json.dumps({"times_us": m.times_us.tolist(), "method": m.method, "cpu_util": m.cpu_util,
                      "faults_per_call": m.faults_per_call}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
