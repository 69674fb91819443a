"""`devchar predict --hf-config/--module`, `what-if` and `reference`: predictions from captured
graphs and the peer-reference comparison (split from cli.py, which parses and dispatches)."""
from __future__ import annotations

import sys

from pipeline.cli.common import local_slug, peer_dir, warehouse
from pipeline.core.errors import DevcharError, check_dims


def predict_captured(args) -> int:
    """Any model: run it once here on the CPU, capture its execution graph, price every kernel
    with the device's models, and walk Algorithm 1 with the device's shared overhead model
    (fitted on the traced workloads; the model predicted here is never one of them)."""
    from pipeline.core.dtypes import check_dtype
    from pipeline.workloads import predict_callable as pc

    # what can be refused cheaply is refused before any model is loaded or anything is built
    dtype = check_dtype(args.dtype)
    if args.hf_config:
        config = pc.check_hf_config(args.hf_config, args.batch, args.seq, dtype)
    else:
        factory = pc.load_factory(args.module)
    _FALLBACKS.clear()
    gemm, utility = champion_model(args.device, "gemm_model"), champion_model(args.device, "utility_model")
    overheads, extra = _optional_models(args.device, load=champion_model)
    sync = _is_cpu(args.device)  # a GPU target: Algorithm 1's asynchronous CPU/GPU clocks
    free = _free_probe(args.device)
    if args.hf_config:
        out = pc.predict_hf_config(args.hf_config, args.batch, args.seq, gemm, utility, overheads, dtype, extra=extra,
                                   synchronous=sync, config=config, free=free)
        label = f"{out['model_type']} from {args.hf_config} batch={args.batch} seq={args.seq}"
        model, inputs = out["model"], out["inputs"]
    else:
        model, inputs = pc.call_factory(args.module, factory)
        out = pc.predict_module(model, inputs, gemm, utility, overheads, dtype, extra=extra, synchronous=sync,
                                free=free)
        label = args.module
    cov = out["coverage"]
    host = "host overheads from the shared overhead model" if overheads else "no overhead model: kernels only"
    print(f"{label} on {args.device}: predicted {out['e2e_us'] / 1e3:.2f} ms "
          f"(kernels {out['kernel_only_us'] / 1e3:.2f} ms, {host}; {cov['priced_share'] + cov['covered_share']:.0%} "
          f"of the captured CPU time re-priced, {len(cov['unmapped'])} unmapped op kinds)")
    if cov.get("weights_uncached_share") is not None:
        print(f"GEMM weights: {cov['weights_uncached_share']:.0%} priced as read from memory (the share the "
              f"{gemm.weight_cache_bytes / 2**20:.0f} MB weight cache measured on {args.device} cannot hold)")
    if getattr(args, "breakdown", False):
        from pipeline.predict.graph_predict import op_breakdown

        _print_breakdown(op_breakdown(cov))
    if args.measure:
        m, medians = pc.measure_call(model, inputs)
        err = (out["e2e_us"] - m.median_us) / m.median_us
        print(f"measured {m.median_us / 1e3:.2f} ms here ({_blocks_said(medians)}): error {err:+.1%}")
        _say_spell(args.device, m)
    say_fallbacks()
    return 0


def _say_spell(device: str, m) -> None:
    """Whether the spell probes read the machine slower during a --measure (Measurement `m`) than
    during the device's calibration (harness/spells.py): the GEMM probe against the GEMM sweep's
    readings, the host probe against the readings of the GEMM sweep and the traces the shared
    overheads come from."""
    from pipeline.harness.spells import spell_note

    if device != local_slug(None):  # another machine's calibration: its probe is not this one's
        return
    readings, wh = {"probe_us": [], "host_probe_us": []}, warehouse()
    for table in ("gemm_samples", "workload_graphs"):
        try:
            rows = wh.device_rows(table, device)
        except DevcharError:
            continue
        for col in readings if table == "gemm_samples" else ("host_probe_us",):
            readings[col] += rows[col].tolist() if col in rows else []
    for col, probe in (("probe_us", "the spell probe"), ("host_probe_us", "the host probe (a tiny op's time a call)")):
        note = spell_note(getattr(m, col), readings[col], probe)
        if note:
            print(note)


def _free_probe(device: str) -> dict:
    """The device row's free probe (harness/free_cost.py); empty where none was measured."""
    from pipeline.predict.graph_predict import free_probe

    try:
        return free_probe(warehouse().device_rows("devices", device).iloc[0])
    except (DevcharError, IndexError):
        return {}


