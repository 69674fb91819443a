"""gemm_samples: PM2Lat III-C. Times the points of sweeps/gemm_points.py (whole waves, the CPU's
aspect, batch and cold-weight grids, held-out shapes) into rows with their kernels and tiles.
"""
from __future__ import annotations

import time

import numpy as np

from pipeline.core.dtypes import dtypes_for
from pipeline.core.ops import GEMM_OPS
from pipeline.device.discover import DeviceIdentity
from pipeline.device.peaks import peak_matmul_flops
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.order import interleaved
from pipeline.harness.page_faults import fault_from_bytes, fault_us_per_page, held_output_us
from pipeline.harness.progress import Progress
from pipeline.harness.repeat import repeat_sample, retime
from pipeline.harness.revisit import revisit
from pipeline.harness.stalls import remeasure_stalled
from pipeline.harness.suspects import revisit_suspects
from pipeline.harness.timer import measure
from pipeline.predict.gemm_grids import COLD_GRIDS
from pipeline.predict.geometry import blocks, waves
from pipeline.sweeps.cpu_kernels import cpu_kernel_name
from pipeline.sweeps.gemm_points import GemmPoint, cold_points, slots_for, sweep_points, tile_of, within_call_budget
from pipeline.sweeps.profiles import Profile

LAYOUT = {"mm": "NN", "bmm": "NN", "linear": "TN"}


def gemm_callable(op: str, dtype: str, b: int, m: int, n: int, k: int, device: str, kept_output: bool = False):
    """A call of the GEMM; `kept_output`: writing into one output kept across calls (out=), its
    time without the page faults of a fresh output, which the allocator's reuse spares a model."""
    import torch

    from pipeline.harness.random_pool import randn

    # the CPU's generator alone on the CPU: torch.manual_seed also seeds each lazy backend (CUDA,
    # XPU, MTIA), each keeping a formatted stack trace, 0.27 ms a call against 2 us (Zen 3 VM)
    (torch.default_generator if device == "cpu" else torch).manual_seed(0)
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


def cpu_tiles(dev: DeviceIdentity, profile: Profile, log=None) -> dict[tuple[str, str], tuple[int, int]]:
    """(op, dtype) -> (tile_m, tile_n): the measured padding steps (tile_probe.py)."""
    from pipeline.sweeps.tile_probe import PROBE_OTHER, probe_tile

    def gemm(op, dtype, m, n, k):
        return gemm_callable(op, dtype, 1, m, n, k, dev.torch_device)

    out = {}
    for dtype in dtypes_for(dev.kind):
        for op in GEMM_OPS:
            tm, tn = out[(op, dtype)] = probe_tile(
                lambda m, n, k: measure(gemm(op, dtype, m, n, k), profile.gemm_timing, dev.torch_device).median_us,
                profile.tile_probe_rounds)
            kernel = cpu_kernel_name(gemm(op, dtype, PROBE_OTHER, 16, PROBE_OTHER))  # for the log line only
            (log or print)(f"gemm_samples: {op} {dtype} pads M by {tm} and N by {tn} ({kernel})")
    return out


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


def _fault_from(log=None) -> dict:
    """{"fault_from_bytes": ...}: from which output size a step's process faults every page of a
    fresh one (harness/page_faults.fault_from_bytes, in a process set up as a step's is); {}
    where the probe failed or nothing faulted, and the GEMM model keeps the rows' own counts."""
    from pipeline.workloads.isolated import ADAPT_BYTES

    try:
        found = fault_from_bytes(ADAPT_BYTES)
    except RuntimeError as exc:
        (log or print)(f"page faults: {exc}; output faults are charged as the rows counted them")
        return {}
    if found is None:
        return {}
    (log or print)(f"page faults: a step's process faults in every page of a fresh output from {found / 2**20:.0f} MiB")
    return {"fault_from_bytes": found}


def set_tf32(dtype: str) -> None:
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"


