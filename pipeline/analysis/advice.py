"""Shape advice for one model, as rows of the `shape_advice` table and as text: the best
candidate of each searched dimension, the proposals named by hand (the paper's cases), and
a whole-model comparison (Pythia-410M against Pythia-1B). Shared by `devchar advise` and
the `shape_advice` asset; no torch, no dagster."""
from __future__ import annotations

import pandas as pd

from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict import advise
from pipeline.predict.lm_shape import LMShape, from_hf_config
from pipeline.predict.shape_catalog import CASES, Case


def parse_proposals(items) -> dict[str, int]:
    """["heads=20", "vocab=50304"] -> {"heads": 20, "vocab": 50304}; BadShapeError naming a bad item."""
    out = {}
    for item in items or ():
        dim, eq, value = str(item).partition("=")
        if not eq or dim not in advise.DIMENSIONS or not value.strip().lstrip("-").isdigit():
            raise BadShapeError(f"--propose {item!r}: expected DIM=INT with DIM one of {advise.DIMENSIONS}")
        if int(value) <= 0:
            raise BadShapeError(f"--propose {item!r}: {dim} must be positive")
        out[dim] = int(value)
    return out


def proposed_shape(shape: LMShape, batch: int, dim: str, value: int) -> tuple[LMShape, int]:
    if dim == "batch":
        return shape, value
    if dim == "heads":
        width = shape.attn_width
        if width % value:
            raise BadShapeError(f"{shape.name}: attention width {width} is not divisible by {value} heads")
        kv = value if shape.kv_heads == shape.heads else max(1, value * shape.kv_heads // shape.heads)
        return shape.with_(heads=value, kv_heads=kv, head_dim=width // value), batch
    return shape.with_(**{dim: value}), batch


def advise_model(name: str, config: dict, gemm, utility, dtype: str, batch: int, seq: int, tolerance: float,
                 proposals: dict[str, int] | None = None, dims=advise.DIMENSIONS, rank: str = "time"):
    """(shape, search table, summary rows) for one model: the best of each dimension, then
    each proposal (a proposal that is also a dimension's best is one row)."""
    shape = from_hf_config(config, name)
    extra = [(dim, *proposed_shape(shape, batch, dim, v)) for dim, v in (proposals or {}).items()]
    table = advise.search(shape, batch, seq, dtype, gemm, utility, tolerance, dims, extra, rank)
    rows = []
    for _, r in advise.best_per_dimension(table).iterrows():
        both = (proposals or {}).get(r["dimension"]) == int(r["value"])
        rows.append(_row(name, r, "best in budget" + (" + proposal" if both else "")))
    for dim, v in (proposals or {}).items():
        if any(row["dimension"] == dim and row["proposed"] == str(v) for row in rows):
            continue
        r = table[(table["dimension"] == dim) & (table["value"] == v)].iloc[0]
        rows.append(_row(name, r, "proposal"))
    if "ffn" in dims:
        place, n = advise.standing(table, "ffn")
        for row in rows:
            if row["dimension"] == "ffn":
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"original {shape.ffn} is #{place} of {n} sizes by predicted MLP TFLOP/s"
        if not any(row["dimension"] == "ffn" for row in rows):
            rows.append({"model": name, "dimension": "ffn", "original": str(shape.ffn), "proposed": str(shape.ffn),
                         "params_change": 0.0, "predicted_speedup": 1.0, "source": "standing",
                         "note": f"original is #{place} of {n} sizes by predicted MLP TFLOP/s"})
    return shape, table, rows


def _row(name: str, r, source: str) -> dict:
    note = "" if r["in_budget"] else "outside the parameter budget"
    return {"model": name, "dimension": r["dimension"], "original": str(int(r["original"])),
            "proposed": str(int(r["value"])), "params_change": float(r["params_change"]),
            "predicted_speedup": float(r["predicted_speedup"]),
            "speedup_equal_params": float(r["speedup_equal_params"]), "source": source, "note": note}


def against_row(name: str, shape: LMShape, other_name: str, other: LMShape, gemm, utility, dtype: str, batch: int,
                seq: int) -> dict:
    """Another whole model against this one: predicted speed-up per token and parameter change."""
    p = advise.price([(shape, batch), (other, batch)], seq, dtype, gemm, utility)["step_us"].to_numpy()
    return {"model": name, "dimension": "model", "original": name, "proposed": other_name,
            "params_change": other.params() / shape.params() - 1, "predicted_speedup": float(p[0] / p[1]),
            "source": "against", "note": f"{other_name}: {other.layers} layers, {other.heads} heads, "
                                          f"hidden {other.hidden}"}


def catalog_rows(cases: list[Case], gemm, utility, dtype: str, batch: int, seq: int, tolerance: float,
                 progress=None) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """shape_advice rows (without device/run_id) for every case, and each case's search table."""
    by_name = {c.name: c for c in (*CASES, *cases)}
    rows, tables = [], {}
    for i, c in enumerate(cases):
        if progress:
            progress(f"shape_advice: {c.name} ({i + 1}/{len(cases)})")
        try:
            shape, table, got = advise_model(c.name, c.config, gemm, utility, dtype, batch, seq, tolerance, c.propose)
        except MissingModelError as exc:  # e.g. a calibration without rmsnorm or silu: skip, say why
            if progress:
                progress(f"shape_advice: {c.name} skipped: {exc}")
            continue
        if c.against:
            other = from_hf_config(by_name[c.against].config, c.against)
            got.append(against_row(c.name, shape, c.against, other, gemm, utility, dtype, batch, seq))
        rows += got
        tables[c.name] = table
    if not rows:
        raise MissingModelError("shape_advice: the device's models cover none of the catalog's models")
    out = pd.DataFrame(rows)
    return out.assign(dtype=dtype, batch=batch, seq=seq), tables


def format_rows(rows: pd.DataFrame) -> str:
    cols = [c for c in ("model", "dimension", "original", "proposed", "params_change", "predicted_speedup",
                        "speedup_equal_params", "measured_speedup", "verdict", "source", "note") if c in rows]
    fmt = {"params_change": "{:+.2%}".format, "predicted_speedup": "{:.3f}x".format,
           "speedup_equal_params": lambda v: "-" if v != v else f"{v:.3f}x",
           "measured_speedup": lambda v: "-" if v != v else f"{v:.3f}x"}
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        return rows[cols].to_string(index=False, formatters=fmt)
