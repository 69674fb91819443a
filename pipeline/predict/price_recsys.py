"""Op mappings for recommendation-model training graphs (DLRM), for price_graph's `extra`.

The DLRM paper's kernel models (§III-B) price what the GEMM/utility tables cannot:
  aten::_embedding_bag             EL-F: embedding model, forward (B, E, T=1, L, D); covers
                                   its subtree (offset bookkeeping). With cold fits (CPU), a
                                   lookup is priced hot for the share of the step's footprint
                                   the measured cache holds, cold for the rest (`observe`)
  aten::_embedding_bag_backward    EL-B: embedding model, backward; it covers its subtree
                                   (cumsum, sparse_backward, ...) and the sparse SGD update
                                   of the table (aten::add_ of the table by its sparse grad),
                                   as the embedding sweep times backward + SGD together
  aten::cat / aten::stack          concat: memory model (batch, n, k), batch the row segments
                                   before the joined dim (concat_dims)
  aten::index_select, dim 1        tril-F: gather of the interaction's lower triangle
  aten::index_select_backward      tril-B: zero fill + index_add (covers its subtree)
No torch here: shapes and scalar arguments come from the execution trace (capture.py).
"""
from __future__ import annotations

import math

from pipeline.core.dtypes import element_bytes
from pipeline.core.errors import MissingModelError

EMB_FWD, EMB_BWD = "aten::_embedding_bag", "aten::_embedding_bag_backward"
NUM_WEIGHTS_ARG = 6  # _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_idx, num_weights, ...)


def concat_dims(parts: list[list[int]], dim, stack: bool = False) -> tuple[int, int, int]:
    """(batch, n, k) of the memory model's concat for k tensors joined along `dim`: ATen copies
    each input as `batch` row segments of n elements, batch the product of the dims before
    `dim` (a stack's new dim likewise). Llama's rotary cat of two (B, H, S, d/2) halves along the
    last dim is B*H*S segments of d/2, not one of H*S*d/2. Without a recorded dim (a profiler
    capture): rows along the first dim, as DLRM's (batch, features) cats are."""
    rank = len(parts[0])
    if isinstance(dim, int) and not isinstance(dim, bool) and -(rank + stack) <= dim < rank + stack:
        batch = math.prod(parts[0][: dim % (rank + stack)])
    else:
        batch = parts[0][0]
    n = sum(math.prod(t) for t in parts) // max(batch * len(parts), 1)
    return max(batch, 1), max(n, 1), len(parts)


class RecsysOps:
    """ExtraOps for DLRM-style graphs, given the embedding and memory models (either may be None:
    ops needing a missing one are left unpriced, reported as such)."""

    covers = frozenset({EMB_FWD, EMB_BWD, "aten::index_select_backward", "aten::stack"})

    def __init__(self, embedding_model=None, memory_model=None):
        self.embedding_model, self.memory_model = embedding_model, memory_model
        # the cache the GEMM sweep's probe measured holding data between two uses (None: the
        # embedding model's reported last level). A VM may report far more than it gives: the
        # Xeon VM's 480 MB last level held ~155 MB, and DLRM's lookups ran cold beside it.
        self.cache_bytes: float | None = None
        self.tables: set[tuple[int, int]] = set()  # (E, D) of tables seen in forward lookups
        # elements of every table looked up in the forward pass (classify_graph maps every op
        # before any is priced): the working set when no step footprint was observed
        self.table_elements = 0
        # bytes the whole captured step's priced ops span (price_graph's `observe`): between two
        # lookups of one table a training step runs every other lookup, update and GEMM. Tables
        # alone, against the reported cache, priced DLRM-default's batch-512 lookups hot on the
        # Xeon VM, 2.5x under their traced time.
        self.step_bytes = 0.0

    def map(self, name: str, shapes: list | None, scalars: list | None):
        if not shapes:
            return None
        if name == EMB_FWD and len(shapes) >= 3 and shapes[0] and shapes[1] and shapes[2]:
            (E, D), n_idx, B = shapes[0], math.prod(shapes[1]), math.prod(shapes[2])
            self.tables.add((E, D))
            self.table_elements += E * D
            return "embedding:forward", (B, E, 1, max(n_idx // max(B, 1), 1), D)
        if name == EMB_BWD and len(shapes) >= 3 and shapes[0] and shapes[1]:
            B, D = shapes[0]
            E = scalars[NUM_WEIGHTS_ARG] if scalars and len(scalars) > NUM_WEIGHTS_ARG else None
            if not E:  # no scalar recorded: the table of this width seen in the forward pass
                E = max((e for e, d in self.tables if d == D), default=None)
            if E is None:
                return None
            return "embedding:backward", (B, int(E), 1, max(math.prod(shapes[1]) // max(B, 1), 1), D)
        if name == "aten::add_" and len(shapes) >= 2 and shapes[0] and tuple(shapes[0]) in self.tables \
                and shapes[1] == shapes[0]:
            return "covered", ()  # the sparse SGD step of a table: part of EL-B's timing
        if name in ("aten::cat", "aten::stack") and isinstance(shapes[0], list) and shapes[0] \
                and all(isinstance(t, list) and t for t in shapes[0]):
            return "memory:concat", concat_dims(shapes[0], scalars[1] if scalars and len(scalars) > 1 else None,
                                                stack=name == "aten::stack")
        if name == "aten::index_select" and scalars and len(scalars) >= 2 and scalars[1] == 1 \
                and len(shapes[0] or ()) == 2:
            batch, nn_ = shapes[0]
            n = math.isqrt(nn_)
            return ("memory:tril_fwd", (batch, n)) if n * n == nn_ and n >= 2 else None
        if name == "aten::index_select_backward" and shapes[0] and len(shapes[0]) == 2:
            batch, pairs = shapes[0]
            n = (1 + math.isqrt(1 + 8 * pairs)) // 2  # pairs = n(n-1)/2
            return ("memory:tril_bwd", (batch, n)) if n * (n - 1) // 2 == pairs else None
        return None

    def observe(self, step_bytes: float, cache_bytes: float | None) -> None:
        self.step_bytes, self.cache_bytes = float(step_bytes), cache_bytes

    def predict(self, model_op: str, dims: tuple, dtype: str) -> float:
        if model_op == "covered":
            return 0.0
        family, op = model_op.split(":")
        model = self.embedding_model if family == "embedding" else self.memory_model
        if model is None:
            raise MissingModelError(f"no {family} model to price {op}")
        if family == "embedding":
            blend = getattr(model, "cached_share", None)  # a stand-in model (tests) may have no cold fits
            working = max(self.step_bytes, self.table_elements * element_bytes(dtype))
            share = blend(working, self.cache_bytes) if blend else None
            return float(model.predict(op, dtype, *dims, cached_share=share))
        names = ("batch", "n", "k") if op == "concat" else ("batch", "n")
        return float(model.predict(op, dtype, **dict(zip(names, dims))))
