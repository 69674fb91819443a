"""embedding_samples: batched EmbeddingBag (mode="sum") forward and backward over (B, E, T, L, D).

The DLRM paper's batched lookup (III-B1): T tables of E rows are one concatenated table of
T x E rows; bag j = t x B + b (table-major) sums L rows of table t, so `indices` holds
T x B x L global row ids (int64, as torch's nn.EmbeddingBag takes them) and `offsets` the
T x B bag starts. What is timed:

- forward: `F.embedding_bag(indices, weight, offsets, mode="sum")` under no_grad.
- backward: the weight gradient of a sum loss plus the sparse SGD step. The forward graph
  (sparse=True) is built once; one timed call is `out.backward(ones)` (ones is the gradient
  of `out.sum()`; passing it avoids timing the sum itself) followed by
  `weight.add_(weight.grad, alpha=-lr)` (the update scatters the B x T x L gradient rows into
  the table). The paper's fused backward+SGD kernel is two or three kernels here, timed together.

Tables of one (D, dtype) are views of one zero-filled buffer (the first T x E rows), so a
sweep allocates once per (D, dtype); the SGD steps move its values a little, and any values
gather at the same speed. Grid points above the profile's table-size or work caps are
skipped, as are points that run out of device memory. Each row also records the device parameters the heuristic's L2 hit-rate term
uses (`l2_bytes`, `llc_bytes`, `units`, `rows_per_block`; see pipeline.predict.embedding).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import element_bytes
from pipeline.harness.cache_probe import cpu_llc_bytes
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.progress import Progress
from pipeline.harness.revisit import revisit
from pipeline.harness.timer import TimingSpec, kept_flusher, measure, release_flusher, timing_scale
from pipeline.predict.embedding import (DEFAULT_ROWS_PER_BLOCK, INDEX_BYTES, embedding_traffic)
from pipeline.sweeps.profiles import GPU_FULL_TIMING, GPU_QUICK_TIMING, get_profile

DIRECTIONS = ("forward", "backward")
LR = 1e-3  # the SGD step's learning rate: any non-zero value does the same work


@dataclass(frozen=True)
class EmbeddingSizes:
    B: tuple[int, ...]
    E: tuple[int, ...]
    T: tuple[int, ...]
    L: tuple[int, ...]
    D: tuple[int, ...]
    dtypes: tuple[str, ...]
    max_table_bytes: float  # T x E x D x element bytes, one concatenated table
    max_work: float  # B x T x L x D: gathered elements per call (the backward's gradient rows too)
    heldout: int  # random shapes, each measured in both directions
    timing: TimingSpec
    cold: bool = True  # CPU: flush the measured effective cache before every repetition
    cold_budget_s: float = 90.0  # CPU: flush time the cold timings may spend (a subset of points past it)


_CPU_QUICK_TIMING = TimingSpec(warmup_s=0.003, budget_s=0.015, min_reps=5, max_reps=60, min_block_s=2e-4)
_TINY_TIMING = TimingSpec(warmup_s=0.0, budget_s=0.002, min_reps=3, max_reps=10)

# (profile, device kind) -> sizes. The CPU scales E down (a few hundred MB per table at most);
# the GPU's full profile reaches tens of millions of rows, as in the paper's DLRM_MLPerf tables.
SIZES = {
    ("tiny", "cpu"): EmbeddingSizes(B=(8, 32), E=(100, 2000), T=(1, 3), L=(2, 8), D=(16,), dtypes=("float32",),
                                    max_table_bytes=1 << 20, max_work=1 << 14, heldout=2, timing=_TINY_TIMING,
                                    cold=False),  # tests: a probe and 100 MB flushes per call are not what they test
    # L reaches 100 and D includes 32: DLRM_default pools 100 rows of 32-wide vectors (scaled
    # config), and a lookup priced by extrapolation in L came out 2-3x too fast.
    ("quick", "cpu"): EmbeddingSizes(B=(16, 128, 1024), E=(1000, 30_000, 1_000_000), T=(1, 4), L=(1, 8, 32, 100),
                                     D=(16, 32, 64), dtypes=("float32",), max_table_bytes=1 << 28, max_work=1 << 22,
                                     heldout=24, timing=_CPU_QUICK_TIMING),
    ("full", "cpu"): EmbeddingSizes(B=(16, 128, 512, 2048), E=(1000, 10_000, 100_000, 1_000_000, 4_000_000),
                                    T=(1, 4, 16), L=(1, 8, 32, 64), D=(16, 64, 128), dtypes=("float32", "bfloat16"),
                                    max_table_bytes=1 << 30, max_work=1 << 24, heldout=60, cold_budget_s=600.0,
                                    timing=TimingSpec(warmup_s=0.01, budget_s=0.05, min_reps=5, max_reps=200,
                                                      min_block_s=2e-4)),
    ("tiny", "cuda"): EmbeddingSizes(B=(8, 64), E=(100, 10_000), T=(1, 4), L=(2, 8), D=(16, 64), dtypes=("float32",),
                                     max_table_bytes=1 << 26, max_work=1 << 20, heldout=2, timing=_TINY_TIMING),
    ("quick", "cuda"): EmbeddingSizes(B=(128, 1024, 8192), E=(1000, 100_000, 1_000_000, 10_000_000), T=(1, 8, 32),
                                      L=(1, 8, 32, 100), D=(32, 64, 128), dtypes=("float32", "float16"),
                                      max_table_bytes=8 << 30, max_work=1 << 29, heldout=40, timing=GPU_QUICK_TIMING),
    ("full", "cuda"): EmbeddingSizes(B=(128, 512, 2048, 8192), E=(1000, 10_000, 100_000, 1_000_000, 10_000_000,
                                                                  40_000_000),
                                     T=(1, 4, 16, 64), L=(1, 4, 16, 64, 100), D=(16, 32, 64, 128, 256),
                                     dtypes=("float32", "float16", "bfloat16"), max_table_bytes=16 << 30,
                                     max_work=1 << 30, heldout=200, timing=GPU_FULL_TIMING),
}


@dataclass(frozen=True)
class EmbeddingPoint:
    B: int
    E: int
    T: int
    L: int
    D: int
    held_out: bool


def sizes_for(profile_name: str, kind: str) -> EmbeddingSizes:
    get_profile(profile_name, kind)  # one clear error for an unknown profile name
    return SIZES[(profile_name, "cuda" if kind == "cuda" else "cpu")]


def _fits(p: EmbeddingPoint, s: EmbeddingSizes, eb: int) -> bool:
    return p.T * p.E * p.D * eb <= s.max_table_bytes and p.B * p.T * p.L * p.D <= s.max_work


def training_points(s: EmbeddingSizes, eb: int = 4) -> list[EmbeddingPoint]:
    pts = [EmbeddingPoint(*shape, False) for shape in itertools.product(s.B, s.E, s.T, s.L, s.D)]
    return [p for p in pts if _fits(p, s, eb)]


def heldout_points(s: EmbeddingSizes, eb: int = 4, seed: int = 3) -> list[EmbeddingPoint]:
    """Log-uniform B, E and L, uniform T, D a multiple of 4, inside the grid's ranges and caps."""
    rng = np.random.default_rng(seed)

    def logu(vals) -> int:
        return int(round(float(np.exp(rng.uniform(np.log(min(vals)), np.log(max(vals)))))))

    pts = []
    for _ in range(1000 * max(s.heldout, 1)):
        if len(pts) >= s.heldout:
            break
        d = max(4, 4 * round(logu(s.D) / 4))
        p = EmbeddingPoint(logu(s.B), logu(s.E), int(rng.integers(min(s.T), max(s.T) + 1)), logu(s.L), d, True)
        if _fits(p, s, eb):
            pts.append(p)
    return pts


