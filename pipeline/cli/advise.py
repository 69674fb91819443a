"""`devchar advise`: explain a causal LM's shape against a device, search nearby shapes
within a parameter budget, and (--measure) time the advice here. See docs/advise.md."""
from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core.errors import BadShapeError, UnknownDeviceError


def register(subparsers) -> None:
    a = subparsers.add_parser("advise", help="explain a model's GEMM shapes on a device and search faster nearby "
                                             "shapes within a parameter budget (co-design paper)")
    a.add_argument("--device", default=None, help="device slug with saved models (default: the local device)")
    a.add_argument("--hf-config", default=None, help="a Hugging Face config.json of a causal LM")
    a.add_argument("--case", default=None, help="one of the paper's cases (gpt3-2.7b, nanogpt-124m, llama-2-7b, "
                                                "pythia-410m, pythia-1b) instead of a config")
    a.add_argument("--layers", type=int, default=12, help="GPT-2 flags, without --hf-config/--case")
    a.add_argument("--hidden", type=int, default=768)
    a.add_argument("--heads", type=int, default=12)
    a.add_argument("--vocab", type=int, default=50257)
    a.add_argument("--dtype", default="float32")
    a.add_argument("--batch", type=int, default=1)
    a.add_argument("--seq", type=int, default=512)
    a.add_argument("--tolerance", type=float, default=0.02, help="parameter budget, a fraction (default ±2 %%)")
    a.add_argument("--dims", default=",".join(("heads", "hidden", "ffn", "vocab", "batch")),
                   help="dimensions to search, comma-separated")
    a.add_argument("--propose", action="append", default=[], metavar="DIM=INT",
                   help="also price (and measure) this change, e.g. heads=20 or vocab=50304")
    a.add_argument("--against", default=None, help="a second config.json or case to compare whole (per token)")
    a.add_argument("--rank", choices=("time", "efficiency"), default="time",
                   help="time: predicted µs per token (default); efficiency: the same at equal parameters "
                        "(speed-up x parameter ratio), so a smaller model does not win by being smaller")
    a.add_argument("--top", type=int, default=12, help="ranked candidates to print")
    a.add_argument("--plot", default=None, help="write the throughput-vs-dimension figure to this PNG")
    a.add_argument("--measure", action="store_true",
                   help="build the original and the advised shapes with random weights and time them here")
    a.add_argument("--measure-layers", type=int, default=2,
                   help="layers of the models --measure builds (the advice's ratios at this depth are printed "
                        "beside the measured ones)")
    a.add_argument("--rounds", type=int, default=7, help="--measure: interleaved rounds (A/B/A/B)")
    a.add_argument("--reps", type=int, default=3, help="--measure: forwards per variant per round")
    a.set_defaults(fn=cmd_advise)


def _device(slug: str | None) -> str:
    """A device with saved models, or one UnknownDeviceError naming those that have them."""
    from pipeline.cli.common import local_slug
    from pipeline.core.config import model_store_root
    from pipeline.core.slugs import check_slug
    from pipeline.predict import store

    device = check_slug(local_slug(slug))
    root = model_store_root()
    if not store.versions(root, device, "gemm_model"):
        have = sorted(p.name for p in root.iterdir() if (p / "gemm_model").is_dir()) if root.is_dir() else []
        raise UnknownDeviceError(f"unknown device {device!r}: no saved gemm_model under {root}; devices with "
                                 f"models: {have or 'none'} (run `devchar run --device <slug>` first)")
    return device


def _config(args) -> tuple[str, dict]:
    from pipeline.predict.lm_shape import gpt2_config
    from pipeline.predict.shape_catalog import case

    if args.hf_config and args.case:
        raise BadShapeError("give --hf-config or --case, not both")
    if args.case:
        return args.case, dict(case(args.case).config)
    if args.hf_config:
        from pipeline.workloads.predict_callable import load_config_dict

        return Path(args.hf_config).stem, load_config_dict(args.hf_config)
    return "gpt2-flags", gpt2_config(args.layers, args.hidden, args.heads, args.vocab)


def _other(spec: str) -> tuple[str, dict]:
    from pipeline.predict.shape_catalog import CASES

    if spec in {c.name for c in CASES}:
        from pipeline.predict.shape_catalog import case

        return spec, dict(case(spec).config)
    from pipeline.workloads.predict_callable import load_config_dict

    return Path(spec).stem, load_config_dict(spec)


