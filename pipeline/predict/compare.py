"""devchar against its baselines on the same held-out shapes (PM2Lat Table II, Figs. 5-9)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.predict.evaluate import error_table, layer_type
from pipeline.predict.metrics import rel_err

ERROR_BINS = np.append(np.arange(0.0, 1.0, 0.05), np.inf)  # 5 % wide, the last one ">= 95 %"


class DevcharPair:
    """devchar's GEMM and utility models behind the baselines' interface."""

    name = "devchar"

    def __init__(self, gemm, utility):
        self.gemm, self.utility = gemm, utility

    def predict_gemm(self, op, dtype, m, n, k, batch):
        return self.gemm.predict(op, dtype, m, n, k, batch)

    def predict_utility(self, op, dtype, rows, cols):
        return self.utility.predict(op, dtype, rows, cols)


def held_out_predictions(models: dict, gemm_held: pd.DataFrame, util_held: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, held-out sample): predicted_us beside median_us, with `domain`
    (FLOPs for GEMMs, bytes moved for utility ops) for the worst-case-per-bin plot."""
    parts = []
    for name, model in models.items():
        for (op, dtype), g in gemm_held.groupby(["op", "dtype"]):
            pred = model.predict_gemm(op, dtype, g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(),
                                      g["batch"].to_numpy())
            parts.append(g.assign(model=name, predicted_us=pred, domain=g["flops"].astype(float)))
        for (op, dtype), g in util_held.groupby(["op", "dtype"]):
            pred = model.predict_utility(op, dtype, g["rows"].to_numpy(), g["cols"].to_numpy())
            parts.append(g.assign(model=name, predicted_us=pred,
                                  domain=(g["bytes_read"] + g["bytes_written"]).astype(float)))
    df = pd.concat(parts, ignore_index=True)
    cols = ["model", "op", "dtype", "domain", "predicted_us", "median_us"]
    return df[cols].assign(layer_type=df["op"].map(layer_type), rel_err=rel_err(df["predicted_us"], df["median_us"]))


def table_ii(pred: pd.DataFrame) -> pd.DataFrame:
    """Mean and max relative error per model x layer type x dtype."""
    return error_table(pred, ["model", "layer_type", "dtype"])


def worst_per_bin(pred: pd.DataFrame, bins: int = 100) -> pd.DataFrame:
    """PM2Lat Fig. 5: the input domain (log FLOPs, GEMMs only) cut into `bins` bins; the
    maximum relative error of each model in each non-empty bin."""
    g = pred[pred["layer_type"].isin(["MM", "BMM", "Linear"])]
    edges = np.logspace(np.log10(g["domain"].min()), np.log10(g["domain"].max()) + 1e-9, bins + 1)
    idx = np.clip(np.searchsorted(edges, g["domain"], side="right") - 1, 0, bins - 1)
    out = g.assign(bin=idx, abs_err=g["rel_err"].abs()).groupby(["model", "dtype", "bin"])["abs_err"].max()
    return out.reset_index().assign(bin_flops=lambda d: edges[d["bin"]])


def error_distribution(pred: pd.DataFrame) -> pd.DataFrame:
    """PM2Lat Figs. 6-9: share of GEMM predictions per 5 %-wide relative-error bin, per model and dtype."""
    g = pred[pred["layer_type"].isin(["MM", "BMM", "Linear"])]
    cut = pd.cut(g["rel_err"].abs(), ERROR_BINS, right=False, labels=False)
    counts = g.assign(err_bin=cut).groupby(["model", "dtype", "err_bin"]).size()
    share = counts / counts.groupby(level=["model", "dtype"]).transform("sum")
    return share.rename("share").reset_index()
