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


# Element-count edges of the bands bias_by_dim reports: powers of 4, the spacing of the CPU GEMM
# sweep's aspect lattice, so each band holds one lattice step and the shapes between.
DIM_BAND_EDGES = (1, 4, 16, 64, 256)
GEMM_LAYERS = ("MM", "BMM", "Linear")


def dim_band(values) -> pd.Categorical:
    """'1-3', '4-15', '16-63', '64-255', '256+' by DIM_BAND_EDGES."""
    edges = list(DIM_BAND_EDGES)
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])] + [f"{edges[-1]}+"]
    return pd.cut(np.asarray(values, float), edges + [np.inf], right=False, labels=labels)


def bias_by_dim(pred: pd.DataFrame, dims: tuple[str, ...] = ("m", "n", "k")) -> pd.DataFrame:
    """Held-out GEMM rows (gemm_predictions: layer_type, dtype, m, n, k, predicted_us, median_us, rel_err) by
    the size of each dimension: per (layer type, dtype, dim, band) the rows, their mean |relative
    error| and the geometric mean of predicted / measured.

    Noise moves a ratio both ways, so a band whose geometric mean sits off 1 marks a bias the
    tables carry there. On the ten CPU data sets of 2026-11-29 (float32), N of 4-15 read 0.71 in
    MM and 0.74 in Linear, N of 16 and more 0.94-1.02 (docs/methods.md, stop 51)."""
    base = pred["layer_type"].str.removesuffix(" cold")
    g = pred[base.isin(GEMM_LAYERS)]
    g = g.assign(log_ratio=np.log(g["predicted_us"].to_numpy(float) / g["median_us"].to_numpy(float)),
                 abs_err=g["rel_err"].abs())
    out = []
    for dim in dims:
        per = g.assign(dim=dim, band=dim_band(g[dim])).groupby(["layer_type", "dtype", "dim", "band"], observed=True)
        out.append(per.agg(n=("abs_err", "size"), mean_abs_err=("abs_err", "mean"), log_ratio=("log_ratio", "mean")))
    t = pd.concat(out).reset_index()
    return t.assign(ratio_geomean=np.exp(t.pop("log_ratio")))


def bias_pivot(bias: pd.DataFrame) -> pd.DataFrame:
    """bias_by_dim as one row per (layer type, dtype, dim), a column of ratio_geomean per band
    (empty where the band held no row)."""
    t = bias.pivot_table(index=["layer_type", "dtype", "dim"], columns="band", values="ratio_geomean", observed=True)
    t.columns = [str(c) for c in t.columns]
    return t.reset_index()