def cmd_advise(args) -> int:
    import pandas as pd

    from pipeline.analysis import advice
    from pipeline.cli.predict import champion_model, say_fallbacks
    from pipeline.core.dtypes import check_dtype
    from pipeline.core.errors import check_dims
    from pipeline.predict import advise as adv
    from pipeline.predict.lm_shape import from_hf_config

    # everything cheap is refused before models load
    dtype = check_dtype(args.dtype)
    check_dims(batch=args.batch, seq=args.seq, top=args.top, measure_layers=args.measure_layers,
               rounds=args.rounds, reps=args.reps)
    dims = tuple(d.strip() for d in args.dims.split(",") if d.strip())
    proposals = advice.parse_proposals(args.propose)
    name, config = _config(args)
    shape = from_hf_config(config, name)
    other = _other(args.against) if args.against else None
    other_shape = from_hf_config(other[1], other[0]) if other else None
    device = _device(args.device)
    # the registry's champions, as devchar predict and plan use (else the store's latest passing)
    gemm, utility = champion_model(device, "gemm_model"), champion_model(device, "utility_model")
    say_fallbacks()

    _, table, rows = advice.advise_model(name, config, gemm, utility, dtype, args.batch, args.seq, args.tolerance,
                                         proposals, dims, args.rank)
    if other:
        rows.append(advice.against_row(name, shape, other[0], other_shape, gemm, utility, dtype, args.batch,
                                       args.seq))
    explain = adv.explain(shape, args.batch, args.seq, dtype, gemm, utility)
    step_us = float(adv.price([(shape, args.batch)], args.seq, dtype, gemm, utility)["step_us"].iloc[0])
    print(f"{name} ({shape.model_type}, {shape.params() / 1e6:,.1f} M parameters) on {device}, {dtype}, "
          f"batch={args.batch} seq={args.seq}: predicted step {step_us / 1e3:,.1f} ms "
          f"({args.batch * args.seq / step_us * 1e6:,.0f} tokens/s; forward pass, kernel sum)")
    print(f"\nGEMMs of one layer (x{shape.layers}) and the LM head; alignment = multiples of "
          f"{adv.alignment(dtype)} elements ({dtype}, the paper's 128-byte rule); head_dim {shape.head_dim}"
          f"{'' if shape.head_dim % adv.HEAD_DIM_STEP == 0 else ' (not a multiple of 64)'}:")
    print(_explain_text(explain))
    print(_tile_note(explain))
    searched = table.groupby("dimension").size().to_dict()
    print(f"\nsearched within ±{args.tolerance:.1%} parameters: "
          + ", ".join(f"{d} {searched.get(d, 0)}" for d in dims) + " candidates; top by predicted µs per token:")
    _print_top(table, args.top)
    print("\nadvice:")
    rows_df = pd.DataFrame(rows)
    if args.measure:
        rows_df = _measure(args, name, config, shape, other, rows_df, dtype, gemm, utility)
        _record(device, rows_df.assign(dtype=dtype, batch=args.batch, seq=args.seq))
    print(advice.format_rows(rows_df))
    if args.plot:
        from pipeline.analysis.plots import advice_plot

        Path(args.plot).write_bytes(advice_plot(table, name))
        print(f"\nplot: {args.plot}")
    return 0


def _explain_text(df) -> str:
    import pandas as pd

    fmt = {"tail_util": "{:.0%}".format, "tile_eff": "{:.1%}".format, "share": "{:.1%}".format,
           "time": lambda v: f"{v / 1e3:,.1f} ms", "TFLOP/s": "{:.3f}".format}
    cols = ["gemm", "op", "m", "n", "k", "batch", "kernel", "tile", "slots", "waves", "tail_util", "tile_eff",
            "aligned", "tflops", "us", "share"]
    with pd.option_context("display.width", 250):
        return df[cols].rename(columns={"us": "time", "tflops": "TFLOP/s"}).to_string(index=False, formatters=fmt)


def _tile_note(df) -> str:
    """What the device's tables say a tile and a wave are, honestly."""
    tiles = set(df["tile"])
    if tiles == {"1x1"}:
        return ("note: this device's kernel tables have a 1x1 tile (the CPU tile probe found no padding step for "
                "these kernels) and one slot per thread: no tile or wave quantization is predicted; differences "
                "between shapes come from the throughput each size measured at, interpolated in K between powers "
                "of two, so alignment effects off those points are not modelled.")
    return (f"note: tiles {sorted(tiles)} and slots {sorted(set(df['slots']))} are the kernel tables' own (selector's "
            "kernel per shape); a tail wave below 100 % and a tile efficiency below 100 % are paid in full.")