def cache_params(dev: DeviceIdentity) -> dict:
    """The hit-rate term's device parameters. GPU: its L2 and SM count. CPU analogs: the thread
    count (one bag per thread at a time) and two candidate caches, the private L2 of all
    threads together and the shared last-level cache; the fit keeps the one that fits better."""
    if dev.kind == "cuda":
        l2 = int(dev.l2_bytes or 0)
        return {"l2_bytes": l2, "llc_bytes": l2, "units": int(dev.sm_count or 1),
                "rows_per_block": DEFAULT_ROWS_PER_BLOCK["cuda"]}
    threads = int(dev.threads or 1)
    l2 = int(dev.l2_bytes or 0) * threads
    return {"l2_bytes": l2, "llc_bytes": int(cpu_llc_bytes() or l2), "units": threads,
            "rows_per_block": DEFAULT_ROWS_PER_BLOCK["cpu"]}


COLD_REPS = 5  # each cold repetition costs a flush of ~100 MB (~10 ms): a fixed few, not a time budget


def cold_timing(s: EmbeddingSizes, dev: DeviceIdentity, log=None) -> tuple[TimingSpec, int, float] | None:
    """(spec, half the flush size, seconds one cold timing costs) for the cold timings, or None
    (GPU, tiny). Inside DLRM the other tables and layers evict a table between two of its
    lookups (harness/cache_probe.py); the GPU profiles flush their L2 already. On a CPU each
    cold repetition follows a flush of the measured effective cache; the model blends hot and
    cold by how much of a graph's tables the cache holds (predict/embedding.py)."""
    if dev.kind == "cuda" or not s.cold:
        return None
    from pipeline.harness.cache_probe import effective_flush_bytes, flush_seconds

    half = effective_flush_bytes(int(cpu_llc_bytes() or (dev.l2_bytes or 1 << 20)), log) // 2  # swept twice
    spec = replace(s.timing, flush_l2=True, warmup_s=0.0, budget_s=0.0, min_reps=COLD_REPS, max_reps=COLD_REPS)
    # timed on the flusher the cold timings will keep using (one buffer, allocated once); the
    # flusher is swept before each repetition, plus one pass: COLD_REPS + 1 passes
    return spec, half, (COLD_REPS + 1) * flush_seconds(kept_flusher(half, dev.torch_device))


