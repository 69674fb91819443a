"""What-if transforms of a captured graph, predicted without running them (DLRM paper §V-A).

- `with_batch`: the graph at another batch size. Two captures of one model at batch sizes
  b1 != b2 are aligned op by op (by name, in program order; a few ops that run at one batch
  and not the other are tolerated); every input dimension that differs is solved as an
  affine function of the batch, a*b + c with integer a, c (as LLMPerf's Algorithm 1 does for
  buffer sizes against gsize), and evaluated at the new batch. Dimensions that agree are
  constants (weights, widths).
- `fuse_embedding_bags`: separate EmbeddingBag lookups (one per table, forward and backward)
  become one batched lookup over the concatenated table (Fig. 11).
Pure Python: graphs, shapes and scalars as workload_graphs stores them.
"""
from __future__ import annotations

import difflib
import math

from pipeline.core.errors import BadShapeError, check_dims
from pipeline.core.graph import ExecutionGraph, Op
from pipeline.predict.price_recsys import EMB_BWD, EMB_FWD, NUM_WEIGHTS_ARG


def _affine(v1: int, v2: int, b1: int, b2: int) -> tuple[int, int] | None:
    """(a, c) with v = a*b + c through both points, integers only; None if there is none."""
    if (v2 - v1) % (b2 - b1):
        return None
    a = (v2 - v1) // (b2 - b1)
    return a, v1 - a * b1


def _scale(s1, s2, b1: int, b2: int, new: int):
    """Shape (or list of shapes, or None) s1 at batch b1, given the aligned s2 at b2."""
    if isinstance(s1, list) and isinstance(s2, list) and len(s1) == len(s2):
        if all(isinstance(x, list) for x in s1 + s2):
            return [_scale(a, b, b1, b2, new) for a, b in zip(s1, s2)]
        if all(isinstance(x, int) for x in s1 + s2):
            out = []
            for v1, v2 in zip(s1, s2):
                ac = _affine(v1, v2, b1, b2) if v1 != v2 else (0, v1)
                if ac is None:
                    return s1  # not affine in the batch: keep what was captured
                out.append(max(ac[0] * new + ac[1], 0))
            return out
    return s1


def with_batch(graph: ExecutionGraph, shapes: dict, batch: int, other_shapes: dict, other_graph: ExecutionGraph,
               other_batch: int, new_batch: int) -> tuple[dict, dict]:
    """Shapes of `graph` at `new_batch`, from its capture at `batch` and another at `other_batch`.

    Returns (new shapes by op id, report: aligned / unaligned op counts)."""
    check_dims(batch=batch, other_batch=other_batch, new_batch=new_batch)
    if batch == other_batch:
        raise BadShapeError(f"the two captures must be at different batch sizes, both are {batch}")
    a, b = list(graph.ops), list(other_graph.ops)
    matcher = difflib.SequenceMatcher(a=[op.name for op in a], b=[op.name for op in b], autojunk=False)
    new, aligned = dict(shapes), 0
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            oa, ob = a[block.a + i], b[block.b + i]
            sa, sb = shapes.get(oa.id), other_shapes.get(ob.id)
            if sa is not None and sb is not None:
                new[oa.id] = [_scale(x, y, batch, other_batch, new_batch) for x, y in zip(sa, sb)] \
                    if len(sa) == len(sb) else sa
            aligned += 1
    return new, {"aligned_ops": aligned, "unaligned_ops": len(a) - aligned}


def returned_at_batch(returned: list[int], other_returned: list[int], batch: int, other_batch: int,
                      new_batch: int) -> list[int]:
    """Bytes of each tensor the step returns (its output free, graph_predict.output_free_us) at
    `new_batch`: affine in the batch through the two captures, as with_batch solves shapes. The
    capture lists sizes largest first, so tensors pair by rank. A size that is not affine in the
    batch stays as captured, and so does the whole list where the two differ in length."""
    if len(returned) != len(other_returned) or batch == other_batch:
        return list(returned)
    out = []
    for v1, v2 in zip(returned, other_returned):
        ac = _affine(int(v1), int(v2), batch, other_batch)
        out.append(int(v1) if ac is None else max(ac[0] * new_batch + ac[1], 0))
    return out


def fuse_embedding_bags(graph: ExecutionGraph, shapes: dict, scalars: dict) -> tuple[ExecutionGraph, dict, dict]:
    """One batched lookup over the concatenated table in place of T per-table ones (Fig. 11).

    Each per-table top-level op — the forward lookup, its backward, the sparse SGD update and
    the gradient accumulation of the table — is kept for the first table only, which takes all
    tables' work: rows sum(E), T*B bags, all the indices. EmbeddingModel prices the batched
    call with the same traffic, so what fusion saves is per-call work and host overhead."""
    shapes, scalars = dict(shapes), dict(scalars)
    tops = graph.top_level()
    sub = {t.id: [t, *graph.descendants(t.id)] for t in tops}
    fwd = [next(o for o in sub[t.id] if o.name == EMB_FWD) for t in tops if any(o.name == EMB_FWD for o in sub[t.id])]
    if len(fwd) < 2:
        raise BadShapeError(f"the graph has {len(fwd)} EmbeddingBag lookup(s): nothing to fuse")
    tables = [tuple(shapes[o.id][0]) for o in fwd]
    first, e_total = list(tables[0]), sum(e for e, _ in tables)

    def touches_table(op: Op) -> bool:
        return any(isinstance(x, list) and tuple(x) in tables for x in (shapes.get(op.id) or ()))

    kinds = {
        "forward": lambda t: any(o.name == EMB_FWD for o in sub[t.id]),
        "backward": lambda t: any(o.name == EMB_BWD for o in sub[t.id]),
        "sgd": lambda t: t.name == "aten::add_" and touches_table(t),
        "accumulate": lambda t: "AccumulateGrad" in t.name and any(touches_table(o) for o in sub[t.id]),
    }
    remove: set[int] = set()
    for kind, pred in kinds.items():
        group = [t for t in tops if pred(t)]
        if not group:
            continue
        remove |= {t.id for t in group[1:]}
        n = len(group)
        for o in sub[group[0].id]:  # the kept op's subtree now does every table's work
            shp = shapes.get(o.id)
            if shp is None:
                continue
            shapes[o.id] = [[e_total, first[1]] if x == first else x for x in shp]
            if o.name in (EMB_FWD, EMB_BWD):
                s = shapes[o.id]
                s[1], s[2] = [math.prod(s[1]) * n], [math.prod(s[2]) * n]  # indices, offsets of all tables
                if o.name == EMB_BWD:
                    s[0] = [s[0][0] * n, s[0][1]]  # the pooled gradient of T*B bags
                    sc = list(scalars.get(o.id) or [])
                    if len(sc) > NUM_WEIGHTS_ARG:
                        sc[NUM_WEIGHTS_ARG] = e_total
                        scalars[o.id] = sc
    fused = graph.remove_ops(lambda op: op.id in remove)
    keep = {o.id for o in fused}
    return fused, {k: v for k, v in shapes.items() if k in keep}, {k: v for k, v in scalars.items() if k in keep}
