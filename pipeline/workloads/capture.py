"""Capture any PyTorch callable's execution graph on the CPU (DLRM paper §III-D).

The paper builds its graph from two records of one iteration: PyTorch's execution-trace
observer (ops, their tensors and data dependencies) and a profiler trace (timing). We do the
same: `capture(fn)` runs `fn` under `torch.profiler.profile(record_shapes=True)` with an
`ExecutionTraceObserver` attached, and joins the two on the record-function id that both
carry ("Record function id" in the Chrome trace, attr `rf_id` in the execution trace).

What becomes what:
- one `Op` per `cpu_op` event of the Chrome trace, ids in program order;
- parent/child from the event intervals on each thread (the profiler's nesting);
- deps from tensor ids: an op depends on the op that last *finished* writing one of its
  inputs before it started (the outermost such op, so top-level ops depend on top-level ops);
- one `Kernel` per op whose time is the op's *self* CPU time. On the CPU nothing is launched:
  the work runs inline. Not only leaves get one: on torch 2.13 CPU `aten::addmm` nests
  expand/copy_/resolve_conj, so "kernels on leaves only" would drop every GEMM. Self time
  keeps the sum of an op's kernels equal to its measured duration.

Shapes do not fit in `Op`, so they live in side tables keyed by op id:
`info["shapes"]` (per input: a list of dims for a tensor, None for anything else),
`info["dtypes"]`, `info["strides"]` (the execution trace's, per input), `info["times"]` (ts, dur, self_us). If the observer is missing or fails,
shapes come from the profiler's "Input Dims", deps are left empty and `info["notes"]` says so.
The observer slows every op while it is timed; `separate_timing=True` takes times from an
observer-free profiled call instead, on a CPU-only host the last of TIMING_WARM_CALLS + 1 (see
capture()).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Callable

from pipeline.core.graph import ExecutionGraph, Kernel, Op

_EPS_US = 1e-3  # Chrome-trace times are µs with ns digits: tolerate rounding in containment
# Calls of the step the CPU timing run makes under the profiler before the one it keeps. The
# first profiled call runs cold: after the observer's run has serialized every op, and while the
# profiler fills its first buffers. On the Zen 5 EPYC VM (2026-11-30), five captures each of
# three DLRM steps at batch 32: the first profiled call spanned 2.87-3.28 ms (ddp), 5.04-5.45
# (mlperf) and 5.32-5.74 (default), the third 1.82-2.33, 3.86-4.31 and 3.58-4.85; their summed
# T1 gaps 0.61-0.72 -> 0.36-0.59 ms (ddp). The steps the traces are scored against (workload_runs)
# are medians of warm steps.
TIMING_WARM_CALLS = 2
_TIMED_MARK = "devchar::timed_call"
# Profiler / execution-trace dtype spellings -> devchar / torch names.
_DTYPES = {"float": "float32", "double": "float64", "c10::BFloat16": "bfloat16", "c10::Half": "float16",
           "long int": "int64", "int": "int32", "bool": "bool", "unsigned char": "uint8", "signed char": "int8",
           "short int": "int16", "c10::complex<float>": "complex64"}


def capture(fn: Callable[[], Any], *, warmup: int = 2, execution_trace: bool = True,
            separate_timing: bool = False) -> tuple[ExecutionGraph, dict]:
    """Run `fn` `warmup` times, then once profiled with the observer; return (graph, info).

    info: trace (the Chrome trace dict, for extract_overheads), shapes, dtypes, times,
    source ("execution_trace" or "profiler"), times_source, deps_source, notes,
    et_parent_mismatches. The observer serializes every op's arguments while the op is timed
    (~7 µs per op on torch 2.13 CPU, against ~0.5 µs for a view without it), so
    `separate_timing=True` profiles one more call without the observer and takes times (and
    the returned trace) from it when it ran the same ops in the same nesting. On the CPU that
    call is the last of TIMING_WARM_CALLS + 1 under one profiler, so it is timed warm, as the
    measured steps are.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
    out = None
    for _ in range(warmup):  # first calls pay allocation, lazy init, oneDNN primitive creation
        out = None  # dropped before the next call, as a loop of steps drops it: one output alive at a time
        out = fn()
    # what a loop of steps frees after each one (harness/free_cost.py); unknown without a warm-up
    returned = returned_bytes(out) if warmup else []
    del out
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="devchar-capture-") as tmp:
        et_path = os.path.join(tmp, "et.json")
        et = _observer(et_path, notes) if execution_trace else None
        try:
            trace = _profile(fn, tmp, et)
        except Exception as e:  # the observer, not fn, may be what failed: retry without it
            if et is None:
                raise
            notes.append(f"profiling with the execution-trace observer failed ({e!r}); ran again without it")
            _unregister(et)
            et = None
            trace = _profile(fn, tmp, None)
        et_nodes = _read_et(et, et_path, notes) if et is not None else None
        timing = None
        if separate_timing and et_nodes is not None:
            try:
                timing = _profile(fn, tmp, None, TIMING_WARM_CALLS)
            except MarkError as e:  # the observer's run still times every op
                notes.append(f"the timing run's trace was unusable ({e}): times from the execution-trace run")
    if not execution_trace:
        notes.append("execution trace not requested: shapes from the profiler, no data dependencies")
    graph, info = _build(trace, et_nodes, timing, notes)
    info.update(trace=timing if info["times_source"] == "timing run" else trace, notes=notes, returned_bytes=returned)
    return graph, info


