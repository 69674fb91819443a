"""Re-price a captured execution graph's kernels with devchar's models (no torch here).

Each op's kernel (its self time, see capture.py) gets one of five fates, recorded per op:
  priced     a GEMM or utility model predicts it from the op's input shapes;
  free       the op launches no work (views, metadata, allocation) or touches no element;
  delegated  a composite op whose work is done, and priced, by a descendant
             (aten::linear -> aten::addmm, aten::layer_norm -> aten::native_layer_norm,
             aten::clone -> aten::copy_), so the work is not counted twice;
  kept       unmapped (or no calibration for it), measured time kept: keep_unmapped=True;
  dropped    unmapped, priced 0: the default.
Free and delegated ops lose their kernel (0 µs, and nothing for Algorithm 1 to launch).
Predicted times of priced ops come only from the models, never from the measured times, so
a graph captured on one device predicts another; measured times feed only `coverage`.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from pipeline.errors import MissingModelError
from pipeline.predict.graph import ExecutionGraph

# aten GEMMs -> devchar GEMM op. addmm is mm plus a bias the CPU copies into the output
# first (its aten::copy_ child, priced as copy). matmul/linear nest the real GEMM; they
# are priced here only if ever seen as leaves.
GEMM = {"aten::mm": "mm", "aten::addmm": "mm", "aten::bmm": "bmm", "aten::baddbmm": "bmm",
        "aten::matmul": "matmul", "aten::linear": "linear"}
_ELEMENTWISE = {"relu": ("relu", "relu_", "clamp_min", "clamp_min_"),  # CPU relu runs as clamp_min
                "gelu": ("gelu", "gelu_"), "silu": ("silu", "silu_"),
                "add": ("add", "add_", "sub", "sub_", "rsub"), "mul": ("mul", "mul_", "div", "div_"),
                "copy": ("copy_", "clone", "_to_copy"), "dropout": ("native_dropout",)}
_ROWWISE = {"softmax": ("softmax", "_softmax"), "layernorm": ("layer_norm", "native_layer_norm"),
            "rmsnorm": ("rms_norm", "_fused_rms_norm")}
UTILITY = {f"aten::{a}": op for op, names in {**_ELEMENTWISE, **_ROWWISE}.items() for a in names}
UTILITY.update({"aten::embedding": "embedding", "aten::index_select": "embedding"})
# Element-wise ops with no calibration of their own, priced by the calibrated op that moves
# the same bytes (these ops are memory-bound): unary transcendental -> silu, other unary ->
# relu, compare/select -> add. Listed apart so a report can tell proxies from exact matches.
PROXY = {f"aten::{a}": op for op, names in {
    "silu": ("tanh", "tanh_", "exp", "sigmoid", "log", "rsqrt", "sqrt", "erf"),
    "relu": ("neg", "abs", "pow", "reciprocal", "square"),
    "add": ("where", "masked_fill", "masked_fill_", "eq", "ne", "lt", "le", "gt", "ge")}.items() for a in names}
UTILITY.update(PROXY)
# Ops that move no data themselves. aten::dropout is here because in eval it returns its
# input, and in training its work is its aten::native_dropout child; aten::contiguous and
# aten::to likewise either return the input or do their work in a clone/_to_copy child.
FREE = {f"aten::{a}" for a in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "view_as", "transpose", "t", "permute", "expand",
    "expand_as", "as_strided", "detach", "detach_", "alias", "empty", "empty_like", "empty_strided", "resize_",
    "unsqueeze", "squeeze", "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "flatten", "unflatten", "contiguous", "dropout", "to", "type_as", "lift_fresh", "resolve_conj",
    "resolve_neg", "result_type", "size", "stride", "numel", "dim")}
STATUSES = ("priced", "free", "delegated", "kept", "dropped")


def _numel(shape) -> int:
    return math.prod(shape)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    """numpy broadcasting of the tensor inputs: the output shape of an element-wise op."""
    n = max((len(s) for s in shapes), default=0)
    padded = [[1] * (n - len(s)) + list(s) for s in shapes]
    return [max((d for d in col if d != 1), default=1) for col in zip(*padded)]


def gemm_dims(name: str, shapes: list) -> tuple[str, int, int, int, int] | None:
    """(model op, m, n, k, batch) from an aten GEMM's input shapes; None if they do not fit."""
    t = [s for s in shapes if s is not None]
    if name in ("aten::addmm", "aten::baddbmm"):
        t = t[1:]  # drop the bias / accumulator input
    if len(t) < 2:
        return None
    a, b = t[0], t[1]
    if name == "aten::linear":  # x[..., k] @ W[n, k]^T: every leading dim of x is a row
        return ("linear", _numel(a[:-1]), b[0], a[-1], 1) if a and len(b) == 2 else None
    if len(a) == 2 and len(b) == 2:
        return ("mm", a[0], b[1], a[1], 1)
    if len(a) >= 3 and len(b) >= 2 and name in ("aten::bmm", "aten::baddbmm", "aten::matmul"):
        return ("bmm", a[-2], b[-1], a[-1], _numel(_broadcast([a[:-2], b[:-2]])))
    return None


