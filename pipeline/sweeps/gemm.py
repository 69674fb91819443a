"""gemm_samples: PM2Lat III-C. K over powers of two at M x N that fill whole waves, plus
random held-out shapes that are never used for fitting (held_out = True).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import dtypes_for
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.order import interleaved
from pipeline.harness.page_faults import fault_us_per_page
from pipeline.harness.progress import Progress
from pipeline.harness.repeat import repeat_sample, retime
from pipeline.harness.revisit import revisit
from pipeline.harness.stalls import remeasure_stalled
from pipeline.harness.suspects import revisit_suspects
from pipeline.harness.timer import measure
from pipeline.predict.gemm_batch import BATCH_GRID
from pipeline.predict.gemm_grids import COLD_GRID, COLD_HELDOUT, COLD_GRIDS
from pipeline.predict.geometry import blocks, waves, whole_wave_shape
from pipeline.sweeps.cpu_kernels import ATEN_KERNEL, cpu_kernel_name
from pipeline.sweeps.profiles import Profile, wave_counts
from pipeline.core.ops import GEMM_OPS

# Nominal tile used to lay out whole waves. On CUDA the tile actually used is parsed from
# the kernel name where it says. On the CPU the padding steps of M and N are measured per
# (op, dtype) (tile_probe.py: 1 x 16 on AVX-512); 8 x 8 is only the fallback resolution for a
# kernel the probe did not see, fine enough that skinny and tiny GEMMs fall inside the grid.
NOMINAL_TILE = {"cuda": (128, 128), "cpu": (8, 8)}
LAYOUT = {"mm": "NN", "bmm": "NN", "linear": "TN"}
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
    grid: str = "waves"  # "waves" (PM2Lat's whole-wave grid), "aspect" (CPU: off its diagonal), "batch", "heldout"


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
            fm, fn = _tile_of(ATEN_KERNEL, dev.kind, dtype, (tile_m, tile_n))
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


def _lattice(dev: DeviceIdentity, profile: Profile, ops: tuple[str, ...], batch: int, top: int) -> list[GemmPoint]:
    """`ops` at `batch` over M, N in powers of 4 up to `top`, rows and columns of two, at the
    aspect K values within the caps (counted over the batch), and the unaligned twins."""
    sides = [4 ** i for i in range(int(math.log(top, 4)) + 1)]
    cap = profile.max_aspect_flops or profile.max_point_flops

    def cells(ms, ns):
        return [GemmPoint(op, dtype, batch, m, n, k, False, "aspect") for dtype in dtypes_for(dev.kind)
                for op in ops for k in profile.gemm_aspect_k for m in ms for n in ns
                if batch * m * n <= profile.max_gemm_outputs and 2 * batch * m * n * k <= cap]

    grid = cells(sides, sides)
    # Two rows (columns) as well: between one, a GEMV, and four a BLAS changes kernels, and a
    # line through the two prices neither (Xeon VM, mm float32 166 x 2 x 452: 21 us, priced 8.4).
    # The twins stay on the powers of 4: a two-column row is shorter than a cache line.
    two = cells([TWO], [*sides, TWO]) + cells(sides, [TWO])
    return grid + two + unaligned_twins(grid, profile.gemm_twin_k or min(profile.gemm_aspect_k))


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
UNALIGNED = {"unaligned_n": "n", "unaligned_k": "k"}


def unaligned_twins(grid: list[GemmPoint], k: int) -> list[GemmPoint]:
    """For each aspect cell at K = k, the same shape with N + 1 and with K + 1."""
    return [replace(p, grid=name, **{dim: getattr(p, dim) + 1}) for p in grid if p.k == k
            for name, dim in UNALIGNED.items()]


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


def gemm_callable(op: str, dtype: str, b: int, m: int, n: int, k: int, device: str, kept_output: bool = False):
    """A call of the GEMM; `kept_output`: writing into one output kept across calls (out=), its
    time without the page faults of a fresh output, which the allocator's reuse spares a model."""
    import torch

    from pipeline.harness.random_pool import randn

    torch.manual_seed(0)
    dt = torch_dtype(dtype)
    kw = dict(dtype=dt, device=device)
    if op == "bmm":
        a, w = randn(b, m, k, **kw), randn(b, k, n, **kw)
        out = torch.empty(b, m, n, **kw) if kept_output else None
        return lambda: torch.bmm(a, w, out=out)
    if op == "mm":
        a, w = randn(m, k, **kw), randn(k, n, **kw)
        out = torch.empty(m, n, **kw) if kept_output else None
        return lambda: torch.mm(a, w, out=out)
    a, w = randn(m, k, **kw), randn(n, k, **kw)
    bias = randn(n, **kw) if linear_has_bias(device) else None
    if kept_output:  # F.linear has no out=; mm / addmm is its computation
        out = torch.empty(m, n, **kw)
        return (lambda: torch.mm(a, w.t(), out=out)) if bias is None else (lambda: torch.addmm(bias, a, w.t(), out=out))
    return lambda: torch.nn.functional.linear(a, w, bias)


