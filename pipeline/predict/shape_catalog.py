"""Public shapes `shape_advice` advises on: the co-design paper's cases, as config.json dicts
(dimensions from the models' published configs; nothing is downloaded), plus any config
files in a folder (the repository's tests/fixtures/hf). Plain data, no torch."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

NEOX = {"model_type": "gpt_neox", "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True}


@dataclass(frozen=True)
class Case:
    name: str
    config: dict
    claim: str  # what the paper reports
    propose: dict[str, int] = field(default_factory=dict)  # dimension -> value, priced beside the search
    against: str | None = None  # another case's name, compared whole


CASES: tuple[Case, ...] = (
    Case("gpt3-2.7b", {**NEOX, "hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 32,
                       "intermediate_size": 10240, "vocab_size": 50257},
         "32 heads -> 20 (head_dim 80 -> 128): 1.18x on A100 (paper VI-B, Fig. 1)", {"heads": 20}),
    Case("nanogpt-124m", {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
                          "n_positions": 1024, "activation_function": "gelu_pytorch_tanh"},
         "vocabulary 50257 -> 50304 (a multiple of 64): ~25% faster nanoGPT training (paper ref. 19)",
         {"vocab": 50304}),
    Case("llama-2-7b", {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                        "num_key_value_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008,
                        "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_act": "silu"},
         "intermediate size 11008 is among the best performing sizes in its range (paper VII-B)"),
    Case("pythia-410m", {**NEOX, "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
                         "intermediate_size": 4096, "vocab_size": 50304},
         "Pythia-1B infers faster than Pythia-410M: fewer heads and layers, larger hidden (paper VII-C, Fig. 13)",
         against="pythia-1b"),
    Case("pythia-1b", {**NEOX, "hidden_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 16,
                       "intermediate_size": 8192, "vocab_size": 50304}, "the comparison shape of pythia-410m"),
)


def case(name: str) -> Case:
    by = {c.name: c for c in CASES}
    if name not in by:
        from pipeline.core.errors import BadConfigError

        raise BadConfigError(f"unknown case {name!r}; expected one of {sorted(by)}")
    return by[name]


def fixture_cases(folder: Path) -> list[Case]:
    """One case per *.json config in `folder` (sorted), named after the file."""
    if not folder.is_dir():
        return []
    return [Case(p.stem, json.loads(p.read_text()), f"config file {p.name}") for p in sorted(folder.glob("*.json"))]
