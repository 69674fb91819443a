"""Which device kernels a call launched, and how long CUPTI says each ran: many calls in one
profiler session, each under its own marker.

One profiler session per point cost about 0.1 s of a 0.29 s point on the H100 (the quick
profile's 38 minutes); one session for hundreds of points costs about one. A kernel belongs
to the marker around the runtime or driver call that launched it (the trace's correlation
id links the two), so kernels still running when the next marker opens are not misassigned.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Hashable, Iterable

import numpy as np

MARK = "devchar_point:"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def kernels_by_marker(trace: dict) -> dict[int, list[tuple[str, float]]]:
    """Marker index -> [(kernel name, CUPTI duration us)] in launch order, from a Chrome trace."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    markers = sorted((e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(MARK)),
                     key=lambda e: e["ts"])
    launches = {e.get("args", {}).get("correlation"): e for e in events if e.get("cat") in LAUNCH_CATS}
    starts = np.array([m["ts"] for m in markers], dtype=float)
    index = [int(m["name"][len(MARK):]) for m in markers]
    out: dict[int, list[tuple[str, float]]] = {i: [] for i in index}
    for k in sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"]):
        call = launches.get(k.get("args", {}).get("correlation"))
        if call is None or not len(starts):
            continue
        i = int(np.searchsorted(starts, call["ts"], side="right")) - 1  # the last marker opened before the launch
        if i >= 0 and call["ts"] <= markers[i]["ts"] + markers[i]["dur"]:
            out[index[i]].append((k["name"], float(k["dur"])))
    return out


class KernelRecorder:
    """`with KernelRecorder() as rec: rec.run(key, fn)` ... then `rec.kernels[key]`."""

    def __init__(self):
        self.keys: list[Hashable] = []
        self.kernels: dict[Hashable, list[tuple[str, float]]] = {}

    def __enter__(self) -> "KernelRecorder":
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._prof = profile(activities=acts)
        self._prof.__enter__()
        return self

    def run(self, key: Hashable, fn: Callable[[], object]) -> None:
        from torch.profiler import record_function

        with record_function(f"{MARK}{len(self.keys)}"):
            fn()
        self.keys.append(key)

    def __exit__(self, *exc) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        with tempfile.TemporaryDirectory(prefix="devchar-trace-") as d:
            path = Path(d) / "trace.json"
            self._prof.export_chrome_trace(str(path))
            found = kernels_by_marker(json.loads(path.read_text()))
        self.kernels = {key: found.get(i, []) for i, key in enumerate(self.keys)}


def record_kernels(keys: Iterable[Hashable], make_fn: Callable[[Hashable], Callable[[], object]],
                   chunk: int = 400) -> dict[Hashable, list[tuple[str, float]]]:
    """Each key's kernels, one profiler session per `chunk` keys. make_fn(key) builds the call,
    which runs once outside its marker first, so one-time set-up kernels are not taken for its own."""
    keys, out = list(keys), {}
    for lo in range(0, len(keys), chunk):
        with KernelRecorder() as rec:
            for key in keys[lo:lo + chunk]:
                fn = make_fn(key)
                fn()
                rec.run(key, fn)
        out.update(rec.kernels)
    return out


def cupti_us(fn: Callable[[], object], calls: int = 20, flush: Callable[[], None] | None = None) -> float:
    """Median over calls of the summed CUPTI durations of the kernels one call launched (the
    flush runs outside the markers, so its kernels are not counted)."""
    fn()
    with KernelRecorder() as rec:
        for i in range(calls):
            if flush is not None:
                flush()
            rec.run(i, fn)
    return float(np.median([sum(d for _, d in rec.kernels[i]) for i in range(calls)]))


def pick_gemm_kernel(names: list[str]) -> str:
    """The GEMM among a call's kernels (a linear may add a bias or a cast kernel beside it)."""
    names = [n for n in names if "memcpy" not in n.lower() and "memset" not in n.lower()]
    gemm = [n for n in names if any(s in n.lower() for s in ("gemm", "xmma", "cutlass", "sm90", "sm80"))]
    return (gemm or names or ["unknown"])[0][:200]
