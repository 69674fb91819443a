"""A causal LM's transformer blocks priced one by one, for `devchar plan` (PM2Lat §IV-D.1).

The model is captured once on the CPU (capture.py) with a profiler annotation around each
piece (`devchar::embed`, `devchar::block<i>`, `devchar::norm`, `devchar::lm_head`, recorded by
forward hooks; annotations are user_annotation events, not cpu_ops, so the graph is the same
as without them). Each top-level op goes to the annotation that holds it; ops outside every
annotation are the prologue (before the first block: position ids, masks, rotary tables) or
the epilogue (after the last block). The graph is priced once per device with that device's
models and overheads, and `plan.segment_times` gives each piece's time.

Both stages of a split recompute the prologue (the measured pipeline, two_stage.py, runs the
model's own forward on each side), so a first stage is embed + prologue + its blocks, a
second prologue + its blocks + norm + lm_head + epilogue.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.core.errors import BadConfigError
from pipeline.predict.plan import StageCosts, segment_times
from pipeline.predict.price import price_graph

PREFIX = "devchar::"


def decoder_parts(model):
    """(base model, embedding, blocks, final norm, lm_head) of a decoder-only causal LM laid out
    as Llama/Qwen/Mistral are (model.model.{embed_tokens, layers, norm}, model.lm_head);
    BadConfigError naming the class otherwise."""
    import torch

    base = getattr(model, "model", None)
    parts = [getattr(base, a, None) for a in ("embed_tokens", "layers", "norm")] + [getattr(model, "lm_head", None)]
    if base is None or any(p is None for p in parts) or not isinstance(parts[1], torch.nn.ModuleList):
        raise BadConfigError(f"{type(model).__name__}: devchar plan splits decoder-only models laid out as "
                             "model.model.embed_tokens / .layers / .norm and model.lm_head (Llama, Qwen2, Qwen3, "
                             "Mistral...); this one is not")
    return base, *parts


@contextmanager
def annotated(model):
    """Profiler annotations around the embedding, each block, the final norm and the lm_head;
    yields a dict that fills with each block's output bytes (the activation a split sends)."""
    import torch

    _, embed, layers, norm, head = decoder_parts(model)
    open_, sizes, handles = [], {}, []

    def pre(name):
        def hook(_mod, _args):
            rf = torch.profiler.record_function(PREFIX + name)
            rf.__enter__()
            open_.append(rf)
        return hook

    def post(name):
        def hook(_mod, _args, out):
            open_.pop().__exit__(None, None, None)
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor):
                sizes[name] = t.numel() * t.element_size()
        return hook

    named = [("embed", embed), *[(f"block{i}", m) for i, m in enumerate(layers)], ("norm", norm), ("lm_head", head)]
    try:
        for name, mod in named:
            handles += [mod.register_forward_pre_hook(pre(name)), mod.register_forward_hook(post(name))]
        yield sizes
    finally:
        for h in handles:
            h.remove()


def segments(graph, info: dict) -> dict[int, str]:
    """Top-level op id -> "embed", "block<i>", "norm", "lm_head", "prologue" or "epilogue", from
    the annotations in the captured trace (info["trace"], the run info["times"] come from)."""
    notes = sorted(((e["ts"], e["ts"] + e["dur"], e["name"][len(PREFIX):])
                    for e in info["trace"].get("traceEvents", [])
                    if e.get("ph") == "X" and str(e.get("name", "")).startswith(PREFIX)), key=lambda n: n[0])
    blocks = [n for n in notes if n[2].startswith("block")]
    if not blocks:
        raise BadConfigError("the captured trace holds no block annotations: cannot tell the blocks apart")
    first, last = blocks[0][0], blocks[-1][1]
    out, prev_block = {}, blocks[0][2]
    for op in graph.top_level():
        t = info["times"][op.id]
        start, end = t["ts"], t["ts"] + t["dur"]
        inside = [n for n in notes if n[0] <= start + 1e-3 and end <= n[1] + 1e-3]
        if inside:
            name = min(inside, key=lambda n: n[1] - n[0])[2]  # the innermost
        elif start < first:
            name = "prologue"
        elif start >= last:
            name = "epilogue"
        else:  # between two blocks (Python glue): charged to the block before
            name = prev_block
        if name.startswith("block"):
            prev_block = name
        out[op.id] = name
    return out


@dataclass(frozen=True)
class BlockPrices:
    """Per device, the StageCosts of one model; plus what the split sends and the capture's coverage."""

    costs: dict[str, StageCosts]
    pieces: dict[str, dict[str, float]]  # device -> segment -> µs
    transfer_bytes: tuple[int, ...]  # after block k, k = 1 .. L-1
    n_blocks: int
    coverage: dict[str, dict]


def stage_costs(device: str, times: dict[str, float], n_blocks: int) -> StageCosts:
    """A device's segment times as StageCosts (see the module doc for head and tail)."""
    pro = times.get("prologue", 0.0)
    return StageCosts(device, tuple(times.get(f"block{i}", 0.0) for i in range(n_blocks)),
                      head_us=times.get("embed", 0.0) + pro,
                      tail_us=pro + times.get("norm", 0.0) + times.get("lm_head", 0.0) + times.get("epilogue", 0.0))


def price_blocks(model, inputs: dict, dtype: str, devices: dict[str, dict]) -> BlockPrices:
    """Capture `model(**inputs)` once with block annotations and price it for each device.

    devices: slug -> {"gemm": ..., "utility": ..., "overheads": OverheadModel, "extra": ..., "synchronous": bool}.
    """
    import torch

    from pipeline.workloads.capture import capture
    from pipeline.workloads.predict_callable import NO_OVERHEADS

    _, _, layers, _, _ = decoder_parts(model)
    n = len(layers)
    with annotated(model) as sizes, torch.inference_mode():
        graph, info = capture(lambda: model(**inputs), warmup=2, separate_timing=True)
    seg = segments(graph, info)
    costs, pieces, coverage = {}, {}, {}
    for slug, m in devices.items():
        priced, cov = price_graph(graph, info["shapes"], m["gemm"], m["utility"], dtype, scalars=info.get("scalars"),
                                  extra=m.get("extra"), synchronous=m["synchronous"], strides=info.get("strides"))
        times = segment_times(priced, seg, m["overheads"] or NO_OVERHEADS, synchronous=m["synchronous"])
        pieces[slug], coverage[slug] = times, cov
        costs[slug] = stage_costs(slug, times, n)
    moved = tuple(int(sizes.get(f"block{k - 1}", 0)) for k in range(1, n))
    return BlockPrices(costs, pieces, moved, n, coverage)