def linear_has_bias(device: str) -> bool:
    """Whether the `linear` table is timed with a bias: on CUDA, yes (cuBLASLt fuses it into the
    GEMM's epilogue, so nn.Linear's one kernel carries it); on the CPU, no. A CPU addmm first
    broadcasts the bias into its output in an aten::copy_ of its own, which a captured graph
    prices apart (copy_bcast), and many linears have none (an LM head, Llama's projections).
    Timed with a bias, the table charged that copy twice to a biased linear and once to a
    bias-free one: on the Xeon VM, 128 x 50257 x 128 float32 ran 4.45 ms bias-free and 5.66 ms
    with a bias; at 1024 rows, whose 206 MB output faults in every page, 88.5 and 85.9 ms (a
    broadcast faults pages in more cheaply than the GEMM's tiles do)."""
    return not device.startswith("cpu")


def output_faulted(faults_per_call: float | None, p: GemmPoint) -> bool:
    """Whether a call faulted in at least half its output's pages (a fresh mapping each call)."""
    from pipeline.core.dtypes import element_bytes
    from pipeline.predict.page_faults import PAGE_BYTES

    pages = p.batch * p.m * p.n * element_bytes(p.dtype) / PAGE_BYTES
    return faults_per_call is not None and pages >= 1 and faults_per_call >= 0.5 * pages


def kernel_namer(dev: DeviceIdentity, keys: list, make_fn):
    """name(key, fn) -> the GEMM kernel a point runs. On CUDA every key is named up front, in
    one profiler session per few hundred (harness/kernel_names.py), from make_fn(key); on the
    CPU the point's own call is traced with oneDNN's verbose log when asked, so a CPU sweep
    builds each point's tensors once."""
    if dev.kind != "cuda":
        return lambda key, fn: cpu_kernel_name(fn)
    from pipeline.harness.kernel_names import pick_gemm_kernel, record_kernels

    recorded = record_kernels(keys, make_fn)
    names = {key: pick_gemm_kernel([name for name, _ in recorded[key]]) for key in keys}
    return lambda key, fn: names[key]


def kernel_name(fn, dev: DeviceIdentity) -> str:
    return kernel_namer(dev, [0], lambda _: fn)(0, fn)


def _tile_of(kernel: str, kind: str, dtype: str, probed: tuple[int, int] | None = None) -> tuple[int, int]:
    """The tile a kernel pads to: on CUDA from its name; on the CPU the (op, dtype)'s probed
    tile (the points are laid out in whole waves of it), except ATen's reduced-precision loop."""
    if kind == "cpu" and kernel == ATEN_KERNEL and dtype in ("bfloat16", "float16"):
        return (1, 1)  # ATen's reduced-precision fallback is a plain loop nest: nothing is padded
    m = _TILE_RE.search(kernel) if kind == "cuda" else None
    return (int(m.group(1)), int(m.group(2))) if m else (probed or NOMINAL_TILE[kind])