def cold_subset(todo: list, per_point_s: float, budget_s: float, seed: int = 5) -> set[int]:
    """Indices of the points timed cold: all of them when their flushes fit `budget_s`, else
    as many as fit, drawn at random (seeded) from the fitting and the held-out points in
    proportion, so the cold fit still spans every size. A 1.9 GB flush (a VM that reports its
    host's 480 MB L3) made the cold half of the quick embedding sweep 7 minutes."""
    n = len(todo) if per_point_s <= 0 else min(len(todo), int(budget_s / per_point_s))
    if n >= len(todo):
        return set(range(len(todo)))
    rng = np.random.default_rng(seed)
    held = [i for i, (_, p) in enumerate(todo) if p.held_out]
    fit = [i for i, (_, p) in enumerate(todo) if not p.held_out]
    n_held = min(len(held), max(2 if held else 0, round(n * len(held) / len(todo))))
    n_fit = min(len(fit), max(n - n_held, 2))
    return set(rng.choice(fit, n_fit, replace=False).tolist()) | set(rng.choice(held, n_held, replace=False).tolist())


class _Tables:
    """One zero-filled (rows, D) buffer per (D, dtype); a point's table is a leaf view of its first T x E rows."""

    def __init__(self, device: str):
        self.device, self.buf, self.key = device, None, None

    def get(self, rows_needed: int, D: int, dtype: str, rows_alloc: int):
        import torch

        if self.key != (D, dtype) or self.buf.shape[0] < rows_needed:
            self.buf, self.key = None, None
            kw = dict(dtype=torch_dtype(dtype), device=self.device)
            try:
                self.buf = torch.zeros(max(rows_alloc, rows_needed), D, **kw)
            except torch.OutOfMemoryError:  # the group's largest table does not fit: this point's may
                torch.cuda.empty_cache()
                self.buf = torch.zeros(rows_needed, D, **kw)
            self.key = (D, dtype)
        return self.buf[:rows_needed].detach().requires_grad_()


