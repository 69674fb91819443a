"""LLMPerf Fig. 2: predicted and measured time over input size, one panel per benchmark kernel."""
from __future__ import annotations

import pandas as pd

from pipeline.analysis.plots import new_figure, label_axes, to_png

MARKERS = {"opencl_lm": "^", "opencl_scratch": "s", "opencl_features": "x"}


def time_over_input_size(bench: pd.DataFrame) -> bytes:
    """bench: benchmark launches with kernel_name, input_size, median_us, and one predicted
    column per model named predicted_us_<model>. Measured in blue, predictions in red shades."""
    kernels = sorted(bench["kernel_name"].unique())
    plt, fig, axes = new_figure(max(1, len(kernels)))
    models = [c.removeprefix("predicted_us_") for c in bench if c.startswith("predicted_us_")]
    for ax, name in zip(axes, kernels):
        g = bench[bench["kernel_name"] == name].groupby("input_size").median(numeric_only=True).reset_index()
        ax.plot(g["input_size"], g["median_us"], "o-", color="tab:blue", ms=4, label="measured")
        for i, m in enumerate(models):
            ax.plot(g["input_size"], g[f"predicted_us_{m}"], marker=MARKERS.get(m, "."), ls="--", ms=4, lw=0.8,
                    color=plt.cm.Reds(0.5 + 0.2 * i), label=m.removeprefix("opencl_"))
        label_axes(ax, name, "input size", "time (us)")
        ax.legend(fontsize=6)
    return to_png(plt, fig, axes, len(kernels))
