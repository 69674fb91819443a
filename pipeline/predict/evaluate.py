"""Held-out evaluation: predictions beside measurements, and PM2Lat Table II style summaries."""
from __future__ import annotations

import pandas as pd

from pipeline.predict.attention import AttentionModel
from pipeline.predict.embedding import predict_rows
from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_grids import is_cold
from pipeline.predict.metrics import rel_err, summarize
from pipeline.predict.utility import UtilityModel

GEMM_LAYER = {"mm": "MM", "bmm": "BMM", "linear": "Linear"}


def layer_type(op: str) -> str:
    """PM2Lat's layer types: BMM, MM, Linear, SoftMax and Vector (every other memory-bound op)."""
    return GEMM_LAYER.get(op, "Softmax" if op == "softmax" else "Vector")


COLD_SUFFIX = " cold"  # op and layer type of the held-out shapes timed with rotated weights


def gemm_predictions(model: GemmModel, samples: pd.DataFrame) -> pd.DataFrame:
    """Held-out GEMM rows with predicted_us. Rows timed with their weights rotated through
    memory (grid cold_heldout, CPU) are priced wholly cold and reported as their own op
    ("linear cold", layer type "Linear cold"), apart from the hot ones PM2Lat's Table II holds."""
    out = []
    for (op, dtype, cold), g in samples.assign(_cold=is_cold(samples)).groupby(["op", "dtype", "_cold"]):
        g = g.assign(predicted_us=model.predict(op, dtype, g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(),
                                                g["batch"].to_numpy(), cold=1.0 if cold else None))
        out.append(g.assign(op=op + COLD_SUFFIX) if cold else g)
    df = pd.concat(out).drop(columns="_cold")
    return _with_err(df).assign(layer_type=lambda d: d["op"].map(
        lambda o: layer_type(o.removesuffix(COLD_SUFFIX)) + (COLD_SUFFIX if o.endswith(COLD_SUFFIX) else "")))


def utility_predictions(model: UtilityModel, samples: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (op, dtype), g in samples.groupby(["op", "dtype"]):
        out.append(g.assign(predicted_us=model.predict(op, dtype, g["rows"].to_numpy(), g["cols"].to_numpy())))
    return _with_err(pd.concat(out))


def attention_predictions(model: AttentionModel, samples: pd.DataFrame) -> pd.DataFrame:
    """Held-out attention rows with predicted_us; op = the SDPA backend, layer type "Attention" (PM2Lat Table VI)."""
    out = []
    for (backend, dtype), g in samples.groupby(["backend", "dtype"]):
        out.append(g.assign(predicted_us=model.predict(backend, dtype, *(g[c].to_numpy() for c in (
            "batch", "heads", "seq_q", "seq_kv", "head_dim", "causal")))))
    df = pd.concat(out).assign(op=lambda d: d["backend"])
    return df.assign(rel_err=rel_err(df["predicted_us"], df["median_us"]), layer_type="Attention")


def _with_err(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(rel_err=rel_err(df["predicted_us"], df["median_us"]), layer_type=df["op"].map(layer_type))


def error_table(pred: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in pred.groupby(by):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), **summarize(g["predicted_us"], g["median_us"])})
    return pd.DataFrame(rows)


def embedding_predictions(model, samples: pd.DataFrame) -> pd.DataFrame:
    """Held-out EmbeddingBag rows with predicted_us (hit-rate model; cold rows with the cold fits);
    op = direction, layer type EL-F/EL-B."""
    out = []
    for (direction, dtype), g in samples.groupby(["direction", "dtype"]):
        pred = predict_rows(model, direction, dtype, g)
        out.append(g.assign(predicted_us=pred, op=direction, layer_type="EL-" + direction[0].upper()))
    df = pd.concat(out)
    return df.assign(rel_err=rel_err(df["predicted_us"], df["median_us"]))


def memory_predictions(model, samples: pd.DataFrame) -> pd.DataFrame:
    """Held-out memory-kernel rows with predicted_us; layer type = the DLRM paper's Table IV name."""
    from pipeline.predict.memory import OP_DIMS, kernel_name

    out = []
    for (op, dtype), g in samples.groupby(["op", "dtype"]):
        pred = model.predict(op, dtype, **{d: g[d].to_numpy() for d in OP_DIMS[op]})
        out.append(g.assign(predicted_us=pred, layer_type=kernel_name(op)))
    df = pd.concat(out)
    return df.assign(rel_err=rel_err(df["predicted_us"], df["median_us"]))
