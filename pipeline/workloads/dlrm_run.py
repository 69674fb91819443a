"""Build, train and time a randomly initialised DLRM (torch only; nothing is downloaded).

The model is facebookresearch/dlrm's DLRM_Net (dlrm_s_pytorch.py) with the dot interaction
and the options the paper's runs use: sparse EmbeddingBags in sum mode, BCE loss, plain
SGD (which applies the sparse embedding gradients to the looked-up rows only). With
batched=True all tables share one EmbeddingBag and one lookup, the batched embedding op
of the paper's Fig. 11 (Tulloch's table-batched lookup, as FBGEMM's TBE does it on GPUs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate, cycle
from typing import Callable

import torch
from torch import nn
from torch.nn.utils import skip_init

from pipeline.harness.timer import Measurement, TimingSpec, measure_step
from pipeline.workloads.dlrm import DLRMSpec, check_batch


def _mlp(in_dim: int, widths: tuple[int, ...], sigmoid_last: bool) -> nn.Sequential:
    """Linear+ReLU per width; the top MLP ends in a sigmoid instead (dlrm's sigmoid_top)."""
    layers: list[nn.Module] = []
    for i, out_dim in enumerate(widths):
        lin = nn.Linear(in_dim, out_dim)
        # dlrm's init: Glorot-like normal weights, normal biases (std sqrt(1/out)).
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (in_dim + out_dim)))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / out_dim))
        last = i == len(widths) - 1
        layers += [lin, nn.Sigmoid() if last and sigmoid_last else nn.ReLU()]
        in_dim = out_dim
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """forward(dense (B, F), indices (T, B*L), offsets (T, B)) -> click probability (B, 1).

    indices/offsets are dlrm's lS_i/lS_o stacked per table: each table's flat index list
    and the start of each bag in it. The batched variant shifts them into the one big table.
    """

    def __init__(self, spec: DLRMSpec, batched: bool = False, sparse: bool = True):
        super().__init__()
        self.spec, self.batched = spec, batched
        rows, dim = spec.table_rows, spec.embedding_dim
        self.bottom = _mlp(spec.dense_features, spec.bottom_mlp, sigmoid_last=False)
        self.top = _mlp(spec.interaction_dim, spec.top_mlp, sigmoid_last=True)

        def bag(num_rows: int) -> nn.EmbeddingBag:
            # skip_init: the default normal_ fill would be overwritten below, and filling
            # 8M rows twice doubles the build time of the full configs.
            return skip_init(nn.EmbeddingBag, num_rows, dim, mode="sum", sparse=sparse,
                             device=torch.get_default_device())

        if batched:
            self.table = bag(sum(rows))
            slices = self.table.weight.data.split(list(rows))
            starts = [0, *accumulate(rows[:-1])]  # first row of each table in the big one
            self.register_buffer("row_base", torch.tensor(starts, dtype=torch.int64), persistent=False)
            self.register_buffer("table_ids", torch.arange(len(rows), dtype=torch.int64), persistent=False)
        else:
            self.tables = nn.ModuleList(bag(r) for r in rows)
            slices = [t.weight.data for t in self.tables]
        for w, r in zip(slices, rows):  # dlrm: uniform(+-sqrt(1/rows)) per table
            nn.init.uniform_(w, -math.sqrt(1.0 / r), math.sqrt(1.0 / r))
        # Flat positions of Z's strictly-lower triangle in dlrm's order ((1,0), (2,0), (2,1), ...):
        # one index_select forward (tril-F) and one index_add backward (tril-B), as in the paper.
        n = spec.num_features
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("tril_flat", li * n + lj, persistent=False)

    def embed(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings, (B, T, D)."""
        if self.batched:
            flat = (indices + self.row_base[:, None]).reshape(-1)
            # each table's bag starts move past the previous tables' index lists
            starts = (offsets + self.table_ids[:, None] * indices.shape[1]).reshape(-1)
            pooled = self.table(flat, starts)  # (T*B, D), table-major
            return pooled.view(indices.shape[0], offsets.shape[1], -1).transpose(0, 1)
        return torch.stack([t(indices[i], offsets[i]) for i, t in enumerate(self.tables)], dim=1)

    def interact(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Top MLP input: [bottom output, lower triangle of T T^T], (B, D + n(n-1)/2)."""
        x = self.bottom(dense)
        feats = torch.cat([x.unsqueeze(1), self.embed(indices, offsets)], dim=1)  # (B, n, D)
        z = torch.bmm(feats, feats.transpose(1, 2))
        return torch.cat([x, z.flatten(1).index_select(1, self.tril_flat)], dim=1)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.top(self.interact(dense, indices, offsets))


@dataclass
class DLRMBatch:
    dense: torch.Tensor  # (B, F) float32
    indices: torch.Tensor  # (T, B*L) int64, each table's rows
    offsets: torch.Tensor  # (T, B) int64, bag starts within a table's list
    target: torch.Tensor  # (B, 1) float32 in {0, 1}


def make_batch(spec: DLRMSpec, batch: int, device: str = "cpu", seed: int = 0) -> DLRMBatch:
    """Synthetic inputs like dlrm's --data-generation=random with fixed L (dense ~ randn,
    indices uniform over each table, rounded-uniform click targets)."""
    check_batch(spec, batch)
    gen = torch.Generator().manual_seed(seed)
    n = batch * spec.pooling
    indices = torch.stack([torch.randint(0, r, (n,), generator=gen) for r in spec.table_rows])
    offsets = torch.arange(0, n, spec.pooling, dtype=torch.int64).expand(spec.num_tables, batch).contiguous()
    dense = torch.randn(batch, spec.dense_features, generator=gen)
    target = torch.randint(0, 2, (batch, 1), generator=gen).float()
    return DLRMBatch(dense.to(device), indices.to(device), offsets.to(device), target.to(device))


# A training step never sees the same batch twice; a benchmark that feeds one batch every step
# leaves that batch's looked-up rows in cache, which a real step does not find there. So steps
# cycle through distinct batches: a run of fewer steps than the pool sees a fresh batch every
# step, as dlrm's --data-generation=random draws each afresh, and a longer one meets a batch
# again only after the rest of the pool has looked up more rows than a last-level cache (or GPU
# L2) holds, or than the tables themselves where they are smaller. (On the EPYC VM with one
# fixed batch, DLRM-default's batch-32 lookups and sparse updates ran in 155 us a table against
# 231 us priced from the tables' size: its rows stayed cached between steps.) Indices are
# uniform over each table, the worst case: real ids (Criteo's) are skewed, and their hot rows
# stay cached.
POOL_TOUCHED_BYTES = 1 << 30
MAX_POOL = 1024  # batches held at most: the smallest steps would want more, at little gain


def pool_size(spec: DLRMSpec, batch: int) -> int:
    """How many distinct batches a timed or traced run cycles through (1: one batch looks up as
    many rows as the tables hold, and evicts its own)."""
    row_bytes = spec.embedding_dim * torch.get_default_dtype().itemsize  # build_dlrm's tables' dtype
    touched = batch * spec.pooling * spec.num_tables * row_bytes
    tables = sum(spec.table_rows) * row_bytes
    return int(min(MAX_POOL, max(1, math.ceil(min(POOL_TOUCHED_BYTES, tables) / max(touched, 1)))))


def make_batches(spec: DLRMSpec, batch: int, device: str = "cpu", count: int | None = None) -> list[DLRMBatch]:
    """`count` (default pool_size) distinct batches, seeds 0, 1, ...: the first is make_batch's."""
    count = pool_size(spec, batch) if count is None else count
    if count < 1:
        raise ValueError(f"count={count} must be at least 1")
    return [make_batch(spec, batch, device, seed=i) for i in range(count)]


def training_steps(model: DLRM, batches: list[DLRMBatch]) -> Callable[[], torch.Tensor]:
    """A no-argument training step that takes the next batch of the pool on each call."""
    nxt = cycle(batches).__next__
    return lambda: train_step(model, nxt())


def build_dlrm(spec: DLRMSpec, device: str = "cpu", batched: bool = False, lr: float = 0.01) -> DLRM:
    """A seeded DLRM on `device`, with its BCE loss and SGD optimizer attached (lr: dlrm's default)."""
    torch.manual_seed(0)
    # Parameters are created on the device directly: the full configs' tables (up to 38 GB)
    # would otherwise be initialised on the host and then copied.
    with torch.device(device):
        model = DLRM(spec, batched=batched)
    model.loss_fn = nn.BCELoss()
    model.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return model.train()


def train_step(model: DLRM, batch: DLRMBatch) -> torch.Tensor:
    """One dlrm training iteration: forward, BCE loss, backward, SGD step. Returns the loss
    unsynchronized (no .item()), so timing on CUDA is not serialized by it."""
    model.optimizer.zero_grad(set_to_none=True)
    loss = model.loss_fn(model(batch.dense, batch.indices, batch.offsets), batch.target)
    loss.backward()
    model.optimizer.step()
    return loss.detach()


def measure_training_step(spec: DLRMSpec, batch: int, device: str = "cpu", warmup: int = 5, reps: int = 25,
                          batched: bool = False) -> Measurement:
    """Per-batch training time: one build, a pool of batches (pool_size), PM2Lat's 5 warm-up / 25
    timed steps."""
    return measure_step(built_step(spec, batch, device, batched), TimingSpec.fixed(warmup, reps), device)


def measure_training_blocks(spec: DLRMSpec, batch: int, batched: bool = False, warmup: int = 5,
                            reps: int = 25) -> tuple[Measurement, list[float]]:
    """A one-off measurement on the CPU (`what-if --measure`): the same steps in blocks, the
    quickest kept (harness/stalls.quickest_block). Returns (the kept Measurement, every block's
    median in µs)."""
    from pipeline.harness.stalls import quickest_block

    return quickest_block(built_step(spec, batch, "cpu", batched), TimingSpec.fixed(warmup, reps))


def built_step(spec: DLRMSpec, batch: int, device: str = "cpu", batched: bool = False) -> Callable[[], torch.Tensor]:
    """A built model's training step over its pool of batches: what runs and traces time."""
    check_batch(spec, batch)
    return training_steps(build_dlrm(spec, device, batched=batched), make_batches(spec, batch, device))
