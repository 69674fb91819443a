"""`devchar advise`: a causal LM's shape against a device (co-design paper, sections V-VII;
PM2Lat IV-D's use of a fast predictor to search shapes). No torch: numpy over saved models.

explain(): every GEMM of one layer and of the LM head with its tile and wave quantization,
read from the device's own kernel tables (the kernel the selector picks for the shape, its
tile_m x tile_n, its slots: SMs on a GPU, threads on a CPU), its 128-byte alignment, and its
share of the predicted step. search(): nearby shapes within a parameter budget, one
dimension at a time (heads, hidden, MLP intermediate size, vocabulary, micro-batch), each
priced as a whole forward step (GEMMs + utility ops, PM2Lat's kernel sum) and ranked by
predicted step time per token.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, check_dims
from pipeline.core.ops import GemmOp
from pipeline.predict.geometry import blocks as count_blocks
from pipeline.predict.lm_shape import LMShape

DIMENSIONS = ("heads", "hidden", "ffn", "vocab", "batch")
HEAD_DIM_STEP = 64  # the paper's rule: head dimension a multiple of 64
MAX_CANDIDATES = 4096
RANK_KEYS = {"time": "predicted_speedup", "efficiency": "speedup_equal_params"}  # per dimension; the brute-force step grows past this


def alignment(dtype: str) -> int:
    """Elements in 128 bytes (the paper's A100 tensor-core rule): 64 for 16-bit types, 32 for tf32/fp32."""
    return 128 // element_bytes(check_dtype(dtype))


def largest_pow2_divisor(x: int) -> int:
    return int(x & -x)


def _check(dtype, batch, seq, tolerance):
    check_dtype(dtype)
    check_dims(batch=batch, seq=seq)
    if not 0 < tolerance < 1:
        raise BadShapeError(f"parameter tolerance {tolerance} must lie in (0, 1), e.g. 0.02 for ±2 %")


def price(cands: list[tuple[LMShape, int]], seq: int, dtype: str, gemm, utility) -> pd.DataFrame:
    """Per candidate (shape, batch): predicted step µs (GEMMs + utility ops), its MLP µs and
    GEMM µs, vectorized: one predict call per (kind, op) over every candidate's ops."""
    rows = []
    for i, (shape, b) in enumerate(cands):
        for o in shape.ops(b, seq):
            if isinstance(o, GemmOp):
                rows.append((i, o.name, "gemm", o.op, o.m, o.n, o.k, o.batch, o.count))
            else:
                rows.append((i, o.name, "util", o.op, o.rows, o.cols, 0, 0, o.count))
    df = pd.DataFrame(rows, columns=["cand", "name", "kind", "op", "a", "b", "c", "d", "count"])
    us = np.empty(len(df))
    for (kind, op), g in df.groupby(["kind", "op"]):
        if kind == "gemm":
            us[g.index] = gemm.predict(op, dtype, g["a"].to_numpy(), g["b"].to_numpy(), g["c"].to_numpy(),
                                       g["d"].to_numpy())
        else:
            us[g.index] = utility.predict(op, dtype, g["a"].to_numpy(), g["b"].to_numpy())
    df["us"] = us * df["count"]
    out = pd.DataFrame({"step_us": df.groupby("cand")["us"].sum()})
    out["gemm_us"] = df[df["kind"] == "gemm"].groupby("cand")["us"].sum()
    out["mlp_us"] = df[df["name"].str.startswith("mlp.")].groupby("cand")["us"].sum()
    return out.reindex(range(len(cands))).fillna(0.0)


def explain(shape: LMShape, batch: int, seq: int, dtype: str, gemm, utility) -> pd.DataFrame:
    """One row per GEMM of a layer and of the LM head: shape, kernel, tile, blocks, waves,
    tail-wave utilisation, tile efficiency (useful / padded outputs), the dimensions that
    break the 128-byte alignment, predicted µs (all layers) and share of the predicted step."""
    _check(dtype, batch, seq, 0.5)
    step = float(price([(shape, batch)], seq, dtype, gemm, utility)["step_us"].iloc[0])
    align, rows = alignment(dtype), []
    for o in shape.gemms(batch, seq):
        kernel = gemm.selector.predict(o.op, dtype, o.m, o.n, o.k, o.batch)[0] if hasattr(gemm, "selector") else None
        t = gemm.table(o.op, dtype, kernel)
        nb = int(count_blocks(o.m, o.n, o.batch, t.tile_m, t.tile_n, t.split_k))
        waves = -(-nb // t.slots)
        tail = (nb - (waves - 1) * t.slots) / t.slots
        padded = -(-o.m // t.tile_m) * t.tile_m * -(-o.n // t.tile_n) * t.tile_n
        us = float(gemm.predict(o.op, dtype, o.m, o.n, o.k, o.batch)) * o.count
        misaligned = [f"{d}={v}" for d, v in (("n", o.n), ("k", o.k)) if v % align]
        rows.append({"gemm": o.name, "op": o.op, "m": o.m, "n": o.n, "k": o.k, "batch": o.batch, "count": o.count,
                     "kernel": t.kernel, "tile": f"{t.tile_m}x{t.tile_n}", "slots": t.slots, "blocks": nb,
                     "waves": waves, "tail_util": tail, "tile_eff": o.m * o.n / padded,
                     "aligned": "yes" if not misaligned else "no: " + ", ".join(misaligned),
                     "pow2": min(largest_pow2_divisor(o.n), largest_pow2_divisor(o.k)),
                     "tflops": 2.0 * o.batch * o.m * o.n * o.k * o.count / us / 1e6, "us": us, "share": us / step})
    return pd.DataFrame(rows)


def _within(shape: LMShape, p0: int, tolerance: float) -> bool:
    return abs(shape.params() / p0 - 1) <= tolerance + 1e-12


def _heads(shape: LMShape) -> list[LMShape]:
    """Head counts a' with head_dim = attn_width / a' a multiple of 64, within 2x of the
    original count (nearby: fewer heads are always faster, and cost accuracy); the key/value
    group size is kept (kv = a' / group) where it divides."""
    width, group, out = shape.attn_width, shape.heads // shape.kv_heads, []
    for a in range(max(1, shape.heads // 2), 2 * shape.heads + 1):
        if width % a or (width // a) % HEAD_DIM_STEP or a % group:
            continue
        kv = a if shape.kv_heads == shape.heads else a // group
        out.append(shape.with_(heads=a, kv_heads=kv, head_dim=width // a))
    return out


def _hidden(shape: LMShape, p0: int, tolerance: float) -> list[LMShape]:
    out = []
    lo, hi = int(shape.hidden * (1 - tolerance)), int(np.ceil(shape.hidden * (1 + tolerance)))
    ratio = shape.ffn == 4 * shape.hidden  # a derived 4h MLP follows the hidden size
    for h in range(max(1, lo), hi + 1):
        if not shape.explicit_head_dim and h % shape.heads:
            continue
        s = shape.with_(hidden=h, **({"ffn": 4 * h} if ratio else {}))
        if _within(s, p0, tolerance):
            out.append(s)
    return out


def _ffn(shape: LMShape, p0: int, tolerance: float) -> list[LMShape]:
    """Every intermediate size within the budget (the paper's VII-B brute force)."""
    per_unit = shape.with_(ffn=shape.ffn + 1).params() - shape.params()
    reach = int(tolerance * p0 // per_unit)
    step = max(1, (2 * reach + 1) // MAX_CANDIDATES + 1)
    sizes = sorted({*range(max(1, shape.ffn - reach), shape.ffn + reach + 1, step), shape.ffn})
    return [shape.with_(ffn=f) for f in sizes if _within(shape.with_(ffn=f), p0, tolerance)]


def _vocab(shape: LMShape, p0: int, tolerance: float) -> list[LMShape]:
    """The vocabulary padded up to multiples of 2, 4, ... 1024 (padding rows are never sampled)."""
    sizes = sorted({-(-shape.vocab // m) * m for m in (2 ** i for i in range(1, 11))} | {shape.vocab})
    return [s for s in (shape.with_(vocab=v) for v in sizes) if _within(s, p0, tolerance)]


def _batches(batch: int) -> list[int]:
    return sorted({b for b in (batch // 4, batch // 2, batch, 2 * batch, 4 * batch) if b >= 1})


def candidates(shape: LMShape, batch: int, tolerance: float, dims=DIMENSIONS) -> list[tuple[str, LMShape, int]]:
    """(dimension, shape, batch) for every nearby candidate, the original once per dimension."""
    p0, out = shape.params(), []
    for dim in dims:
        if dim not in DIMENSIONS:
            raise BadShapeError(f"unknown dimension {dim!r}; expected some of {DIMENSIONS}")
        if dim == "batch":
            out += [(dim, shape, b) for b in _batches(batch)]
            continue
        found = {"heads": lambda: _heads(shape), "hidden": lambda: _hidden(shape, p0, tolerance),
                 "ffn": lambda: _ffn(shape, p0, tolerance), "vocab": lambda: _vocab(shape, p0, tolerance)}[dim]()
        if shape not in found:
            found = [shape] + found
        out += [(dim, s, batch) for s in found]
    return out


def value_of(dim: str, shape: LMShape, batch: int) -> int:
    return batch if dim == "batch" else getattr(shape, dim)


def search(shape: LMShape, batch: int, seq: int, dtype: str, gemm, utility, tolerance: float = 0.02,
           dims=DIMENSIONS, extra: list[tuple[str, LMShape, int]] = (), rank: str = "time") -> pd.DataFrame:
    """Every candidate priced: dimension, value, original value, params and their change,
    predicted step µs, µs per token, speed-up per token over the original, MLP µs and MLP
    TFLOP/s, speed-up at equal parameters, and the rank (1 = best, over all dimensions) by µs
    per token (rank="time") or by speed-up at equal parameters (rank="efficiency"). `extra`: more
    (dimension, shape, batch) to price beside the search (a proposal named by hand, which
    may lie outside the budget: its in_budget says so)."""
    _check(dtype, batch, seq, tolerance)
    if rank not in RANK_KEYS:
        raise BadShapeError(f"unknown ranking {rank!r}; expected one of {sorted(RANK_KEYS)}")
    cands = candidates(shape, batch, tolerance, dims) + list(extra)
    priced = price([(s, b) for _, s, b in cands] + [(shape, batch)], seq, dtype, gemm, utility)
    base = priced.iloc[-1]
    p0, base_tok = shape.params(), base["step_us"] / (batch * seq)
    rows = []
    for (dim, s, b), (_, p) in zip(cands, priced.iloc[:-1].iterrows()):
        tok = p["step_us"] / (b * seq)
        mlp_flops = 2.0 * b * seq * shape.layers * s.hidden * s.ffn * (3 if s.gated else 2)
        rows.append({"dimension": dim, "value": value_of(dim, s, b), "original": value_of(dim, shape, batch),
                     "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim, "hidden": s.hidden,
                     "ffn": s.ffn, "vocab": s.vocab, "batch": b, "params": s.params(),
                     "params_change": s.params() / p0 - 1, "in_budget": _within(s, p0, tolerance),
                     "step_us": p["step_us"], "us_per_token": tok, "predicted_speedup": base_tok / tok,
                     "mlp_us": p["mlp_us"], "mlp_tflops": mlp_flops / p["mlp_us"] / 1e6 if p["mlp_us"] else np.nan,
                     "is_original": s == shape and b == batch})
    df = pd.DataFrame(rows).drop_duplicates(["dimension", "value"])
    # speed-up at equal parameters: throughput per parameter, the paper's figures' view
    df["speedup_equal_params"] = df["predicted_speedup"] * (1 + df["params_change"])
    key = RANK_KEYS[rank]
    df["rank"] = (-df[key]).rank(method="min").astype(int)
    return df.sort_values(["rank", "dimension"]).reset_index(drop=True)


def best_per_dimension(table: pd.DataFrame) -> pd.DataFrame:
    """The best-ranked in-budget candidate of each dimension that is not the original."""
    t = table[~table["is_original"] & table["in_budget"]]
    return t.sort_values("rank").groupby("dimension", sort=False).head(1).reset_index(drop=True)


def standing(table: pd.DataFrame, dim: str, by: str = "mlp_tflops") -> tuple[int, int]:
    """(place of the original, candidates) in one dimension by `by`, highest first (the paper's
    'among the best performing sizes in its range' for Llama-2-7B's intermediate size)."""
    t = table[table["dimension"] == dim].sort_values(by, ascending=False).reset_index(drop=True)
    return int(t.index[t["is_original"]][0]) + 1, len(t)


def shape_for(table_row, shape: LMShape) -> LMShape:
    """The LMShape a search row describes."""
    return shape.with_(heads=int(table_row["heads"]), kv_heads=int(table_row["kv_heads"]),
                       head_dim=int(table_row["head_dim"]), hidden=int(table_row["hidden"]),
                       ffn=int(table_row["ffn"]), vocab=int(table_row["vocab"]))
