"""The points the GEMM sweep times (PM2Lat III-C): K over powers of two at M x N that fill whole
waves, the CPU's aspect, batch and cold-weight grids, and random held-out shapes that are never
used for fitting (held_out = True). What is timed and how lives in sweeps/gemm.py."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from pipeline.core.dtypes import dtypes_for, element_bytes
from pipeline.core.ops import GEMM_OPS
from pipeline.device.discover import DeviceIdentity
from pipeline.predict.gemm_alias import ALIAS_GRID, rows_alias, short_k, twin_steps
from pipeline.predict.gemm_batch import BATCH_GRID
from pipeline.predict.gemm_grids import (COLD_GRID, COLD_HELDOUT, LINE_BASE_GRID, TWIN_K_GRID, TWIN_N_GRID,
                                         line_elements)
from pipeline.predict.gemm_narrow import NARROW_GRID
from pipeline.predict.geometry import whole_wave_shape
from pipeline.sweeps.cpu_kernels import ATEN_KERNEL
from pipeline.sweeps.profiles import Profile, wave_counts

# Nominal tile used to lay out whole waves. On CUDA the tile actually used is parsed from
# the kernel name where it says. On the CPU the padding steps of M and N are measured per
# (op, dtype) (tile_probe.py: 1 x 16 on AVX-512); 8 x 8 is only the fallback resolution for a
# kernel the probe did not see, fine enough that skinny and tiny GEMMs fall inside the grid.
NOMINAL_TILE = {"cuda": (128, 128), "cpu": (8, 8)}


_TILE_RE = re.compile(r"(\d{2,3})x(\d{2,3})")


@dataclass(frozen=True)
class GemmPoint:
    op: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    held_out: bool
    grid: str = "waves"  # "waves" (PM2Lat's whole-wave grid), "aspect" (CPU: off its diagonal), "batch", "narrow_n",
    # "off_alias_n", "unaligned_n", "unaligned_k", "line_n" (an N twin's base, unaligned_twins), "heldout"

    @property
    def shape(self) -> tuple[str, str, int, int, int, int]:
        """The GEMM this point times, whatever its grid: what "measured once" compares."""
        return self.op, self.dtype, self.batch, self.m, self.n, self.k

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def slots_for(dev: DeviceIdentity) -> int:
    return int(dev.sm_count if dev.kind == "cuda" else dev.threads or 1)


def training_points(dev: DeviceIdentity, profile: Profile,
                    tiles: dict[tuple[str, str], tuple[int, int]] | None = None) -> list[GemmPoint]:
    """Whole waves of each (op, dtype)'s tile (`tiles`, measured on the CPU; nominal otherwise) x K."""
    slots = slots_for(dev)
    pts = []
    for dtype in dtypes_for(dev.kind):
        for op in GEMM_OPS:
            tile_m, tile_n = (tiles or {}).get((op, dtype), NOMINAL_TILE[dev.kind])
            for w in wave_counts(profile, slots, tile_m, tile_n):
                pts += _wave_points(op, dtype, w, tile_m, tile_n, slots, profile)
            # Outputs smaller than one wave of the probed tile, laid out in the tile of the kernel
            # that runs tiny shapes where it pads differently (ATen's bf16 loop: 1 x 1, 1.2 us where
            # oneDNN takes 16): without them it has no small cell when the probe finds a large tile
            # (mm bf16: 32 x 16 in one sweep) and was priced at its smallest whole-wave cell, 80x slow.
            fm, fn = tile_of(ATEN_KERNEL, dev.kind, dtype, (tile_m, tile_n))
            if (fm, fn) != (tile_m, tile_n):
                pts += [p for w in wave_counts(profile, slots, fm, fn) if w * fm * fn < tile_m * tile_n
                        for p in _wave_points(op, dtype, w, fm, fn, slots, profile)]
    return pts


