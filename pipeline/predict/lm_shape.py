"""A causal LM's shape as plain data (no torch): read from a Hugging Face config dict, its
parameter count, the operators of one forward pass, and the config dict of a reshaped model.

One decoder layer, as the co-design paper's Table II lists it (generalised to grouped KV
heads and gated MLPs): the QKV projection (fused for GPT-2 / GPT-NeoX, three linears
otherwise), the attention score and attention-over-value BMMs (batch b*a), the output
projection, the MLP (2 matrices, or 3 for SwiGLU), plus the LM head (n = vocabulary).
The memory-bound ops around them (norms, softmax, activation, residual adds) are priced by
the utility model so a step's time is the whole kernel sum, not the GEMMs alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.errors import BadConfigError, BadShapeError, check_dims
from pipeline.core.ops import GemmOp, Op, UtilityOp

GATED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2", "granite", "smollm3")
FUSED_QKV = ("gpt2", "gpt_neox", "gpt_bigcode", "bloom", "falcon", "phi3")
LEARNED_POS = ("gpt2", "opt", "gpt_neo", "gpt_bigcode")


@dataclass(frozen=True)
class LMShape:
    """The dimensions devchar advises on. attn_width = heads * head_dim (the hidden size unless
    the config sets head_dim, as Qwen3 does); ffn = the MLP's intermediate size."""

    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated: bool = False  # SwiGLU: gate and up projections, then down
    fused_qkv: bool = False
    bias: bool = True  # linears carry biases (GPT-2, NeoX, OPT) or not (Llama)
    norm: str = "layernorm"
    act: str = "gelu"
    tied: bool = True  # the LM head shares the embedding's weights
    positions: int = 0  # learned position embeddings (rows), 0 for rotary
    explicit_head_dim: bool = False  # the config names head_dim itself

    def __post_init__(self):
        check_dims(layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                   head_dim=self.head_dim, ffn=self.ffn, vocab=self.vocab)
        if not self.explicit_head_dim and self.hidden % self.heads:
            raise BadShapeError(f"{self.name}: hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise BadShapeError(f"{self.name}: heads={self.heads} is not divisible by kv_heads={self.kv_heads}")

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim

    def with_(self, **changes) -> "LMShape":
        """A reshaped copy; head_dim follows heads when the config derives it from hidden."""
        s = replace(self, **changes)
        if not s.explicit_head_dim and ("hidden" in changes or "heads" in changes) and "head_dim" not in changes:
            if s.hidden % s.heads:
                raise BadShapeError(f"{s.name}: hidden={s.hidden} is not divisible by heads={s.heads}")
            s = replace(s, head_dim=s.hidden // s.heads)
        return s

    def params(self) -> int:
        """Parameters of the model transformers builds from the config (biases and norms counted)."""
        h, d, a, kv, f = self.hidden, self.head_dim, self.heads, self.kv_heads, self.ffn
        b = 1 if self.bias else 0
        norm = 2 * h if self.norm == "layernorm" else h
        attn = h * (a + 2 * kv) * d + b * (a + 2 * kv) * d + a * d * h + b * h
        if self.model_type == "qwen2":  # biases on q, k, v only
            attn += (a + 2 * kv) * d
        if self.model_type == "qwen3":  # q_norm, k_norm over head_dim
            attn += 2 * d
        if self.model_type == "gpt_neo":  # q, k, v without bias; out_proj and the MLP with
            attn, b = h * 3 * a * d + a * d * h + h, 1
        mlp = (3 * h * f) if self.gated else (2 * h * f + b * (f + h))
        layer = attn + mlp + 2 * norm
        embed = self.vocab * h + self.positions * h
        head = 0 if self.tied else self.vocab * h
        return self.layers * layer + embed + norm + head

    def gemms(self, batch: int, seq: int, op: str = "linear") -> list[GemmOp]:
        """One layer's GEMMs and the LM head's, in execution order (count = layers for a layer's).
        `op`: the GEMM kind a linear runs as on the target ("mm" for GPT-2's Conv1D addmm)."""
        check_dims(batch=batch, seq=seq)
        t, n, a, kv, d, h = batch * seq, self.layers, self.heads, self.kv_heads, self.head_dim, self.hidden
        lin = "mm" if self.model_type == "gpt2" else op
        if self.fused_qkv:
            qkv = [GemmOp("qkv", lin, m=t, n=(a + 2 * kv) * d, k=h, count=n)]
        else:
            qkv = [GemmOp("q", lin, m=t, n=a * d, k=h, count=n),
                   GemmOp("k", lin, m=t, n=kv * d, k=h, count=n), GemmOp("v", lin, m=t, n=kv * d, k=h, count=n)]
        mlp_in = [GemmOp("mlp.gate", lin, m=t, n=self.ffn, k=h, count=n)] if self.gated else []
        return qkv + [
            GemmOp("attn.score", "bmm", m=seq, n=seq, k=d, batch=batch * a, count=n),
            GemmOp("attn.over_value", "bmm", m=seq, n=d, k=seq, batch=batch * a, count=n),
            GemmOp("attn.out", lin, m=t, n=h, k=a * d, count=n),
            *mlp_in,
            GemmOp("mlp.up", lin, m=t, n=self.ffn, k=h, count=n),
            GemmOp("mlp.down", lin, m=t, n=h, k=self.ffn, count=n),
            GemmOp("lm_head", "linear", m=t, n=self.vocab, k=h),
        ]

    def utility_ops(self, batch: int, seq: int) -> list[UtilityOp]:
        t, n, h, rows = batch * seq, self.layers, self.hidden, batch * self.heads * seq
        act = {"gelu": "gelu", "silu": "silu", "relu": "relu"}.get(self.act, "gelu")
        ops = [UtilityOp("embed", "embedding", rows=t, cols=h),
               UtilityOp("norm", self.norm, rows=t, cols=h, count=2 * n),
               UtilityOp("attn.scale", "mul", rows=rows, cols=seq, count=n),
               UtilityOp("attn.mask", "add", rows=rows, cols=seq, count=n),
               UtilityOp("attn.softmax", "softmax", rows=rows, cols=seq, count=n),
               UtilityOp("mlp.act", act, rows=t, cols=self.ffn, count=n),
               UtilityOp("residual", "add", rows=t, cols=h, count=2 * n),
               UtilityOp("final_norm", self.norm, rows=t, cols=h)]
        if self.gated:
            ops.append(UtilityOp("mlp.gate_mul", "mul", rows=t, cols=self.ffn, count=n))
        if self.heads > 1 and seq > 1:
            # (B, H, S, D) -> (B, S, H*D): rows of head_dim, permuted (price.copy_layout)
            ops.append(UtilityOp("attn.merge_heads", "copy_rows", rows=t * self.heads, cols=self.head_dim, count=n))
        return ops

    def ops(self, batch: int, seq: int) -> list[Op]:
        return [*self.gemms(batch, seq), *self.utility_ops(batch, seq)]


def _get(d: dict, label: str, *keys, default=None, required=True):
    for k in keys:
        if d.get(k) is not None:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise BadConfigError(f"{label}: {k}={v!r} is not an integer")
            if v <= 0:
                raise BadConfigError(f"{label}: {k}={v} must be positive")
            return v
    if required and default is None:
        raise BadConfigError(f"{label}: none of {list(keys)} is set")
    return default


def from_hf_config(d: dict, name: str | None = None) -> LMShape:
    """The shape a config.json dict describes (GPT-2, GPT-Neo, GPT-NeoX, OPT, Llama, Mistral,
    Qwen2/3 and other decoders with the usual keys); BadConfigError naming the bad key."""
    mt = d.get("model_type")
    if not mt:
        raise BadConfigError(f"config {name or ''} has no model_type")
    label = f"config {name or mt}"
    layers = _get(d, label, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(d, label, "hidden_size", "n_embd", "d_model")
    heads = _get(d, label, "num_attention_heads", "n_head", "num_heads")
    kv = _get(d, label, "num_key_value_heads", required=False, default=heads)
    explicit = d.get("head_dim") is not None
    if explicit:
        head_dim = _get(d, label, "head_dim")
    else:
        if hidden % heads:
            raise BadConfigError(f"{label}: hidden size {hidden} is not divisible by {heads} attention heads")
        head_dim = hidden // heads
    if heads % kv:
        raise BadConfigError(f"{label}: {heads} attention heads are not divisible by {kv} key/value heads")
    ffn = _get(d, label, "intermediate_size", "n_inner", "ffn_dim", required=False, default=4 * hidden)
    vocab = _get(d, label, "vocab_size")
    act = str(d.get("hidden_act") or d.get("activation_function") or "gelu")
    act = "silu" if "silu" in act or "swish" in act else "relu" if act == "relu" else "gelu"
    gated = mt in GATED
    rms = gated or mt in ("gemma",)
    pos = _get(d, label, "n_positions", "max_position_embeddings", required=False, default=0) \
        if mt in LEARNED_POS else 0
    if mt == "opt":
        pos += 2  # OPT's learned positions are offset by 2
    bias = mt in ("gpt2", "gpt_neox", "opt", "gpt_bigcode", "bloom") or bool(d.get("attention_bias", False))
    default_tied = mt in ("gpt2", "opt", "gpt_neo", "gpt_bigcode", "bloom", "gemma", "gemma2")
    tied = bool(d.get("tie_word_embeddings", default_tied))
    try:
        return LMShape(name or d.get("_name_or_path") or mt, mt, layers, hidden, heads, kv, head_dim, ffn, vocab,
                       gated=gated, fused_qkv=mt in FUSED_QKV, bias=bias, norm="rmsnorm" if rms else "layernorm",
                       act=act, tied=tied, positions=pos, explicit_head_dim=explicit)
    except BadShapeError as exc:
        raise BadConfigError(f"{label}: {exc}") from exc


KEYS = {  # LMShape field -> the config keys that may hold it
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
}


def to_hf_config(base: dict, shape: LMShape) -> dict:
    """`base` with the dimensions of `shape` written back under the keys base uses."""
    out = dict(base)
    for field, keys in KEYS.items():
        present = [k for k in keys if base.get(k) is not None]
        value = getattr(shape, field)
        if present:
            out[present[0]] = value
        elif field == "ffn" and value != 4 * shape.hidden:
            out[{"gpt2": "n_inner", "opt": "ffn_dim"}.get(shape.model_type, "intermediate_size")] = value
        elif field == "kv_heads" and value != shape.heads:
            out["num_key_value_heads"] = value
    if shape.model_type == "opt":
        out["word_embed_proj_dim"] = shape.hidden
    return out


def gpt2_config(layers: int, hidden: int, heads: int, vocab: int, positions: int = 1024) -> dict:
    """The HF config dict of the GPT-2 flags (`devchar predict`'s --layers/--hidden/--heads/--vocab)."""
    return {"model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads, "vocab_size": vocab,
            "n_positions": positions, "activation_function": "gelu_pytorch_tanh", "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
