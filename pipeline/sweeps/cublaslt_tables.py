"""cuBLASLt facts that need no GPU: enum values, struct layouts, the row-major <-> column-major
mapping, and devchar's configuration ids. Kept apart from the ctypes calls (cublaslt.py) so
all of it is unit-tested on a CPU-only machine.

Values are those of cublasLt.h / cublas_api.h / library_types.h (CUDA 12.x); the tile table
follows cublasLtMatmulTile_t as of CUDA 12.8. A tile id this table does not know (a newer
library) decodes to (0, 0) and the sweep falls back to a nominal tile, flagged in its rows.
"""
from __future__ import annotations

import ctypes
import re

from pipeline.core.errors import DevcharError, UnknownDtypeError


class CublasLtError(DevcharError, RuntimeError):
    """libcublasLt missing, a call that failed (status named), or a config the problem rejects."""


# cublasStatus_t names, for error messages
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
          11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED",
          16: "LICENSE_ERROR"}

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14  # cudaDataType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77  # cublasComputeType_t
OP = {"N": 0, "T": 1}  # cublasOperation_t

# devchar dtype -> (storage type of A/B/C/D, compute type). The scale type (alpha, beta) is
# always CUDA_R_32F: fp32 accumulation for every dtype, as torch does by default.
DTYPES = {
    "float32": (CUDA_R_32F, COMPUTE_32F),
    "tf32": (CUDA_R_32F, COMPUTE_32F_FAST_TF32),  # float32 storage, TF32 tensor-core math
    "bfloat16": (CUDA_R_16BF, COMPUTE_32F),
    "float16": (CUDA_R_16F, COMPUTE_32F),
}

# attribute enums (cublasLtMatmulDescAttributes_t, ...LayoutAttribute_t, ...PreferenceAttributes_t)
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_DEFAULT, EPILOGUE_BIAS = 1, 4
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6  # int32_t, int64_t
PREF_MAX_WORKSPACE_BYTES = 1  # uint64_t
CAP_SPLITK_SUPPORT, CAP_TILE_IDS, CAP_STAGES_IDS = 0, 6, 13