def sweep_gemm(dev: DeviceIdentity, profile: Profile, log=None) -> list[dict]:
    tiles = cpu_tiles(dev, profile, log) if dev.kind == "cpu" else {}
    faults = {}
    if dev.kind == "cpu":  # each row's faults are counted; what one costs is measured once
        faults = {"fault_us_per_page": fault_us_per_page(), **_fault_from(log)}
        if log:
            log(f"page faults: a fresh page costs {faults['fault_us_per_page']:.2f} us to fault in")
    cache, pool = cold_weight_setup(dev, profile, log)
    if cache:
        faults["weight_cache_bytes"] = float(cache)
    pts = sweep_points(dev, profile, tiles)
    pts += cold_points(dev, profile, cache, [p for p in pts if p.held_out])
    if dev.kind == "cpu":
        pts = _within_call_budget(pts, dev, profile, log)
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
    too_slow = {}  # point index -> seconds of its quicker first call, over twice the call budget
    for i in interleaved(len(pts)):  # a slow spell of a shared machine must not land on one group
        p = pts[i]
        fn = make(p)
        t0 = time.perf_counter()
        kernel = name(p, fn)  # on the CPU, the point's first call
        first_s = time.perf_counter() - t0
        slow = _over_budget(fn, first_s, 2 * profile.gemm_max_call_s) if dev.kind == "cpu" else None
        if slow is not None:
            too_slow[i] = slow
            prog.step(f"{p.op} {p.dtype} b={p.batch} {p.m}x{p.n}x{p.k} (over budget, left out)")
            continue
        tm, tn = tile_of(kernel, dev.kind, p.dtype, tiles.get((p.op, p.dtype)))
        meas = measure(fn, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0)
        rows[i] = {
            "op": p.op, "dtype": p.dtype, "layout": LAYOUT[p.op], "batch": p.batch, "m": p.m, "n": p.n, "k": p.k,
            "kernel": kernel, "tile_m": tm, "tile_n": tn, "split_k": 1 if dev.kind == "cpu" else None, "slots": slots,
            "blocks": int(blocks(p.m, p.n, p.batch, tm, tn)), "waves": int(waves(p.m, p.n, p.batch, tm, tn, slots)),
            "flops": p.flops, "held_out": p.held_out, "grid": p.grid,
            **meas.row(profile.gemm_timing.cv_threshold), **faults,
        }
        if dev.kind == "cpu" and p.grid not in COLD_GRIDS and output_faulted(
                rows[i].get("faults_per_call"), p):  # the same GEMM into a kept output: the faults' cost
            rows[i]["kept_us"] = _kept_us(p, profile, dev)
            rows[i]["held_us"], rows[i]["held_faults"] = held_output_us(fn, profile.gemm_timing.min_reps)
        prog.step(f"{p.op} {p.dtype} b={p.batch} {p.m}x{p.n}x{p.k}")
    if too_slow:
        _say_too_slow({pts[i]: s for i, s in too_slow.items()}, profile, log)
        pts = [p for i, p in enumerate(pts) if i not in too_slow]
        rows = [r for i, r in enumerate(rows) if i not in too_slow]
    makers = [lambda p=p: make(p) for p in pts]
    revisit(rows, makers, profile.gemm_timing, dev.torch_device, profile.visits, dev.l2_bytes or 0, prog.log)
    if profile.visits > 1:
        _revisit_kept(rows, pts, profile, dev, log)
        # training grids only: a held-out row's own time must not decide whether it is timed again
        groups = [None if p.held_out else (p.op, p.dtype, p.grid) for p in pts]  # cold_heldout is held out too
        revisit_suspects(rows, makers, profile.gemm_timing, dev.torch_device, groups,
                         np.array([(p.m, p.n, p.k, p.batch) for p in pts], float), dev.l2_bytes or 0, prog.log,
                         stall_wait_s=profile.stall_wait_s)
    remeasure_stalled(rows, makers, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0, prog.log,
                      profile.stall_wait_s)
    # the hot held-out rows only: they are what the held-out error is scored on
    picked = repeat_sample([(p.op, p.dtype) for p in pts], [p.grid == "heldout" for p in pts],
                           profile.gemm_repeats_per_group)
    retime(rows, makers, picked, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0, prog.log)
    return rows


# the square matmul each dtype's rate is read from: large enough to run at the dtype's speed,
# small enough to take ~0.3 s where it runs in software (ATen's bf16 loop at 1 GFLOP/s)
RATE_SIZE = 512


