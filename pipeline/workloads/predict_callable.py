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

import importlib
import json
import os
import reprlib
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.predict.graph_predict import output_free_us
from pipeline.core.errors import BadConfigError, BadShapeError, check_dims
from pipeline.core.dtypes import element_bytes
from pipeline.harness.dtypes import torch_dtype
from pipeline.predict.critical_path import critical_path
from pipeline.predict.overheads import OverheadModel
from pipeline.workloads.capture import capture
from pipeline.predict.price import price_graph

NO_OVERHEADS = OverheadModel(individual={}, shared={})  # every T-type 0: kernels only
GIB = float(1 << 30)


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
                   synchronous: bool = True, free: dict | None = None) -> dict[str, Any]:
    """capture -> price_graph -> critical_path (synchronous for a CPU target, see the module doc).

    Returns e2e_us (the E2E record's, plus output_free_us), kernel_only_us (sum of re-priced
    kernels), coverage (price.py), per_op (a DataFrame, one row per captured op), e2e (the E2E
    record), graph (re-priced), measured_us (the profiled call's top-level op time: for
    comparison only, profiler overhead included) and capture_info (notes, source, shapes...; the Chrome trace is under
    capture_info["trace"]). `overheads=None` predicts with every overhead 0. Measured times
    come from an observer-free call by default (separate_timing, see capture): they feed only
    coverage, keep_unmapped and measured_us. `extra`: more op mappings (price_recsys.RecsysOps).
    `free`: the device's free probe; a loop of calls frees what each returns, which e2e_us
    then counts (graph_predict.output_free_us).
    """
    import torch

    torch_dtype(dtype)  # a bad dtype name fails before the (slow) capture
    call = _call(fn_or_module, inputs)
    with torch.inference_mode():  # a forward pass: no autograd bookkeeping in the graph
        graph, info = capture(call, warmup=warmup, execution_trace=execution_trace,
                              separate_timing=separate_timing)
    priced, coverage = price_graph(graph, info["shapes"], gemm_model, utility_model, dtype,
                                   keep_unmapped=keep_unmapped, scalars=info.get("scalars"), extra=extra,
                                   synchronous=synchronous, strides=info.get("strides"))
    e2e = critical_path(priced, overheads if overheads is not None else NO_OVERHEADS, synchronous=synchronous)
    per_op = pd.DataFrame(coverage["ops"])
    per_op.insert(2, "parent", [graph.op(i).parent for i in per_op["id"]])
    per_op["shapes"] = [info["shapes"].get(i) for i in per_op["id"]]
    measured = sum(info["times"][op.id]["dur"] for op in graph.top_level())
    freed = output_free_us(info["returned_bytes"], free)  # e2e_us holds it; the E2E record does not
    return {"e2e_us": e2e.e2e_us + freed, "output_free_us": freed, "kernel_only_us": e2e.active_us,
            "coverage": coverage, "per_op": per_op, "e2e": e2e, "graph": priced, "measured_us": measured,
            "capture_info": info}


def _label(config_path_or_dict) -> str:
    return f"config {config_path_or_dict}" if isinstance(config_path_or_dict, (str, Path)) else "config"


def load_config_dict(config_path_or_dict) -> dict:
    """A config as a plain dict, from a dict or a config.json path; needs model_type.
    A missing or unreadable file, text that is not a JSON object, or no model_type: BadConfigError."""
    label = _label(config_path_or_dict)
    if isinstance(config_path_or_dict, (str, Path)):
        try:
            d = json.loads(Path(config_path_or_dict).read_text())
        except OSError as exc:
            raise BadConfigError(f"{label}: cannot read it ({exc.strerror or exc})") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise BadConfigError(f"{label}: not valid JSON ({exc})") from exc
        if not isinstance(d, dict):
            raise BadConfigError(f"{label}: holds a JSON {type(d).__name__}, not an object of config keys")
    elif isinstance(config_path_or_dict, dict):
        d = dict(config_path_or_dict)
    else:
        raise TypeError(f"config must be a dict or a path to config.json, got {type(config_path_or_dict).__name__}")
    if not d.get("model_type"):
        raise BadConfigError(f"{label} has no model_type (keys: {sorted(d)[:12]}...)")
    return d


def causal_lm_config(config_path_or_dict, attn_implementation: str = "eager"):
    """The transformers config a config.json or dict describes; BadConfigError naming the file
    when transformers does not know its model_type or refuses its keys."""
    from transformers import AutoConfig

    label = _label(config_path_or_dict)
    d = load_config_dict(config_path_or_dict)
    model_type = d.pop("model_type")
    d.setdefault("use_cache", False)
    try:
        # A config.json may carry from_pretrained-only keys; they are harmless to for_model.
        config = AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadConfigError(f"{label}: transformers cannot read model_type {model_type!r}: {_first_line(exc)}") from exc
    config._attn_implementation = attn_implementation
    return config


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _from_config(config, label: str, attn_implementation: str):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    except (ValueError, KeyError, TypeError) as exc:  # not a causal LM, or values its class refuses
        why = _first_line(exc)
        if "Unrecognized configuration class" in why:  # the rest of the line lists every causal LM
            why = f"AutoModelForCausalLM has no class for {type(config).__name__}"
        raise BadConfigError(f"{label}: model_type {config.model_type!r} is not a causal LM transformers can "
                             f"build: {why}") from exc


