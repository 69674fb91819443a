"""devchar's dtype names as torch dtypes: the torch side of pipeline.core.dtypes, kept apart so
the vocabulary (and everything that prices graphs) imports no torch."""
from __future__ import annotations

import torch

from pipeline.core.dtypes import check_dtype

_STORAGE = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch storage dtype (tf32 stores float32: TF32 is a math mode, not a format)."""
    return _STORAGE[check_dtype(name)]
