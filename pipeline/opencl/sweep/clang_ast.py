"""libclang set up for OpenCL C 1.2, without the clang resource headers.

The `libclang` wheel ships no `opencl-c.h` / `opencl-c-base.h`, so we parse with
`-cl-no-stdinc` and get the builtin *functions* from clang's own table
(`-fdeclare-opencl-builtins`); the builtin *types and macros* (float4, uint,
CLK_LOCAL_MEM_FENCE, ...) come from the small PRELUDE below, force-included from a
virtual file so that source offsets in the returned AST are those of the kernel text.

API:
    parse_kernel(source, name=None) -> (translation_unit, kernel_cursor)
    kernel_params(kernel_cursor)    -> list[Param]   (name, type, kind, element type)
    KernelParseError                 -> raised with clang's diagnostics when parsing fails
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import DevcharError

_PRELUDE_PATH = "/devchar-virtual/opencl_prelude.h"
_SOURCE_PATH = "/devchar-virtual/kernel.cl"
_SCALARS = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "float", "double")
_VECTOR_TYPEDEFS = "\n".join(f"typedef {'unsigned ' + t[1:] if t.startswith('u') else t} {t}{n} "
                             f"__attribute__((ext_vector_type({n})));"
                             for t in _SCALARS for n in (2, 3, 4, 8, 16))
PRELUDE = f"""
typedef unsigned char uchar; typedef unsigned short ushort; typedef unsigned int uint; typedef unsigned long ulong;
typedef __SIZE_TYPE__ size_t; typedef __PTRDIFF_TYPE__ ptrdiff_t; typedef __INTPTR_TYPE__ intptr_t;
typedef __UINTPTR_TYPE__ uintptr_t; typedef uint cl_mem_fence_flags;
{_VECTOR_TYPEDEFS}
#define __opencl_c_named_address_space_builtins 1
#define CLK_LOCAL_MEM_FENCE 0x01
#define CLK_GLOBAL_MEM_FENCE 0x02
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1.0p-126f
#define FLT_EPSILON 0x1.0p-23f
#define MAXFLOAT FLT_MAX
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 0xffffffffU
#define M_PI_F 3.14159274101257f
#define M_E_F 2.71828174591064f
"""
CLANG_ARGS = ("-x", "cl", "-cl-std=CL1.2", "-cl-no-stdinc", "-Xclang", "-fdeclare-opencl-builtins",
              "-include", _PRELUDE_PATH)


class KernelParseError(DevcharError, ValueError):
    """The source does not parse as OpenCL C 1.2; the message carries clang's diagnostics."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # clang's spelling without the implicit __private, e.g. "__global float *"
    kind: str  # "global" (also __constant buffers), "local" or "scalar"
    element: str  # pointee type for buffers ("float4"), the type itself for scalars


_index = None


def _clang_index():
    global _index
    if _index is None:  # libclang loads lazily: the runner imports only torch/numpy at module level
        import clang.cindex as ci

        _index = ci.Index.create()
    return _index


def _is_kernel(cursor) -> bool:
    for tok in cursor.get_tokens():
        if tok.spelling == cursor.spelling:
            return False
        if tok.spelling in ("__kernel", "kernel"):
            return True
    return False


def parse_kernel(source: str, name: str | None = None):
    """Parse OpenCL C `source`; return (translation_unit, cursor of the kernel function).

    `name` picks one kernel when the source defines several (default: the first one).
    Raises KernelParseError with the error diagnostics if clang reports any error, or if
    no (such) kernel is defined."""
    import clang.cindex as ci

    tu = _clang_index().parse(_SOURCE_PATH, args=list(CLANG_ARGS),
                              unsaved_files=[(_SOURCE_PATH, source), (_PRELUDE_PATH, PRELUDE)])
    errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
    if errors:
        lines = "; ".join(f"{d.location.line}:{d.location.column}: {d.spelling}" for d in errors[:5])
        raise KernelParseError(f"kernel source does not parse ({len(errors)} error(s)): {lines}")
    for cur in tu.cursor.get_children():
        if (cur.kind == ci.CursorKind.FUNCTION_DECL and cur.is_definition() and cur.location.file is not None
                and cur.location.file.name == _SOURCE_PATH and _is_kernel(cur)
                and (name is None or cur.spelling == name)):
            return tu, cur
    raise KernelParseError(f"no __kernel function {name!r} defined in the source" if name
                           else "no __kernel function defined in the source")


def _strip(spelling: str) -> str:
    drop = {"__private", "private", "const", "volatile", "restrict", "__restrict", "__global", "global",
            "__local", "local", "__constant", "constant"}
    return " ".join(w for w in spelling.replace("*", " * ").split() if w not in drop).strip()


def kernel_params(kernel_cursor) -> list[Param]:
    """The kernel's parameters with their address-space kind, in declaration order."""
    import clang.cindex as ci

    params = []
    for arg in kernel_cursor.get_arguments():
        t = arg.type
        spelling = " ".join(t.spelling.replace("__private", "").split())
        if t.kind == ci.TypeKind.POINTER:
            pointee = t.get_pointee().spelling
            kind = "local" if ("__local" in pointee or pointee.startswith("local ")) else "global"
            params.append(Param(arg.spelling, spelling, kind, _strip(pointee)))
        else:
            params.append(Param(arg.spelling, spelling, "scalar", _strip(spelling)))
    return params