def returned_bytes(out) -> list[int]:
    """Bytes of each storage a step returns (a tensor, or one inside a tuple, list, dict or a
    Hugging Face ModelOutput; views of one storage count once), the largest first. Other
    containers (a DynamicCache) are not looked into."""
    import torch

    found, seen, todo = [], set(), [out]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                found.append(storage.nbytes())
        elif isinstance(x, dict):  # ModelOutput is an OrderedDict
            todo.extend(x.values())
        elif isinstance(x, (tuple, list)):
            todo.extend(x)
    return sorted(found, reverse=True)


# Kineto's severity above its USDT level (5) and ERROR (4): torch 2.13 prints two
# "USDT:... profiler_start/stop" lines on stderr per profiled call, 94 in one `make run`.
KINETO_QUIET = "6"


def quiet_kineto_on_cpu() -> None:
    """Silence kineto's per-trace stderr lines where no GPU is profiled; read once, at the
    process's first profiler start. On a GPU machine its errors are CUPTI's, which matter,
    so nothing changes there; a KINETO_LOG_LEVEL the user set is kept."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


def _profile(fn, tmp: str, et, warm_calls: int = 0) -> dict:
    """A profiled call of fn; its Chrome trace as a dict. With `warm_calls` (CPU only), fn runs
    that many times more first, under the same profiler, and the trace keeps only the events of
    the last call. Where CUDA is available (a GPU host, even for a CPU-only workload) one call,
    as before: the warm calls' kernels would run on into the kept call's window, and nothing
    was measured there."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    quiet_kineto_on_cpu()

    # CUDA activity too where a GPU is present: its kernels and launches are what T2-T5 and
    # the graph's kernels come from. (A CPU-only workload on a GPU machine just has none.)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    warm_calls = warm_calls if len(activities) == 1 else 0
    with profile(activities=activities, record_shapes=True, execution_trace_observer=et) as prof:
        for _ in range(warm_calls):
            fn()  # its output dropped at once, as a loop of steps drops it
        with record_function(_TIMED_MARK) if warm_calls else contextlib.nullcontext():
            fn()
        if len(activities) > 1:
            torch.cuda.synchronize()  # the step's kernels finish inside the trace
    path = os.path.join(tmp, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    return _only_marked_call(trace) if warm_calls else trace


class MarkError(RuntimeError):
    """The timing run's trace does not fence its kept call with exactly one mark."""


def _only_marked_call(trace: dict) -> dict:
    """The trace without the events that started before the kept call's mark (the warm calls')
    and without the mark itself, which is not an op."""
    marks = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("name") == _TIMED_MARK]
    if len(marks) != 1:
        raise MarkError(f"{len(marks)} marks of its kept call, not 1")
    start = marks[0]["ts"]
    kept = [e for e in trace["traceEvents"] if e is not marks[0] and not (e.get("ph") == "X" and e["ts"] < start)]
    return {**trace, "traceEvents": kept}


def _observer(path: str, notes: list[str]):
    try:
        from torch.profiler import ExecutionTraceObserver

        return ExecutionTraceObserver().register_callback(path)
    except Exception as e:  # absent in old torch builds; registration can fail on odd platforms
        notes.append(f"ExecutionTraceObserver unavailable ({e!r}): shapes from the profiler, no data dependencies")
        return None


def _unregister(et) -> None:
    try:
        et.unregister_callback()
    except Exception:
        pass  # best effort: a broken observer must not hide the capture