def cpu_tiles(dev: DeviceIdentity, profile: Profile, log=None) -> dict[tuple[str, str], tuple[int, int]]:
    """(op, dtype) -> (tile_m, tile_n): the measured padding steps (tile_probe.py)."""
    from pipeline.sweeps.tile_probe import PROBE_OTHER, probe_tile

    def gemm(op, dtype, m, n, k):
        return gemm_callable(op, dtype, 1, m, n, k, dev.torch_device)

    out = {}
    for dtype in dtypes_for(dev.kind):
        for op in GEMM_OPS:
            tm, tn = out[(op, dtype)] = probe_tile(
                lambda m, n, k: measure(gemm(op, dtype, m, n, k), profile.gemm_timing, dev.torch_device).median_us)
            kernel = cpu_kernel_name(gemm(op, dtype, PROBE_OTHER, 16, PROBE_OTHER))  # for the log line only
            (log or print)(f"gemm_samples: {op} {dtype} pads M by {tm} and N by {tn} ({kernel})")
    return out


def cold_points(dev: DeviceIdentity, profile: Profile, cache_bytes: int | None,
                heldout: list[GemmPoint]) -> list[GemmPoint]:
    """CPU: twins of the aspect grid's mm and linear cells at its largest K, and of the held-out
    mm and linear shapes, timed with rotated weights. Only weights whose rotation passes the
    measured weight cache twice over (the fit fills the smaller ones' cells from beside them)."""
    if dev.kind != "cpu" or not profile.gemm_cold_weights or not cache_bytes:
        return []
    from pipeline.core.dtypes import element_bytes
    from pipeline.harness.weight_rotation import MAX_COPIES

    def rotates(p: GemmPoint) -> bool:
        return p.op in ASPECT_OPS and p.n * p.k * element_bytes(p.dtype) * MAX_COPIES >= 2 * cache_bytes

    k = max(profile.gemm_aspect_k)
    # on the powers of 4, as the unaligned twins: the fit fills the rows of 2 from beside them
    grid = [replace(p, grid=COLD_GRID) for p in aspect_points(dev, profile)
            if p.grid == "aspect" and p.k == k and TWO not in (p.m, p.n)]
    return [p for p in grid if rotates(p)] + [replace(p, grid=COLD_HELDOUT) for p in heldout if rotates(p)]


def cold_weight_setup(dev: DeviceIdentity, profile: Profile, log=None):
    """(weight cache bytes, pool) for the rotated timings, or (None, None) where none are taken."""
    if dev.kind != "cpu" or not profile.gemm_cold_weights:
        return None, None
    from pipeline.harness.cache_probe import cpu_llc_bytes
    from pipeline.harness.weight_rotation import weight_cache_bytes

    def time_us(fn):
        return measure(fn, profile.gemm_timing, dev.torch_device).median_us

    cache, pool = weight_cache_bytes(int(cpu_llc_bytes() or dev.l2_bytes or 1 << 20), time_us, log=log or print)
    return (cache, pool) if cache else (None, None)


def set_tf32(dtype: str) -> None:
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"


def sweep_points(dev: DeviceIdentity, profile: Profile,
                 tiles: dict[tuple[str, str], tuple[int, int]] | None = None) -> list[GemmPoint]:
    """Every point of the sweep: the whole-wave grid, the aspect grid (CPU), the batch grid (CPU),
    the held-out shapes. A shape is measured once: an aspect point the whole-wave or the batch
    grid already holds (bmm's square cells at its batch) is left to it (the fit reads such rows
    into the aspect grid too, predict/gemm.py)."""
    train, batched = training_points(dev, profile, tiles), batch_points(dev, profile)
    have = {(p.op, p.dtype, p.batch, p.m, p.n, p.k) for p in train + batched}
    aspect = [p for p in aspect_points(dev, profile)
              if p.grid != "aspect" or (p.op, p.dtype, p.batch, p.m, p.n, p.k) not in have]  # twins all stay
    return train + aspect + batched + heldout_points(dev, profile)


