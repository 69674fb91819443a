"""PNG figures for asset metadata and MLflow: throughput vs K, predicted vs measured."""
from __future__ import annotations

import io

import numpy as np


PANEL_IN = (4.2, 3.2)  # each panel's share of the figure, inches
# Fixed margins and gaps (inches; at 80 dpi 0.9 in holds a six-digit tick label and the axis
# label), not tight_layout: it measures every tick label of every panel, which was a third of a
# figure's time (26 panels: 1.4 of 3.9 s on the Zen 3 VM), every figure of every fit.
MARGIN_IN = {"left": 0.9, "right": 0.2, "bottom": 0.6, "top": 0.35, "wgap": 0.95, "hgap": 0.8}


def new_figure(nplots: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(nplots, 3)
    rows = (nplots + cols - 1) // cols
    w, h = PANEL_IN[0] * cols, PANEL_IN[1] * rows
    fig, axes = plt.subplots(rows, cols, figsize=(w, h), squeeze=False)
    m = MARGIN_IN
    axis_w = (w - m["left"] - m["right"] - (cols - 1) * m["wgap"]) / cols
    axis_h = (h - m["bottom"] - m["top"] - (rows - 1) * m["hgap"]) / rows
    fig.subplots_adjust(left=m["left"] / w, right=1 - m["right"] / w, bottom=m["bottom"] / h, top=1 - m["top"] / h,
                        wspace=m["wgap"] / axis_w, hspace=m["hgap"] / axis_h)
    return plt, fig, axes.ravel()


def label_axes(ax, title: str, xlabel: str, ylabel: str, loglog: bool = True) -> None:
    if loglog:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def to_png(plt, fig, axes, used: int) -> bytes:
    for ax in axes[used:]:  # the grid's spare panels
        ax.axis("off")
    for ax in axes[:used]:
        _drop_minor_ticks(ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def _drop_minor_ticks(ax) -> None:
    """No minor ticks on a log axis spanning over two decades. Over five decades one makes ~60
    minor Tick objects, each laid out (by tight_layout then) and drawn: 12 log-log panels took 7.2 s
    with them and 1.9 s without (2-thread Zen 3 VM), ~50 s of plots in each reference replay.
    A narrower log axis keeps them: under a decade its only labels are the minor ticks'."""
    from matplotlib.ticker import NullLocator

    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = sorted((lo, hi))
        if axis.get_scale() == "log" and lo > 0 and hi / lo > 100:
            axis.set_minor_locator(NullLocator())


def panel_per_group(groups, draw) -> bytes:
    """One panel per (key, frame) in `groups`: draw(ax, key, frame) plots it; a panel with
    labelled lines gets a legend."""
    plt, fig, axes = new_figure(len(groups))
    for ax, (key, g) in zip(axes, groups):
        draw(ax, key, g)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=6)
    return to_png(plt, fig, axes, len(groups))


def throughput_vs_k(train) -> bytes:
    """PM2Lat Fig. 4: throughput vs K, one line per whole-wave count, one panel per (op, dtype)."""
    groups = list(train.groupby(["op", "dtype"]))

    def draw(ax, key, g):
        op, dtype = key
        for w, gw in g.groupby("waves"):
            gw = gw.sort_values("k")
            ax.plot(gw["k"], gw["flops"] / gw["median_us"] / 1e6, marker="o", ms=3, label=f"{w} waves")
        label_axes(ax, f"{op} {dtype}", "K", "TFLOP/s", loglog=False)
        ax.set_xscale("log", base=2)

    return panel_per_group(groups, draw)


def predicted_vs_measured(panels: dict[str, tuple[np.ndarray, np.ndarray]], unit: str = "us") -> bytes:
    """One log-log scatter per panel name: (measured, predicted), with the y = x line."""
    plt, fig, axes = new_figure(len(panels))
    for ax, (name, (meas, pred)) in zip(axes, panels.items()):
        ax.scatter(meas, pred, s=8, alpha=0.7)
        lo = float(min(np.min(meas), np.min(pred)))
        hi = float(max(np.max(meas), np.max(pred)))
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        label_axes(ax, name, f"measured ({unit})", f"predicted ({unit})")
    return to_png(plt, fig, axes, len(panels))


def latency_vs_bytes(samples) -> bytes:
    """Utility ops: measured latency against bytes moved, one panel per op, one colour per dtype."""
    groups = list(samples.groupby("op"))

    def draw(ax, op, g):
        for dtype, gd in g.groupby("dtype"):
            ax.scatter(gd["bytes_read"] + gd["bytes_written"], gd["median_us"], s=8, label=dtype)
        label_axes(ax, op, "bytes moved", "us")

    return panel_per_group(groups, draw)


def attention_throughput_vs_seq(train) -> bytes:
    """Fused attention: throughput vs seq (q = kv) at the smallest batch, one panel per (backend, dtype),
    one line per (head_dim, causal)."""
    groups = list(train.groupby(["backend", "dtype"]))

    def draw(ax, key, g):
        backend, dtype = key
        g = g[g["batch"] == g["batch"].min()]
        for (hd, causal), gl in g.groupby(["head_dim", "causal"]):
            gl = gl.sort_values("seq_q")
            ax.plot(gl["seq_q"], gl["flops"] / gl["median_us"] / 1e6, marker="o", ms=3,
                    ls="--" if causal else "-", label=f"d={hd}{' causal' if causal else ''}")
        label_axes(ax, f"{backend} {dtype} (bh={int(g['batch'].min() * g['heads'].min())})", "seq", "TFLOP/s",
               loglog=False)
        ax.set_xscale("log", base=2)

    return panel_per_group(groups, draw)


def attention_seq_scan_plot(scan, alignment: dict) -> bytes:
    """The kv alignment scan: time vs seq at one shape per (backend, dtype), the multiples of
    the period found (predict/attention_align.py) marked; the title says the period."""
    groups = list(scan.groupby(["backend", "dtype"]))

    def draw(ax, key, g):
        g = g.sort_values("seq_kv")
        ax.plot(g["seq_kv"], g["median_us"], lw=0.8, marker=".", ms=2)
        period = (alignment.get(tuple(key)) or {}).get("period")
        if period:
            on = g[g["seq_kv"] % period == 0]
            ax.plot(on["seq_kv"], on["median_us"], "o", ms=4, label=f"multiples of {period}")
        label_axes(ax, f"{key[0]} {key[1]}: period {period or 'none'}", "seq (q = kv)", "us", loglog=False)

    return panel_per_group(groups, draw)


def t1_after_op_plot(t1, after, shared_us: float) -> bytes:
    """T1 gaps against the previous op's duration (CPU captures), per workload, with the fitted
    slowdown (overheads.AfterOp) drawn on the pooled gap after a short op, `shared_us`."""
    plt, fig, axes = new_figure(1)
    ax = axes[0]
    for w, g in t1.groupby("workload"):
        ax.plot(np.maximum(g["prev_us"], 1.0), np.maximum(g["us"], 0.1), ".", ms=2, alpha=0.4, label=w)
    edges = 2.0 ** np.append(after.log2_us, after.log2_us[-1] + 4)
    ax.step(edges, np.append(after.slowdown, after.slowdown[-1]) * shared_us, where="post", color="k",
            lw=1.5, label="fit: shared gap x slowdown")
    label_axes(ax, "T1 after the previous op", "previous op (us)", "T1 gap (us)")
    ax.legend(fontsize=6)
    return to_png(plt, fig, axes, 1)


def worst_per_bin_plot(worst) -> bytes:
    """PM2Lat Fig. 5: one panel per dtype, the max relative error of each model per FLOP bin."""
    groups = list(worst.groupby("dtype"))

    def draw(ax, dtype, g):
        for model, gm in g.groupby("model"):
            ax.plot(gm["bin_flops"], gm["abs_err"] * 100, marker=".", ms=3, lw=0.8, label=model)
        label_axes(ax, f"GEMM {dtype}", "FLOPs (bin start)", "max relative error (%)")

    return panel_per_group(groups, draw)


def error_distribution_plot(dist) -> bytes:
    """PM2Lat Figs. 6-9: share of predictions per 5 %-wide error bin (the last bin is >= 95 %)."""
    groups = list(dist.groupby("dtype"))

    def draw(ax, dtype, g):
        models = sorted(g["model"].unique())
        width = 0.8 / len(models)
        for i, model in enumerate(models):
            gm = g[g["model"] == model]
            ax.bar(gm["err_bin"] * 5 + (i - len(models) / 2) * width * 5, gm["share"] * 100, width=width * 5,
                   label=model, align="edge")
        label_axes(ax, f"GEMM {dtype}", "relative error (%, 5 % bins)", "share of predictions (%)", loglog=False)

    return panel_per_group(groups, draw)


def step_time_vs_batch(pred) -> bytes:
    """Per config: measured step time against batch size, with one line per predictor."""
    groups = list(pred.groupby("config"))

    def draw(ax, config, g):
        m = g.drop_duplicates("batch").sort_values("batch")
        ax.plot(m["batch"], m["measured_ms"], "ko-", label="measured")
        for p, gp in g.groupby("predictor", sort=False):
            gp = gp.sort_values("batch")
            ax.plot(gp["batch"], gp["predicted_ms"], "--", marker=".", label=p)
        ax.set_xscale("log", base=2)
        label_axes(ax, config, "batch", "ms per step")

    return panel_per_group(groups, draw)


def advice_plot(table, title: str = "") -> bytes:
    """Co-design paper Figs. 5-10 style: predicted throughput against each searched dimension,
    one panel per dimension (MLP TFLOP/s for the intermediate size, tokens/s of the whole step
    otherwise), the original value marked, and measured points where the table has them."""
    groups = [(d, g.sort_values("value")) for d, g in table.groupby("dimension", sort=False)]
    plt, fig, axes = new_figure(len(groups))
    for ax, (dim, g) in zip(axes, groups):
        mlp = dim == "ffn"
        y = g["mlp_tflops"] if mlp else 1e6 / g["us_per_token"]
        ax.plot(g["value"], y, marker="." if len(g) < 60 else None, ms=4, lw=0.8, label="predicted")
        orig = g[g["is_original"]]
        ax.scatter(orig["value"], (orig["mlp_tflops"] if mlp else 1e6 / orig["us_per_token"]), c="k", s=25,
                   zorder=3, label="original")
        if "measured_us_per_token" in g and g["measured_us_per_token"].notna().any() and not mlp:
            m = g[g["measured_us_per_token"].notna()]
            ax.scatter(m["value"], 1e6 / m["measured_us_per_token"], marker="x", c="r", s=30, zorder=4,
                       label="measured")
        label_axes(ax, f"{title} {dim}".strip(), dim, "MLP TFLOP/s" if mlp else "tokens/s", loglog=False)
        ax.legend(fontsize=6)
    return to_png(plt, fig, axes, len(groups))