def _print_top(table, top: int) -> None:
    import pandas as pd

    cols = ["rank", "dimension", "value", "original", "params_change", "predicted_speedup", "speedup_equal_params",
            "us_per_token", "mlp_tflops"]
    fmt = {"params_change": "{:+.2%}".format, "predicted_speedup": "{:.3f}x".format,
           "speedup_equal_params": "{:.3f}x".format,
           "us_per_token": "{:,.1f}".format, "mlp_tflops": "{:.3f}".format}
    with pd.option_context("display.width", 250):
        print(table.head(top)[cols].to_string(index=False, formatters=fmt))


def _measure(args, name, config, shape, other, rows, dtype, gemm, utility):
    """Time the original and each advised shape at --measure-layers layers, interleaved;
    add measured_speedup, its spread and a verdict to each row."""
    import numpy as np

    from pipeline.analysis import advice
    from pipeline.predict import advise as adv
    from pipeline.predict.lm_shape import from_hf_config, to_hf_config
    from pipeline.workloads.advise_measure import measure_ab

    depth = min(args.measure_layers, shape.layers)
    small = shape.with_(layers=depth)
    variants, predicted = {"original": (to_hf_config(config, small), args.batch)}, {}
    for i, r in rows.iterrows():
        label = f"{r['dimension']}={r['proposed']}"
        if r["dimension"] == "model":
            o = from_hf_config(other[1], other[0])
            o_small = o.with_(layers=max(1, round(o.layers * depth / shape.layers)))
            variants[label] = (to_hf_config(other[1], o_small), args.batch)
            p = adv.price([(small, args.batch), (o_small, args.batch)], args.seq, dtype, gemm, utility)["step_us"]
            predicted[label] = float(p.iloc[0] / p.iloc[1])
        elif r["original"] != r["proposed"] and label not in variants:
            s, b = advice.proposed_shape(small, args.batch, r["dimension"], int(r["proposed"]))
            variants[label] = (to_hf_config(config, s), b)
            p = adv.price([(small, args.batch), (s, b)], args.seq, dtype, gemm, utility)["step_us"].to_numpy()
            predicted[label] = float(p[0] / args.batch / (p[1] / b))
    print(f"measuring {len(variants)} variants at {depth} layer(s) here, {args.rounds} interleaved rounds of "
          f"{args.reps} forwards (random weights, eager attention)...", file=sys.stderr, flush=True)
    got = measure_ab(variants, args.seq, dtype, rounds=args.rounds, reps=args.reps)
    rows = rows.copy()
    for col in ("measured_speedup", "measured_p20", "measured_p80", "predicted_at_depth"):
        rows[col] = np.nan
    rows["verdict"] = ""
    for i, r in rows.iterrows():
        label = f"{r['dimension']}={r['proposed']}"
        if label not in predicted:
            continue
        med, lo, hi = got.speedup("original", label)
        rows.loc[i, ["measured_speedup", "measured_p20", "measured_p80", "predicted_at_depth"]] = \
            [med, lo, hi, predicted[label]]
        rows.loc[i, "verdict"] = got.verdict("original", label, predicted[label])
    rows["measured_layers"] = depth
    print(f"\nmeasured here at {depth} layer(s) (median of {args.rounds} paired rounds, p20-p80) beside the "
          "prediction at that depth:")
    for _, r in rows[rows["measured_speedup"].notna()].iterrows():
        print(f"  {r['dimension']} {r['original']} -> {r['proposed']}: predicted {r['predicted_at_depth']:.3f}x, "
              f"measured {r['measured_speedup']:.3f}x ({r['measured_p20']:.3f}-{r['measured_p80']:.3f}): "
              f"{r['verdict']}")
    print()
    return rows


def _record(device: str, rows) -> None:
    """Measured advice goes into shape_advice, replacing this device's rows for this model (the
    latest advice per device and model, measured where measured); the asset's next
    materialization prices the catalog afresh. Only for this machine: a speed-up measured here
    says nothing about another device's partition."""
    import time

    from pipeline.cli.common import local_slug, warehouse

    here = local_slug(None)  # identifies this machine: probes it, so once
    if device != here:
        print(f"devchar: note: measured on this machine ({here}), not on {device}: "
              "not recorded in shape_advice", file=sys.stderr)
        return
    run_id = time.strftime("advise-%Y%m%dT%H%M%S", time.gmtime())
    rows = rows.assign(device=device, run_id=run_id, original=rows["original"].astype(str),
                       proposed=rows["proposed"].astype(str))
    n = warehouse().replace_partition("shape_advice", device, rows, scope="model")
    print(f"recorded {n} rows in shape_advice for {device} (devchar sql \"select * from shape_advice\")")
