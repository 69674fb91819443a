"""Traces of every profiled workload: one capture each (workloads/capture.py) gives two tables.

- `workload_graphs`: the execution graph with each op's input shapes and scalar arguments,
  as JSON, so a graph captured once is re-priced for any device and transformed (what-if)
  without running it again.
- `overhead_samples`: the host overheads T1–T5 of that trace (host_time.py), profiler cost
  per event measured here and subtracted.
Each capture's times come from an observer-free profiled call (capture's separate_timing), on
the CPU the last of three under one profiler: the first runs cold (capture.TIMING_WARM_CALLS).

On a CPU the list is captured `profile.workload_passes` times, a whole pass apart, and each
workload keeps the capture whose step spanned the least time (`span_ms`, first op's start to
last op's end), as its timed runs keep their quicker pass: one traced step is all its overhead
samples come from, and a slow spell inflates every gap of it. On the model-85 Xeon VM
(2026-11-27 15:30), three captures of each quick workload: GPT-2 2l-256 batch 1 spanned 23.9,
91.6 and 23.6 ms, its T1 gaps summing to 1.72, 3.49 and 1.71 ms; 1l-128 batch 8 131.6, 275.3
and 134.0 ms (T1 1.30, 2.68, 1.51 ms); most others within a few percent.

A CPU capture also keeps the spell probes' readings around it (`probe_us`, `host_probe_us`;
harness/spells.py): the host probe reads how fast the host ran ops while the overheads were
traced, which the summary sets against its readings around the workload runs. A workload whose
kept capture read either probe 1.2x over its usual time (the lower quartile of the readings
around every capture, or the calibration's where lower: spells.anchored_usual) is captured once
more after both read usual again, at most the profile's `stall_wait_s` of waiting in all, as the
workload steps are timed again.
"""
from __future__ import annotations

import json
import math

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.harness.spells import again_when_usual, pair_in_spell, read_both_around, sweep_usual
from pipeline.sweeps.profiles import Profile
from pipeline.sweeps.catalog import workload_entries


def sweep_traces(dev: DeviceIdentity, profile: Profile, log=None, dtype: str = "float32",
                 calibration_usual: tuple[float | None, float | None] | None = None) -> dict[str, list[dict]]:
    """Every workload captured; `calibration_usual` as in workload_runs.sweep_workloads."""
    from pipeline.workloads.host_time import measure_profiler_overhead

    todo = workload_entries(profile)
    passes = max(profile.workload_passes, 1) if dev.kind == "cpu" else 1
    ovh = measure_profiler_overhead()
    prog = Progress("traces", len(todo) * passes, log)
    prog.log(f"[traces] profiler overhead {ovh:.2f} us per recorded op, subtracted from every gap")
    kept: dict[int, tuple[dict, list[dict]]] = {}  # entry -> (graph row, sample rows) of its quickest capture
    spans: dict[int, list[float]] = {i: [] for i in range(len(todo))}
    readings: list[tuple[float, float]] = []  # (GEMM probe, host probe) around every capture (CPU)

    def take(i: int, what: str) -> None:
        e = todo[i]
        graph_row, rows = _capture(e, dev, profile, ovh, dtype)
        readings.append((graph_row.get("probe_us", math.nan), graph_row.get("host_probe_us", math.nan)))
        spans[i].append(graph_row["span_ms"])
        if i not in kept or graph_row["span_ms"] < kept[i][0]["span_ms"]:
            kept[i] = graph_row, rows
        prog.step(f"{e.workload} {e.config} b={e.batch} s={e.seq}: {graph_row['n_ops']} ops, {len(rows)} "
                  f"overheads, {graph_row['span_ms']:.1f} ms{what}")

    for p in range(passes):
        for i in range(len(todo)):
            take(i, f" (pass {p + 1}/{passes})" if passes > 1 else "")
    # a kept capture a probe says ran in a slow spell (harness/spells.py) is taken once more once
    # both probes read their usual times, as the workload runs are timed again: its gaps are
    # what every other workload's shared overheads are fitted on
    usual, anchored = sweep_usual(readings, passes, calibration_usual)
    if anchored:
        prog.log(f"[traces] {anchored}")
    again = [i for i in range(len(todo)) if pair_in_spell(kept[i][0].get("probe_us"), kept[i][0].get("host_probe_us"),
                                                         usual)]
    prog.total += len(again)
    waited, left = again_when_usual(again, usual, profile.stall_wait_s,
                                    lambda i: take(i, " (ran in a slow spell of a probe: captured again)"), set(again))
    prog.total -= left  # left as they were: never stepped
    if again:
        prog.log(f"[traces] {len(again)} captures ran in a slow spell of a probe: {len(again) - left} taken once more "
                 f"after {waited:.0f} s waiting for the probes' usual times" +
                 (f", {left} left as they were when the wait ran out in the spell" if left else ""))
    graphs = [{**kept[i][0], "passes": len(spans[i]), "pass_spread": max(spans[i]) / min(spans[i]) - 1.0}
              for i in range(len(todo))]
    if passes > 1:
        spread = sorted(g["pass_spread"] for g in graphs)
        prog.log(f"[traces] {passes} or more captures of each workload, the quickest kept: their spans differed by "
                 f"{spread[len(spread) // 2]:.1%} (median), at most {spread[-1]:.1%}")
    return {"workload_graphs": graphs, "overhead_samples": [r for i in range(len(todo)) for r in kept[i][1]]}


def _capture(e, dev: DeviceIdentity, profile: Profile, ovh: float, dtype: str) -> tuple[dict, list[dict]]:
    """One capture of a workload entry: its workload_graphs row and its overhead_samples rows."""
    from pipeline.workloads.capture import capture
    from pipeline.workloads.host_time import cpu_overheads, gpu_overheads
    from pipeline.predict.price_recsys import RecsysOps

    step = e.build(dev.torch_device, dtype)
    probes = {}
    if dev.kind == "cpu":
        (graph, info), probes["probe_us"], probes["host_probe_us"] = read_both_around(
            lambda: capture(step, warmup=profile.trace_warmup, separate_timing=True))
    else:
        graph, info = capture(step, warmup=profile.trace_warmup, separate_timing=True)
    key = {"workload": e.workload, "config": e.config, "batch": e.batch, "seq": e.seq, "mode": e.mode,
           "dtype": dtype}
    rows = cpu_overheads(graph, info, RecsysOps(), ovh) if dev.kind == "cpu" else gpu_overheads(info, ovh)
    samples = [{**key, "op": r.op, "type": r.type, "us": float(r.us), "profiler_overhead_us": ovh,
                "prev_us": _float_or_none(getattr(r, "prev_us", None))} for r in rows.itertuples()]
    top = graph.top_level()
    times = [info["times"][op.id] for op in top]
    row = {**key, "n_ops": len(graph), "n_top_level": len(top),
           "traced_ms": sum(t["dur"] for t in times) / 1e3,
           "span_ms": (max(t["ts"] + t["dur"] for t in times) - min(t["ts"] for t in times)) / 1e3,
           "capture_source": info["source"], "times_source": info["times_source"],
           "graph_json": json.dumps({"graph": graph.to_dict(), "shapes": info["shapes"],
                                     "scalars": info.get("scalars", {}), "strides": info.get("strides", {}),
                                     "returned_bytes": info.get("returned_bytes", [])}),
           **{k: v for k, v in probes.items() if math.isfinite(v)}}
    return row, samples


def _float_or_none(v) -> float | None:
    """A T1 row's previous-op duration; None elsewhere (and on GPU captures, which have none)."""
    return None if v is None or v != v else float(v)
