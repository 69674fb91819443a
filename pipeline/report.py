"""The text summary `devchar run` prints: device, held-out model errors, GPT-2 predicted vs measured."""
from __future__ import annotations


def _present(x) -> bool:
    import pandas as pd

    return not pd.isna(x)


def _fmt_flops(x) -> str:
    return f"{x / 1e12:.2f} TFLOP/s" if _present(x) else "-"


def render_summary(warehouse, device: str) -> str:
    lines = [f"\n== device {device} =="]
    if warehouse.has_table("devices"):
        d = warehouse.query("SELECT * FROM devices WHERE device = ?", [device])
        if not d.empty:
            r = d.iloc[0]
            units = f"{r['sm_count']} SMs" if r["kind"] == "cuda" else f"{r['threads']} threads"
            lines.append(f"{r['model']} ({r['kind']}, {units}), torch {r['torch_version']}")
            peaks = ", ".join(f"{dt} {_fmt_flops(r[f'peak_flops_{dt}'])}" for dt in
                              ("float32", "tf32", "bfloat16", "float16") if _present(r.get(f"peak_flops_{dt}")))
            lines.append(f"measured peaks: {peaks}; copy bandwidth {r['bandwidth_gbps']:.1f} GB/s")
    if warehouse.has_table("model_errors"):
        e = warehouse.query("SELECT model, layer_type, dtype, n, mean_rel_err, max_rel_err FROM model_errors "
                            "WHERE device = ? ORDER BY dtype, layer_type", [device])
        if not e.empty:
            lines.append("\n-- held-out error per layer type (PM2Lat Table II analog; shapes never fitted) --")
            own = e[e["model"] == "devchar"].drop(columns="model")
            lines.append(own.to_string(index=False, formatters={"mean_rel_err": "{:.1%}".format,
                                                                "max_rel_err": "{:.1%}".format}))
            if e["model"].nunique() > 1:
                lines.append("\n-- mean relative error, devchar beside the baselines --")
                pivot = e.pivot_table(index=["layer_type", "dtype"], columns="model", values="mean_rel_err")
                lines.append(pivot.map(lambda v: "-" if v != v else f"{v:.1%}").to_string())
    if warehouse.has_table("predictions"):
        p = warehouse.query("SELECT config, batch, seq, predictor, predicted_ms, measured_ms, rel_err FROM predictions "
                            "WHERE device = ? ORDER BY config, batch, seq", [device])
        if not p.empty:
            lines.append("\n-- GPT-2 forward: predicted vs measured (ms) --")
            lines.append(p.to_string(index=False, formatters={"predicted_ms": "{:.2f}".format,
                                                              "measured_ms": "{:.2f}".format,
                                                              "rel_err": "{:+.1%}".format}))
            lines.append(f"mean |error| {p['rel_err'].abs().mean():.1%}")
    return "\n".join(lines)