def _inputs(p: EmbeddingPoint, device: str, seed: int = 0):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    local = torch.randint(0, p.E, (p.T, p.B * p.L), generator=g)
    idx = (local + torch.arange(p.T)[:, None] * p.E).reshape(-1).to(device)
    offsets = torch.arange(0, p.T * p.B * p.L, p.L, device=device)
    return idx, offsets


def _callable(direction: str, weight, idx, offsets):
    import torch
    import torch.nn.functional as F

    if direction == "forward":
        def fwd():
            with torch.no_grad():
                return F.embedding_bag(idx, weight, offsets, mode="sum")
        return fwd
    out = F.embedding_bag(idx, weight, offsets, mode="sum", sparse=True)
    ones = torch.ones_like(out)  # d(out.sum())/d(out)

    def bwd():
        weight.grad = None
        out.backward(ones, retain_graph=True)
        with torch.no_grad():
            weight.add_(weight.grad, alpha=-LR)
    return bwd


def backward_call_us(timing: TimingSpec, device: str = "cpu") -> float:
    """What one `out.backward(ones)` costs around the work it starts: the autograd engine's
    set-up and hand-back, timed on a one-element view of a leaf (the quicker of two timings).
    Each backward row of the sweep pays it once; a training step pays it once for all its
    lookups (DLRM-MLPerf: 26 tables, one backward), so the fit takes it off each backward row
    (predict/embedding.py). EPYC VM, 2026-11-28: 21-30 us, against 55 us for a whole row of
    16 one-row bags."""
    import torch

    leaf = torch.zeros(1, requires_grad=True, device=device)
    out = leaf.view(1)
    ones = torch.ones_like(out)

    def call():
        leaf.grad = None
        out.backward(ones, retain_graph=True)
    return min(measure(call, timing, device).median_us for _ in range(2))


