"""Static counts from a kernel's Clang AST (parsed by pipeline.opencl.sweep.clang_ast).

One walk per kernel gives *events*: (category, amount, loops), where `loops` are the loops
around the event, innermost last. A loop's trip count is resolved per launch, because
`for (c = 0; c < n; c++)` with n a kernel argument is only known once n is:
  ("static", trips) for literal bounds, ("param", name, start, step, inclusive) for a bound
  that is a scalar argument, ("unknown",) for everything else (while loops, data-dependent
  bounds, shifts), counted once.
Categories: global/local loads and stores (and bytes), arithmetic by type (float, double,
int; vector ops count once per lane), math builtins, branches, barriers, atomics.
"""
from __future__ import annotations

import math
from collections import Counter

SCALAR_BYTES = {"char": 1, "uchar": 1, "bool": 1, "short": 2, "ushort": 2, "half": 2, "int": 4, "uint": 4,
                "float": 4, "long": 8, "ulong": 8, "double": 8, "size_t": 8}
ARITH_OPS = {"+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
             "<<=", ">>="}
MATH_PREFIXES = ("sin", "cos", "tan", "exp", "log", "sqrt", "rsqrt", "pow", "fabs", "fma", "mad", "native_", "half_",
                 "floor", "ceil", "fmin", "fmax", "min", "max", "hypot", "atan", "asin", "acos", "dot", "length",
                 "normalize", "cross", "clamp", "mix")
BARRIERS = {"barrier", "work_group_barrier", "mem_fence", "read_mem_fence", "write_mem_fence"}


def type_info(spelling: str) -> tuple[str, int]:
    """(scalar base, vector width) of a type spelling such as '__global float4' or 'unsigned int'."""
    words = [w for w in spelling.replace("*", " ").split() if not w.startswith("__") and w not in (
        "const", "volatile", "global", "local", "constant", "private", "restrict")]
    word = words[-1] if words else "int"
    if words[:1] == ["unsigned"]:
        word = "u" + word
    base = word.rstrip("0123456789")
    width = int(word[len(base):]) if word[len(base):] else 1
    return base, width


def type_bytes(spelling: str) -> int:
    base, width = type_info(spelling)
    return SCALAR_BYTES.get(base, 4) * (4 if width == 3 else width)


def _unwrap(c):
    while c.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR") and len(list(c.get_children())) == 1:
        c = next(c.get_children())
    return c


def _int_literal(c) -> int | None:
    c = _unwrap(c)
    if c.kind.name != "INTEGER_LITERAL":
        return None
    toks = [t.spelling for t in c.get_tokens()]
    try:
        return int(toks[0].rstrip("uUlL"), 0) if toks else None
    except ValueError:
        return None


def _param_name(c) -> str | None:
    c = _unwrap(c)
    if c.kind.name == "DECL_REF_EXPR" and c.referenced is not None and c.referenced.kind.name == "PARM_DECL":
        return c.spelling
    return None


def binary_op(c) -> str:
    """The operator token of a binary / compound assignment cursor (the python bindings of
    libclang 18 do not expose it): the first token after the left operand."""
    children = list(c.get_children())
    if not children:
        return ""
    end = children[0].extent.end.offset
    return next((t.spelling for t in c.get_tokens() if t.extent.start.offset >= end), "")


def _unary_op(c) -> str:
    return next((t.spelling for t in c.get_tokens() if t.spelling in ("++", "--", "*", "-", "!", "~", "&")), "")


