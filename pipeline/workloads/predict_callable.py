"""Predict any PyTorch callable's latency: capture its graph on the CPU, re-price every op
with devchar's models, and walk Algorithm 1 (DLRM paper §III-D) over the result.

The CPU is the capture device. For a CPU target, `critical_path` runs in its synchronous
mode (each "kernel" runs inline on the CPU clock); for a GPU target (`synchronous=False`,
that device's models and overhead model) the same graph is walked asynchronously: each
priced op launches one kernel, and host overheads can hide behind device time or not. Host overheads come from `overheads`, an
OverheadModel fitted on *another* workload's trace (extract_overheads): the evaluated
workload's own measured times never enter its prediction (see price.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.errors import BadShapeError, check_dims
from pipeline.dtypes import torch_dtype
from pipeline.predict.critical_path import critical_path
from pipeline.predict.overheads import OverheadModel
from pipeline.workloads.capture import capture
from pipeline.workloads.price import price_graph

NO_OVERHEADS = OverheadModel(individual={}, shared={})  # every T-type 0: kernels only


def _call(fn_or_module, inputs):
    """A no-argument callable: inputs may be None, a dict (keywords), a tuple/list or one value."""
    if inputs is None:
        return fn_or_module
    if isinstance(inputs, dict):
        return lambda: fn_or_module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return lambda: fn_or_module(*inputs)
    return lambda: fn_or_module(inputs)


def predict_module(fn_or_module, inputs, gemm_model, utility_model, overheads: OverheadModel | None,
                   dtype: str = "float32", *, keep_unmapped: bool = False, warmup: int = 2,
                   execution_trace: bool = True, separate_timing: bool = True, extra=None,
                   synchronous: bool = True) -> dict[str, Any]:
    """capture -> price_graph -> critical_path (synchronous for a CPU target, see the module doc).

    Returns e2e_us, kernel_only_us (sum of re-priced kernels), coverage (price.py), per_op
    (a DataFrame, one row per captured op), e2e (the E2E record), graph (re-priced),
    measured_us (the profiled call's top-level op time: for comparison only, profiler
    overhead included) and capture_info (notes, source, shapes...; the Chrome trace is under
    capture_info["trace"]). `overheads=None` predicts with every overhead 0. Measured times
    come from an observer-free call by default (separate_timing, see capture): they feed only
    coverage, keep_unmapped and measured_us. `extra`: more op mappings (price_recsys.RecsysOps).
    """
    import torch

    torch_dtype(dtype)  # a bad dtype name fails before the (slow) capture
    call = _call(fn_or_module, inputs)
    with torch.inference_mode():  # a forward pass: no autograd bookkeeping in the graph
        graph, info = capture(call, warmup=warmup, execution_trace=execution_trace,
                              separate_timing=separate_timing)
    priced, coverage = price_graph(graph, info["shapes"], gemm_model, utility_model, dtype,
                                   keep_unmapped=keep_unmapped, scalars=info.get("scalars"), extra=extra,
                                   synchronous=synchronous)
    e2e = critical_path(priced, overheads if overheads is not None else NO_OVERHEADS, synchronous=synchronous)
    per_op = pd.DataFrame(coverage["ops"])
    per_op.insert(2, "parent", [graph.op(i).parent for i in per_op["id"]])
    per_op["shapes"] = [info["shapes"].get(i) for i in per_op["id"]]
    measured = sum(info["times"][op.id]["dur"] for op in graph.top_level())
    return {"e2e_us": e2e.e2e_us, "kernel_only_us": e2e.active_us, "coverage": coverage, "per_op": per_op,
            "e2e": e2e, "graph": priced, "measured_us": measured, "capture_info": info}


def load_config_dict(config_path_or_dict) -> dict:
    """A config as a plain dict, from a dict or a config.json path; needs model_type."""
    if isinstance(config_path_or_dict, (str, Path)):
        with open(config_path_or_dict) as f:
            d = json.load(f)
    elif isinstance(config_path_or_dict, dict):
        d = dict(config_path_or_dict)
    else:
        raise TypeError(f"config must be a dict or a path to config.json, got {type(config_path_or_dict).__name__}")
    if not d.get("model_type"):
        raise ValueError(f"config has no model_type (keys: {sorted(d)[:12]}...)")
    return d


def build_causal_lm(config_path_or_dict, dtype: str = "float32", *, attn_implementation: str = "eager", seed: int = 0):
    """A randomly initialised AutoModelForCausalLM from a config; nothing is downloaded.

    Eager attention by default: its bmm/softmax/bmm are what the GEMM and utility models
    price; SDPA would run one fused op these models do not cover.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = load_config_dict(config_path_or_dict)
    model_type = d.pop("model_type")
    d.setdefault("use_cache", False)
    # A config.json may carry from_pretrained-only keys; they are harmless to for_model.
    config = AutoConfig.for_model(model_type, **d)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.eval().to(dtype=torch_dtype(dtype))


def predict_hf_config(config_path_or_dict, batch: int, seq: int, gemm_model, utility_model,
                      overheads: OverheadModel | None, dtype: str = "float32", *, seed: int = 0,
                      attn_implementation: str = "eager", **kwargs) -> dict[str, Any]:
    """predict_module on a transformers causal LM built from its config, fed random token ids
    of shape (batch, seq). Extra keywords go to predict_module."""
    import torch

    check_dims(batch=batch, seq=seq)
    model = build_causal_lm(config_path_or_dict, dtype, attn_implementation=attn_implementation, seed=seed)
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit and seq > limit:
        raise BadShapeError(f"seq={seq} exceeds the model's {limit} positions")
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    inputs = {"input_ids": ids, "use_cache": False}
    out = predict_module(model, inputs, gemm_model, utility_model, overheads, dtype, **kwargs)
    out.update(model_type=model.config.model_type, model=model, inputs=inputs)
    return out


def measure_call(fn_or_module, inputs, warmup: int = 5, reps: int = 25):
    """The real latency here, PM2Lat's protocol (5 warm-up, 25 timed, median), without profiling."""
    import torch

    from pipeline.harness.timer import TimingSpec, measure_step

    with torch.inference_mode():
        return measure_step(_call(fn_or_module, inputs), TimingSpec.fixed(warmup, reps))
