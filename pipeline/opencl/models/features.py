"""Per-launch static features for the trees (opencl_features): AST counts with loop trip
counts resolved from the launch's scalar arguments, argument sizes, and the NDRange.

Nothing here runs the kernel: like the LLMPerf prompt, the features use only the source and
the launch settings (sizes of buffers, values of scalars, gsize, lsize). Counts are per
work-item; the *_total columns multiply by gsize, which is what a memory- or compute-bound
launch costs. Sizes enter as log2, which is how their effect on time scales.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.opencl.models.ast_counts import kernel_events, type_bytes
from pipeline.opencl.models.prompts import parse_args

CATEGORIES = ("global_load", "global_store", "global_load_bytes", "global_store_bytes", "local_load", "local_store",
              "local_load_bytes", "local_store_bytes", "arith_float", "arith_double", "arith_int", "math", "branch",
              "barrier", "atomic", "loop")
TOTALS = ("global_load", "global_store", "global_load_bytes", "global_store_bytes", "arith_float", "arith_int",
          "math", "atomic")
SHAPE = ("log2_gsize", "log2_lsize", "log2_work_groups", "wg_per_cu", "log2_global_bytes", "log2_local_bytes",
         "log2_max_buffer_elems", "log2_max_scalar", "n_args", "n_loops_static", "n_loops_param", "n_loops_unknown",
         "max_loop_depth", "source_lines", "parse_failed")
FEATURES = CATEGORIES + tuple(f"log2_{c}_total" for c in TOTALS) + SHAPE
UNKNOWN_TRIP = 1  # an unresolvable loop counts its body once; n_loops_unknown tells the trees it happened


def _log2(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


def resolve_trip(loop: tuple, scalars: dict) -> float:
    if loop[0] == "static":
        return float(loop[1])
    if loop[0] == "param" and loop[1] in scalars:
        _, name, start, step, inclusive = loop
        return max(0.0, math.ceil((float(scalars[name]) + inclusive - start) / step))
    return float(UNKNOWN_TRIP)


def kernel_summary(source: str, name: str, parse) -> tuple[dict, bool]:
    """Events of kernel `name` in the source (or of its first kernel when no kernel has that
    name); ({}, True) when libclang cannot parse it, so one odd kernel costs its AST
    features (NaN-free zeros plus parse_failed = 1), not the whole fit."""
    from pipeline.core.errors import DevcharError

    for pick in (name, None):
        try:
            _, cursor = parse(source, pick)
            return dict(kernel_events(cursor)), False
        except DevcharError:
            continue
    return {}, True


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def launch_features(events: dict, parse_failed: bool, args, gsize: int, lsize: int, compute_units: int,
                    source: str) -> list[float]:
    args = parse_args(args)
    scalars = {a["name"]: _number(a.get("value")) for a in args if a["kind"] == "scalar"}
    scalars = {k: v for k, v in scalars.items() if v is not None}
    counts = dict.fromkeys(CATEGORIES, 0.0)
    loops_seen: set = set()
    depth = 0
    for (cat, loops), amount in events.items():
        counts[cat] = counts.get(cat, 0.0) + amount * float(np.prod([resolve_trip(lp, scalars) for lp in loops]))
        loops_seen.update(loops)
        depth = max(depth, len(loops))
    kinds = [lp[0] for lp in loops_seen]
    buffers = [a for a in args if a["kind"] != "scalar"]
    glob = sum(a["elements"] * type_bytes(a["type"]) for a in buffers if a["kind"] == "global")
    loc = sum(a["elements"] * type_bytes(a["type"]) for a in buffers if a["kind"] == "local")
    work_groups = max(1, int(gsize) // max(1, int(lsize)))
    shape = [_log2(gsize), _log2(lsize), _log2(work_groups), work_groups / max(1, int(compute_units)), _log2(glob),
             _log2(loc), _log2(max([a["elements"] for a in buffers], default=0)),
             _log2(max([abs(v) for v in scalars.values()], default=0)), len(args), kinds.count("static"),
             kinds.count("param"), kinds.count("unknown"), depth, source.count("\n") + 1, float(parse_failed)]
    totals = [_log2(counts[c] * gsize) for c in TOTALS]
    return [counts[c] for c in CATEGORIES] + totals + shape


def feature_matrix(rows: pd.DataFrame, parse=None) -> np.ndarray:
    """One row of FEATURES per launch; the AST is walked once per distinct source."""
    if parse is None:
        from pipeline.opencl.sweep.clang_ast import parse_kernel as parse
    cache: dict[str, tuple[dict, bool]] = {}
    out = []
    for r in rows[["source", "args", "gsize", "lsize", "compute_units", "kernel_name"]].itertuples(index=False):
        key = (r.source, r.kernel_name)
        if key not in cache:
            cache[key] = kernel_summary(r.source, r.kernel_name, parse)
        out.append(launch_features(*cache[key], r.args, r.gsize, r.lsize, r.compute_units, r.source))
    return np.asarray(out, dtype=float)