def _wave_points(op: str, dtype: str, w: int, tile_m: int, tile_n: int, slots: int,
                 profile: Profile) -> list[GemmPoint]:
    # bmm: a batch of up to 8 matrices shares the whole waves' tiles, so inputs
    # stay the size of the mm ones (a tile per matrix would need huge batches).
    b = math.gcd(w * slots, 8) if op == "bmm" else 1
    m, n = whole_wave_shape(w, tile_m, tile_n, slots, batch=b)
    # The largest outputs (where a CPU allocator's page faults start to show) are
    # measured at small K only, within the profile's FLOP cap per point.
    cap = profile.max_wave_flops or profile.max_point_flops
    ks = [k for k in profile.k_values if 2 * b * m * n * k <= cap]
    return [GemmPoint(op, dtype, b, m, n, k, False) for k in ks or profile.k_values[:1]]


# One matrix per call: a batched GEMM spreads its batch over the cores, so a skinny matrix
# in a batch of 32 does not run like a skinny matrix alone; bmm has a grid of its own at one
# batch (BMM_ASPECT_BATCH).
ASPECT_OPS = ("mm", "linear")


TWO = 2  # the one side off the powers of 4 that the aspect grid also times


def aspect_points(dev: DeviceIdentity, profile: Profile) -> list[GemmPoint]:
    """CPU: M and N over powers of 4 at the profile's aspect K values, within its caps.

    The whole-wave grid lays out near-square M x N, so a skinny or wide shape (a batch-1 LM
    head: 128 x 50257) is priced with the throughput of a square one of the same output size;
    a BLAS packs its operands per panel, and with few rows (or columns) the packing is spread
    over little work. These points measure that, per (op, dtype), instead of assuming it."""
    if dev.kind != "cpu" or not profile.gemm_aspect_k:
        return []
    return (_lattice(dev, profile, ASPECT_OPS, 1, profile.gemm_aspect_max)
            + _lattice(dev, profile, ("bmm",), BMM_ASPECT_BATCH, min(profile.gemm_aspect_max, max(BATCH_SIDES))))


# bmm's own aspect grid is timed at one batch, the batch grid's middle one, up to the batch
# grid's largest side (batched matrices are attention's and DLRM's, not LM heads): how a batched
# skinny matrix runs is not how a lone one does, and not the same on every CPU (EPYC VM, float32:
# a bmm of 12 x 457 x 2 x 168 ran 525 us, 12 lone mm's 750, and the square table priced 29; bf16
# there amortizes 3x), so neither mm's grid nor the table can stand in for it. The batch grid
# (square matrices, BATCH_SIZES) says how the batch size moves a shape; this one what its
# aspect does at a batch of this size. It has twins of its own: the held-out and the models'
# batched shapes are rarely aligned (EPYC VM, float32 31 x 106 x 119 x 137: 1416 us, priced 653
# from aligned cells alone).
BMM_ASPECT_BATCH = 16


def past_whole_wave(p: GemmPoint, profile: Profile) -> bool:
    """Whether `p` has more outputs (over its batch) than the whole-wave grid times: the aspect
    cells of `max_aspect_outputs`, timed at one K, without K or cold twins."""
    return p.batch * p.m * p.n > profile.max_gemm_outputs