def _within_call_budget(pts: list[GemmPoint], dev: DeviceIdentity, profile: Profile, log=None) -> list[GemmPoint]:
    """The points whose one call fits `profile.gemm_max_call_s` at their dtype's rate, measured
    here: what a dtype costs on this CPU (bf16 in hardware or in a scalar loop) is not assumed.
    Each rate is the quicker of two readings, as every CPU point keeps the quicker of two visits:
    one read in a slow spell would leave out float32's largest cells (the AVX2 EPYC VM read 71.6
    GFLOP/s at 512^3 once, where its largest cells need 68)."""
    rates = {dt: max(peak_matmul_flops(dev, dt, RATE_SIZE) for _ in range(2)) for dt in dtypes_for(dev.kind)}
    budget = profile.gemm_max_call_s
    kept, dropped = within_call_budget(pts, rates, budget)
    if log:
        said = ", ".join(f"{dt} {r / 1e9:.3g} GFLOP/s (up to {r * budget:.2g} FLOPs a point)" for dt, r in rates.items())
        log(f"matmul rates at {RATE_SIZE}^3, the quicker of two readings: {said} at {budget:g} s a call")
        for dt, mine in _by_dtype(dropped).items():
            log(f"{len(mine)} {dt} points over {budget:g} s a call left out: {_left_out(mine)}")
    return kept


def _by_dtype(pts: list[GemmPoint]) -> dict[str, list[GemmPoint]]:
    return {dt: [p for p in pts if p.dtype == dt] for dt in sorted({p.dtype for p in pts})}


def _left_out(pts: list[GemmPoint]) -> str:
    """What leaving `pts` out costs: grid cells the fit fills, held-out shapes not scored."""
    held = sum(p.held_out for p in pts)
    return f"{len(pts) - held} of the grids (filled at fit time), {held} held-out (not scored)"


def _over_budget(fn, first_s: float, limit_s: float) -> float | None:
    """Seconds of the quicker of a point's first call and one more, when both ran over `limit_s`;
    None otherwise. The second call is taken only after a slow first one: one call in a slow
    spell (single timings here have read 2.2x their usual) must not decide a cell alone."""
    if first_s <= limit_s:
        return None
    t0 = time.perf_counter()
    fn()
    quicker = min(first_s, time.perf_counter() - t0)
    return quicker if quicker > limit_s else None


def _say_too_slow(slow: dict[GemmPoint, float], profile: Profile, log=None) -> None:
    """The log line for the points whose first two calls both ran over twice the call budget.
    The rate at 512^3 misjudges some shapes: the AVX2 EPYC's bf16 ran skinny GEMMs (4 x 65536 x
    1024) at 0.27 GFLOP/s against 1.3 there, and 29 points the rate let in took 0.5-2 s a call
    (15 of them over 1 s). Twice the budget, not once: a float32 cell the rate let in must not be
    lost to a slow spell."""
    if not log:
        return
    for dt, mine in _by_dtype(list(slow)).items():
        log(f"{len(mine)} {dt} points left out after two calls over {2 * profile.gemm_max_call_s:g} s "
            f"(twice the budget; the slowest {max(slow[p] for p in mine):.2g} s): {_left_out(mine)}")


def _revisit_kept(rows: list[dict], pts: list[GemmPoint], profile: Profile, dev: DeviceIdentity,
                  log=None) -> None:
    """The kept-output and held-output timings of a faulting row on a second visit too, the
    quicker of each kept: the faults' cost is the held time less the kept one, and both should
    be the quiet machine's. With progress lines: on the Zen 3 EPYC (bf16 in software) this ran
    silent for over 12 minutes (2026-11-30)."""
    todo = [(r, p) for r, p in zip(rows, pts) if "kept_us" in r and r["kept_us"] == r["kept_us"]]
    prog = Progress("gemm_samples: faulting rows' kept and held outputs, visit 2", len(todo), log)
    for r, p in todo:
        r["kept_us"] = min(r["kept_us"], _kept_us(p, profile, dev))
        fn = gemm_callable(p.op, p.dtype, p.batch, p.m, p.n, p.k, dev.torch_device)
        us, faults = held_output_us(fn, profile.gemm_timing.min_reps)
        first = r.get("held_us", float("nan"))
        if not first == first or us < first:  # a missing or NaN first reading never sticks
            r["held_us"], r["held_faults"] = us, faults
        prog.step(f"{p.op} {p.dtype} b={p.batch} {p.m}x{p.n}x{p.k}")


def _kept_us(p: GemmPoint, profile: Profile, dev: DeviceIdentity) -> float:
    """Median µs of the point's GEMM writing into an output kept across calls (no page faults)."""
    kept = gemm_callable(p.op, p.dtype, p.batch, p.m, p.n, p.k, dev.torch_device, kept_output=True)
    return measure(kept, profile.gemm_timing, dev.torch_device).median_us