def _print_breakdown(table) -> None:
    """The ops that hold 99 % of the traced time, predicted beside traced."""
    # the rows until the one that reaches 99 %, that one included (a single op may hold more)
    keep = table[table["share_of_traced"].cumsum().shift(fill_value=0.0) < 0.99].head(25) if len(table) else table
    fmt = {"traced_us": "{:,.0f}".format, "predicted_us": "{:,.0f}".format, "share_of_traced": "{:.1%}".format,
           "predicted_over_traced": lambda v: "-" if v != v else f"{v:.2f}"}
    print("per op (traced self time in the captured run vs devchar's price):")
    print(keep.to_string(index=False, formatters=fmt))


def _is_cpu(device: str) -> bool:
    """The device's kind from the warehouse (a reference GPU calibration may be loaded there),
    else from its slug: local CPU slugs start with "cpu-"."""
    wh = warehouse()
    if wh.has_table("devices"):
        kinds = wh.query("SELECT kind FROM devices WHERE device = ?", [device])["kind"]
        if len(kinds):
            return kinds.iloc[0] == "cpu"
    return device.startswith("cpu")


def _optional_models(device: str, load=None):
    """(overhead model or None, RecsysOps with whichever embedding/memory models exist), each
    read by `load(device, name)` (default: the store's latest passing version)."""
    from pipeline.core.errors import MissingModelError
    from pipeline.predict.price_recsys import RecsysOps

    got = {}
    for name in ("overhead_model", "embedding_model", "memory_model"):
        try:
            got[name] = (load or _load_model)(device, name)
        except MissingModelError:
            got[name] = None
    return got["overhead_model"], RecsysOps(got["embedding_model"], got["memory_model"])


def cmd_what_if(args) -> int:
    """Transform a captured graph (batch size, fused embedding lookups) and predict it unrun."""
    from pipeline.core.errors import BadShapeError
    from pipeline.predict import graph_predict as gp
    from pipeline.predict.what_if import fuse_embedding_bags, returned_at_batch, with_batch

    if args.new_batch is not None:  # 0 or a negative batch is an error, not "not given"
        check_dims(new_batch=args.new_batch)
    device = local_slug(args.device)
    wh = warehouse()
    graphs = wh.device_rows("workload_graphs", device)
    if args.config not in set(graphs["config"]):
        raise BadShapeError(f"no captured graph of config {args.config!r} for {device}; "
                            f"traced configs: {sorted(set(graphs['config']))}")
    graphs = graphs[graphs["config"] == args.config]
    by_batch = {int(r["batch"]): r for r in graphs.to_dict("records")}
    if args.batch not in by_batch:
        raise BadShapeError(f"no captured graph of {args.config!r} at batch={args.batch} for {device}; "
                            f"captured batches: {sorted(by_batch)}")
    row = by_batch[args.batch]
    graph, shapes, scalars, strides = gp.load_graph(row["graph_json"])
    key = {k: row[k] for k in gp.KEY}
    overheads = gp.overheads_for(wh.device_rows("overhead_samples", device), key)
    models = {m: _load_model(device, m) for m in ("gemm_model", "utility_model", "embedding_model", "memory_model")}
    sync = _is_cpu(device)
    free = _free_probe(device)

    def show(label, g, shp, sc, breakdown=False, st=strides, freed=0.0):
        got = gp.predict_graph(g, shp, sc, models, row["dtype"], overheads, sync, st, freed)
        parts = ", ".join(f"{p} {got[p] / 1e3:.2f} ms" for p in gp.PREDICTORS if p in got)
        print(f"{label}: {parts}")
        if breakdown:
            _print_breakdown(gp.op_breakdown(got["coverage"]))
        return got

    # a step frees what it returned (graph_predict.output_free_us): a batch what-if scales the
    # returned sizes as it scales shapes; fused lookups return what the captured step did
    returned = gp.returned_of(row["graph_json"])
    show(f"{args.config} batch={args.batch} as captured", graph, shapes, scalars, args.breakdown,
         freed=gp.output_free_us(returned, free))
    label = f"{args.config}"
    if args.new_batch is not None:
        # the second point: another captured batch, not the target itself (so a target that was
        # captured checks the transform rather than reading the answer back)
        others = [b for b in by_batch if b not in (args.batch, args.new_batch)] or \
            [b for b in by_batch if b != args.batch]
        other = min(others, key=lambda b: abs(b - args.new_batch), default=None)
        if other is None:
            raise BadShapeError(f"{args.config!r} was captured at one batch size only; a batch what-if needs two")
        og, oshapes, _, _ = gp.load_graph(by_batch[other]["graph_json"])
        shapes, report = with_batch(graph, shapes, args.batch, oshapes, og, other, args.new_batch)
        returned = returned_at_batch(returned, gp.returned_of(by_batch[other]["graph_json"]), args.batch, other,
                                     args.new_batch)
        label += f" batch={args.new_batch} (shapes solved from batches {args.batch} and {other}; " \
                 f"{report['unaligned_ops']} ops unaligned)"
    if args.fuse_embeddings:
        graph, shapes, scalars = fuse_embedding_bags(graph, shapes, scalars)
        label += " with one batched EmbeddingBag"
    got = show(label, graph, shapes, scalars, freed=gp.output_free_us(returned, free))
    if args.new_batch in by_batch and not args.fuse_embeddings:
        captured = by_batch[args.new_batch]["graph_json"]
        g2, s2, c2, t2 = gp.load_graph(captured)
        show(f"  check: the graph captured at batch={args.new_batch}", g2, s2, c2, st=t2,
             freed=gp.output_free_us(gp.returned_of(captured), free))
    if args.measure:
        m, medians = _measure_what_if(args.config, args.batch if args.new_batch is None else args.new_batch,
                                      args.fuse_embeddings)
        best = got.get("e2e_shared", got["kernel_only"])
        print(f"measured here: {m.median_us / 1e3:.2f} ms ({_blocks_said(medians)}): "
              f"e2e_shared error {(best - m.median_us) / m.median_us:+.1%}")
        _say_spell(args.device, m)
    return 0


