"""opencl_scratch: a small transformer encoder trained from scratch on the LLMPerf prompts.

The tokenizer is deliberately simple: identifiers and keywords are words, every other
non-space character is its own token, and an integer becomes a magnitude token `<2^b>`
(b = its bit length) -- latency depends on a size's order of magnitude, and a from-scratch
model sees too few launches to learn arithmetic on digit strings. The vocabulary is the
training prompts' most frequent tokens; anything else is <unk>.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from pipeline.opencl.models import neural
from pipeline.opencl.models.prompts import launch_prompts
from pipeline.opencl.models.settings import ScratchSize

PAD, UNK, CLS = "<pad>", "<unk>", "<cls>"
_TOKEN = re.compile(r"\d+\.\d*f?|\d+[uUlL]*|0x[0-9a-fA-F]+|[A-Za-z_]\w*|\S")


def tokenize(text: str) -> list[str]:
    out = []
    for t in _TOKEN.findall(text):
        if t[0].isdigit():
            digits = t.rstrip("uUlLf")
            is_int = digits.isdigit() or digits.startswith("0x")
            out.append(f"<2^{int(digits, 0).bit_length()}>" if is_int else "<float>")
        else:
            out.append(t)
    return out


def build_vocab(prompts: list[str], size: int) -> list[str]:
    counts = Counter(t for p in prompts for t in tokenize(p))
    return [PAD, UNK, CLS] + [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:size - 3]


class ScratchNet(nn.Module):
    def __init__(self, vocab: int, size: ScratchSize):
        super().__init__()
        self.embed = nn.Embedding(vocab, size.dim, padding_idx=0)
        self.pos = nn.Embedding(size.max_tokens, size.dim)
        layer = nn.TransformerEncoderLayer(size.dim, size.heads, 2 * size.dim, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.head = neural.Head(size.max_tokens, size.dim, size.dim, size.pool)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
        return self.head(self.encoder(h, src_key_padding_mask=~mask.bool()), mask.float())


class ScratchModel(neural.PromptModel):
    name = "opencl_scratch"
    predict_batch = 256

    def __init__(self, size: ScratchSize, vocab: list[str], net: ScratchNet, y_mean: float, y_std: float,
                 info: dict | None = None):
        self.size, self.vocab, self.net, self.y_mean, self.y_std = size, vocab, net, y_mean, y_std
        self.index = {t: i for i, t in enumerate(vocab)}
        self.info = info or {}

    def encode(self, rows: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor, int]:
        n = self.size.max_tokens
        prompts, cut = launch_prompts(rows, lambda t: len(tokenize(t)) + 1, n)  # +1: the <cls> in front
        ids = np.zeros((len(prompts), n), dtype=np.int64)
        for r, p in enumerate(prompts):
            toks = [self.index[CLS]] + [self.index.get(t, 1) for t in tokenize(p)]
            ids[r, :min(n, len(toks))] = toks[:n]
        ids = torch.from_numpy(ids)
        return ids, (ids != 0).long(), cut

    @classmethod
    def fit(cls, rows: pd.DataFrame, size: ScratchSize, device: str = "cpu", seed: int = 0,
            log=None) -> "ScratchModel":
        torch.manual_seed(seed)
        rows, y, mean, std = cls.training_sample(rows, size.max_train_rows, seed)
        vocab = build_vocab(launch_prompts(rows)[0], size.vocab)
        model = cls(size, vocab, ScratchNet(len(vocab), size).to(device), mean, std)
        ids, mask, cut = model.encode(rows)
        target = model.standardised(y)
        net = model.net.train()

        def step_loss(idx):
            return nn.functional.mse_loss(net(ids[idx].to(device), mask[idx].to(device)), target[idx].to(device))

        model.run_training(step_loss, len(rows), seed, cut, device, log)
        return model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(ids, mask)

    def to_dict(self) -> dict:
        return {"size": self.size.__dict__, "vocab": self.vocab, "y_mean": self.y_mean, "y_std": self.y_std,
                "info": self.info}

    @classmethod
    def from_dir(cls, d: dict, directory: Path) -> "ScratchModel":
        size = ScratchSize(**d["size"])
        net = ScratchNet(len(d["vocab"]), size)
        neural.load_weights(net, directory, d["info"].get("weights_sha256"))
        return cls(size, list(d["vocab"]), net.eval(), float(d["y_mean"]), float(d["y_std"]), d["info"])