def sweep_gemm(dev: DeviceIdentity, profile: Profile, log=None) -> list[dict]:
    tiles = cpu_tiles(dev, profile, log) if dev.kind == "cpu" else {}
    faults = {}
    if dev.kind == "cpu":  # each row's faults are counted; what one costs is measured once
        faults = {"fault_us_per_page": fault_us_per_page()}
        if log:
            log(f"page faults: a fresh page costs {faults['fault_us_per_page']:.2f} us to fault in")
    cache, pool = cold_weight_setup(dev, profile, log)
    if cache:
        faults["weight_cache_bytes"] = float(cache)
    pts = sweep_points(dev, profile, tiles)
    pts += cold_points(dev, profile, cache, [p for p in pts if p.held_out])
    slots = slots_for(dev)
    # each rotation passes the weight cache four times over, within the pool the probe allocated
    rotation = min(4 * cache, pool.nbytes) if cache else 0

    def make(p: GemmPoint):
        set_tf32(p.dtype)
        if p.grid in COLD_GRIDS:
            from pipeline.harness.weight_rotation import rotating_gemm
            return rotating_gemm(p.op, p.dtype, p.m, p.n, p.k, pool, rotation)
        return gemm_callable(p.op, p.dtype, p.batch, p.m, p.n, p.k, dev.torch_device)

    name = kernel_namer(dev, pts, make)
    prog = Progress("gemm_samples", len(pts), log)
    rows: list[dict] = [{}] * len(pts)
    for i in interleaved(len(pts)):  # a slow spell of a shared machine must not land on one group
        p = pts[i]
        fn = make(p)
        kernel = name(p, fn)
        tm, tn = _tile_of(kernel, dev.kind, p.dtype, tiles.get((p.op, p.dtype)))
        meas = measure(fn, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0)
        rows[i] = {
            "op": p.op, "dtype": p.dtype, "layout": LAYOUT[p.op], "batch": p.batch, "m": p.m, "n": p.n, "k": p.k,
            "kernel": kernel, "tile_m": tm, "tile_n": tn, "split_k": 1 if dev.kind == "cpu" else None, "slots": slots,
            "blocks": int(blocks(p.m, p.n, p.batch, tm, tn)), "waves": int(waves(p.m, p.n, p.batch, tm, tn, slots)),
            "flops": 2 * p.batch * p.m * p.n * p.k, "held_out": p.held_out, "grid": p.grid,
            **meas.row(profile.gemm_timing.cv_threshold), **faults,
        }
        if dev.kind == "cpu" and p.grid not in COLD_GRIDS and output_faulted(
                rows[i].get("faults_per_call"), p):  # the same GEMM into a kept output: the faults' cost
            rows[i]["kept_us"] = _kept_us(p, profile, dev)
        prog.step(f"{p.op} {p.dtype} b={p.batch} {p.m}x{p.n}x{p.k}")
    makers = [lambda p=p: make(p) for p in pts]
    revisit(rows, makers, profile.gemm_timing, dev.torch_device, profile.visits, dev.l2_bytes or 0, prog.log)
    if profile.visits > 1:
        _revisit_kept(rows, pts, profile, dev)
        # training grids only: a held-out row's own time must not decide whether it is timed again
        groups = [None if p.held_out else (p.op, p.dtype, p.grid) for p in pts]  # cold_heldout is held out too
        revisit_suspects(rows, makers, profile.gemm_timing, dev.torch_device, groups,
                         np.array([(p.m, p.n, p.k, p.batch) for p in pts], float), dev.l2_bytes or 0, prog.log)
    remeasure_stalled(rows, makers, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0, prog.log,
                      profile.stall_wait_s)
    # the hot held-out rows only: they are what the held-out error is scored on
    picked = repeat_sample([(p.op, p.dtype) for p in pts], [p.grid == "heldout" for p in pts],
                           profile.gemm_repeats_per_group)
    retime(rows, makers, picked, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0, prog.log)
    return rows


def _revisit_kept(rows: list[dict], pts: list[GemmPoint], profile: Profile, dev: DeviceIdentity) -> None:
    """The kept-output timing of a faulting row on a second visit too, the quicker kept: the
    faults' cost is the row's time less this one, and both should be the quiet machine's."""
    for r, p in zip(rows, pts):
        if "kept_us" in r and r["kept_us"] == r["kept_us"]:
            r["kept_us"] = min(r["kept_us"], _kept_us(p, profile, dev))


def _kept_us(p: GemmPoint, profile: Profile, dev: DeviceIdentity) -> float:
    """Median µs of the point's GEMM writing into an output kept across calls (no page faults)."""
    kept = gemm_callable(p.op, p.dtype, p.batch, p.m, p.n, p.k, dev.torch_device, kept_output=True)
    return measure(kept, profile.gemm_timing, dev.torch_device).median_us
