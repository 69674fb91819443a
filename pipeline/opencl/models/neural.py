"""What the two prompt models share: the regression head on log2(time), target scaling,
the training loop (AdamW, linear warm-up then decay, MSE, as in LLMPerf III-B / IV-B1),
batched prediction, and weights saved as a safetensors state dict beside model.json."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import MissingModelError

WEIGHTS = "weights.safetensors"


class Head(nn.Module):
    """Regression head. pool="concat" is LLMPerf's: the N token vectors (d each) concatenated
    into one N*d vector (padding zeroed), then an MLP to one number; its weights are tied to
    token positions, which needs many launches. pool="mean" averages the token vectors first
    (position-free, d inputs), for small datasets."""

    def __init__(self, tokens: int, dim: int, hidden: int, pool: str = "concat"):
        super().__init__()
        if pool not in ("concat", "mean"):
            raise ValueError(f"unknown pooling {pool!r}; expected 'concat' or 'mean'")
        self.pool = pool
        width = tokens * dim if pool == "concat" else dim
        self.mlp = nn.Sequential(nn.Dropout(0.1), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = h * mask[..., None]
        x = h.flatten(1) if self.pool == "concat" else h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.mlp(x)[:, 0]


def scaler(y_log2: np.ndarray) -> tuple[float, float]:
    """Mean and spread of the training targets: the net learns (y - mean) / std."""
    std = float(np.std(y_log2))
    return float(np.mean(y_log2)), std if std > 1e-6 else 1.0


def lr_lambda(total_steps: int, warmup_frac: float):
    warm = max(1, int(total_steps * warmup_frac))
    return lambda s: min((s + 1) / warm, max(0.0, (total_steps - s) / max(1, total_steps - warm)))


def train(step_loss, n: int, epochs: int, batch_size: int, params, lr: float, seed: int,
          warmup_frac: float = 0.1, log=None) -> dict:
    """Mini-batch training: step_loss(index_tensor) -> scalar loss for those rows. Returns the
    loss history and wall time."""
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    steps = max(1, epochs * ((n + batch_size - 1) // batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps, warmup_frac))
    gen = torch.Generator().manual_seed(seed)
    history, t0 = [], time.perf_counter()
    for epoch in range(epochs):
        perm, total = torch.randperm(n, generator=gen), 0.0
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            loss = step_loss(idx)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / n)
        if log:
            log(f"epoch {epoch + 1}/{epochs}: mse {history[-1]:.4f}")
    return {"loss_history": history, "train_s": time.perf_counter() - t0}


def save_weights(module: nn.Module, directory: Path, only_trainable: bool = True) -> str:
    """State dict (trainable tensors only, when the rest is the pretrained package's) to
    safetensors; returns its sha256, recorded in model.json so a swapped file is caught."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in module.named_parameters()
             if v.requires_grad or not only_trainable}
    path = Path(directory) / WEIGHTS
    save_file(state, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_weights(module: nn.Module, directory: Path, sha256: str | None) -> None:
    """Loads the saved tensors into `module`; MissingModelError if the file is missing,
    corrupt, altered, or does not fit the architecture."""
    from safetensors.torch import load_file

    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise MissingModelError(f"saved model weights {path} are missing")
    if sha256 and hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        raise MissingModelError(f"saved model weights {path} are corrupt: sha256 differs from model.json")
    try:
        state = load_file(str(path))
        missing = set(state) - set(dict(module.named_parameters()))
        if missing:
            raise KeyError(f"unexpected tensors {sorted(missing)[:3]}")
        module.load_state_dict(state, strict=False)
    except Exception as exc:  # safetensors and torch raise several types for a bad file
        raise MissingModelError(f"saved model weights {path} are corrupt: {exc}") from exc


@torch.no_grad()
def predict_batches(forward, n: int, batch_size: int) -> np.ndarray:
    """forward(index_tensor) -> standardised outputs, over all n rows in batches."""
    out = [forward(torch.arange(i, min(n, i + batch_size))).float().cpu().numpy() for i in range(0, n, batch_size)]
    return np.concatenate(out) if out else np.zeros(0)


class PromptModel:
    """What opencl_lm and opencl_scratch share around their networks: the training sample and
    its target scaling, the training call, batched prediction and the saved weights.
    Subclasses set `net`, `size`, `y_mean`, `y_std`, `info` and define encode(rows) ->
    (ids, mask, truncated) and forward(ids, mask) -> standardised log2 time."""

    predict_batch = 64

    @staticmethod
    def training_sample(rows, max_rows: int, seed: int):
        """(rows, log2 targets, mean, std): at most max_rows launches (0: all), sampled with the seed."""
        if max_rows and len(rows) > max_rows:
            rows = rows.sample(max_rows, random_state=seed)
        y = np.log2(rows["median_us"].to_numpy(float))
        return (rows, y, *scaler(y))

    def standardised(self, y: np.ndarray) -> torch.Tensor:
        return torch.tensor((y - self.y_mean) / self.y_std, dtype=torch.float32)

    def run_training(self, step_loss, n: int, seed: int, truncated: int, device, log) -> None:
        size = self.size
        hist = train(step_loss, n, size.epochs, size.batch_size, self.net.parameters(), size.lr, seed, log=log)
        self.net.eval()
        self.info = {**hist, "train_rows": n, "truncated_prompts": truncated, "device": str(device)}

    def predict(self, rows, device=None) -> np.ndarray:
        """Predicted microseconds per launch."""
        device = device or next(self.net.parameters()).device
        self.net.to(device).eval()
        ids, mask, _ = self.encode(rows)
        z = predict_batches(lambda i: self.forward(ids[i].to(device), mask[i].to(device)), len(ids),
                            self.predict_batch)
        return np.exp2(z * self.y_std + self.y_mean)

    def write_artifacts(self, directory: Path) -> None:
        self.info["weights_sha256"] = save_weights(self.net, directory)
