"""Split a model across two devices: PM2Lat §IV-D.1 (no torch here).

Two devices run a chain of transformer blocks as a two-stage pipeline: the first device runs
the blocks before the partition point, sends the activation over the link, and takes the
next request; the second runs the rest. A stream of requests flows at the pace of the slower
stage, so the best partition point minimises the larger stage time (PM2Lat: "the optimal
strategy is to heuristically select the partition that minimises the maximum execution time
across both devices"). With two devices there is one partition point, so every split is
tried.

A stage's time is what its device runs (kernels and host overheads, as priced per block by
the graph pricing, see `segment_times`) plus, for the first stage, the activation transfer
(link latency + bytes / bandwidth): the sender copies the activation out before it can take
the next request. N requests pipelined take fill + (N - 1) x bottleneck, where fill is one
request's latency through both stages.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.errors import BadShapeError, DevcharError
from pipeline.core.graph import ExecutionGraph
from pipeline.predict.critical_path import critical_path
from pipeline.predict.overheads import OverheadModel


class PlanError(DevcharError, ValueError):
    """A partition that cannot be planned: too few blocks, a bad time, bandwidth or size."""


def _finite_nonneg(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PlanError(f"{name}={value!r} must be a finite number >= 0")
    return float(value)


@dataclass(frozen=True)
class StageCosts:
    """One device's predicted times (µs) for the pieces of one model: each block, what a first
    stage runs besides its blocks (`head_us`: embedding, masks, positions) and what a last
    stage runs besides its blocks (`tail_us`: final norm and output head, plus anything the
    stage must recompute, such as masks and positions)."""

    device: str
    blocks_us: tuple[float, ...]
    head_us: float = 0.0
    tail_us: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "blocks_us", tuple(_finite_nonneg(f"{self.device} block {i}", t)
                                                    for i, t in enumerate(self.blocks_us)))
        _finite_nonneg(f"{self.device} head_us", self.head_us)
        _finite_nonneg(f"{self.device} tail_us", self.tail_us)


@dataclass(frozen=True)
class Link:
    """The link between the two devices: GB/s (1e9 bytes/s) and a fixed cost per transfer (µs)."""

    gbps: float
    latency_us: float = 0.0

    def __post_init__(self):
        if isinstance(self.gbps, bool) or not isinstance(self.gbps, (int, float)) or not math.isfinite(self.gbps) \
                or self.gbps <= 0:
            raise PlanError(f"link bandwidth {self.gbps!r} GB/s must be a finite number > 0")
        _finite_nonneg("link latency_us", self.latency_us)

    def transfer_us(self, nbytes: float) -> float:
        return self.latency_us + _finite_nonneg("transfer bytes", nbytes) / (self.gbps * 1e3)  # 1 GB/s = 1e3 B/µs


@dataclass(frozen=True)
class Split:
    """Stage 1 runs blocks [0, after_block) on the first device, stage 2 the rest on the second."""

    after_block: int
    stage1_us: float  # head + its blocks + the transfer
    stage2_us: float  # its blocks + tail
    transfer_us: float
    transfer_bytes: float

    @property
    def bottleneck_us(self) -> float:
        return max(self.stage1_us, self.stage2_us)

    @property
    def bottleneck_stage(self) -> int:
        return 1 if self.stage1_us >= self.stage2_us else 2

    @property
    def fill_us(self) -> float:
        """One request's latency through both stages (the pipeline's fill)."""
        return self.stage1_us + self.stage2_us

    @property
    def throughput_per_s(self) -> float:
        return 1e6 / self.bottleneck_us if self.bottleneck_us > 0 else math.inf

    def total_us(self, n_requests: int) -> float:
        return pipelined_total_us(self.fill_us, self.bottleneck_us, n_requests)


def pipelined_total_us(fill_us: float, bottleneck_us: float, n_requests: int) -> float:
    """N requests through a two-stage pipeline, all queued at time 0: fill + (N - 1) x bottleneck."""
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise PlanError(f"requests={n_requests!r} must be an integer >= 1")
    fill, neck = _finite_nonneg("fill_us", fill_us), _finite_nonneg("bottleneck_us", bottleneck_us)
    if neck > fill:
        raise PlanError(f"bottleneck {neck} µs exceeds the fill {fill} µs: a stage cannot outlast both together")
    return fill + (n_requests - 1) * neck


def splits(first: StageCosts, second: StageCosts, transfer_bytes, link: Link) -> list[Split]:
    """Every partition point k = 1 .. L-1 (each device runs at least one block).

    `transfer_bytes`: one number (every boundary sends the same activation) or L - 1 numbers,
    the bytes sent after block k for k = 1 .. L-1."""
    n = len(first.blocks_us)
    if len(second.blocks_us) != n:
        raise PlanError(f"{first.device} prices {n} blocks, {second.device} {len(second.blocks_us)}: not one model")
    if n < 2:
        raise PlanError(f"a model with {n} block(s) has no partition point between blocks; need at least 2")
    if isinstance(transfer_bytes, (int, float)):
        sizes = [transfer_bytes] * (n - 1)
    else:
        sizes = list(transfer_bytes)
        if len(sizes) != n - 1:
            raise PlanError(f"{len(sizes)} transfer sizes for {n - 1} partition points")
    out = []
    for k in range(1, n):
        moved = _finite_nonneg(f"transfer bytes after block {k}", sizes[k - 1])
        t = link.transfer_us(moved)
        s1 = first.head_us + sum(first.blocks_us[:k]) + t
        s2 = sum(second.blocks_us[k:]) + second.tail_us
        out.append(Split(k, s1, s2, t, moved))
    return out


def best_split(candidates: list[Split]) -> Split:
    """The smallest bottleneck; ties go to the shorter fill, then the earlier point."""
    if not candidates:
        raise PlanError("no partition point to choose from")
    return min(candidates, key=lambda s: (s.bottleneck_us, s.fill_us, s.after_block))


def plan(first: StageCosts, second: StageCosts, transfer_bytes, link: Link) -> tuple[Split, list[Split]]:
    """(the best split, every split in order of partition point)."""
    every = splits(first, second, transfer_bytes, link)
    return best_split(every), every


def segment_times(graph: ExecutionGraph, segment_of: dict[int, str], overheads: OverheadModel, *,
                  synchronous: bool = True) -> dict[str, float]:
    """Predicted time (µs) of each segment of a priced graph. On the CPU (synchronous) one walk
    of Algorithm 1 over the whole graph, each op's CPU time (its T1 and its own) to its segment:
    the segments add up to the whole graph's prediction exactly, and an op's T1 follows the op
    that really precedes it (a long one slows the gap after it, overheads.AfterOp). On a GPU,
    Algorithm 1 over the top-level ops `segment_of` assigns to it, as if that segment ran alone
    (its device clock overlaps the host's)."""
    tops = graph.top_level()
    missing = [op.id for op in tops if op.id not in segment_of]
    if missing:
        raise BadShapeError(f"{len(missing)} top-level ops have no segment (first: op {missing[0]})")
    names = list(dict.fromkeys(segment_of[op.id] for op in tops))
    if synchronous:
        out = dict.fromkeys(names, 0.0)
        for op_id, us in critical_path(graph, overheads, synchronous=True).op_cpu:
            out[segment_of[op_id]] += us
        return out
    out = {}
    for name in names:
        sub = graph.remove_ops(lambda op, name=name: op.parent is None and segment_of[op.id] != name)
        out[name] = critical_path(sub, overheads, synchronous=synchronous).e2e_us
    return out
