"""attention_samples: fused attention (torch SDPA), one row per (backend, dtype, shape).

PM2Lat IV-C applies the GEMM interpolation to Flash and Cutlass attention: per kernel
(here an SDPA backend) throughput is measured over a grid, seq (q = kv) in powers of two
by batch x heads ("bh", heads fixed at 8 and batch in powers of the profile's step), for
each head_dim and causal flag. Random held-out shapes (non-power-of-two seq, other head
counts and head dims) are measured beside them and never used for fitting.

CPU, profiles with `attention_seq_scan`: per (backend, dtype) every seq from SCAN_SEQS is timed
at one shape first (grid "seq_scan"); where it shows an alignment period of the kv length
(predict/attention_align.py), the grid is timed again at seq - 1 (grid "unaligned", the
period's worst tail), from which the model learns what a tail costs at each shape.

A backend that has no kernel for a dtype or shape ("no available kernel" / "no viable
backend") records nothing for it; nor does a point that runs out of device memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.dtypes import dtypes_for
from pipeline.harness.dtypes import torch_dtype
from pipeline.harness.order import interleaved
from pipeline.harness.progress import Progress
from pipeline.harness.revisit import revisit
from pipeline.harness.suspects import revisit_suspects
from pipeline.harness.stalls import remeasure_stalled
from pipeline.harness.timer import measure
from pipeline.predict.attention import BASE_GRID, HELDOUT_GRID, SCAN_GRID, TWIN_GRID, attention_flops
from pipeline.predict.attention_align import find_period
from pipeline.sweeps.profiles import Profile

# Table name (pipeline.predict.attention.ATTENTION_BACKENDS) -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
BACKENDS = {"cpu": ("flash", "math"), "cuda": ("flash", "efficient", "cudnn", "math")}  # flash and math exist on CPUs
HEADS = 8  # the grid varies batch only; bh = batch x HEADS
MIN_SEQ = 32
HEAD_DIMS = (32, 64, 128)
HELDOUT_HEADS = (4, 8, 12, 16)
HELDOUT_HEAD_DIMS = (32, 64, 80, 96, 128)  # 80 and 96 are interpolated between measured head dims
# The math backend materializes the bh x seq_q x seq_kv score matrix (and its softmax):
# larger points are skipped rather than risk an out-of-memory in the middle of a sweep.
MATH_MAX_SCORE_BYTES = 1 << 31
_NO_KERNEL = ("no available kernel", "no viable backend", "no execution plan")  # CUDA, CPU, cuDNN
# The seq scan: every seq in [2, 6] x MIN_SEQ (and one below) holds odd multiples of each
# candidate period up to 64, so a period of 16 is told from one of 8 or 32 (find_period).
SCAN_SEQS = range(2 * MIN_SEQ - 1, 6 * MIN_SEQ + 1)
SCAN_HEAD_DIM = 64


@dataclass(frozen=True)
class AttentionPoint:
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    held_out: bool
    grid: str = BASE_GRID


def seqs(profile: Profile) -> list[int]:
    out, s = [], MIN_SEQ
    while s <= max(profile.attention_max_seq, MIN_SEQ):
        out.append(s)
        s *= 2
    return out


def batches(profile: Profile) -> list[int]:
    out, b = [], 1
    while b <= profile.attention_max_batch:
        out.append(b)
        b *= profile.attention_batch_step
    return out


def _fits(p: AttentionPoint, profile: Profile) -> bool:
    return float(attention_flops(p.batch, p.heads, p.seq_q, p.seq_kv, p.head_dim, p.causal)) <= \
        profile.attention_max_point_flops


def training_points(profile: Profile) -> list[AttentionPoint]:
    pts = [AttentionPoint(b, HEADS, s, s, d, c, False) for d in HEAD_DIMS for c in (False, True)
           for b in batches(profile) for s in seqs(profile)]
    # The largest (bh, seq) corner over the FLOP cap is skipped and filled at fit time; the
    # smallest batch is always measured at every seq so each (head_dim, causal) row is whole.
    return [p for p in pts if p.batch == 1 or _fits(p, profile)]


def heldout_points(profile: Profile, seed: int = 2) -> list[AttentionPoint]:
    """Log-uniform bh and seq inside the grid's range (seq mostly not a power of two)."""
    rng = np.random.default_rng(seed)
    bh_max = HEADS * batches(profile)[-1]
    lo, hi = np.log(MIN_SEQ), np.log(seqs(profile)[-1])
    pts = []
    for _ in range(1000 * max(profile.attention_heldout, 1)):
        if len(pts) >= profile.attention_heldout:
            break
        heads = int(rng.choice(HELDOUT_HEADS))
        bh = float(np.exp(rng.uniform(np.log(HEADS), np.log(bh_max))))
        s = int(round(float(np.exp(rng.uniform(lo, hi)))))
        p = AttentionPoint(max(1, round(bh / heads)), heads, s, s, int(rng.choice(HELDOUT_HEAD_DIMS)),
                           bool(rng.integers(2)), True, HELDOUT_GRID)
        if _fits(p, profile):
            pts.append(p)
    return pts