def utility_dims(name: str, shapes: list) -> tuple[int, int] | None:
    """(rows, cols) of a utility op: cols is the last dim of the tensor it sweeps."""
    t = [s for s in shapes if s is not None]
    if not t:
        return None
    if name in ("aten::embedding", "aten::index_select"):  # (table, ids) / (table, index)
        table, idx = t[0], t[-1]
        return (_numel(idx), _numel(table[1:])) if len(t) >= 2 and table else None
    if UTILITY[name] in _ROWWISE:
        s = t[0]  # reduce over the last dim (softmax dim=-1, layer norm over the hidden size)
    else:
        s = _broadcast(t)
    if not s:
        return 1, 1  # a 0-d tensor: one element
    return _numel(s[:-1]), s[-1]


def _family(name: str) -> str | None:
    return "gemm" if name in GEMM else UTILITY.get(name)


def _descendant_work(graph: ExecutionGraph) -> dict[int, set[str]]:
    """Op id -> families ("gemm" or a utility op) of the mapped ops anywhere below it."""
    below: dict[int, set[str]] = defaultdict(set)
    for op in reversed(graph.ops):  # children come after parents: fold bottom-up
        kind = _family(op.name)
        if op.parent is not None:
            below[op.parent] |= below[op.id] | ({kind} if kind else set())
    return below


def price_graph(graph: ExecutionGraph, shapes: dict, gemm_model, utility_model, dtype: str,
                *, keep_unmapped: bool = False) -> tuple[ExecutionGraph, dict]:
    """Re-priced graph and coverage (see module doc). `shapes`: op id -> input shapes."""
    below = _descendant_work(graph)
    new: dict[int, float] = {}
    records = []
    for op in graph.ops:
        status, model_op, dims, why, new[op.id] = _price_one(op.name, shapes.get(op.id), below[op.id], gemm_model,
                                                             utility_model, dtype)
        if status == "unmapped":
            status = "kept" if keep_unmapped else "dropped"
            new[op.id] = sum(k.time_us for k in op.kernels) if keep_unmapped else 0.0
        records.append({"id": op.id, "name": op.name, "status": status, "model_op": model_op, "dims": dims,
                        "why": why, "measured_us": sum(k.time_us for k in op.kernels), "predicted_us": new[op.id]})

    # Ops that do no work of their own launch nothing on any device: no kernel, so Algorithm 1
    # charges them no launch overhead (T2-T4). A dropped op keeps a 0 µs kernel: it does launch.
    status = {r["id"]: r["status"] for r in records}
    ops = [replace(op, kernels=()) if status[op.id] in ("free", "delegated") else
           replace(op, kernels=tuple(replace(k, time_us=new[op.id] / len(op.kernels)) for k in op.kernels))
           for op in graph.ops]  # one kernel per captured op; split evenly if a graph has more
    return ExecutionGraph(ops), _coverage(records)


def _price_one(name, shp, below, gemm_model, utility_model, dtype):
    """(status, model op, dims, reason, predicted µs): from the name and shapes alone, so a
    mapped op's measured time cannot leak into its prediction."""
    if name in FREE:
        return "free", None, None, "no work of its own", 0.0
    # Delegated only to the same family: aten::mul's child copy_ (a 0-d scalar converted to the
    # tensor's dtype) or addmm's bias copy_ is extra work, not the op's own.
    if _family(name) in below:
        return "delegated", None, None, "priced at a descendant", 0.0
    if name not in GEMM and name not in UTILITY:
        return "unmapped", None, None, "no mapping", 0.0
    if shp is None:
        return "unmapped", None, None, "no shapes recorded", 0.0
    if name in GEMM:
        g = gemm_dims(name, shp)
        model_op, dims = (g[0], g[1:]) if g else (None, None)
    else:
        model_op, dims = UTILITY[name], utility_dims(name, shp)
    if dims is None:
        return "unmapped", None, None, f"shapes {shp} do not fit", 0.0
    if 0 in dims:
        return "free", model_op, dims, "zero-size", 0.0
    try:
        model = gemm_model.predict if name in GEMM else utility_model.predict
        predicted = float(model(model_op, dtype, *dims))
    except MissingModelError:
        return "unmapped", model_op, dims, f"no calibration for {model_op}/{dtype}", 0.0
    return "priced", model_op, dims, "", predicted


def _coverage(records: list[dict]) -> dict:
    """Shares of measured time by fate, and the unmapped ops by name."""
    total = sum(r["measured_us"] for r in records)
    by = {s: sum(r["measured_us"] for r in records if r["status"] == s) for s in STATUSES}
    unmapped: dict[str, dict] = {}
    for r in records:
        if r["status"] in ("kept", "dropped"):
            u = unmapped.setdefault(r["name"], {"count": 0, "measured_us": 0.0, "why": r["why"]})
            u["count"] += 1
            u["measured_us"] += r["measured_us"]
    return {"measured_us": total, "predicted_us": sum(r["predicted_us"] for r in records),
            **{f"{s}_us": v for s, v in by.items()},
            **{f"{s}_share": (v / total if total else 0.0) for s, v in by.items()},
            "unmapped": dict(sorted(unmapped.items(), key=lambda kv: -kv[1]["measured_us"])),
            "ops": records}
