"""Re-price a captured execution graph's kernels with devchar's models (no torch here).

Each op's kernel (its self time, see capture.py) gets one of six fates, recorded per op:
  priced     a GEMM or utility model (or an ExtraOps mapping) predicts it from its input shapes;
  free       the op launches no work (views, metadata, allocation) or touches no element;
  delegated  a composite op whose work is done, and priced, by a descendant
             (aten::linear -> aten::addmm, aten::layer_norm -> aten::native_layer_norm,
             aten::clone -> aten::copy_), so the work is not counted twice;
  covered    inside an op whose prediction includes its whole subtree (ExtraOps.covers);
  kept       unmapped (or no calibration for it), measured time kept: keep_unmapped=True;
  dropped    unmapped, priced 0: the default.
Free, delegated and covered ops lose their kernel (0 µs, and nothing for Algorithm 1 to launch).
Predicted times of priced ops come only from the models, never from the measured times, so
a graph captured on one device predicts another; measured times feed only `coverage`.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from typing import Protocol

from pipeline.core.dtypes import element_bytes
from pipeline.core.errors import MissingModelError
from pipeline.core.graph import ExecutionGraph
from pipeline.predict.cache_cold import graph_footprint, op_bytes, utility_bytes

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
    "relu": ("neg", "abs", "pow", "reciprocal", "square", "fill_", "zero_"),
    "add": ("where", "masked_fill", "masked_fill_", "eq", "ne", "lt", "le", "gt", "ge", "threshold_backward",
            "sum", "mean", "cumsum"),
    "mul": ("sigmoid_backward", "binary_cross_entropy", "binary_cross_entropy_backward")}.items() for a in names}
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
STATUSES = ("priced", "free", "delegated", "covered", "kept", "dropped")


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


_COPY_SOURCE = {"aten::copy_": 1, "aten::clone": 0, "aten::_to_copy": 0}  # which input a copy reads


def _contiguous_run(shape, strides) -> int:
    """Elements of the innermost run that are adjacent in memory (1: the innermost dim strided)."""
    run = 1
    for size, stride in reversed([(d, st) for d, st in zip(shape, strides) if d != 1]):
        if stride != run:
            break
        run *= size
    return run


def copy_layout(name: str, shapes: list, strides: list | None) -> tuple[str, tuple[int, int]] | None:
    """(utility op, (rows, cols)) of a copy by its tensors' layouts (execution-trace strides);
    None without strides. A transposing copy (an innermost dim strided in the source or the
    destination) is `copy`; a source broadcast along a dim (stride 0) is `copy_bcast`, rows of
    its contiguous run; any other is `copy_rows`, rows of the run both keep contiguous. On the
    Xeon VM a head permute of 8 x 8 x 128 x 64 float32 ran 43 us, a bias broadcast into
    1024 x 1536 104 us, where a transposing copy of the same size took 350 and 1020."""
    src = _COPY_SOURCE.get(name)
    if src is None or not strides or len(strides) <= src or len(shapes) <= src:
        return None
    tensors = [(shapes[src], strides[src])] + ([(shapes[0], strides[0])] if name == "aten::copy_" else [])
    if any(not isinstance(sh, list) or not isinstance(st, list) or len(sh) != len(st) or
           not all(isinstance(x, int) for x in sh + st) for sh, st in tensors):
        return None
    (shape, st), numel = tensors[0], _numel(tensors[0][0])
    if numel == 0:
        return None
    runs = [_contiguous_run(sh, t) for sh, t in tensors]
    inner = [(d, t) for d, t in zip(shape, st) if d != 1][-1:] or [(1, 1)]
    if inner[0][1] == 0:  # the innermost dim itself broadcast ((n, 1) expanded to (n, m)): a fill per row
        return "copy_bcast", (numel // inner[0][0], inner[0][0])
    if min(runs) == 1 and inner[0][0] > 1:
        return "copy", utility_dims(name, shapes)
    cols = min(runs)
    broadcast = any(d != 1 and t == 0 for d, t in zip(shape, st))
    return ("copy_bcast" if broadcast else "copy_rows"), (numel // cols, cols)


class ExtraOps(Protocol):
    """More op mappings for price_graph, tried before the GEMM/utility tables (price_recsys.py).

    `map` is model-free (so host-time extraction can classify ops on a device with no
    models): None when the op is not its to price, else (model op, dims). `covers` names
    ops whose whole subtree the mapped op's prediction already includes (their children are
    marked "covered"). `predict` returns µs; it may raise MissingModelError.
    """

    covers: frozenset[str]

    def map(self, name: str, shapes: list, scalars: list | None) -> tuple[str, tuple] | None: ...

    def predict(self, model_op: str, dims: tuple, dtype: str) -> float: ...

    def observe(self, step_bytes: float, cache_bytes: float | None) -> None:
        """Told, before any `predict`, how many bytes the graph's priced ops span in all and how
        much the cache holds as the GEMM sweep measured it (None: not measured). Optional."""


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


def classify_graph(graph: ExecutionGraph, shapes: dict, scalars: dict | None = None,
                   extra: ExtraOps | None = None, strides: dict | None = None) -> dict[int, tuple]:
    """Op id -> (status, model op, dims, reason), from names, shapes and (where captured) the
    copies' strides only (no models).

    Status is "priced" for an op a model can price (given a calibration), else free,
    delegated, covered (inside an `extra.covers` op) or unmapped."""
    below = _descendant_work(graph)
    scalars, strides = scalars or {}, strides or {}
    out: dict[int, tuple] = {}
    for op in graph.ops:
        if op.parent is not None and _covers_children(out[op.parent], graph.op(op.parent).name, extra):
            out[op.id] = ("covered", None, None, f"inside {graph.op(op.parent).name}")
            continue
        mapped = extra.map(op.name, shapes.get(op.id), scalars.get(op.id)) if extra is not None else None
        out[op.id] = ("priced", mapped[0], mapped[1], "extra") if mapped else _map_one(
            op.name, shapes.get(op.id), below[op.id], strides.get(op.id))
        if out[op.id][:2] == ("priced", "mm") and _under_linear(graph, op):
            out[op.id] = ("priced", "linear", out[op.id][2], LINEAR_GEMM)
    return out


LINEAR_GEMM = "nn.Linear's GEMM"  # an mm priced by the linear table (mm's when it has none)


def _under_linear(graph: ExecutionGraph, op, depth: int = 2) -> bool:
    """Whether an mm is nn.Linear's own GEMM (aten::linear -> [matmul ->] mm or addmm): it
    multiplies by the weight transposed (x @ W^T), the layout the `linear` table was timed in,
    not the `mm` table's A @ B (on the Xeon VM 128 x 4864 x 896 float32: 3.84 ms as mm, 3.66 ms
    as F.linear). GPT-2's Conv1D calls addmm itself, with the weight as stored: mm."""
    parent = op.parent
    for _ in range(depth):
        if parent is None:
            return False
        if graph.op(parent).name == "aten::linear":
            return True
        parent = graph.op(parent).parent
    return False