def _lattice(dev: DeviceIdentity, profile: Profile, ops: tuple[str, ...], batch: int, top: int) -> list[GemmPoint]:
    """`ops` at `batch` over M, N in powers of 4 up to `top`, rows and columns of two, at the
    aspect K values within the caps (counted over the batch), the unaligned twins, and the
    output class past the whole-wave cap (`max_aspect_outputs`) at the twin K alone."""
    sides = [s for s in lattice_sides(top) if s != TWO]
    cap = profile.max_aspect_flops or profile.max_point_flops
    twin_k = profile.gemm_twin_k or min(profile.gemm_aspect_k)

    def fits(outputs: int, k: int) -> bool:
        if outputs <= profile.max_gemm_outputs:
            return 2 * outputs * k <= cap
        # Past the whole-wave grid's outputs, one K with its N twins: an LM head's output (GPT-2
        # at batch 8: 1024 x 50257, 206 MB) was priced from the 1024 x 16384 cell, its
        # throughput held, and a neighbourhood of twins four times smaller, 13 % under its
        # kept time (Zen 5 EPYC VM, 2026-11-30; docs/methods.md). The FLOP cap is not applied:
        # the call budget (gemm_max_call_s) leaves out what a slow CPU cannot time.
        return outputs <= (profile.max_aspect_outputs or 0) and k == twin_k

    def cells(ms, ns):
        return [GemmPoint(op, dtype, batch, m, n, k, False, "aspect") for dtype in dtypes_for(dev.kind)
                for op in ops for k in profile.gemm_aspect_k for m in ms for n in ns if fits(batch * m * n, k)]

    grid = cells(sides, sides)
    # Two rows (columns) as well: between one, a GEMV, and four a BLAS changes kernels, and a
    # line through the two prices neither (Xeon VM, mm float32 166 x 2 x 452: 21 us, priced 8.4).
    # The twins stay on the powers of 4: a two-column row is shorter than a cache line.
    two = cells([TWO], [*sides, TWO]) + cells(sides, [TWO])
    # the large class's K twin is left out: its K is a model's width, and each point costs seconds
    twins = [p for p in unaligned_twins(grid, twin_k)
             if p.grid in (TWIN_N_GRID, LINE_BASE_GRID) or not past_whole_wave(p, profile)]
    return grid + two + twins


BATCH_SIZES = (1, 4, 16, 64, 256)  # the batch grid: powers of 4, up to attention's batch x heads


BATCH_SIDES = (4, 16, 64, 256, 1024)


def batch_points(dev: DeviceIdentity, profile: Profile) -> list[GemmPoint]:
    """CPU: bmm of BATCH_SIZES square matrices of BATCH_SIDES at the profile's batch-grid K values,
    within its caps: what many small matrices cost beside the whole-wave table's few large ones
    (predict/gemm_batch.py)."""
    if dev.kind != "cpu" or not profile.gemm_batch_k:
        return []
    return [GemmPoint("bmm", dtype, b, s, s, k, False, BATCH_GRID) for dtype in dtypes_for(dev.kind)
            for b in BATCH_SIZES for s in BATCH_SIDES for k in profile.gemm_batch_k
            if b * s * s <= profile.max_gemm_outputs and 2 * b * s * s * k <= profile.max_point_flops]


# Twins of the aspect cells one element off in N (a row of B and C no longer fills whole cache
# lines) and in K (the same for the rows of A, and of W in linear): a GPT-2 LM head with
# N = 50257 ran 1.36x as long as with N = 50304 on the EPYC VM (146 vs 108 ms at 512 x 256),
# while every grid shape is a power of two. M is never a leading dimension here.
def unaligned_twins(grid: list[GemmPoint], k: int) -> list[GemmPoint]:
    """For each aspect cell at K = k, the same shape with N + 1 and with K + 1; where the cell's
    output rows alias (a multiple of 4 KiB, predict/gemm_alias.py), the N twin is one element
    past a base one cache line wider (grid LINE_BASE_GRID), timed as well.
    Why: N + 1 beside an aliasing N times two things, the aliasing gone and the row ending mid
    line, and shapes of other widths pay the second alone. On the Zen 5 EPYC VM (linear float32,
    K = 256, 2026-11-30) N + 1 ran 0.78-0.94x 16 384 and 65 536 at M = 64-256 while 50 257 ran 1.03-1.14x
    50 256; 48 random odd-N shapes were priced 7.5 % under on average with the pairs at the
    aliasing N, and 0.3 % over with pairs one line past it."""
    out = []
    for p in grid:
        if p.k != k:
            continue
        if rows_alias(p.n, p.dtype):
            line = line_elements(p.dtype)
            out += [replace(p, grid=LINE_BASE_GRID, n=p.n + line), replace(p, grid=TWIN_N_GRID, n=p.n + line + 1)]
        else:
            out.append(replace(p, grid=TWIN_N_GRID, n=p.n + 1))
        out.append(replace(p, grid=TWIN_K_GRID, k=p.k + 1))
    return out


