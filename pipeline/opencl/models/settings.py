"""How big each OpenCL model is and how long it trains, per sweep profile.

`tiny` is for tests (seconds). `quick` is the CPU default: all three models together train
in about two minutes on a 2-core machine, so the LM keeps MiniLM's first 4 of 6 layers,
fine-tunes only the top one, on a sample of 640 launches with prompts of 160 tokens.
`full` is for a GPU: prompts up to MiniLM's 512 positions, every layer trained, all launches;
on a GPU `quick` also trains bigger (CUDA_SIZES).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import DevcharError


@dataclass(frozen=True)
class LMSize:
    max_tokens: int  # prompt budget incl. [CLS]/[SEP]; the code section is cut to fit
    encoder_layers: int  # the pretrained encoder's first layers kept (MiniLM has 6): fewer is cheaper
    train_layers: int  # top encoder layers fine-tuned (the rest frozen, their outputs cached)
    head_hidden: int
    epochs: int
    batch_size: int
    lr: float
    max_train_rows: int  # launches sampled for training (0: all)
    pool: str = "concat"  # regression head: LLMPerf's "concat" of token vectors, or "mean"


@dataclass(frozen=True)
class ScratchSize:
    max_tokens: int
    dim: int
    layers: int
    heads: int
    vocab: int
    epochs: int
    batch_size: int
    lr: float
    max_train_rows: int
    pool: str = "concat"


@dataclass(frozen=True)
class Sizes:
    lm: LMSize
    scratch: ScratchSize
    trees_max_iter: int


SIZES = {
    "tiny": Sizes(LMSize(48, 2, 1, 16, 1, 8, 1e-4, 16), ScratchSize(96, 16, 1, 2, 500, 2, 8, 1e-3, 64), 20),
    "quick": Sizes(LMSize(160, 4, 1, 32, 3, 16, 2e-4, 640), ScratchSize(192, 48, 2, 4, 2000, 6, 32, 5e-4, 960), 200),
    "full": Sizes(LMSize(512, 6, 6, 256, 20, 16, 2e-5, 0), ScratchSize(512, 128, 4, 4, 8000, 40, 64, 3e-4, 0), 500),
}


def sizes(profile: str) -> Sizes:
    if profile not in SIZES:
        raise DevcharError(f"unknown profile {profile!r} for the OpenCL models; expected one of {sorted(SIZES)}")
    return SIZES[profile]


# On a GPU the same profile names train bigger: longer prompts, more layers, more launches.
CUDA_SIZES = {
    "quick": Sizes(LMSize(384, 6, 3, 128, 8, 16, 5e-5, 0), ScratchSize(384, 128, 3, 4, 4000, 30, 64, 3e-4, 0), 300),
}


def sizes_for(profile: str, torch_device: str) -> Sizes:
    base = sizes(profile)
    return CUDA_SIZES.get(profile, base) if str(torch_device).startswith("cuda") else base


def train_device(requested: str = "") -> str:
    """Where the prompt models train: `requested` (the device_runner resource's train_device,
    $DEVCHAR_TRAIN_DEVICE) if given, else the GPU when torch sees one."""
    import torch

    return requested or ("cuda" if torch.cuda.is_available() else "cpu")
