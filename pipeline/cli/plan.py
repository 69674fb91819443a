"""`devchar plan`: split a causal LM across two devices (PM2Lat §IV-D.1), predicted, and with
--measure run here as a two-stage pipeline on two CPU partitions (docs/plan.md)."""
from __future__ import annotations

import statistics

from pipeline.core.errors import DevcharError, UnknownDeviceError, check_dims


def register(subparsers) -> None:
    """Add `devchar plan` to the CLI's subparsers (called from main.build_parser)."""
    from pipeline.core.slugs import check_slug

    def slug(value: str) -> str:
        import argparse

        try:
            return check_slug(value)
        except DevcharError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    p = subparsers.add_parser("plan", help="split a model across two devices: best partition point, bottleneck, "
                                           "pipelined throughput (PM2Lat IV-D.1)")
    p.add_argument("--hf-config", required=True, help="a Hugging Face config.json of a decoder-only causal LM")
    p.add_argument("--devices", nargs=2, required=True, type=slug, metavar=("FIRST", "SECOND"),
                   help="the two device slugs, in the order a request visits them (the same slug twice: two alike)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="link bandwidth between the devices, GB/s (default: measured here as a memory copy, "
                        "for two CPU partitions of this machine)")
    p.add_argument("--link-latency-us", type=float, default=0.0, help="fixed cost per transfer, µs")
    p.add_argument("--requests", type=int, default=10, help="requests in the pipelined stream")
    p.add_argument("--measure", action="store_true",
                   help="run the chosen split here as a two-stage pipeline (two CPU partitions of this machine)")
    p.add_argument("--repeats", type=int, default=3, help="measured pipeline runs (medians and range reported)")
    p.set_defaults(fn=cmd_plan)


def _device_models(device: str) -> dict:
    """A device's models for pricing, as `devchar predict` loads them (the registry's champion,
    else the store's latest passing version); UnknownDeviceError when nothing is saved for it."""
    from pipeline.cli.predict import _is_cpu, _optional_models, champion_model
    from pipeline.core.config import model_store_root

    root = model_store_root()
    if not (root / device).is_dir():
        known = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        raise UnknownDeviceError(f"unknown device {device!r}: no models saved for it under {root} (devices with "
                                 f"models: {known or 'none'}); characterize it with `devchar run` first")
    overheads, extra = _optional_models(device, load=champion_model)
    return {"gemm": champion_model(device, "gemm_model"), "utility": champion_model(device, "utility_model"),
            "overheads": overheads, "extra": extra, "synchronous": _is_cpu(device)}


def _check_args(args) -> None:
    from pipeline.predict.plan import Link

    check_dims(batch=args.batch, seq=args.seq, requests=args.requests, repeats=args.repeats)
    # a zero or negative bandwidth, or a negative latency, fails here (no bandwidth given: measured later)
    Link(1.0 if args.link_gbps is None else args.link_gbps, args.link_latency_us)


def cmd_plan(args) -> int:
    from pipeline.cli.predict import say_fallbacks
    from pipeline.core.dtypes import check_dtype
    from pipeline.predict.plan import PlanError, plan
    from pipeline.workloads import predict_callable as pc
    from pipeline.workloads.blocks import decoder_parts, price_blocks

    _check_args(args)
    dtype = check_dtype(args.dtype)
    first, second = args.devices
    config = pc.check_hf_config(args.hf_config, args.batch, args.seq, dtype)
    blocks = int(getattr(config, "num_hidden_layers", 0) or 0)
    if blocks < 2:
        raise PlanError(f"{args.hf_config} has {blocks} transformer block(s): a split between blocks needs at least 2")
    threads = None
    if args.measure:
        from pipeline.workloads.two_stage import assign_cores, check_splittable, local_cpu_threads

        threads = (local_cpu_threads(first), local_cpu_threads(second))
        assign_cores(threads)
        check_splittable(config)
    if args.link_gbps is None:
        _local_link_threads(first)  # a link that cannot be measured here fails before the capture
    models = {d: _device_models(d) for d in dict.fromkeys((first, second))}
    model = pc.build_causal_lm(args.hf_config, dtype, config=config)
    decoder_parts(model)  # a model plan cannot split fails before the capture
    import torch

    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    prices = price_blocks(model, {"input_ids": ids, "use_cache": False}, dtype, models)
    del model
    link, link_note = _link(args, prices.transfer_bytes, first, dtype)
    best, every = plan(prices.costs[first], prices.costs[second], prices.transfer_bytes, link)
    _print_plan(args, config, prices, best, every, link, link_note)
    say_fallbacks()
    if args.measure:
        _measure(args, config, dtype, best, threads)
    return 0


def _link(args, moved, first: str, dtype: str):
    from pipeline.predict.plan import Link

    if args.link_gbps is not None:
        return Link(args.link_gbps, args.link_latency_us), "given"
    from pipeline.workloads.two_stage import measure_copy_gbps

    threads = _local_link_threads(first)
    nbytes = max(moved)
    gbps = measure_copy_gbps(nbytes, threads, dtype)
    return Link(gbps, args.link_latency_us), f"measured here: a {nbytes / 1024:,.0f} KiB copy into shared memory " \
                                             f"at {threads} thread(s)"


def _local_link_threads(first: str) -> int:
    """The first device's threads, when the link is measured here; else why it cannot be."""
    from pipeline.workloads.two_stage import local_cpu_threads

    try:
        return local_cpu_threads(first)
    except UnknownDeviceError as exc:
        raise UnknownDeviceError(f"give --link-gbps: the link can be measured here only between CPU partitions of "
                                 f"this machine ({exc})") from None


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f} ms"