def alias_twins(dev: DeviceIdentity, profile: Profile, train: list[GemmPoint]) -> list[GemmPoint]:
    """CPU: each whole-wave point with a K of at most one cache line whose output rows are a
    multiple of 4 KiB, again one line, 1 KiB and 2 KiB wider (predict/gemm_alias.py): short-K
    shapes of other widths ran up to 5x faster than the grid's on the Zen 5 EPYC VM."""
    if dev.kind != "cpu" or not profile.gemm_aspect_k:
        return []
    return [replace(p, n=p.n + step, grid=ALIAS_GRID) for p in train
            if p.grid == "waves" and short_k(p.k, p.dtype) and rows_alias(p.n, p.dtype)
            for step in twin_steps(p.dtype)]


def lattice_sides(top: int) -> list[int]:
    """The aspect lattice's sides up to `top`: powers of 4, and TWO."""
    return sorted({TWO, *(4 ** i for i in range(int(math.log(top, 4)) + 1))})


def narrow_points(dev: DeviceIdentity, profile: Profile) -> list[GemmPoint]:
    """CPU: at each of the profile's narrow (M, K) cells, every whole N of up to one cache line of
    columns that the aspect lattice does not hold (float32: 3, 5-15), for mm and linear alone and
    bmm at its aspect batch: a BLAS picks kernels by N there, and the time between two lattice
    columns is not between theirs (predict/gemm_narrow.py)."""
    if dev.kind != "cpu" or not profile.gemm_narrow_cells:
        return []
    sides = set(lattice_sides(profile.gemm_aspect_max))
    out = []
    for dtype in dtypes_for(dev.kind):
        ns = [n for n in range(1, line_elements(dtype) + 1) if n not in sides]
        for op, batch in [*((op, 1) for op in ASPECT_OPS), ("bmm", BMM_ASPECT_BATCH)]:
            out += [GemmPoint(op, dtype, batch, m, n, k, False, NARROW_GRID)
                    for m, k in profile.gemm_narrow_cells for n in ns
                    if batch * m * n <= profile.max_gemm_outputs and 2 * batch * m * n * k <= profile.max_point_flops]
    return out


