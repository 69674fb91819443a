"""libcublasLt loading, status checks and the per-problem descriptors (matmul desc + layouts),
for cublaslt.py. UNTESTED ON A GPU (see cublaslt.py); loaded on first use, never at import.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from ctypes import byref, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

from pipeline.sweeps import cublaslt_tables as T
from pipeline.sweeps.cublaslt_tables import CublasLtError

_LIB = None
WORKSPACE_BYTES = 32 << 20  # NVIDIA's recommendation for Hopper (4 MiB before it); torch uses the same


def _candidates() -> list[str]:
    """Where libcublasLt may be: an explicit path, the copy torch already mapped into this
    process (so both use one library), the pip wheels beside torch, then the system's."""
    import ctypes.util

    found = [os.environ.get("DEVCHAR_CUBLASLT", "")]
    try:
        with open("/proc/self/maps") as f:
            found += sorted({ln.split()[-1] for ln in f if "libcublasLt.so" in ln})
    except OSError:
        pass
    for root in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        for pat in ("nvidia/cublas/lib/libcublasLt.so*", "nvidia/cu*/lib/libcublasLt.so*", "torch/lib/libcublasLt.so*"):
            found += sorted(glob.glob(os.path.join(root, pat)), reverse=True)  # newest soname first
    found.append(ctypes.util.find_library("cublasLt") or "")
    return [p for p in dict.fromkeys(found) if p]


def load():
    """The loaded library, with argument types declared (pointers must not be truncated to int)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    import torch  # noqa: F401  (a CUDA torch maps its own libcublasLt on import; prefer that copy)

    tried = _candidates()
    lib = None
    for path in tried:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    if lib is None:
        raise CublasLtError(f"libcublasLt not found (tried {tried or 'nothing'}); set DEVCHAR_CUBLASLT to its path")
    P, I = c_void_p, c_int
    sigs = {
        "cublasLtCreate": [P], "cublasLtDestroy": [P],
        "cublasLtMatmulDescCreate": [P, I, I], "cublasLtMatmulDescDestroy": [P],
        "cublasLtMatmulDescSetAttribute": [P, I, P, c_size_t],
        "cublasLtMatrixLayoutCreate": [P, I, c_uint64, c_uint64, c_int64], "cublasLtMatrixLayoutDestroy": [P],
        "cublasLtMatrixLayoutSetAttribute": [P, I, P, c_size_t],
        "cublasLtMatmulPreferenceCreate": [P], "cublasLtMatmulPreferenceDestroy": [P],
        "cublasLtMatmulPreferenceSetAttribute": [P, I, P, c_size_t],
        "cublasLtMatmulAlgoGetHeuristic": [P, P, P, P, P, P, P, I, P, P],
        "cublasLtMatmulAlgoGetIds": [P, I, I, I, I, I, I, I, P, P],
        "cublasLtMatmulAlgoInit": [P, I, I, I, I, I, I, I, P],
        "cublasLtMatmulAlgoCheck": [P, P, P, P, P, P, P, P],
        "cublasLtMatmulAlgoCapGetAttribute": [P, I, P, c_size_t, P],
        "cublasLtMatmulAlgoConfigSetAttribute": [P, I, P, c_size_t],
        "cublasLtMatmulAlgoConfigGetAttribute": [P, I, P, c_size_t, P],
        "cublasLtMatmul": [P, P, P, P, P, P, P, P, P, P, P, P, P, P, c_size_t, P],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, c_int
    lib.cublasLtGetVersion.argtypes, lib.cublasLtGetVersion.restype = [], c_size_t
    _LIB = lib
    return lib


def check_status(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed: CUBLAS_STATUS_{T.STATUS.get(status, status)}")


class Problem:
    """One (dtype, layout, batch, M, N, K[, bias]) problem: the matmul descriptor and the three
    layouts (C and D share one). Close it (or use `with`) to free the descriptors."""

    def __init__(self, lt, dtype: str, layout: str, batch: int, m: int, n: int, k: int, bias: bool = False):
        self.lt, self.dtype, self.layout, self.bias = lt, dtype, layout, bias
        self.batch, self.m, self.n, self.k = batch, m, n, k
        self.data_type, compute = T.lt_types(dtype)
        spec = T.lt_problem(layout, batch, m, n, k)
        self.desc, self.layouts = c_void_p(), []
        try:
            self._create(lt.lib, compute, spec)
        except CublasLtError:  # nothing half-made is left behind
            self.close()
            raise

    def _create(self, lib, compute: int, spec: dict) -> None:
        check_status(lib.cublasLtMatmulDescCreate(byref(self.desc), compute, T.CUDA_R_32F), "cublasLtMatmulDescCreate")
        self._set(T.DESC_TRANSA, c_int32(spec["transa"]))
        self._set(T.DESC_TRANSB, c_int32(spec["transb"]))
        if self.bias:  # bias over torch's N = the rows of cuBLAS's D, which is how this epilogue adds it
            self._set(T.DESC_EPILOGUE, c_uint32(T.EPILOGUE_BIAS))
        for rows, cols, ld, stride in (spec["a"], spec["b"], spec["c"]):
            lay = c_void_p()
            check_status(lib.cublasLtMatrixLayoutCreate(byref(lay), self.data_type, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            self.layouts.append(lay)
            if self.batch > 1:
                for attr, val in ((T.LAYOUT_BATCH_COUNT, c_int32(self.batch)),
                                  (T.LAYOUT_STRIDED_BATCH_OFFSET, c_int64(stride))):
                    check_status(lib.cublasLtMatrixLayoutSetAttribute(lay, attr, byref(val), ctypes.sizeof(val)),
                           f"cublasLtMatrixLayoutSetAttribute({attr})")

    def _set(self, attr: int, val) -> None:
        check_status(self.lt.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, byref(val), ctypes.sizeof(val)),
               f"cublasLtMatmulDescSetAttribute({attr})")

    def descriptors(self) -> tuple:
        a, b, c = self.layouts
        return self.desc, a, b, c, c

    def close(self) -> None:
        for lay in self.layouts:
            self.lt.lib.cublasLtMatrixLayoutDestroy(lay)
        if self.desc:
            self.lt.lib.cublasLtMatmulDescDestroy(self.desc)
        self.layouts, self.desc = [], c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        bias = "+bias" if self.bias else ""
        return f"{self.dtype} {self.layout}{bias} b={self.batch} {self.m}x{self.n}x{self.k}"
