"""Build and time a randomly initialised GPT-2 (torch + transformers; nothing is downloaded)."""
from __future__ import annotations

from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.timer import Measurement, TimingSpec, measure_step
from pipeline.workloads.gpt2 import GPT2Spec, check_batch_seq


def build_gpt2(spec: GPT2Spec, dtype: str = "float32", device: str = "cpu"):
    """GPT2LMHeadModel with the exact setup gpt2_ops describes: eager attention, tanh gelu, eval."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tdtype = torch_dtype(dtype)  # validates the name before the (slow) build
    config = GPT2Config(
        n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head,
        vocab_size=spec.vocab_size, n_positions=spec.n_positions,
        activation_function="gelu_pytorch_tanh", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        # transformers 5 reads this into config._attn_implementation; without it the model
        # would pick sdpa, whose fused kernel is not the op list's bmm/softmax/bmm.
        attn_implementation="eager", use_cache=False,
        # GPT-2's special token is the last id of its vocabulary, whatever the vocabulary's size.
        bos_token_id=spec.vocab_size - 1, eos_token_id=spec.vocab_size - 1,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"expected eager attention, got {model.config._attn_implementation!r}")
    return model.eval().to(device=device, dtype=tdtype)


def measure_forward(spec: GPT2Spec, batch: int, seq: int, dtype: str = "float32", device: str = "cpu",
                    warmup: int = 5, reps: int = 25) -> Measurement:
    """Median-ready timings of one full forward pass (PM2Lat's protocol: 5 warm-up, 25 timed)."""
    import torch

    check_batch_seq(spec, batch, seq)
    model = build_gpt2(spec, dtype, device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen).to(device)
    prev = torch.get_float32_matmul_precision()
    if dtype == "tf32":  # tf32 is float32 storage with TF32 matmul math
        torch.set_float32_matmul_precision("high")
    try:
        with torch.inference_mode():
            return measure_step(lambda: model(input_ids=ids, use_cache=False), TimingSpec.fixed(warmup, reps), device)
    finally:
        torch.set_float32_matmul_precision(prev)
