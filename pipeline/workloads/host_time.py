"""Host overheads T1–T5 from a captured workload: the `overhead_samples` rows (DLRM paper §III-C).

On a GPU, the T-types come straight from the trace's launches (predict/overheads.py).
The CPU as the device runs each op's work inline, so there is no launch to measure from;
the same Algorithm 1 holds with these definitions, which match price_graph(synchronous=True):
  T1  gap between two consecutive top-level ops (as on a GPU), with `prev_us`, the previous
      op's traced duration: a gap after a long op runs longer (overheads.AfterOp);
  T2  for a top-level op that does modeled work: its CPU time outside that work — dispatch,
      composite wrappers, unmapped helpers — i.e. the op's time minus the inclusive time of
      the outermost ops in its subtree that a model prices (classify_graph);
  T5  for a top-level op with no modeled work: its whole CPU time (Algorithm 1 line 19);
  T3, T4 do not exist (no launch), and Algorithm 1 reads them as 0.
Which ops are "modeled work" is decided from names and shapes alone (no models), so the
extraction runs on a bare device and agrees with any later pricing.

Profiler overhead (§III-C subtracts a fixed cost per event): `measure_profiler_overhead`
measures ours, and each recorded CPU event outside modeled work is charged once.
"""
from __future__ import annotations

import time

import pandas as pd

from pipeline.core.graph import ExecutionGraph
from pipeline.predict.overheads import extract_overheads
from pipeline.predict.price import ExtraOps, classify_graph

WORK = ("priced", "covered")


def cpu_overheads(graph: ExecutionGraph, info: dict, extra: ExtraOps | None = None,
                  profiler_overhead_us: float = 0.0) -> pd.DataFrame:
    """Rows (op, type, us, prev_us) for a CPU capture (capture.py's graph and info); prev_us
    on T1 rows only."""
    classes = classify_graph(graph, info["shapes"], info.get("scalars"), extra, info.get("strides"))
    times = info["times"]
    rows, prev = [], None
    for op in graph.top_level():
        t = times[op.id]
        if prev is not None:
            gap = max(t["ts"] - prev["ts"] - prev["dur"] - profiler_overhead_us, 0.0)
            rows.append((op.name, "T1", gap, round(prev["dur"], 3)))
        prev = t
        work_us, outside_events = _work(graph, op.id, classes, times)
        kind = "T2" if work_us is not None else "T5"
        residual = t["dur"] - (work_us or 0.0) - profiler_overhead_us * outside_events
        rows.append((op.name, kind, max(residual, 0.0), None))
    return pd.DataFrame([(o, k, round(u, 3), p) for o, k, u, p in rows], columns=["op", "type", "us", "prev_us"])


def _work(graph: ExecutionGraph, op_id: int, classes: dict, times: dict) -> tuple[float | None, int]:
    """(inclusive µs of the outermost modeled-work ops under op_id, or None if there is none;
    number of recorded events outside them, op_id itself included)."""
    if classes[op_id][0] in WORK:
        return times[op_id]["dur"], 0
    total, events, found = 0.0, 1, False
    for c in graph.op(op_id).children:
        w, e = _work(graph, c, classes, times)
        events += e
        if w is not None:
            total, found = total + w, True
    return (total if found else None), events


def gpu_overheads(info: dict, profiler_overhead_us: float = 0.0) -> pd.DataFrame:
    """Rows (op, type, us) for a CUDA capture: T1–T5 from its launches."""
    return extract_overheads(info["trace"], profiler_overhead_us)


def measure_profiler_overhead(n_ops: int = 2000, repeats: int = 5) -> float:
    """The profiler's cost per recorded CPU op (µs): a loop of cheap ops timed with and without
    torch.profiler (record_shapes on, as capture() runs it); the median over repeats."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pipeline.workloads.capture import quiet_kineto_on_cpu

    quiet_kineto_on_cpu()
    x = torch.zeros(4)

    def loop():
        for _ in range(n_ops):
            x.view(-1)

    loop()
    costs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        loop()
        plain = time.perf_counter_ns() - t0
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            t0 = time.perf_counter_ns()
            loop()
            profiled = time.perf_counter_ns() - t0
        costs.append(max(profiled - plain, 0) / 1e3 / n_ops)
    return float(sorted(costs)[len(costs) // 2])
