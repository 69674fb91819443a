"""A generated corpus of one-dimensional OpenCL C kernels (the paper's GitHub corpus, II-A,
replaced by templates covering its four access patterns, II-B2, and more).

Families: map (element-wise, chained ops), partition (a loop of k elements per work-item),
offset_stride, complex (boundary check + partition + stride), reduction (local memory and
barriers), stencil, gather / scatter (index arrays), divergence (branches on scalars or data),
compute (arithmetic loops). Each is crossed with int / float / float4 and a set of operations:
a few thousand distinct kernels. `generate(count, seed)` draws `count` of them round-robin over
the families, deterministically; a kernel's id comes from its template parameters, so it is
the same in every draw that contains it.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

TYPES = ("int", "float", "float4")
OPS = {  # unary operations on x, per element type
    "int": ("{x} * 3", "{x} + 7", "{x} ^ ({x} >> 3)", "({x} << 1) | 1", "max({x} - 5, 5 - {x})", "min({x}, 100)",
            "{x} * {x}", "({x} & 255) + 1"),
    "float": ("{x} * 2.0f", "sqrt({x})", "exp({x})", "sin({x}) * cos({x})", "{x} * {x} + 1.0f", "fabs({x} - 0.5f)",
              "log({x} + 1.0f)", "pow({x}, 1.5f)"),
}
OPS["float4"] = OPS["float"]
ZERO = {"int": "0", "float": "0.0f", "float4": "(float4)(0.0f)"}
FIRST = {"int": "{}", "float": "{}", "float4": "{}.x"}  # a scalar view of a value, for conditions
THRESH = {"int": "n / 2", "float": "0.5f", "float4": "0.5f"}


@dataclass(frozen=True)
class Kernel:
    kernel_id: str
    family: str
    name: str  # the __kernel function's name
    source: str
    suite: str = "generated"

    @property
    def source_hash(self) -> str:
        return source_hash(self.source)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _op(op: str, t: str, x: str) -> str:
    return "(" + op.format(x=f"({x})") + ")"


def _chain(op: str, t: str, x: str, times: int) -> str:
    for _ in range(times):
        x = _op(op, t, x)
    return x


def _sig(name: str, t: str, buffers: list[str], scalars: list[str], extra: str = "") -> str:
    params = [f"__global {t}* {b}" for b in buffers] + [f"int {s}" for s in scalars] + ([extra] if extra else [])
    return f"__kernel void {name}({', '.join(params)})"


def _map(name, t, op, inputs, chain, check):
    ins = ["a", "b", "c"][:inputs]
    expr = " + ".join(_chain(op, t, f"{v}[i]", chain) for v in ins)
    body = f"out[i] = {expr};"
    if check:
        body = f"if (i < n) {{\n        {body}\n    }}"
    head = _sig(name, t, ins + ["out"], ["n"] if check else [])
    return head + f" {{\n    int i = get_global_id(0);\n    {body}\n}}\n"


def _partition(name, t, op, k, check, combine):
    kdecl = "k" if k == "scalar" else str(k)
    acc = f"acc = max(acc, {_op(op, t, 'in[idx]')});" if combine == "max" else f"acc += {_op(op, t, 'in[idx]')};"
    if check:
        acc = f"if (idx < n) {{ {acc} }}"
    scal = (["k"] if k == "scalar" else []) + (["n"] if check else [])
    return (_sig(name, t, ["in", "out"], scal) + f" {{\n    int id = get_global_id(0);\n    {t} acc = {ZERO[t]};\n"
            f"    for (int j = 0; j < {kdecl}; j++) {{\n        int idx = id * {kdecl} + j;\n        {acc}\n    }}\n"
            f"    out[id] = acc;\n}}\n")


def _offset_stride(name, t, op, stride, offset, write_at):
    st = "st" if stride == "scalar" else str(stride)
    os_ = "os" if offset == "scalar" else str(offset)
    scal = (["os"] if offset == "scalar" else []) + (["st"] if stride == "scalar" else [])
    dst = "idx" if write_at == "idx" else "get_global_id(0)"
    return (_sig(name, t, ["in", "out"], scal) + f" {{\n    int idx = get_global_id(0) * {st} + {os_};\n"
            f"    out[{dst}] = {_op(op, t, 'in[idx]')} + in[idx + 1];\n}}\n")


def _complex(name, t, op, stride, check):
    scal = ["n", "k"] + (["st"] if stride == "scalar" else [])
    st = "st" if stride == "scalar" else str(stride)
    cond = "idx < n" if check == "index" else "get_global_id(0) < n"
    return (_sig(name, t, ["in", "out"], scal) + f" {{\n    int id = get_global_id(0);\n    {t} acc = {ZERO[t]};\n"
            f"    for (int j = 0; j < k; j++) {{\n        int idx = (id * k + j) * {st};\n"
            f"        if ({cond}) {{ acc += {_op(op, t, 'in[idx]')}; }}\n    }}\n"
            f"    if (id < n) {{ out[id] = acc; }}\n}}\n")


def _reduction(name, t, op, grid_stride):
    load = (f"    {t} v = {ZERO[t]};\n"
            f"    for (int j = gid; j < n; j += get_global_size(0)) {{ v += {_op(op, t, 'in[j]')}; }}\n"
            if grid_stride else f"    {t} v = {_op(op, t, 'in[gid]')};\n")
    return (_sig(name, t, ["in", "out"], ["n"] if grid_stride else [], f"__local {t}* tmp") +
            f" {{\n    int gid = get_global_id(0);\n    int lid = get_local_id(0);\n{load}    tmp[lid] = v;\n"
            f"    barrier(CLK_LOCAL_MEM_FENCE);\n"
            f"    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {{\n"
            f"        if (lid < s) {{ tmp[lid] += tmp[lid + s]; }}\n        barrier(CLK_LOCAL_MEM_FENCE);\n    }}\n"
            f"    if (lid == 0) {{ out[get_group_id(0)] = tmp[0]; }}\n}}\n")


def _stencil(name, t, op, radius, guard):
    terms = " + ".join(f"in[{'i' if d == 0 else f'i {chr(43) if d > 0 else chr(45)} {abs(d)}'}]"
                       for d in range(-radius, radius + 1))
    body = f"out[i] = {_op(op, t, terms)};"
    if guard == "check":
        body = f"if (i >= {radius} && i < n - {radius}) {{ {body} }}"
        scal = ["n"]
    else:  # the offset pattern: work-item i reads around i + radius
        body = body.replace("in[i", f"in[{radius} + i")
        scal = []
    return _sig(name, t, ["in", "out"], scal) + f" {{\n    int i = get_global_id(0);\n    {body}\n}}\n"


def _gather(name, t, op, mode):
    head = f"__kernel void {name}(__global {t}* in, __global int* idx, __global {t}* out)"
    stmt = {"gather": f"out[i] = {_op(op, t, 'in[idx[i]]')};",
            "scatter": f"out[idx[i]] = {_op(op, t, 'in[i]')};",
            "double_gather": f"out[i] = {_op(op, t, 'in[idx[idx[i]]]')};"}[mode]
    return head + f" {{\n    int i = get_global_id(0);\n    {stmt}\n}}\n"


def _divergence(name, t, op, cond, iters):
    c = {"gid_mod": "get_global_id(0) % m < s", "data": f"{FIRST[t].format('in[i]')} > {THRESH[t]}",
         "lid_parity": "(get_local_id(0) & 1) == 0"}[cond]
    scal = ["m", "s"] if cond == "gid_mod" else (["n"] if cond == "data" and t == "int" else [])
    return (_sig(name, t, ["in", "out"], scal) + f" {{\n    int i = get_global_id(0);\n    {t} x = in[i];\n"
            f"    if ({c}) {{\n        for (int j = 0; j < {iters}; j++) {{ x = {_op(op, t, 'x')}; }}\n"
            f"    }} else {{\n        x = x + x;\n    }}\n    out[i] = x;\n}}\n")


def _compute(name, t, op, iters, unroll):
    step = "; ".join([f"x = {_op(op, t, 'x')}"] * unroll)
    return (_sig(name, t, ["in", "out"], []) + f" {{\n    int i = get_global_id(0);\n    {t} x = in[i];\n"
            f"    for (int j = 0; j < {iters}; j++) {{ {step}; }}\n    out[i] = x;\n}}\n")


FAMILIES = {  # name -> (template, grid of parameters after type and op)
    "map": (_map, dict(inputs=(1, 2, 3), chain=(1, 2, 3, 4), check=(False, True))),
    "partition": (_partition, dict(k=("scalar", 4, 16), check=(False, True), combine=("sum", "max"))),
    "offset_stride": (_offset_stride, dict(stride=("scalar", 1, 2, 4), offset=("scalar", 0, 3),
                                           write_at=("gid", "idx"))),
    "complex": (_complex, dict(stride=("scalar", 1, 2), check=("index", "id"))),
    "reduction": (_reduction, dict(grid_stride=(False, True))),
    "stencil": (_stencil, dict(radius=(1, 2, 3, 4), guard=("check", "offset"))),
    "gather": (_gather, dict(mode=("gather", "scatter", "double_gather"))),
    "divergence": (_divergence, dict(cond=("gid_mod", "data", "lid_parity"), iters=(8, 32, 128))),
    "compute": (_compute, dict(iters=(16, 64, 256, 1024), unroll=(1, 2, 4))),
}


def _specs(family: str) -> list[dict]:
    _, grid = FAMILIES[family]
    keys = list(grid)
    return [dict(t=t, op=op, **dict(zip(keys, vals)))
            for t in TYPES for op in OPS[t] for vals in itertools.product(*grid.values())]


def build(family: str, spec: dict) -> Kernel:
    """The kernel of one template instance; its id hashes the family and parameters."""
    if family not in FAMILIES:
        from pipeline.core.errors import DevcharError

        raise DevcharError(f"unknown kernel family {family!r}; expected one of {sorted(FAMILIES)}")
    digest = hashlib.sha256(repr((family, sorted(spec.items()))).encode()).hexdigest()[:10]
    kid = f"{family}_{digest}"
    source = FAMILIES[family][0](kid, **spec)
    return Kernel(kernel_id=kid, family=family, name=kid, source=source)


def corpus_size() -> int:
    return sum(len(_specs(f)) for f in FAMILIES)


def generate(count: int, seed: int = 0) -> list[Kernel]:
    """`count` distinct kernels, round-robin over the families, each family in a seeded order."""
    rng = np.random.default_rng(seed)
    queues = {f: [specs[i] for i in rng.permutation(len(specs))] for f in FAMILIES for specs in [_specs(f)]}
    out: list[Kernel] = []
    while len(out) < count and any(queues.values()):
        for family in FAMILIES:
            if queues[family] and len(out) < count:
                out.append(build(family, queues[family].pop(0)))
    return out