def cmd_reference(args) -> int:
    """devchar's GEMM predictions on the peer H100 shapes (NeuSight fp32, Vidur fp16)."""
    import pandas as pd

    from pipeline.analysis.reference import compare, peers

    device = local_slug(args.device)
    wh = warehouse()
    try:
        ours = wh.device_rows("reference_timings", device)
    except DevcharError:  # not timed on this device (yet): the peer comparison alone
        ours = None
    table = compare(_load_model(device, "gemm_model"), peers(peer_dir()), ours)
    if ours is None:
        print(f"(no reference_timings for {device}: run `python -m pipeline.runner reference` on it and "
              "`devchar load` the output to see ours_vs_peer and devchar_vs_ours)")
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1%}"))
    return 0


_FALLBACKS: list[str] = []  # what champion_model said, until say_fallbacks prints it


def champion_model(device: str, name: str):
    """What `devchar predict` uses: the MLflow registry's champion of devchar-<name>-<device>
    (exactly the model-store version it records), else the store's latest passing version, said
    by say_fallbacks after the prediction (pipeline/analysis/champion.py)."""
    from pipeline.analysis.champion import load_champion
    from pipeline.core.config import model_store_root

    return load_champion(model_store_root(), device, name, say=_FALLBACKS.append)


def say_fallbacks() -> None:
    """On stderr, after a prediction (an error stays one line): the models that came from the
    store's latest passing version because the registry had no champion for them."""
    for line in dict.fromkeys(_FALLBACKS):
        print(line, file=sys.stderr)
    _FALLBACKS.clear()


def _load_model(device: str, name: str):
    from pipeline.core.config import model_store_root
    from pipeline.predict import store

    return store.load(model_store_root(), device, name)


def _measure_what_if(config: str, batch: int, batched: bool):
    from pipeline.core.errors import BadShapeError
    from pipeline.workloads import dlrm
    from pipeline.workloads.dlrm_run import measure_training_blocks

    specs = {s.name: s for sets in dlrm.CONFIG_SETS.values() for s in sets}
    if config not in specs:
        raise BadShapeError(f"--measure runs DLRM configs only ({sorted(specs)}); got {config!r}")
    return measure_training_blocks(specs[config], batch, batched=batched)


def _blocks_said(medians: list[float]) -> str:
    """How a --measure was timed, for the line that prints it."""
    return (f"the quickest of {len(medians)} blocks of 5 warm-up and 25 runs, medians "
            + " / ".join(f"{v / 1e3:.2f}" for v in medians) + " ms")


