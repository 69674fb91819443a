"""Kernel arguments, both ways of the paper (II-B1, II-B2).

- simple: every global array holds gsize elements, every scalar equals gsize.
- memory (Algorithm 1): Clang's AST finds each subscript of a global array; the source is
  rewritten so every such index first goes through `dc_rec_`, which records the largest and
  smallest index per array into an extra buffer (atomic_max / atomic_min) and clamps the
  access into the probe buffer, so the probe itself cannot run out of bounds. The
  instrumented kernel runs at two global sizes for each scalar combination drawn from
  {1, 4, gsize, 16, 32, 256}; each array's size is the affine function of gsize through the
  two (gsize, max index + 1) points, checked at a third gsize (our addition: a size that grows
  faster than the line would overflow its array at the large gsizes the sweep launches).
  Combinations with a negative index, an index past the
  probe buffer (clamped: the size is not affine or too large), or an array never touched are
  dropped, as are combinations whose probe launches failed.

Local-memory arguments (__local T*) always get lsize elements. Probes run at the smallest
lsize the sweep uses, so per-work-group arrays (out[get_group_id(0)]) are sized for the most
work-groups a launch of that gsize can have.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import numpy as np

from pipeline.opencl.sweep.clang_ast import Param, kernel_params, parse_kernel

CANDIDATES = (1, 4, "gsize", 16, 32, 256)  # the paper's scalar candidates
PROBE_CAP = 1 << 18  # elements per probe buffer; a larger index means "too large or not affine"
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1

_HOOK = """int dc_rec_(__global int* dc_log, int k, long idx, int cap) {
    atomic_max(&dc_log[2 * k], (int)clamp(idx, (long)(-2147483647 - 1), (long)2147483647));
    atomic_min(&dc_log[2 * k + 1], (int)clamp(idx, (long)(-2147483647 - 1), (long)2147483647));
    return (idx >= 0 && idx < cap) ? (int)idx : 0;
}

"""


@dataclass(frozen=True)
class ArgPlan:
    """How to build a kernel's arguments at any (gsize, lsize)."""

    method: str  # "simple" | "memory"
    params: tuple[Param, ...]
    scalars: dict = field(default_factory=dict)  # scalar name -> int or "gsize"
    sizes: dict = field(default_factory=dict)  # global array name -> (slope, intercept); absent: gsize

    def args(self, gsize: int, lsize: int) -> list[dict]:
        out = []
        for p in self.params:
            a = {"name": p.name, "type": p.type, "kind": p.kind, "element": p.element}
            if p.kind == "scalar":
                v = self.scalars.get(p.name, "gsize")
                a["value"] = gsize if v == "gsize" else int(v)
            elif p.kind == "local":
                a["elements"] = lsize
            else:
                c, d = self.sizes.get(p.name, (1.0, 0.0))
                a["elements"] = max(int(np.ceil(c * gsize + d - 1e-9)), 1)
            out.append(a)
        return out

    def key(self) -> str:
        """Identifies the plan among a kernel's plans (the scalar combination)."""
        return json.dumps(self.scalars, sort_keys=True)


def simple_plan(source: str, name: str) -> ArgPlan:
    _, cur = parse_kernel(source, name)
    return ArgPlan("simple", tuple(kernel_params(cur)))


def _decl_ref(cursor):
    """The parameter an array expression names, looking through casts and parentheses."""
    import clang.cindex as ci

    while cursor is not None and cursor.kind in (ci.CursorKind.UNEXPOSED_EXPR, ci.CursorKind.PAREN_EXPR):
        kids = list(cursor.get_children())
        cursor = kids[0] if len(kids) == 1 else None
    if cursor is not None and cursor.kind == ci.CursorKind.DECL_REF_EXPR and cursor.referenced is not None:
        return cursor.referenced.spelling
    return None


