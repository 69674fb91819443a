"""Traces of every profiled workload: one capture each (workloads/capture.py) gives two tables.

- `workload_graphs`: the execution graph with each op's input shapes and scalar arguments,
  as JSON, so a graph captured once is re-priced for any device and transformed (what-if)
  without running it again.
- `overhead_samples`: the host overheads T1–T5 of that trace (host_time.py), profiler cost
  per event measured here and subtracted.
Each capture's times come from an observer-free profiled call (capture's separate_timing).
"""
from __future__ import annotations

import json

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.sweeps.profiles import Profile
from pipeline.sweeps.catalog import workload_entries


def sweep_traces(dev: DeviceIdentity, profile: Profile, log=None, dtype: str = "float32") -> dict[str, list[dict]]:
    from pipeline.workloads.capture import capture
    from pipeline.workloads.host_time import cpu_overheads, gpu_overheads, measure_profiler_overhead
    from pipeline.predict.price_recsys import RecsysOps

    todo = workload_entries(profile)
    ovh = measure_profiler_overhead()
    prog = Progress("traces", len(todo), log)
    prog.log(f"[traces] profiler overhead {ovh:.2f} us per recorded op, subtracted from every gap")
    graphs, samples = [], []
    for e in todo:
        step = e.build(dev.torch_device, dtype)
        graph, info = capture(step, warmup=profile.trace_warmup, separate_timing=True)
        key = {"workload": e.workload, "config": e.config, "batch": e.batch, "seq": e.seq, "mode": e.mode,
               "dtype": dtype}
        if dev.kind == "cpu":
            rows = cpu_overheads(graph, info, RecsysOps(), ovh)
        else:
            rows = gpu_overheads(info, ovh)
        samples += [{**key, "op": r.op, "type": r.type, "us": float(r.us), "profiler_overhead_us": ovh,
                     "prev_us": _float_or_none(getattr(r, "prev_us", None))} for r in rows.itertuples()]
        top = graph.top_level()
        graphs.append({**key, "n_ops": len(graph), "n_top_level": len(top),
                       "traced_ms": sum(info["times"][op.id]["dur"] for op in top) / 1e3,
                       "capture_source": info["source"], "times_source": info["times_source"],
                       "graph_json": json.dumps({"graph": graph.to_dict(), "shapes": info["shapes"],
                                                 "scalars": info.get("scalars", {}),
                                                 "strides": info.get("strides", {}),
                                                 "returned_bytes": info.get("returned_bytes", [])})})
        prog.step(f"{e.workload} {e.config} b={e.batch} s={e.seq}: {len(graph)} ops, {len(rows)} overheads")
    return {"workload_graphs": graphs, "overhead_samples": samples}


def _float_or_none(v) -> float | None:
    """A T1 row's previous-op duration; None elsewhere (and on GPU captures, which have none)."""
    return None if v is None or v != v else float(v)
