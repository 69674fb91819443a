"""gpt2_ops checked against what torch.profiler sees a real transformers GPT-2 forward run."""
from __future__ import annotations

import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pipeline.core.errors import BadShapeError  # noqa: E402
from pipeline.workloads.gpt2 import QUICK_CONFIGS, GPT2Spec, gpt2_ops  # noqa: E402
from pipeline.workloads.gpt2_run import build_gpt2, measure_forward  # noqa: E402
from pipeline.core.ops import GemmOp  # noqa: E402

SPEC = QUICK_CONFIGS[0]
SEQ = 16
# aten op -> the op-list kind it is priced as (GEMMs by torch call, utilities by UtilityOp.op).
GEMM_ATEN = {"aten::addmm": "mm", "aten::bmm": "bmm", "aten::mm": "linear"}
UTIL_ATEN = {"aten::layer_norm": "layernorm", "aten::softmax": "softmax", "aten::gelu": "gelu",
             "aten::add": "add", "aten::mul": "mul", "aten::copy_": "copy", "aten::embedding": "embedding"}


@pytest.fixture(scope="module")
def model():
    return build_gpt2(SPEC)


def profile_forward(model, batch: int, seq: int):
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, SPEC.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(input_ids=ids, use_cache=False)
    return [e for e in prof.events() if e.name in GEMM_ATEN or e.name in UTIL_ATEN]


def gemm_flops(e) -> int:
    shapes = e.input_shapes
    if e.name == "aten::addmm":  # (bias, x[m, k], w[k, n])
        (m, k), (_, n) = shapes[1], shapes[2]
        return 2 * m * k * n
    if e.name == "aten::bmm":
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return 2 * b * m * k * n
    (m, k), (_, n) = shapes[0], shapes[1]
    return 2 * m * k * n


def util_elements(e) -> int:
    if e.name == "aten::embedding":  # (weight, indices): gathers numel(indices) rows
        return math.prod(e.input_shapes[1]) * e.input_shapes[0][1]
    return math.prod(e.input_shapes[0])


@pytest.mark.parametrize("batch", [1, 2])
def test_gemms_match_profiler(model, batch):
    events = [e for e in profile_forward(model, batch, SEQ) if e.name in GEMM_ATEN]
    ops = [o for o in gpt2_ops(SPEC, batch, SEQ) if isinstance(o, GemmOp)]
    calls, flops = Counter(), Counter()
    for e in events:
        calls[GEMM_ATEN[e.name]] += 1
        flops[GEMM_ATEN[e.name]] += gemm_flops(e)
    want_calls, want_flops = Counter(), Counter()
    for o in ops:
        want_calls[o.op] += o.count
        want_flops[o.op] += o.flops * o.count
    assert calls == want_calls
    assert flops == want_flops


@pytest.mark.parametrize("batch", [1, 2])
def test_utilities_match_profiler(model, batch):
    # Mask creation (once per forward) and scalar/position-id ops touch at most batch*seq
    # elements; gpt2_ops omits them, so the profiler side skips them too.
    tiny = batch * SEQ
    calls, elems = Counter(), Counter()
    for e in profile_forward(model, batch, SEQ):
        if e.name in UTIL_ATEN and (e.name == "aten::embedding" or util_elements(e) > tiny):
            calls[UTIL_ATEN[e.name]] += 1
            elems[UTIL_ATEN[e.name]] += util_elements(e)
    want_calls, want_elems = Counter(), Counter()
    for o in gpt2_ops(SPEC, batch, SEQ):
        if not isinstance(o, GemmOp):
            kind = "copy" if o.op.startswith("copy") else o.op  # the profiler's shapes say no layout
            want_calls[kind] += o.count
            want_elems[kind] += o.rows * o.cols * o.count
    for kind in ("softmax", "layernorm", "gelu"):
        assert calls[kind] == want_calls[kind] > 0, kind
    assert calls == want_calls
    assert elems == want_elems


@pytest.mark.parametrize("batch, seq, needle", [(0, 16, "batch=0"), (2, -1, "seq=-1"), (2, 1025, "1025")])
def test_bad_shapes(batch, seq, needle):
    with pytest.raises(BadShapeError, match=needle):
        gpt2_ops(SPEC, batch, seq)
    with pytest.raises(BadShapeError, match=needle):
        measure_forward(SPEC, batch, seq)


def test_heads_must_divide_hidden():
    with pytest.raises(BadShapeError, match=r"n_embd=100.*n_head=3"):
        GPT2Spec("bad", n_layer=2, n_embd=100, n_head=3)


def test_measure_forward_smallest():
    m = measure_forward(SPEC, batch=1, seq=SEQ, warmup=1, reps=3)
    assert m.reps == 3
    assert m.median_us > 0