def for_trip(cursor) -> tuple:
    """The loop descriptor of a FOR_STMT (see the module docstring)."""
    kids = list(cursor.get_children())
    if len(kids) != 4:
        return ("unknown",)
    init, cond, inc, _ = kids
    start = None
    if init.kind.name == "DECL_STMT":
        var = next(init.get_children(), None)
        inits = list(var.get_children()) if var is not None else []
        start = _int_literal(inits[-1]) if inits else None
    elif init.kind.name == "BINARY_OPERATOR" and binary_op(init) == "=":
        start = _int_literal(list(init.get_children())[1])
    if start is None or cond.kind.name != "BINARY_OPERATOR" or binary_op(cond) not in ("<", "<=", "!="):
        return ("unknown",)
    step = None
    if inc.kind.name == "UNARY_OPERATOR" and _unary_op(inc) == "++":
        step = 1
    elif inc.kind.name == "COMPOUND_ASSIGNMENT_OPERATOR" and binary_op(inc) == "+=":
        step = _int_literal(list(inc.get_children())[1])
    if not step or step <= 0:
        return ("unknown",)
    bound = list(cond.get_children())[1]
    inclusive = binary_op(cond) == "<="
    end = _int_literal(bound)
    if end is not None:
        return ("static", max(0, math.ceil((end + inclusive - start) / step)))
    name = _param_name(bound)
    return ("param", name, start, step, inclusive) if name else ("unknown",)


def kernel_events(kernel_cursor) -> Counter:
    """Counter of (category, loops) -> amount per work-item, loops as a tuple of descriptors."""
    events: Counter = Counter()

    def access(sub, loops, store: bool, load: bool):
        space = "global" if ("__global" in sub.type.spelling or "__constant" in sub.type.spelling) else (
            "local" if "__local" in sub.type.spelling else None)
        if space is None:
            return
        nbytes = type_bytes(sub.type.spelling)
        for kind, on in (("load", load), ("store", store)):
            if on:
                events[(f"{space}_{kind}", loops)] += 1
                events[(f"{space}_{kind}_bytes", loops)] += nbytes

    def walk(c, loops):
        kind = c.kind.name
        if kind == "FOR_STMT":
            kids = list(c.get_children())
            for k in kids[:-1]:
                walk(k, loops)
            inner = loops + (for_trip(c),)
            events[("loop", loops)] += 1
            if kids:
                walk(kids[-1], inner)
            return
        if kind in ("WHILE_STMT", "DO_STMT"):
            events[("loop", loops)] += 1
            loops = loops + (("unknown",),)
        elif kind in ("IF_STMT", "CONDITIONAL_OPERATOR", "SWITCH_STMT"):
            events[("branch", loops)] += 1
        elif kind == "CALL_EXPR":
            name = c.spelling
            if name in BARRIERS:
                events[("barrier", loops)] += 1
            elif name.startswith(("atomic_", "atom_")):
                events[("atomic", loops)] += 1
            elif name.startswith(MATH_PREFIXES):
                events[("math", loops)] += type_info(c.type.spelling)[1]
        elif kind in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR"):
            op, kids = binary_op(c), list(c.get_children())
            if op in ARITH_OPS:
                base, width = type_info(c.type.spelling)
                group = "double" if base == "double" else ("float" if base in ("float", "half") else "int")
                events[(f"arith_{group}", loops)] += width
            lhs = _unwrap(kids[0]) if kids else None
            if lhs is not None and lhs.kind.name == "ARRAY_SUBSCRIPT_EXPR" and (op == "=" or op.endswith("=") and
                                                                              op not in ("==", "<=", ">=", "!=")):
                access(lhs, loops, store=True, load=op != "=")
                for k in lhs.get_children():  # the index expression may itself load
                    walk(k, loops)
                for k in kids[1:]:
                    walk(k, loops)
                return
        elif kind == "UNARY_OPERATOR" and _unary_op(c) in ("++", "--"):
            events[("arith_int", loops)] += 1
        elif kind == "ARRAY_SUBSCRIPT_EXPR":
            access(c, loops, store=False, load=True)
        for k in c.get_children():
            walk(k, loops)

    body = [k for k in kernel_cursor.get_children() if k.kind.name == "COMPOUND_STMT"]
    for b in body:
        walk(b, ())
    return events