def sweep_embedding(dev: DeviceIdentity, profile_name, log=None) -> list[dict]:
    import torch

    name = getattr(profile_name, "name", profile_name)  # a Profile works too
    s = sizes_for(name, dev.kind)
    params = cache_params(dev)
    todo = []
    for dtype in s.dtypes:
        eb = element_bytes(dtype)
        pts = training_points(s, eb) + heldout_points(s, eb)
        # Grouped by (D, dtype), largest table first: one allocation serves the whole group.
        pts.sort(key=lambda p: (p.D, -p.T * p.E))
        todo += [(dtype, p) for p in pts]
    group_rows: dict[tuple[str, int], int] = {}
    for dtype, p in todo:
        group_rows[(dtype, p.D)] = max(group_rows.get((dtype, p.D), 0), p.T * p.E)
    prog = Progress("embedding_samples", len(todo) * len(DIRECTIONS), log)
    states = [(False, s.timing, int(dev.l2_bytes or 0))]  # hot: the call repeated, as before
    cold, cold_at = cold_timing(s, dev, prog.log), set()
    if cold is not None:
        spec, flush_half, cost_s = cold
        states.append((True, spec, flush_half))
        budget_s = s.cold_budget_s * timing_scale()
        cold_at = cold_subset(todo, cost_s * len(DIRECTIONS), budget_s)
        if len(cold_at) < len(todo):
            prog.log(f"[embedding_samples] a cold timing costs {cost_s:.2f} s of flushing: {len(cold_at)} of "
                     f"{len(todo)} points timed cold (cold_budget_s={budget_s:.0f})")
    # CPU: timings are host time, the engine's call included (a GPU row is device time)
    call = {"backward_call_us": backward_call_us(s.timing, dev.torch_device)} if dev.kind == "cpu" else {}
    if call:
        prog.log(f"[embedding_samples] one backward() call costs {call['backward_call_us']:.1f} us "
                 "beyond its work: taken off each backward row by the fit, paid once per training step")
    tables, rows, skipped = _Tables(dev.torch_device), [], 0
    timed_at: list[tuple[int, str, bool]] = []  # each row's (todo index, direction, cold)
    for i, (dtype, p) in enumerate(todo):
        try:
            weight = tables.get(p.T * p.E, p.D, dtype, group_rows[(dtype, p.D)])
            idx, offsets = _inputs(p, dev.torch_device)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            skipped += len(DIRECTIONS)
            for _ in DIRECTIONS:
                prog.step(f"{dtype} {p}: out of memory, skipped")
            continue
        for direction in DIRECTIONS:
            plain = float(embedding_traffic(direction, dtype, p.B, p.E, p.T, p.L, p.D)[0])
            for is_cold, timing, flush_half in states:
                if is_cold and i not in cold_at:
                    continue
                try:
                    meas = measure(_callable(direction, weight, idx, offsets), timing, dev.torch_device, flush_half)
                except torch.OutOfMemoryError:
                    weight.grad = None
                    torch.cuda.empty_cache()
                    skipped += 1
                    continue
                weight.grad = None
                rows.append({
                    "direction": direction, "B": p.B, "E": p.E, "T": p.T, "L": p.L, "D": p.D, "dtype": dtype,
                    "shape": f"B{p.B}-E{p.E}-T{p.T}-L{p.L}-D{p.D}", "bytes": plain, "index_bytes": INDEX_BYTES,
                    **params, "held_out": p.held_out, "cold": is_cold, **meas.row(timing.cv_threshold),
                    **(call if direction == "backward" else {}),
                })
                timed_at.append((i, direction, is_cold))
            prog.step(f"{direction} {dtype} B={p.B} E={p.E} T={p.T} L={p.L} D={p.D}")
    if dev.kind == "cpu":
        _second_visits(rows, timed_at, todo, tables, states, group_rows, get_profile(name, dev.kind).visits,
                       dev.torch_device, prog.log)
    tables.buf = None
    release_flusher()
    if skipped:
        prog.log(f"[embedding_samples] {skipped} (direction, shape) points ran out of device memory: not recorded")
    return rows


def _second_visits(rows: list[dict], timed_at: list[tuple[int, str, bool]], todo: list, tables: _Tables,
                   states: list, group_rows: dict, visits: int, device: str, log=None) -> None:
    """Every row timed again, as the other CPU sweeps are (harness/revisit.py), keeping the quicker
    visit. One (D, dtype) group at a time, its hot rows and its cold ones apart, each in a shuffled
    order: the group's points share one table buffer, allocated once per group again."""
    if visits < 2 or not rows:
        return
    spec_of = {is_cold: (timing, flush_half) for is_cold, timing, flush_half in states}
    groups: dict[tuple, list[int]] = {}
    for r, (i, _, is_cold) in enumerate(timed_at):
        dtype, p = todo[i]
        groups.setdefault((dtype, p.D, is_cold), []).append(r)

    def maker(r: int):
        i, direction, _ = timed_at[r]
        dtype, p = todo[i]
        weight = tables.get(p.T * p.E, p.D, dtype, group_rows[(dtype, p.D)])
        return _callable(direction, weight, *_inputs(p, device))

    replaced = 0
    for (_, _, is_cold), members in groups.items():
        timing, flush_half = spec_of[is_cold]
        sub = [rows[r] for r in members]
        replaced += revisit(sub, [lambda r=r: maker(r) for r in members], timing, device, visits, flush_half)
    if log:
        log(f"[embedding_samples] every point timed on {visits} visits: a later visit was quicker for "
            f"{replaced}/{len(rows)}")
