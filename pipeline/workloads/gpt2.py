"""GPT-2 workloads as plain data: configs and the operator list of one forward pass (no torch here).

The list mirrors what transformers 5.x GPT2LMHeadModel runs in eval mode with eager
attention (see gpt2_run.build_gpt2), checked op by op against torch.profiler on the CPU
(tests/test_gpt2_ops.py). Per layer, aten ops -> list entries:

  aten::layer_norm (ln_1, ln_2)              -> layernorm (B*S, E)
  aten::addmm (Conv1D: bias + x @ W[in,out]) -> mm m=B*S k=in n=out
      its aten::copy_ (CPU addmm first broadcasts the bias into the output) -> copy_bcast (B*S, out)
  aten::matmul(q, k^T) -> [clone q, clone k^T when B>1 and H>1] + aten::bmm -> copy_rows, copy + bmm
  aten::mul (attn_weights * scaling, its own kernel)           -> mul (B*H*S, S)
  aten::add (+ the float causal mask, broadcast over heads)     -> add (B*H*S, S)
  aten::softmax                                                 -> softmax (B*H*S, S)
  aten::matmul(p, v)   -> [clone v when B>1 and H>1] + aten::bmm -> copy_rows + bmm
  transpose(1, 2).reshape -> aten::clone when H>1 and S>1       -> copy_rows (B*S*H, D)
  aten::gelu (approximate="tanh"), two residual aten::add       -> gelu (B*S, 4E), add (B*S, E)
Not listed because they launch no kernel: .contiguous() after the reshape copy, the
`.type(value.dtype)` after softmax and aten::dropout in eval mode (both return their input).
Omitted on purpose: the mask is built once per forward, not per layer, from tiny tensors
(arange/diff/cumsum/ne/all over the (B, S) position ids for packed-sequence detection, then
aten::le + aten::where into a (B, 1, S, S) float mask), plus the aten::add of the position ids
and 0-d scalar copies; together far below one layer's (B*H*S, S) attention ops.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import BadShapeError, check_dims
from pipeline.core.ops import GemmOp, Op, UtilityOp


@dataclass(frozen=True)
class GPT2Spec:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int = 50257
    n_positions: int = 1024

    def __post_init__(self):
        check_dims(n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head,
                   vocab_size=self.vocab_size, n_positions=self.n_positions)
        if self.n_embd % self.n_head:
            raise BadShapeError(f"{self.name}: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Sized for a 2-core CPU: all quick runs (each config x batch {1,4,8} x seq 128 x 30 forwards,
# model builds included) took ~35 s on the dev machine (batch-8 forward: 2l-256 ~170 ms,
# 4l-512 ~400 ms); a third config (3l-384, ~14 s more) would leave too little headroom
# under the 60 s budget. The 50257-wide LM head is 66-88% of the GEMM FLOPs at these sizes.
QUICK_CONFIGS: tuple[GPT2Spec, ...] = (
    # A small model where, at batch 1, host overhead is a large share of the step (issue 4).
    GPT2Spec("gpt2-1l-128", n_layer=1, n_embd=128, n_head=2),
    GPT2Spec("gpt2-2l-256", n_layer=2, n_embd=256, n_head=4),
    GPT2Spec("gpt2-4l-512", n_layer=4, n_embd=512, n_head=8),
)
# For tests: one small model with a small vocabulary, seconds to build and run.
TINY_CONFIGS: tuple[GPT2Spec, ...] = (GPT2Spec("gpt2-tiny", n_layer=2, n_embd=64, n_head=2, vocab_size=1024),)
FULL_CONFIGS: tuple[GPT2Spec, ...] = QUICK_CONFIGS + (
    GPT2Spec("gpt2", n_layer=12, n_embd=768, n_head=12),
    GPT2Spec("gpt2-medium", n_layer=24, n_embd=1024, n_head=16),
    GPT2Spec("gpt2-large", n_layer=36, n_embd=1280, n_head=20),
)


CONFIG_SETS = {"tiny": TINY_CONFIGS, "quick": QUICK_CONFIGS, "full": FULL_CONFIGS}


def configs_for(name: str) -> tuple[GPT2Spec, ...]:
    if name not in CONFIG_SETS:
        raise BadShapeError(f"unknown GPT-2 config set {name!r}; expected one of {sorted(CONFIG_SETS)}")
    return CONFIG_SETS[name]


def check_batch_seq(spec: GPT2Spec, batch: int, seq: int) -> None:
    check_dims(batch=batch, seq=seq)
    if seq > spec.n_positions:
        raise BadShapeError(f"seq={seq} exceeds n_positions={spec.n_positions} of {spec.name}")


def gpt2_ops(spec: GPT2Spec, batch: int, seq: int, *, bias_copy: bool = True) -> list[Op]:
    """The ops of one forward pass; identical per-layer ops are folded with count=n_layer.

    bias_copy: CPU aten::addmm copies the bias into the output before the GEMM; pass False
    for a backend that fuses the bias into the GEMM (cuBLASLt's epilogue on CUDA).
    """
    check_batch_seq(spec, batch, seq)
    t, e, h, d, n = batch * seq, spec.n_embd, spec.n_head, spec.head_dim, spec.n_layer
    bh_rows = batch * h * seq  # attention-score rows: one per (batch, head, query)
    # matmul folds (B, H) into one bmm batch; q, k^T and v are strided views of the c_attn
    # output, so that reshape has to copy unless B or H is 1 (then it is a view).
    heads_copy = batch > 1 and h > 1

    def conv1d(name: str, k_in: int, n_out: int) -> list[Op]:
        ops: list[Op] = [GemmOp(name, "mm", m=t, n=n_out, k=k_in, count=n)]
        if bias_copy:
            ops.append(UtilityOp(f"{name}.bias", "copy_bcast", rows=t, cols=n_out, count=n))
        return ops

    ops: list[Op] = [
        UtilityOp("wte", "embedding", rows=t, cols=e),
        # position_ids are (1, S): wpe gathers S rows once and the add broadcasts them.
        UtilityOp("wpe", "embedding", rows=seq, cols=e),
        UtilityOp("embed_add", "add", rows=t, cols=e),
        UtilityOp("ln_1", "layernorm", rows=t, cols=e, count=n),
        *conv1d("attn.c_attn", e, 3 * e),
    ]
    if heads_copy:
        # q is permuted whole rows of head_dim; k^T transposes each head (price.copy_layout)
        ops.append(UtilityOp("attn.q_copy", "copy_rows", rows=bh_rows, cols=d, count=n))
        ops.append(UtilityOp("attn.kt_copy", "copy", rows=bh_rows, cols=d, count=n))
    ops += [
        GemmOp("attn.qk", "bmm", m=seq, n=seq, k=d, batch=batch * h, count=n),
        UtilityOp("attn.scale", "mul", rows=bh_rows, cols=seq, count=n),
        UtilityOp("attn.mask", "add", rows=bh_rows, cols=seq, count=n),
        UtilityOp("attn.softmax", "softmax", rows=bh_rows, cols=seq, count=n),
    ]
    if heads_copy:
        ops.append(UtilityOp("attn.v_copy", "copy_rows", rows=bh_rows, cols=d, count=n))
    ops.append(GemmOp("attn.pv", "bmm", m=seq, n=d, k=seq, batch=batch * h, count=n))
    if h > 1 and seq > 1:  # (B, H, S, D) -> (B, S, H*D) cannot be a view
        ops.append(UtilityOp("attn.merge_heads", "copy_rows", rows=t * h, cols=d, count=n))
    ops += [
        *conv1d("attn.c_proj", e, e),
        UtilityOp("resid_attn", "add", rows=t, cols=e, count=n),
        UtilityOp("ln_2", "layernorm", rows=t, cols=e, count=n),
        *conv1d("mlp.c_fc", e, 4 * e),
        UtilityOp("mlp.gelu", "gelu", rows=t, cols=4 * e, count=n),
        *conv1d("mlp.c_proj", 4 * e, e),
        UtilityOp("resid_mlp", "add", rows=t, cols=e, count=n),
        UtilityOp("ln_f", "layernorm", rows=t, cols=e),
        # nn.Linear without bias on a 3-D input: aten::linear -> matmul -> one aten::mm.
        GemmOp("lm_head", "linear", m=t, n=spec.vocab_size, k=e),
    ]
    return ops