def _read_et(et, path: str, notes: list[str]) -> dict[int, dict] | None:
    """Execution-trace nodes by rf_id, or None (with a note) when the file is missing or bad."""
    _unregister(et)
    try:
        with open(et.get_output_file_path() or path) as f:
            nodes = json.load(f)["nodes"]
        out = {}
        for n in nodes:
            attrs = {a["name"]: a["value"] for a in n.get("attrs", ())}
            if attrs.get("rf_id"):  # 0 marks the observer's own process/thread root nodes
                out[int(attrs["rf_id"])] = n
        if not out:
            raise ValueError("no op nodes")
        return out
    except Exception as e:
        notes.append(f"execution trace unreadable ({e!r}): shapes from the profiler, no data dependencies")
        return None


def _dtype(s: str) -> str | None:
    s = s[len("Tensor("):-1] if s.startswith("Tensor(") else s
    return _DTYPES.get(s, s or None)


def _et_inputs(node: dict):
    """(shapes, dtypes, tensor ids, scalars, strides) of an execution-trace node's inputs.

    A tensor's shape is a list of ints; a tensor list's (cat, stack) a list of such shapes,
    its dtype the first element's. `scalars` keeps Int/Double/Bool argument values (None
    elsewhere): index_select's dim and embedding_bag_backward's num_weights live only there.
    `strides` holds a tensor's strides (None elsewhere): whether a copy transposes, gathers
    rows or broadcasts is in them (price.copy_layout).
    """
    ins = node.get("inputs", {})
    shapes, dtypes, ids, scalars = [], [], [], []
    for v, s, t in zip(ins.get("values", ()), ins.get("shapes", ()), ins.get("types", ())):
        tensor = t.startswith("Tensor(")
        tensors = t.startswith("GenericList[Tensor(") and isinstance(s, list) and all(isinstance(x, list) for x in s)
        if tensors:
            shapes.append([[int(d) for d in x] for x in s])
            dtypes.append(_dtype(t[len("GenericList["):].split(",")[0].rstrip("]")))
        else:
            shapes.append([int(d) for d in s] if tensor else None)
            dtypes.append(_dtype(t) if tensor else None)
        ids.append(int(v[0]) if tensor and isinstance(v, list) and v else None)
        scalars.append(v if t in ("Int", "Double", "Bool") and isinstance(v, (int, float)) else None)
    strides = [[int(x) for x in st] if t.startswith("Tensor(") and isinstance(st, list)
               and all(isinstance(x, int) for x in st) else None
               for st, t in zip(ins.get("strides", ()), ins.get("types", ()))]
    return shapes, dtypes, ids, scalars, strides


def _et_outputs(node: dict) -> list[int]:
    outs = node.get("outputs", {})
    return [int(v[0]) for v, t in zip(outs.get("values", ()), outs.get("types", ()))
            if t.startswith("Tensor(") and isinstance(v, list) and v]


def _trace_inputs(args: dict):
    """Profiler fallback: "Input Dims" / "Input type"; scalars and lists -> None."""
    dims, types = args.get("Input Dims", []), args.get("Input type", [])
    shapes, dtypes = [], []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else ""
        tensor = t not in ("", "Scalar", "ScalarList", "TensorList", "GenericList") and isinstance(d, list) \
            and all(isinstance(x, int) for x in d)
        shapes.append(list(d) if tensor else None)
        dtypes.append(_dtype(t) if tensor else None)
    return shapes, dtypes


