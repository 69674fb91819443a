"""Execution graph: the ops a workload ran, in CPU program order, with the kernels each launched.

This is the data model the critical-path E2E predictor walks (DLRM paper, §III-D): ops
carry their call-stack parent/children and data dependencies; kernels carry a device
time (predicted or measured, µs) and a stream. Only top-level ops (parent None) are
scheduled; a top-level op "calls" every kernel launched anywhere in its subtree, which is
how the paper's event tree attributes device time to ops (§III-A).

What-if studies (§V-A: fusion, removal, re-pricing on another device) are graph
transforms that return a new graph; graphs are never mutated in place. Pure Python:
no torch, so a saved graph predicts anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

from pipeline.core.errors import DevcharError


class GraphError(DevcharError, ValueError):
    """A malformed execution graph (duplicate id, dangling parent, negative time...)."""


@dataclass(frozen=True)
class Kernel:
    """One device-side execution launched by an op: a kernel, memcpy or memset.

    `launch` names the host runtime call that issued it (its CPU cost is the paper's T4);
    a memcpy is a Kernel with launch "cudaMemcpyAsync", as in the paper (§III-C, T4).
    `blocking` is an extension the paper does not have (off by default): the CPU waits
    for this kernel to finish, as with a synchronous D2H copy or `.item()`.
    """

    name: str
    time_us: float
    stream: int = 0
    launch: str = "cudaLaunchKernel"
    blocking: bool = False

    def __post_init__(self):
        t = self.time_us
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GraphError(f"kernel {self.name!r}: time_us={t!r} must be a finite number >= 0")


@dataclass(frozen=True)
class Op:
    """One operator call. `kernels` are the ones this op launches itself (not its children's)."""

    id: int
    name: str
    parent: int | None = None
    children: tuple[int, ...] = ()
    deps: tuple[int, ...] = ()
    kernels: tuple[Kernel, ...] = field(default_factory=tuple)

    def __post_init__(self):
        # Accept lists from JSON or callers; store tuples so ops stay hashable and immutable.
        object.__setattr__(self, "children", tuple(self.children))
        object.__setattr__(self, "deps", tuple(self.deps))
        object.__setattr__(self, "kernels", tuple(self.kernels))

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "parent": self.parent, "children": list(self.children),
                "deps": list(self.deps),
                "kernels": [{"name": k.name, "time_us": k.time_us, "stream": k.stream, "launch": k.launch,
                             "blocking": k.blocking} for k in self.kernels]}

    @classmethod
    def from_dict(cls, d: dict) -> "Op":
        try:
            parent = d.get("parent")
            return cls(id=int(d["id"]), name=str(d["name"]), parent=None if parent is None else int(parent),
                       children=[int(c) for c in d.get("children", ())], deps=[int(x) for x in d.get("deps", ())],
                       kernels=tuple(Kernel(**k) for k in d.get("kernels", ())))
        except (KeyError, TypeError, ValueError) as e:
            raise GraphError(f"bad op record {d!r}: {e}") from None


class ExecutionGraph:
    """Ops in CPU program order. Children lists are derived from parent links and checked."""

    def __init__(self, ops: Iterable[Op]):
        ops = list(ops)
        by_id: dict[int, Op] = {}
        for op in ops:
            if op.id in by_id:
                raise GraphError(f"duplicate op id {op.id} ({op.name!r})")
            by_id[op.id] = op
        kids: dict[int, list[int]] = {i: [] for i in by_id}
        for op in ops:
            if op.parent is not None:
                if op.parent not in by_id:
                    raise GraphError(f"op {op.id} ({op.name!r}) has unknown parent {op.parent}")
                if op.parent == op.id:
                    raise GraphError(f"op {op.id} ({op.name!r}) is its own parent")
                kids[op.parent].append(op.id)
            for d in op.deps:
                if d not in by_id:
                    raise GraphError(f"op {op.id} ({op.name!r}) depends on unknown op {d}")
        # Children follow program order; an explicit list that disagrees is a caller bug.
        fixed = []
        for op in ops:
            if op.children and sorted(op.children) != sorted(kids[op.id]):
                raise GraphError(f"op {op.id} ({op.name!r}): children {list(op.children)} disagree "
                                 f"with parent links {kids[op.id]}")
            fixed.append(op if op.children else replace(op, children=tuple(kids[op.id])))
        self._ops = tuple(fixed)
        self._by_id = {op.id: op for op in self._ops}
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        for op in self._ops:
            seen, cur = set(), op
            while cur.parent is not None:
                if cur.id in seen:
                    raise GraphError(f"parent cycle through op {cur.id} ({cur.name!r})")
                seen.add(cur.id)
                cur = self._by_id[cur.parent]

    # ---- lookups -------------------------------------------------------------------------
    @property
    def ops(self) -> tuple[Op, ...]:
        return self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops)

    def op(self, op_id: int) -> Op:
        try:
            return self._by_id[op_id]
        except KeyError:
            raise GraphError(f"no op with id {op_id}") from None

    def top_level(self) -> list[Op]:
        """The ops Algorithm 1 schedules: those not called from inside another op."""
        return [op for op in self._ops if op.parent is None]

    def by_name(self, name: str) -> list[Op]:
        return [op for op in self._ops if op.name == name]

    def descendants(self, op_id: int) -> list[Op]:
        """Pre-order: an op's children (in program order), their children, ..."""
        out: list[Op] = []
        for c in self.op(op_id).children:
            out.append(self._by_id[c])
            out.extend(self.descendants(c))
        return out

    def launched_kernels(self, op_id: int) -> list[Kernel]:
        """Every kernel the op's subtree launches, in launch order (own first, then children)."""
        return [k for o in [self.op(op_id), *self.descendants(op_id)] for k in o.kernels]

    def kernels(self) -> list[Kernel]:
        return [k for op in self._ops for k in op.kernels]

    # ---- transforms (what-if studies) -----------------------------------------------------
    def with_kernel_times(self, fn: Callable[[Op, Kernel], float]) -> "ExecutionGraph":
        """Re-price every kernel: fn(op, kernel) -> new time_us (e.g. a model for another device)."""
        return ExecutionGraph(replace(op, kernels=tuple(replace(k, time_us=float(fn(op, k))) for k in op.kernels))
                              for op in self._ops)

    def remove_ops(self, pred: Callable[[Op], bool]) -> "ExecutionGraph":
        """Drop ops matching pred together with their subtrees; dangling deps are dropped too."""
        gone = set()
        for op in self._ops:
            if op.id not in gone and pred(op):
                gone.add(op.id)
                gone.update(d.id for d in self.descendants(op.id))
        return ExecutionGraph(replace(op, children=tuple(c for c in op.children if c not in gone),
                                      deps=tuple(d for d in op.deps if d not in gone))
                              for op in self._ops if op.id not in gone)

    # ---- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"version": 1, "ops": [op.to_dict() for op in self._ops]}

    @classmethod
    def from_dict(cls, d: dict) -> "ExecutionGraph":
        if not isinstance(d, dict) or not isinstance(d.get("ops"), list):
            raise GraphError(f"execution graph JSON needs an 'ops' list, got {type(d).__name__}")
        return cls(Op.from_dict(o) for o in d["ops"])

    def __eq__(self, other) -> bool:
        return isinstance(other, ExecutionGraph) and self._ops == other._ops

    def __repr__(self) -> str:
        return f"ExecutionGraph({len(self._ops)} ops, {len(self.top_level())} top-level, {len(self.kernels())} kernels)"