def available_memory_bytes() -> int | None:
    """Memory a new allocation can have now: MemAvailable from /proc/meminfo, else free pages."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_hf_config(config_path_or_dict, batch: int, seq: int, dtype: str = "float32", *,
                    attn_implementation: str = "eager", available_bytes: int | None = None):
    """Everything that can be refused before a causal LM is built, each as one BadConfigError or
    BadShapeError naming the value: the file, its JSON, its model_type, a config that is not a
    causal LM, seq beyond its positions, and memory: the parameters (counted on the meta device,
    exactly, nothing allocated) plus the (batch, seq, vocab) logits, against the memory
    available here. Returns the transformers config."""
    import torch

    check_dims(batch=batch, seq=seq)
    label = _label(config_path_or_dict)
    config = causal_lm_config(config_path_or_dict, attn_implementation)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and seq > limit:
        raise BadShapeError(f"seq={seq} exceeds the model's {limit} positions")
    with torch.device("meta"):
        meta = _from_config(config, label, attn_implementation)
    n_params = sum(p.numel() for p in meta.parameters())
    elem = element_bytes(dtype)
    params, logits = n_params * elem, batch * seq * int(getattr(config, "vocab_size", 0) or 0) * elem
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    if avail is not None and params + logits > avail:
        raise BadConfigError(f"{label}: too large for this machine: {n_params / 1e9:,.2f} B parameters need "
                             f"{params / GIB:,.1f} GiB in {dtype}, plus {logits / GIB:,.1f} GiB of logits at "
                             f"batch={batch} seq={seq}; {avail / GIB:,.1f} GiB of memory is available")
    return config


def build_causal_lm(config_path_or_dict, dtype: str = "float32", *, attn_implementation: str = "eager", seed: int = 0,
                    config=None):
    """A randomly initialised AutoModelForCausalLM from a config; nothing is downloaded.
    `config`: the transformers config check_hf_config returned, if already checked.

    Eager attention by default: its bmm/softmax/bmm are what the GEMM and utility models
    price; SDPA would run one fused op these models do not cover.
    """
    import torch

    if config is None:
        config = causal_lm_config(config_path_or_dict, attn_implementation)
    torch.manual_seed(seed)
    model = _from_config(config, _label(config_path_or_dict), attn_implementation)
    return model.eval().to(dtype=torch_dtype(dtype))


def causal_lm_inputs(model, batch: int, seq: int, seed: int = 0) -> dict:
    """A forward pass's keyword inputs: random token ids of shape (batch, seq), no KV cache. What
    predict_hf_config prices is what a measurement elsewhere (scripts/measure_hf.py) must run."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "use_cache": False}


def predict_hf_config(config_path_or_dict, batch: int, seq: int, gemm_model, utility_model,
                      overheads: OverheadModel | None, dtype: str = "float32", *, seed: int = 0,
                      attn_implementation: str = "eager", config=None, **kwargs) -> dict[str, Any]:
    """predict_module on a transformers causal LM built from its config, fed random token ids
    of shape (batch, seq), after check_hf_config (a bad or too large config is refused before
    anything is built; `config`: what check_hf_config already returned for these arguments).
    Extra keywords go to predict_module."""
    if config is None:
        config = check_hf_config(config_path_or_dict, batch, seq, dtype, attn_implementation=attn_implementation)
    model = build_causal_lm(config_path_or_dict, dtype, attn_implementation=attn_implementation, seed=seed,
                            config=config)
    inputs = causal_lm_inputs(model, batch, seq, seed)
    out = predict_module(model, inputs, gemm_model, utility_model, overheads, dtype, **kwargs)
    out.update(model_type=model.config.model_type, model=model, inputs=inputs)
    return out


def load_factory(spec: str):
    """`pkg.module:factory` -> the factory, imported from the current directory or sys.path;
    BadConfigError naming the spec when it is malformed, does not import, or names no callable."""
    mod, colon, attr = spec.partition(":")
    if not colon or not mod or not attr.isidentifier():
        raise BadConfigError(f"--module {spec!r}: expected pkg.module:factory")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:  # as `python -m` would: a module beside the user is importable
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(mod)
    except Exception as exc:  # the user's module: ImportError, SyntaxError, or whatever its import raised
        raise BadConfigError(f"--module {spec!r}: cannot import {mod!r}: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from exc
    finally:
        if added:
            sys.path.remove(cwd)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadConfigError(f"--module {spec!r}: {mod} has no callable {attr!r}")
    return factory


def call_factory(spec: str, factory) -> tuple:
    """(module_or_callable, inputs) from the factory, or BadConfigError saying what it returned."""
    got = factory()
    pair = isinstance(got, (tuple, list)) and len(got) == 2
    if pair and callable(got[0]):
        return got[0], got[1]
    if pair:
        what = f"a pair whose first item, a {type(got[0]).__name__}, is not callable"
    elif isinstance(got, (tuple, list)):
        what = f"a {type(got).__name__} of {len(got)} items"
    else:
        what = f"{type(got).__name__} {reprlib.repr(got)}"
    raise BadConfigError(f"--module {spec!r}: the factory returned {what}; expected (module_or_callable, inputs)")


def measure_call(fn_or_module, inputs, warmup: int = 5, reps: int = 25, blocks: int | None = None):
    """The real latency here, PM2Lat's protocol (5 warm-up, 25 timed, median), without profiling
    or autograd, in blocks (harness/stalls.quickest_block, MEASURE_BLOCKS unless given).
    Returns (the kept Measurement, every block's median in µs, in order)."""
    import torch

    from pipeline.harness.stalls import MEASURE_BLOCKS, quickest_block
    from pipeline.harness.timer import TimingSpec

    fn = _call(fn_or_module, inputs)
    with torch.inference_mode():
        return quickest_block(fn, TimingSpec.fixed(warmup, reps), blocks=MEASURE_BLOCKS if blocks is None else blocks)