def _covers_children(parent_class: tuple, parent_name: str, extra: ExtraOps | None) -> bool:
    """A covered op's children are covered; so are those of an op an ExtraOps mapping prices
    whole (named in `covers`, or mapped to "covered": work already timed elsewhere)."""
    status, model_op, _, why = parent_class
    if status == "covered":
        return True
    return status == "priced" and why == "extra" and (parent_name in extra.covers or model_op == "covered")


def price_graph(graph: ExecutionGraph, shapes: dict, gemm_model, utility_model, dtype: str,
                *, keep_unmapped: bool = False, scalars: dict | None = None, extra: ExtraOps | None = None,
                synchronous: bool = False, strides: dict | None = None) -> tuple[ExecutionGraph, dict]:
    """Re-priced graph and coverage (see module doc). `shapes`: op id -> input shapes;
    `strides` (execution-trace captures since 2026-11-25): op id -> input strides, which
    decide how a copy is priced (copy_layout; without them every copy is a transposing one).

    `synchronous` (the CPU as the device): an unmapped op launches nothing, so it keeps no
    kernel; its time is host time, which the overhead model's T2/T5 carry (host_time.py)."""
    classes = classify_graph(graph, shapes, scalars, extra, strides)
    cold = uncached_weights(classes, gemm_model, dtype)
    # bytes each priced op touches, summed over the step: what passes through the cache between
    # one op and its own next run (an op whose model turns out missing still runs, and counts;
    # a nested op counts beside its parent: both are bounds, and real steps pass the flush many
    # times over). An op mapped "covered" (a table's sparse update, timed inside EL-B) is left
    # out: its inputs' shapes span the whole table and a dense-shaped sparse grad, not what it touches
    foot = {op.id: _op_bytes(op, classes[op.id], shapes, dtype) for op in graph.ops if classes[op.id][0] == "priced"}
    step_bytes = graph_footprint(b for i, b in foot.items() if classes[i][1] != "covered")
    observe = getattr(extra, "observe", None)  # an ExtraOps written before it may lack it
    if observe is not None:
        observe(step_bytes, getattr(gemm_model, "weight_cache_bytes", None))
    # CPU: a step that streams more than the cold twins' flush prices every utility op as its twin
    # timed after that flush (cache_cold.py): by its next run the step has evicted what it touched
    evicted = getattr(utility_model, "cold", None)
    evicted = evicted if evicted is not None and evicted.evicts(step_bytes) else None
    new: dict[int, float] = {}
    records = []
    for op in graph.ops:
        status, model_op, dims, why = classes[op.id]
        new[op.id] = 0.0
        after_evict = False
        if status == "priced":
            try:
                if why == "extra":
                    new[op.id] = float(extra.predict(model_op, dims, dtype))
                elif op.name in GEMM:
                    new[op.id] = _price_gemm(gemm_model, model_op, dtype, dims, cold, why)
                else:
                    new[op.id] = float(utility_model.predict(model_op, dtype, *dims))
                    extra_us = 0.0 if evicted is None else float(
                        evicted.extra_us(model_op, dtype, utility_bytes(model_op, dims, dtype)))
                    new[op.id] += extra_us
                    after_evict = extra_us > 0.0  # an op past the largest twin is charged nothing
            except MissingModelError:
                status, why = "unmapped", f"no calibration for {model_op}/{dtype}"
        if status == "unmapped":
            status = "kept" if keep_unmapped else "dropped"
            new[op.id] = sum(k.time_us for k in op.kernels) if keep_unmapped else 0.0
        records.append({"id": op.id, "name": op.name, "status": status, "model_op": model_op, "dims": dims,
                        "why": why, "measured_us": sum(k.time_us for k in op.kernels), "predicted_us": new[op.id],
                        "after_evict": after_evict})

    # Ops that do no work of their own launch nothing on any device: no kernel, so Algorithm 1
    # charges them no launch overhead (T2-T4). A dropped op keeps a 0 µs kernel on a GPU: it
    # does launch something.
    status = {r["id"]: r["status"] for r in records}
    launchless = {"free", "delegated", "covered"} | ({"dropped"} if synchronous else set())
    ops = [replace(op, kernels=()) if status[op.id] in launchless else
           replace(op, kernels=tuple(replace(k, time_us=new[op.id] / len(op.kernels)) for k in op.kernels))
           for op in graph.ops]  # one kernel per captured op; split evenly if a graph has more
    cov = _coverage(records)
    cov["weights_uncached_share"] = cold  # None: GEMMs priced hot, as swept
    return ExecutionGraph(ops), cov