# cublasLtMatmulAlgoConfigAttributes_t -> (value, bytes, signed)
CONFIG_ATTRS = {
    "algo_id": (0, 4, True), "tile_id": (1, 4, False), "split_k": (2, 4, False), "reduction": (3, 4, False),
    "swizzle": (4, 4, False), "custom": (5, 4, False), "stages_id": (6, 4, False),
    "inner_shape": (7, 2, False), "cluster_shape": (8, 2, False),
}
REDUCTION = {0: "none", 1: "inplace", 2: "compute_type", 4: "output_type"}


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: opaque, uint64_t data[8]."""
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (96 bytes on LP64)."""
    _fields_ = [("algo", MatmulAlgo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _tile_table() -> tuple[tuple[int, int], ...]:
    """cublasLtMatmulTile_t, index = enum value. The first 35 are irregular; later ones are
    generated in the header's order, each group skipping tiles an earlier entry already has."""
    first = ("8x8 8x16 16x8 8x32 16x16 32x8 8x64 16x32 32x16 64x8 32x32 32x64 64x32 32x128 64x64 128x32 "
             "64x128 128x64 64x256 128x128 256x64 64x512 128x256 256x128 512x64 64x96 96x64 96x128 128x160 "
             "160x128 192x128 128x192 128x96 32x256 256x32")
    tiles: list[tuple[int, int]] = [(0, 0)] + [tuple(map(int, t.split("x"))) for t in first.split()]
    seen = set(tiles)

    def add(rows: int, cols) -> None:
        for c in cols:
            if (rows, c) not in seen:
                tiles.append((rows, c))
                seen.add((rows, c))

    # rows 8..768 with columns in steps of 64 up to a per-row maximum (enum values 36..311)
    max_cols = {8: 768, 16: 768, 24: 768, 32: 768, 40: 768, 48: 768, 56: 768, 64: 768, 72: 640, 80: 576,
                88: 512, 96: 512, 104: 448, 112: 384, 120: 384, 128: 384, 136: 320, 144: 320, 152: 320}
    max_cols |= {r: 256 for r in range(160, 193, 8)} | {r: 192 for r in range(200, 257, 8)}
    max_cols |= {r: 128 for r in range(264, 385, 8)} | {r: 64 for r in range(392, 769, 8)}
    for rows, top in max_cols.items():
        add(rows, range(64, top + 1, 64))
    # rows 64..768 with columns in steps of 8 (312..630)
    for rows, top in ((64, 760), (128, 512), (192, 336), (256, 256), (320, 200), (384, 168), (448, 144),
                      (512, 128), (576, 112), (640, 96), (704, 88), (768, 80)):
        add(rows, range(8, top + 1, 8))
    add(256, (512, 1024))  # 631, 632
    add(512, (512, 1024))  # 633, 634
    return tuple(tiles)


TILES = _tile_table()
TILE_IDS = {t: i for i, t in enumerate(TILES)}

# cublasLtMatmulStages_t: id -> (stage size, stage count; 0 = AUTO)
STAGES = {0: (0, 0), **{1 + 6 * i + j: (size, j + 1) for i, size in enumerate((16, 32, 64, 128)) for j in range(6)},
          25: (32, 10), 26: (8, 4), 27: (16, 10), 28: (8, 5), 29: (16, 80), 30: (64, 80), 31: (8, 3),
          32: (8, 0), 33: (16, 0), 34: (32, 0), 35: (64, 0), 36: (128, 0), 37: (256, 0)}


def tile_of(tile_id: int) -> tuple[int, int]:
    """(rows, cols) of a cuBLASLt tile id, in cuBLAS's own orientation; (0, 0) if unknown."""
    return TILES[tile_id] if 0 <= tile_id < len(TILES) else (0, 0)


def stages_name(stages_id: int) -> str:
    size, count = STAGES.get(stages_id, (0, -1))
    return "undefined" if stages_id == 0 else f"{size}x{count or 'AUTO'}" if count >= 0 else f"id{stages_id}"


def lt_types(dtype: str) -> tuple[int, int]:
    if dtype not in DTYPES:
        raise UnknownDtypeError(f"unknown dtype {dtype!r} for cuBLASLt; expected one of {sorted(DTYPES)}")
    return DTYPES[dtype]


# -- row-major torch tensors on column-major cuBLASLt ------------------------------------------
# A row-major (r, c) tensor is, byte for byte, a column-major (c, r) matrix: its transpose. So
# out = x' @ w' (row-major, M x N) is computed as out^T = w'^T x'^T, column-major N x M: cuBLAS's
# "A" is torch's second operand w, cuBLAS's "B" the first operand x, and m/n swap. The layout
# label is cuBLAS's (opA, opB) on those swapped operands, the convention under which torch's
# F.linear is "TN":
#   NN: x (M, K) @ w (K, N)        torch.mm / bmm
#   TN: x (M, K) @ w (N, K).T      F.linear (w is the weight)
#   NT: x (K, M).T @ w (K, N)      e.g. a weight gradient
# bmm prepends a batch dimension to x, w and out (strided batch, contiguous tensors).
LAYOUTS = ("NN", "TN", "NT", "TT")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise CublasLtError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return layout


def operand_shapes(layout: str, batch: int, m: int, n: int, k: int) -> tuple[tuple, tuple, tuple]:
    """Torch shapes of (x, w, out) for a layout; batch > 1 prepends the batch dimension."""
    op_a, op_b = check_layout(layout)
    x = (m, k) if op_b == "N" else (k, m)
    w = (k, n) if op_a == "N" else (n, k)
    lead = (batch,) if batch > 1 else ()
    return lead + x, lead + w, lead + (m, n)


def lt_problem(layout: str, batch: int, m: int, n: int, k: int) -> dict:
    """cuBLASLt's view of the torch problem: transposes and the (rows, cols, ld, batch stride)
    of its A (= torch w), B (= torch x) and C = D (= torch out), all column-major."""
    op_a, op_b = check_layout(layout)
    a = (n, k, n) if op_a == "N" else (k, n, k)
    b = (k, m, k) if op_b == "N" else (m, k, m)
    return {"transa": OP[op_a], "transb": OP[op_b], "m": n, "n": m, "k": k, "batch": batch,
            "a": (*a, n * k), "b": (*b, m * k), "c": (n, m, n, m * n)}


def torch_tile(cfg: dict) -> tuple[int, int]:
    """A config's tile along torch's (M, N): cuBLAS's rows run along torch's N (see above)."""
    return cfg["tile_cols"], cfg["tile_rows"]


# -- configuration ids -----------------------------------------------------------------------
_ID_FIELDS = (("a", "algo_id"), ("s", "stages_id"), ("k", "split_k"), ("r", "reduction"), ("z", "swizzle"),
              ("c", "custom"), ("i", "inner_shape"), ("g", "cluster_shape"))
_ID_RE = re.compile(r"^lt-a(-?\d+)-t(\d+)x(\d+)-s(\d+)-k(\d+)-r(\d+)-z(\d+)-c(\d+)-i(\d+)-g(\d+)$")


def config_id(cfg: dict) -> str:
    """Stable name of a configuration: every attribute that selects a kernel, the tile in
    cuBLAS's orientation as its enum names it (lt-a21-t128x256-s36-k1-r0-z0-c0-i0-g0)."""
    rows, cols = tile_of(int(cfg["tile_id"]))
    return (f"lt-a{cfg['algo_id']}-t{rows}x{cols}-s{cfg['stages_id']}-k{cfg['split_k']}-r{cfg['reduction']}"
            f"-z{cfg['swizzle']}-c{cfg['custom']}-i{cfg['inner_shape']}-g{cfg['cluster_shape']}")


def parse_config_id(text: str) -> dict:
    """The attributes named by config_id (tile back to its enum id); CublasLtError if malformed."""
    got = _ID_RE.match(text)
    if not got:
        raise CublasLtError(f"not a cuBLASLt config id: {text!r}")
    vals = [int(v) for v in got.groups()]
    tile = (vals[1], vals[2])
    if tile not in TILE_IDS:
        raise CublasLtError(f"config id {text!r} names tile {tile[0]}x{tile[1]}, which has no cuBLASLt tile id")
    out = {"algo_id": vals[0], "tile_id": TILE_IDS[tile]}
    out.update({name: v for (_, name), v in zip(_ID_FIELDS[1:], vals[3:])})
    return out
