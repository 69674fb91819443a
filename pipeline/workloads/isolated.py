"""One workload step measured in a Python process of its own (CPU), its allocator in a stated state.

A CPU step's time depends on the C allocator's state. glibc serves a block above its mmap
threshold with fresh pages (a page fault each) and returns the top of its heap to the OS past
its trim threshold; both thresholds rise as the process frees larger blocks, up to 32 MiB on
64-bit. Measured one after another in one process, a workload inherited whatever the sweeps and
workloads before it left: DLRM-default at batch 512 faulted ~5k pages a step on one take and
~13k on another, and its step moved 43-61 ms between calibrations of the Xeon VM.

So each (config, batch) is timed in a fresh interpreter that first allocates and frees one
block just under glibc's cap, as any process that has held a large tensor has (the calibration
process has, many times: its kernel tables are timed in that state). Measured on the Xeon VM
(2026-11-26), 5 + 25 steps then 300 more: without that block DLRM-DDP at batch 512 ran 10.6-11.6
ms with 2.2-2.6k faults a step, with it 8.3-8.6 ms with none; DLRM-default 55-56 ms (12k faults)
against 42-46 ms (2k). The steady state of a process that never freed a large block is that much
slower, and devchar's tables do not price it (docs/methods.md).

The fresh process is forked from a server that imported torch and transformers' GPT-2 once
(workloads/fork_server.py), which spares each step ~2-7 s of imports; `launch="exec"` starts a
new interpreter instead: `python -m pipeline.workloads.isolated ARGS` prints one JSON line with
the step times, the CPU use and the page faults a step. torch and numpy only (the device side).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

from pipeline.core.errors import DevcharError
from pipeline.harness.child_json import ChildError, run_module_json
from pipeline.harness.timer import Measurement
from pipeline.workloads.fork_server import ForkServer, serve

# A child that has not answered in an hour is hung (a deadlocked OpenMP pool, a swapping
# machine), not slow: the full profile's largest step (gpt2-large, batch 8, seq 512, ~7 TFLOP) runs
# tens of seconds on a 2-core CPU, and a child times 30 of them after building the model.
TIMEOUT_S = 3600.0
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit is 32 MiB: freeing a mapped block up to that size
# raises the mmap threshold to it (and the trim threshold to twice it); a larger one changes nothing
ADAPT_BYTES = 31 << 20


ALLOCATOR_STATES = ("adapted", "fresh")
LAUNCHES = ("forkserver", "exec")
# fork() after importing torch is what Linux servers do; elsewhere (macOS) a fresh interpreter
DEFAULT_LAUNCH = "forkserver" if sys.platform.startswith("linux") else "exec"
# what every child needs, imported once by the fork server (a module it cannot import is skipped)
PRELOAD = ["pipeline.workloads.dlrm_run", "pipeline.workloads.gpt2_run", "transformers.models.gpt2.modeling_gpt2"]


def measure_in_child(workload: str, spec, batch: int, seq: int, dtype: str, threads: int, warmup: int, reps: int,
                     timeout_s: float = TIMEOUT_S, allocator: str = "adapted",
                     launch: str = DEFAULT_LAUNCH) -> Measurement:
    """The step of one workload (`spec`: a GPT2Spec or a DLRMSpec), timed in a fresh process
    whose allocator has freed a large block ("adapted") or nothing ("fresh"), forked from the
    fork server or (`launch="exec"`) a new interpreter; raises DevcharError naming the
    workload when the child fails or hangs."""
    if allocator not in ALLOCATOR_STATES:
        raise DevcharError(f"unknown allocator state {allocator!r}; expected one of {ALLOCATOR_STATES}")
    if launch not in LAUNCHES:
        raise DevcharError(f"unknown launch {launch!r}; expected one of {LAUNCHES}")
    args = ["--workload", workload, "--spec", json.dumps(dataclasses.asdict(spec)), "--batch", str(batch),
            "--seq", str(seq), "--dtype", dtype, "--threads", str(threads), "--warmup", str(warmup),
            "--reps", str(reps), "--allocator", allocator]
    what = f"{workload} {spec.name} batch={batch} seq={seq}"
    out = _forked(args, what, timeout_s) if launch == "forkserver" else _executed(args, what, timeout_s)
    return Measurement(np.asarray(out["times_us"], float), method=out["method"], cpu_util=out["cpu_util"],
                       faults_per_call=out["faults_per_call"])


_SERVER = ForkServer("pipeline.workloads.isolated")


def _forked(args: list[str], what: str, timeout_s: float) -> dict:
    try:
        out = _SERVER.request(args, timeout_s)
    except RuntimeError as exc:  # the server did not start
        raise DevcharError(f"measuring {what} in its own process: {exc}") from exc
    if out is None:
        raise DevcharError(f"measuring {what} in its own process: no answer in {timeout_s:g} s")
    if "error" in out:
        raise DevcharError(f"measuring {what} in its own process failed: {out['error']}")
    return out


def _executed(args: list[str], what: str, timeout_s: float) -> dict:
    try:
        out = run_module_json("pipeline.workloads.isolated", args, timeout_s)
    except ChildError as exc:
        raise DevcharError(f"measuring {what} in its own process: {exc}") from exc
    if not RESULT_KEYS <= out.keys():
        raise DevcharError(f"measuring {what} in its own process: no result line in {out!r}")
    return out


def _spec(workload: str, fields: dict):
    from pipeline.workloads.dlrm import DLRMSpec
    from pipeline.workloads.gpt2 import GPT2Spec

    cls = {"gpt2": GPT2Spec, "dlrm": DLRMSpec}.get(workload)
    if cls is None:
        raise DevcharError(f"unknown workload {workload!r}; expected gpt2 or dlrm")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})  # JSON gives lists


def measure_here(workload: str, spec, batch: int, seq: int, dtype: str, device: str, warmup: int,
                 reps: int) -> Measurement:
    """One workload step timed in this process: a GPT-2 forward pass or a DLRM training step."""
    from pipeline.workloads.dlrm_run import measure_training_step
    from pipeline.workloads.gpt2_run import measure_forward

    if workload == "gpt2":
        return measure_forward(spec, batch, seq, dtype, device, warmup, reps)
    return measure_training_step(spec, batch, device, warmup, reps)


def _measure(a: argparse.Namespace) -> Measurement:
    import torch

    torch.set_num_threads(a.threads)
    spec = _spec(a.workload, json.loads(a.spec))
    if a.allocator == "adapted":  # the stated allocator state (module docstring)
        block = torch.empty(ADAPT_BYTES, dtype=torch.uint8)
        del block
    return measure_here(a.workload, spec, a.batch, a.seq, a.dtype, "cpu", a.warmup, a.reps)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.workloads.isolated")
    for name in ("workload", "spec", "dtype"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--allocator", choices=ALLOCATOR_STATES, default="adapted")
    for name in ("batch", "seq", "threads", "warmup", "reps"):
        p.add_argument(f"--{name}", type=int, required=True)
    return p


RESULT_KEYS = {"times_us", "method", "cpu_util", "faults_per_call"}


def _result(m: Measurement) -> dict:
    return {"times_us": m.times_us.tolist(), "method": m.method, "cpu_util": m.cpu_util,
            "faults_per_call": m.faults_per_call}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve"]:  # the fork server (workloads/fork_server.py)
        return serve(PRELOAD, lambda args: _result(_measure(_parser().parse_args(args))))
    print(json.dumps(_result(_measure(_parser().parse_args(argv)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