def scan_points() -> list[AttentionPoint]:
    """One shape (batch 1, HEADS heads, head_dim 64, not causal) at every seq of SCAN_SEQS."""
    return [AttentionPoint(1, HEADS, s, s, SCAN_HEAD_DIM, False, False, SCAN_GRID) for s in SCAN_SEQS]


def twin_points(training: list[AttentionPoint]) -> list[AttentionPoint]:
    """The training grid at seq - 1: each period's worst tail, beside the aligned seq it interpolates."""
    return [AttentionPoint(p.batch, p.heads, p.seq_q - 1, p.seq_kv - 1, p.head_dim, p.causal, False, TWIN_GRID)
            for p in training]


def _sdpa_callable(backend: str, dtype: str, p: AttentionPoint, device: str):
    import torch
    import torch.nn.functional as F

    from pipeline.harness.random_pool import randn

    torch.manual_seed(0)
    kw = dict(dtype=torch_dtype(dtype), device=device)
    q = randn(p.batch, p.heads, p.seq_q, p.head_dim, **kw)
    k = randn(p.batch, p.heads, p.seq_kv, p.head_dim, **kw)
    v = randn(p.batch, p.heads, p.seq_kv, p.head_dim, **kw)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=p.causal)


def _only(backend: str):
    """A context in which SDPA may use this backend only (entered once per point, outside the timed calls)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend]))


def _measure(backend: str, fn, dev: DeviceIdentity, profile: Profile):
    """The harness's measurement with only this backend enabled; None when it has no kernel for this
    dtype/shape (the first warm-up call raises) or the point runs out of device memory."""
    import torch

    try:
        with _only(backend):
            return measure(fn, profile.attention_timing, dev.torch_device, dev.l2_bytes or 0)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None
    except RuntimeError as exc:
        if any(s in str(exc).lower() for s in _NO_KERNEL):
            return None
        raise


def _supported(backend: str, p: AttentionPoint) -> bool:
    if backend == "math":
        return 4 * p.batch * p.heads * p.seq_q * p.seq_kv <= MATH_MAX_SCORE_BYTES  # float32 scores, to be safe
    return True


def sweep_attention(dev: DeviceIdentity, profile: Profile, log=None) -> list[dict]:
    import warnings

    import torch

    if dev.kind == "cuda":  # float32 means float32 math here, whatever a GEMM sweep before left set
        torch.backends.cuda.matmul.allow_tf32 = False
    train = training_points(profile)
    pts = train + heldout_points(profile)
    scan = scan_points() if dev.kind == "cpu" and profile.attention_seq_scan else []
    combos = [(be, dt) for be in BACKENDS[dev.kind] for dt in dtypes_for(dev.kind) if dt != "tf32"]
    prog = Progress("attention_samples", (len(scan) + len(pts)) * len(combos), log)
    skipped = 0

    def run(todo: list[tuple[str, str, AttentionPoint]]) -> list[dict | None]:
        """Rows of `todo` in its order, timed interleaved: a slow spell of a shared machine lands
        on a few points of every (backend, dtype), not on one group's whole grid (a 4 s test
        run beside a sweep once put flash float32's seq grid at a median cv of 0.95)."""
        nonlocal skipped
        out: list[dict | None] = [None] * len(todo)
        for i in interleaved(len(todo)):
            backend, dtype, p = todo[i]
            meas = None
            if _supported(backend, p):
                meas = _measure(backend, _sdpa_callable(backend, dtype, p, dev.torch_device), dev, profile)
            if meas is None:
                skipped += 1
                prog.step(f"{backend} {dtype}: skipped")
                continue
            out[i] = _row(backend, dtype, p, meas, profile)
            prog.step(f"{backend} {dtype} b={p.batch} h={p.heads} s={p.seq_q} d={p.head_dim} causal={p.causal}")
        return out

    with warnings.catch_warnings():  # SDPA warns for every shape a backend rejects; the skip count says it once
        warnings.simplefilter("ignore", UserWarning)
        scan_todo = [(be, dt, p) for be, dt in combos for p in scan]
        scanned = run(scan_todo)
        todo = []
        for backend, dtype in combos:  # each (backend, dtype)'s period from its own scan, then its twins
            mine = [r for (be, dt, _), r in zip(scan_todo, scanned) if (be, dt) == (backend, dtype) and r]
            period = find_period([r["seq_kv"] for r in mine], [r["median_us"] for r in mine]) if mine else None
            twins = twin_points(train) if period else []
            if scan:
                prog.log(f"[attention_samples] {backend} {dtype}: kv alignment period "
                         f"{period or 'none found'}{f'; timing {len(twins)} twins at seq - 1' if twins else ''}")
            prog.total += len(twins)
            todo += [(backend, dtype, p) for p in pts + twins]
        timed = [(key, r) for key, r in zip(scan_todo + todo, scanned + run(todo)) if r is not None]
        if dev.kind == "cpu":  # a second visit, then disturbed rows again once the machine is quiet
            keys = [key for key, _ in timed]
            rows = [r for _, r in timed]
            makers = [lambda k=k: _sdpa_callable(k[0], k[1], k[2], dev.torch_device) for k in keys]
            revisit(rows, makers, profile.attention_timing, dev.torch_device, profile.visits, dev.l2_bytes or 0,
                    prog.log, within=lambda i: _only(keys[i][0]))
            if profile.visits > 1:  # rows whose probe read a slow spell (harness/spells.py)
                revisit_suspects(rows, makers, profile.attention_timing, dev.torch_device, [None] * len(rows), None,
                                 dev.l2_bytes or 0, prog.log, within=lambda i: _only(keys[i][0]),
                                 stall_wait_s=profile.stall_wait_s)
            remeasure_stalled(rows, makers, profile.attention_timing, dev.torch_device, dev.l2_bytes or 0, prog.log,
                              profile.stall_wait_s, within=lambda i: _only(keys[i][0]))
    if skipped:
        prog.log(f"[attention_samples] {skipped} (backend, dtype, shape) points have no kernel here: not recorded")
    return [r for _, r in timed]


def _row(backend: str, dtype: str, p: AttentionPoint, meas, profile: Profile) -> dict:
    return {"backend": backend, "dtype": dtype, "batch": p.batch, "heads": p.heads, "seq_q": p.seq_q,
            "seq_kv": p.seq_kv, "head_dim": p.head_dim, "causal": p.causal,
            "flops": float(attention_flops(p.batch, p.heads, p.seq_q, p.seq_kv, p.head_dim, p.causal)),
            "held_out": p.held_out, "grid": p.grid, **meas.row(profile.attention_timing.cv_threshold)}
