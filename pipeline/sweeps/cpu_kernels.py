"""Which CPU GEMM kernel ran: oneDNN reports every primitive it executes when its verbose
mode is on; a GEMM that leaves no oneDNN line ran in ATen's own BLAS path.

On torch 2.13 / x86 this separates, for bfloat16, oneDNN's brgemm matmul from ATen's
native kernel, which ATen picks for tiny products (batch*m*n*k <= 4096): two kernels with
a 5x different latency floor, the CPU's analog of PM2Lat's kernel configurations.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

ATEN_KERNEL = "aten-cpublas"


@contextmanager
def _captured_stdout_fd():
    """Redirect file descriptor 1 (where oneDNN's C code prints) into a temporary file."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        lines: list[str] = []
        try:
            yield lines
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def parse_onednn_exec(lines: list[str]) -> str | None:
    """The implementation name of the first executed matmul/inner-product primitive, if any."""
    for line in lines:
        parts = line.split(",")
        if "exec" in parts and len(parts) > 7 and parts[0] == "onednn_verbose":
            i = parts.index("exec")
            kind, impl = parts[i + 2], parts[i + 3]
            if kind in ("matmul", "inner_product", "gemm"):
                return f"onednn-{kind}-{impl}"
    return None


def cpu_kernel_name(fn) -> str:
    """Run fn once with oneDNN verbose on and name the kernel that did the work."""
    import torch

    with _captured_stdout_fd() as lines:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            fn()
    return parse_onednn_exec(lines) or ATEN_KERNEL
