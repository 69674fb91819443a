"""Data types devchar measures, by name. tf32 is float32 storage with TF32 tensor-core math."""
from __future__ import annotations

from pipeline.core.errors import UnknownDtypeError

ELEMENT_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2}
CPU_DTYPES = ("float32", "bfloat16")
CUDA_DTYPES = ("float32", "tf32", "bfloat16", "float16")


def check_dtype(name: str) -> str:
    if name not in ELEMENT_BYTES:
        raise UnknownDtypeError(f"unknown dtype {name!r}; expected one of {sorted(ELEMENT_BYTES)}")
    return name


def element_bytes(name: str) -> int:
    return ELEMENT_BYTES[check_dtype(name)]


def dtypes_for(kind: str) -> tuple[str, ...]:
    return CUDA_DTYPES if kind == "cuda" else CPU_DTYPES