def _nest(trace: dict) -> tuple[list[dict], list[int | None], list[float]]:
    """cpu_op events in program order, each one's parent index (intervals, per thread) and self µs."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    events.sort(key=lambda e: (e["ts"], -e["dur"]))  # program order, parents before children
    parent: list[int | None] = [None] * len(events)
    child_us = [0.0] * len(events)
    stacks: dict[tuple, list[int]] = {}
    for i, e in enumerate(events):
        st = stacks.setdefault((e.get("pid"), e.get("tid")), [])
        while st and not _contains(events[st[-1]], e):
            st.pop()
        if st:
            parent[i] = st[-1]
            child_us[st[-1]] += e["dur"]
        st.append(i)
    return events, parent, [max(e["dur"] - c, 0.0) for e, c in zip(events, child_us)]


def _build(trace: dict, et_nodes: dict[int, dict] | None, timing: dict | None,
           notes: list[str]) -> tuple[ExecutionGraph, dict]:
    events, parent, self_us = _nest(trace)
    timed, times_source = events, "profiled run"
    if timing is not None:
        t_events, t_parent, t_self = _nest(timing)
        if [e["name"] for e in t_events] == [e["name"] for e in events] and t_parent == parent:
            timed, self_us, times_source = t_events, t_self, "timing run"
        else:
            notes.append("the timing run ran other ops than the execution-trace run: times from the latter")
    shapes, dtypes, scalars, strides, times, in_ids, out_ids = {}, {}, {}, {}, {}, {}, {}
    op_of_rf = {e["args"]["Record function id"]: i for i, e in enumerate(events)
                if e.get("args", {}).get("Record function id") is not None}
    rf_of_node = {n["id"]: rf for rf, n in (et_nodes or {}).items()}
    mismatches = 0
    for i, e in enumerate(events):
        args = e.get("args", {})
        node = (et_nodes or {}).get(args.get("Record function id"))
        if node is not None and node.get("name") == e["name"]:
            shapes[i], dtypes[i], in_ids[i], scalars[i], strides[i] = _et_inputs(node)
            out_ids[i] = _et_outputs(node)
            # Cross-check the interval nesting against the observer's own call tree (ctrl_deps).
            mismatches += op_of_rf.get(rf_of_node.get(node.get("ctrl_deps"))) != parent[i]
        else:
            shapes[i], dtypes[i] = _trace_inputs(args)
        times[i] = {"ts": timed[i]["ts"], "dur": timed[i]["dur"], "self_us": self_us[i]}

    deps = _data_deps(events, in_ids, out_ids)
    device = _device_kernels(trace, events)
    if device is not None:  # a GPU trace: each op owns the kernels its own launches issued
        notes.append("kernels from the device's trace events, attributed to the op whose launch issued them")
    ops = [Op(i, e["name"], parent=parent[i], deps=deps.get(i, ()),
              kernels=device.get(i, []) if device is not None else
              [Kernel(e["name"], round(times[i]["self_us"], 3), launch="inline")])
           for i, e in enumerate(events)]
    used_et = bool(in_ids)
    info = {"shapes": shapes, "dtypes": dtypes, "scalars": scalars, "strides": strides, "times": times,
            "times_source": times_source,
            "source": "execution_trace" if used_et else "profiler",
            "deps_source": "execution_trace tensor ids" if used_et else "none",
            "et_matched": len(in_ids), "et_parent_mismatches": mismatches if used_et else None}
    return ExecutionGraph(ops), info


_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _device_kernels(trace: dict, events: list[dict]) -> dict[int, list[Kernel]] | None:
    """Op index -> the device executions it launched (kernels, memcpys, memsets), matched by the
    profiler's correlation id to a runtime call and charged to the innermost op around that
    call; None when the trace has no device activity (the CPU: each op's work is inline)."""
    raw = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    device = [e for e in raw if e.get("cat") in _DEVICE_CATS]
    if not device:
        return None
    launches = {e.get("args", {}).get("correlation"): e for e in raw
                if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    out: dict[int, list[Kernel]] = {}
    for k in sorted(device, key=lambda e: e["ts"]):
        call = launches.get(k.get("args", {}).get("correlation"))
        if call is None:
            continue
        owner = None
        for i, e in enumerate(events):  # the innermost (latest-starting) op containing the call
            if (e.get("pid"), e.get("tid")) == (call.get("pid"), call.get("tid")) and _contains(e, call) \
                    and e["ts"] <= call["ts"]:
                owner = i
        if owner is not None:
            out.setdefault(owner, []).append(Kernel(k["name"], round(float(k["dur"]), 3),
                                                    stream=int(k.get("args", {}).get("stream", 0) or 0),
                                                    launch=call["name"]))
    return out


def _contains(outer: dict, e: dict) -> bool:
    """e (starting no earlier than outer) runs inside outer; an event starting exactly where
    outer ends is its successor, not its child."""
    end = outer["ts"] + outer["dur"]
    return e["ts"] + e["dur"] <= end + _EPS_US and (e["ts"] < end or e["ts"] == outer["ts"])


def _data_deps(events, in_ids, out_ids) -> dict[int, tuple[int, ...]]:
    """Op -> ops that last finished writing one of its input tensors before it started."""
    by_end = sorted(out_ids, key=lambda i: events[i]["ts"] + events[i]["dur"])
    writer: dict[int, int] = {}
    j, deps = 0, {}
    for i in sorted(in_ids, key=lambda i: events[i]["ts"]):
        start = events[i]["ts"]
        while j < len(by_end) and events[by_end[j]]["ts"] + events[by_end[j]]["dur"] <= start:
            for t in out_ids[by_end[j]]:  # later ends overwrite: the outermost finished writer wins
                writer[t] = by_end[j]
            j += 1
        found = [writer[t] for t in in_ids[i] if t is not None and t in writer]
        if found:
            deps[i] = tuple(dict.fromkeys(found))
    return deps
