"""The asset plots (analysis/plots.py): each renders a PNG from the frame its asset passes it."""
import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import plots

PNG = b"\x89PNG\r\n\x1a\n"


def gemm_rows():
    return pd.DataFrame([dict(op=op, dtype="float32", waves=w, k=k, flops=2.0 * 64 * 64 * k, median_us=1.0 + k * w)
                         for op in ("mm", "bmm") for w in (1, 2) for k in (32, 64, 128)])


FRAMES = {
    "throughput_vs_k": lambda: gemm_rows(),
    "latency_vs_bytes": lambda: pd.DataFrame(dict(op=["add", "add", "gelu"], dtype=["float32", "bfloat16", "float32"],
                                                  bytes_read=[1e3, 2e3, 4e3], bytes_written=[1e3, 1e3, 2e3],
                                                  median_us=[1.0, 2.0, 3.0])),
    "attention_throughput_vs_seq": lambda: pd.DataFrame(dict(
        backend="math", dtype="float32", batch=[1, 1, 2], heads=2, head_dim=64, causal=[False, True, False],
        seq_q=[128, 256, 128], flops=[1e9, 4e9, 2e9], median_us=[10.0, 30.0, 18.0])),
    "worst_per_bin_plot": lambda: pd.DataFrame(dict(dtype="float32", model=["devchar", "devchar", "roofline"],
                                                    bin_flops=[1e6, 1e7, 1e6], abs_err=[0.1, 0.2, 0.5])),
    "error_distribution_plot": lambda: pd.DataFrame(dict(dtype="float32", model=["devchar", "roofline"],
                                                         err_bin=[0, 3], share=[0.9, 0.4])),
    "step_time_vs_batch": lambda: pd.DataFrame(dict(config="tiny", batch=[1, 1, 2, 2], measured_ms=[1.0, 1.0, 2.0, 2.0],
                                                    predictor=["devchar", "roofline"] * 2,
                                                    predicted_ms=[1.1, 0.5, 2.1, 1.0])),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_each_grouped_plot_renders_a_png(name):
    png = getattr(plots, name)(FRAMES[name]())
    assert png.startswith(PNG) and len(png) > 1000


def test_predicted_vs_measured_renders_a_png():
    meas = np.array([1.0, 2.0, 4.0])
    assert plots.predicted_vs_measured({"mm": (meas, meas * 1.1)}).startswith(PNG)


def test_panel_per_group_draws_each_group_once():
    seen = []
    plots.panel_per_group(list(gemm_rows().groupby("op")), lambda ax, key, g: seen.append((key, len(g))) or
                          ax.plot(g["k"], g["median_us"], label=key))
    assert seen == [("bmm", 6), ("mm", 6)]