def random_shapes(op: str, profile: Profile, n: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """n log-uniform (batch, M, N, K) in PM2Lat's evaluation ranges (scaled by the profile)."""

    def loguni(hi: int) -> np.ndarray:
        return np.exp(rng.uniform(0, np.log(hi), n)).round().astype(int).clip(1, hi)

    if op == "bmm":
        hi = profile.heldout_max_bmm
        dims = [loguni(hi) for _ in range(4)]
        dims[0] = loguni(min(hi, 64))  # batch
    else:
        dims = [np.ones(n, int), loguni(profile.heldout_max_mn), loguni(profile.heldout_max_mn),
                loguni(profile.heldout_max_k)]
    return [tuple(int(x) for x in p) for p in zip(*dims)]


def heldout_points(dev: DeviceIdentity, profile: Profile, seed: int = 0) -> list[GemmPoint]:
    """Random shapes per (op, dtype), never used for fitting."""
    rng = np.random.default_rng(seed)
    return [GemmPoint(op, dtype, b, m, nn, k, True, "heldout") for dtype in dtypes_for(dev.kind) for op in GEMM_OPS
            for b, m, nn, k in random_shapes(op, profile, profile.heldout_per_op, rng)]


def tile_of(kernel: str, kind: str, dtype: str, probed: tuple[int, int] | None = None) -> tuple[int, int]:
    """The tile a kernel pads to: on CUDA from its name; on the CPU the (op, dtype)'s probed
    tile (the points are laid out in whole waves of it), except ATen's reduced-precision loop."""
    if kind == "cpu" and kernel == ATEN_KERNEL and dtype in ("bfloat16", "float16"):
        return (1, 1)  # ATen's reduced-precision fallback is a plain loop nest: nothing is padded
    m = _TILE_RE.search(kernel) if kind == "cuda" else None
    return (int(m.group(1)), int(m.group(2))) if m else (probed or NOMINAL_TILE[kind])


def cold_points(dev: DeviceIdentity, profile: Profile, cache_bytes: int | None,
                heldout: list[GemmPoint]) -> list[GemmPoint]:
    """CPU: twins of the aspect grid's mm and linear cells at its largest K, and of the held-out
    mm and linear shapes, timed with rotated weights. Only weights whose rotation passes the
    measured weight cache twice over (the fit fills the smaller ones' cells from beside them)."""
    if dev.kind != "cpu" or not profile.gemm_cold_weights or not cache_bytes:
        return []
    from pipeline.harness.weight_rotation import MAX_COPIES

    def rotates(p: GemmPoint) -> bool:
        return p.op in ASPECT_OPS and p.n * p.k * element_bytes(p.dtype) * MAX_COPIES >= 2 * cache_bytes

    k = max(profile.gemm_aspect_k)
    # on the powers of 4, as the unaligned twins: the fit fills the rows of 2 from beside them
    # the cells past the whole-wave outputs (max_aspect_outputs) are not: each costs seconds
    grid = [replace(p, grid=COLD_GRID) for p in aspect_points(dev, profile)
            if p.grid == "aspect" and p.k == k and TWO not in (p.m, p.n) and not past_whole_wave(p, profile)]
    return [p for p in grid if rotates(p)] + [replace(p, grid=COLD_HELDOUT) for p in heldout if rotates(p)]


def sweep_points(dev: DeviceIdentity, profile: Profile,
                 tiles: dict[tuple[str, str], tuple[int, int]] | None = None) -> list[GemmPoint]:
    """Every point of the sweep: the whole-wave grid, the aspect grid (CPU), the batch grid (CPU),
    the narrow grid (CPU), the held-out shapes. A shape is measured once: an aspect point the
    whole-wave or the batch grid already holds (bmm's square cells at its batch) is left to it
    (the fit reads such rows into the aspect grid too, predict/gemm.py), and so is a narrow point
    the aspect grid's twins hold."""
    train, batched = training_points(dev, profile, tiles), batch_points(dev, profile)
    train += alias_twins(dev, profile, train)
    have = {p.shape for p in train + batched}
    aspect = [p for p in aspect_points(dev, profile) if p.grid != "aspect" or p.shape not in have]  # twins all stay
    have |= {p.shape for p in aspect}
    # the twins at N = 5 (and bfloat16's 17) on a narrow cell: the fit reads them as narrow rows too
    narrow = [p for p in narrow_points(dev, profile) if p.shape not in have]
    return train + aspect + batched + narrow + heldout_points(dev, profile)


def within_call_budget(pts: list[GemmPoint], rates: dict[str, float],
                       max_call_s: float) -> tuple[list[GemmPoint], list[GemmPoint]]:
    """(the points one call of which takes at most `max_call_s` at its dtype's measured FLOP/s
    (`rates`; a dtype without a rate keeps all its points), the points left out)."""
    kept, dropped = [], []
    for p in pts:
        rate = rates.get(p.dtype)
        # a line base is judged at its twin's FLOPs (one column more): kept without its twin it
        # would cost a call near the cap and pair with nothing
        flops = p.flops * (p.n + 1) / p.n if p.grid == LINE_BASE_GRID else p.flops
        over = rate and flops / rate > max_call_s
        (dropped if over else kept).append(p)
    return kept, dropped