def _print_plan(args, config, prices, best, every, link, link_note) -> None:
    first, second = args.devices
    n, k = prices.n_blocks, best.after_block
    a, b = prices.costs[first], prices.costs[second]
    print(f"{config.model_type} from {args.hf_config} batch={args.batch} seq={args.seq} {args.dtype}: {n} blocks; "
          f"{first} -> {second}; link {link.gbps:,.1f} GB/s + {link.latency_us:g} µs ({link_note})")
    for dev in dict.fromkeys((first, second)):
        c, cov = prices.costs[dev], prices.coverage[dev]
        alone = sum(prices.pieces[dev].values())  # the prologue once
        print(f"  {dev}: whole model alone {_ms(alone)} (blocks {_ms(min(c.blocks_us))}–{_ms(max(c.blocks_us))} "
              f"each; {cov['priced_share'] + cov['covered_share']:.0%} of the captured CPU time re-priced)")
    print(f"best split: blocks 0–{k - 1} on {first} | blocks {k}–{n - 1} on {second}")
    print(f"  stage 1: {_ms(best.stage1_us)} (embedding + prologue {_ms(a.head_us)}, {k} blocks "
          f"{_ms(sum(a.blocks_us[:k]))}, transfer of {best.transfer_bytes / 1024:,.0f} KiB {best.transfer_us:,.1f} µs)")
    print(f"  stage 2: {_ms(best.stage2_us)} ({n - k} blocks {_ms(sum(b.blocks_us[k:]))}, prologue + norm + "
          f"head {_ms(b.tail_us)})")
    print(f"  bottleneck: stage {best.bottleneck_stage}, {_ms(best.bottleneck_us)}; throughput "
          f"{best.throughput_per_s:,.2f} requests/s; {args.requests} requests: {best.total_us(args.requests) / 1e6:,.2f} s"
          f" (fill {_ms(best.fill_us)} + {args.requests - 1} x {_ms(best.bottleneck_us)})")
    near = sorted(every, key=lambda s: s.bottleneck_us)[1:4]
    if near:
        print("  next best: " + ", ".join(f"after block {s.after_block - 1} {_ms(s.bottleneck_us)}" for s in near))


def _measure(args, config, dtype, best, threads) -> None:
    import os

    from pipeline.workloads.predict_callable import load_config_dict
    from pipeline.workloads.two_stage import StageSpec, run_pipeline

    spec = StageSpec(load_config_dict(args.hf_config), args.batch, args.seq, dtype, best.after_block)
    runs = []
    for i in range(args.repeats):
        run = run_pipeline(spec, threads, args.requests, hidden=int(config.hidden_size))
        runs.append(run)
        print(f"  run {i + 1}: stage 1 {run.stage1_s * 1e3:,.1f} ms (copy {run.copy_s * 1e6:,.0f} µs), stage 2 "
              f"{run.stage2_s * 1e3:,.1f} ms, period {run.period_s * 1e3:,.1f} ms, total {run.total_s:,.2f} s; "
              f"CPU time {run.stage_cpu_s(1) * 1e3:,.1f} | {run.stage_cpu_s(2) * 1e3:,.1f} ms per request, "
              f"{run.cpu_share(1):.2f} | {run.cpu_share(2):.2f} per busy second; load average "
              f"{run.load_before:.2f} -> {run.load_after:.2f}", flush=True)
    med = statistics.median
    neck = [r.bottleneck_s * 1e6 for r in runs]
    total = [r.total_s * 1e6 for r in runs]
    s1, s2 = med(r.stage1_s * 1e6 for r in runs), med(r.stage2_s * 1e6 for r in runs)
    c1, c2 = runs[0].cores
    print(f"measured ({args.requests} requests x {args.repeats} runs; stage 1 on core(s) {list(c1)} at {threads[0]} "
          f"thread(s), stage 2 on {list(c2)} at {threads[1]}; {os.cpu_count()} cores here):")
    print(f"  stage 1 {_ms(s1)} (predicted {_ms(best.stage1_us)}, {_err(best.stage1_us, s1)}), stage 2 {_ms(s2)} "
          f"(predicted {_ms(best.stage2_us)}, {_err(best.stage2_us, s2)})")
    print(f"  bottleneck {_ms(med(neck))} (range {_ms(min(neck))}–{_ms(max(neck))}); predicted "
          f"{_ms(best.bottleneck_us)}: error {_err(best.bottleneck_us, med(neck))}")
    cpu = [r.cpu_bottleneck_s * 1e6 for r in runs]
    print(f"  by CPU time (what the stages ran on their cores, without the time another process held them): "
          f"bottleneck {_ms(med(cpu))} (range {_ms(min(cpu))}–{_ms(max(cpu))}): error {_err(best.bottleneck_us, med(cpu))}")
    pred_total = best.total_us(args.requests)
    print(f"  total {med(total) / 1e6:,.2f} s (range {min(total) / 1e6:,.2f}–{max(total) / 1e6:,.2f}); predicted "
          f"{pred_total / 1e6:,.2f} s: error {_err(pred_total, med(total))}")


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.1%}"