def instrument(source: str, name: str) -> tuple[str, list[str]]:
    """The source with every subscript of a global array routed through the recording hook,
    and the instrumented array names (hook slot k is names[k]). The kernel gains two
    parameters at the end: `__global int* dc_log_` (2 ints per array: max, min) and `int dc_cap_`."""
    import clang.cindex as ci

    _, kernel = parse_kernel(source, name)
    params = kernel_params(kernel)
    arrays = [p.name for p in params if p.kind == "global"]
    edits: list[tuple[int, int, str]] = []  # (offset, order, text): order puts closers before openers
    for node in kernel.walk_preorder():
        if node.kind != ci.CursorKind.ARRAY_SUBSCRIPT_EXPR:
            continue
        kids = list(node.get_children())
        if len(kids) != 2 or _decl_ref(kids[0]) not in arrays:
            continue
        k = arrays.index(_decl_ref(kids[0]))
        ext = kids[1].extent
        edits.append((ext.start.offset, 1, f"dc_rec_(dc_log_, {k}, (long)("))
        edits.append((ext.end.offset, 0, "), dc_cap_)"))
    last_param = list(kernel.get_arguments())[-1].extent.end.offset
    edits.append((last_param, 0, ", __global int* dc_log_, int dc_cap_"))
    text = source
    for offset, _, insert in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:offset] + insert + text[offset:]
    return _HOOK + text, arrays


def scalar_combos(params, max_combos: int, rng: np.random.Generator) -> list[dict]:
    """All of CANDIDATES^|scalars|, or `max_combos` of them drawn at random (all-gsize first)."""
    names = [p.name for p in params if p.kind == "scalar"]
    combos = [dict(zip(names, c)) for c in itertools.product(CANDIDATES, repeat=len(names))]
    if len(combos) <= max_combos:
        return combos
    first = dict.fromkeys(names, "gsize")
    rest = [c for c in combos if c != first]
    pick = rng.choice(len(rest), size=max_combos - 1, replace=False)
    return [first] + [rest[i] for i in sorted(pick)]


def probe_launches(params, combo: dict, probes: tuple[int, ...], lsize: int, n_arrays: int):
    """The instrumented launches (one per probe gsize) of one scalar combination."""
    from pipeline.opencl.sweep.execute import Launch

    plan = ArgPlan("memory", tuple(params), combo, {p.name: (0.0, PROBE_CAP) for p in params if p.kind == "global"})
    out = []
    for g in probes:
        log = np.tile(np.array([-1, _INT_MAX], dtype=np.int32), n_arrays)
        args = plan.args(g, lsize) + [
            {"name": "dc_log_", "type": "__global int *", "kind": "global", "element": "int", "elements": 2 * n_arrays},
            {"name": "dc_cap_", "type": "int", "kind": "scalar", "element": "int", "value": PROBE_CAP}]
        out.append(Launch(g, lsize, args, data={len(args) - 2: log}, readback=len(args) - 2, timed=False))
    return out


def fit_sizes(arrays: list[str], probes: tuple[int, ...], logs: tuple[np.ndarray, ...]) -> dict | None:
    """Algorithm 1, lines 12-19: each array's (slope, intercept) through the first two probes'
    (gsize, max index + 1) points. Further probes check the line: a size above it there (an
    index quadratic in gsize, say) rejects the combination, since the line would undersize the
    array at larger gsize. None also when any index was negative, clamped, or never recorded."""
    sizes = {}
    for k, name in enumerate(arrays):
        hi = [int(log[2 * k]) for log in logs]
        lo = [int(log[2 * k + 1]) for log in logs]
        if min(hi) < 0 or min(lo) < 0 or max(hi) >= PROBE_CAP:
            return None
        (g1, g2), (s1, s2) = probes[:2], (hi[0] + 1, hi[1] + 1)
        slope = (s2 - s1) / (g2 - g1)
        intercept = s1 - slope * g1
        if any(h + 1 > np.ceil(slope * g + intercept - 1e-9) for g, h in zip(probes[2:], hi[2:])):
            return None
        sizes[name] = (slope, intercept)
    return sizes


def memory_plans(source: str, name: str, runner, probes: tuple[int, ...], lsize: int, max_combos: int,
                 rng: np.random.Generator) -> list[ArgPlan]:
    """Algorithm 1: the valid (scalar combination, affine array sizes) plans of a kernel."""
    _, kernel = parse_kernel(source, name)
    params = kernel_params(kernel)
    hooked, arrays = instrument(source, name)
    combos = scalar_combos(params, max_combos, rng)
    launches = [la for c in combos for la in probe_launches(params, c, probes, lsize, len(arrays))]
    results = runner.run(hooked, name, launches)
    plans, n = [], len(probes)
    for i, combo in enumerate(combos):
        got = results[n * i: n * (i + 1)]
        if any(r.status != "ok" for r in got):
            continue
        sizes = fit_sizes(arrays, probes, tuple(r.readback for r in got))
        if sizes is not None:
            plans.append(ArgPlan("memory", tuple(params), combo, sizes))
    return plans
