"""How well the machine repeated its held-out GEMM, utility and memory-kernel timings (harness/repeat.py), beside the
model's held-out error on the same groups: the part of an error no model of shapes can remove."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.predict.evaluate import layer_type


def repeat_spread(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (layer_type, dtype) of the rows timed twice (a row's own `layer_type` where it has one,
    else PM2Lat's type of its op): n, `repeat_err` (mean |second / first - 1|)
    and `repeat_ratio` (median second / first: above 1, the machine ran slower the second time).
    Rows whose either timing stalled are left out. Empty without the `repeat_us` column."""
    cols = ["layer_type", "dtype", "n", "repeat_err", "repeat_ratio"]
    if "repeat_us" not in samples:
        return pd.DataFrame(columns=cols)
    r = samples[pd.to_numeric(samples["repeat_us"], errors="coerce").notna()]
    for flag in ("stalled", "repeat_stalled"):
        if flag in r:
            r = r[~r[flag].fillna(False).astype(bool)]
    if r.empty:
        return pd.DataFrame(columns=cols)
    ratio = r["repeat_us"].astype(float) / r["median_us"].astype(float)
    kind = r["op"].map(layer_type)  # rows that name their layer type (memory kernels) keep it
    kind = r["layer_type"].fillna(kind) if "layer_type" in r else kind
    r = r.assign(layer_type=kind, ratio=ratio, dev=np.abs(ratio - 1.0))
    out = r.groupby(["layer_type", "dtype"]).agg(n=("ratio", "size"), repeat_err=("dev", "mean"),
                                                 repeat_ratio=("ratio", "median")).reset_index()
    return out[cols]


def repeat_section(samples: pd.DataFrame, errors: pd.DataFrame | None) -> list[str]:
    """The summary's lines: the spread per group, with devchar's held-out mean error where
    `errors` (model_errors rows of devchar: layer_type, dtype, mean_rel_err) has it."""
    spread = repeat_spread(samples)
    if spread.empty:
        return []
    if errors is not None and not errors.empty:
        own = errors[["layer_type", "dtype", "mean_rel_err"]].rename(columns={"mean_rel_err": "heldout_err"})
        spread = spread.merge(own, on=["layer_type", "dtype"], how="left")
    fmt = {c: "{:.1%}".format for c in ("repeat_err", "heldout_err") if c in spread}
    fmt["repeat_ratio"] = "{:.2f}x".format
    return ["\n-- how well this machine repeats itself: held-out rows timed again at the sweep's end --",
            spread.to_string(index=False, formatters=fmt, na_rep="-"),
            "repeat_err: mean |second / first - 1| of the same shapes with the same harness. A held-out "
            "error near it is what this machine's timings let any model score; well above it, the model's own."]