def _op_bytes(op, cls: tuple, shapes: dict, dtype: str) -> float:
    _, model_op, dims, why = cls
    kind = "other" if why == "extra" else "gemm" if op.name in GEMM else "utility"
    return op_bytes(kind, model_op, dims, shapes.get(op.id), dtype)


def _price_gemm(gemm_model, model_op: str, dtype: str, dims, cold: float | None, why: str) -> float:
    """A GEMM's price; with its weights' cold share where the model has one (uncached_weights:
    only a table with a cold-weight correction, mm and linear, applies it). nn.Linear's mm falls
    back to the mm table where no linear one was calibrated."""
    kw = {"cold": cold} if cold is not None else {}
    try:
        return float(gemm_model.predict(model_op, dtype, *dims, **kw))
    except MissingModelError:
        if why != LINEAR_GEMM:
            raise
        return float(gemm_model.predict("mm", dtype, *dims, **kw))


# GEMMs whose second operand is a weight (mm: A @ B, linear: x @ W^T); a bmm multiplies activations
WEIGHT_OPS = ("mm", "linear")


def uncached_weights(classes: dict[int, tuple], gemm_model, dtype: str) -> float | None:
    """The share of the graph's GEMM weights that come from memory: every priced mm / linear
    op's second operand (N x K) summed, against the cache the GEMM sweep measured holding
    weights. An op repeated per layer is one op per layer in a captured graph; in a training
    graph the backward GEMMs count again (their operands pass through the cache too). None
    when the model has no cold-weight correction (a GPU, an older calibration)."""
    share = getattr(gemm_model, "uncached_share", None)
    if share is None:
        return None
    nbytes = sum(dims[1] * dims[2] for status, model_op, dims, _ in classes.values()
                 if status == "priced" and model_op in WEIGHT_OPS and dims)
    return share(nbytes * element_bytes(dtype)) if nbytes else None


def _map_one(name, shp, below, strides=None):
    """(status, model op, dims, reason) from the name and shapes alone, so a mapped op's
    measured time cannot leak into its prediction."""
    if name in FREE:
        return "free", None, None, "no work of its own"
    # Delegated only to the same family: aten::mul's child copy_ (a 0-d scalar converted to the
    # tensor's dtype) or addmm's bias copy_ is extra work, not the op's own.
    if _family(name) in below:
        return "delegated", None, None, "priced at a descendant"
    if name not in GEMM and name not in UTILITY:
        return "unmapped", None, None, "no mapping"
    if shp is None:
        return "unmapped", None, None, "no shapes recorded"
    if name in GEMM:
        g = gemm_dims(name, shp)
        model_op, dims = (g[0], g[1:]) if g else (None, None)
    else:
        model_op, dims = copy_layout(name, shp, strides) or (UTILITY[name], utility_dims(name, shp))
    if dims is None:
        return "unmapped", None, None, f"shapes {shp} do not fit"
    if 0 in dims:
        return "free", model_op, dims, "zero-size"
    return "priced", model_op, dims, ""


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
