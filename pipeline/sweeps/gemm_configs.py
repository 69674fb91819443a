"""gemm_config_samples: PM2Lat III-C once per cuBLASLt kernel configuration (CUDA only).

For each (op, layout, dtype): the heuristic's first choice (cublasLtMatmulAlgoGetHeuristic) at
random shapes goes to gemm_config_choices, which the offline selector learns from; the
configurations it picks most often, then its runners-up at a few representative shapes (plus,
optionally, AlgoGetIds ones that pass AlgoCheck), are swept. Each configuration is run by itself (cuBLASLt, not torch) at a fixed tile and whole numbers of
waves -- its own tile, its own split-K, the SM count -- with K over powers of two, timed by the
harness. Held-out random shapes record the heuristic's first choice beside the kernel torch ran
(profiler names on both sides), so selection accuracy can be reported.

UNTESTED ON A GPU (written without one): tests/test_gpu.py runs it on the tiny profile.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np

from pipeline.device.discover import DeviceIdentity
from pipeline.core.errors import DevcharError
from pipeline.harness.progress import Progress
from pipeline.harness.timer import measure
from pipeline.predict.geometry import near_square
from pipeline.sweeps import cublaslt_tables as T
from pipeline.sweeps.gemm import kernel_name, kernel_namer, set_tf32
from pipeline.sweeps.gemm_points import heldout_points, random_shapes
from pipeline.sweeps.profiles import Profile

NOMINAL_TILE = (128, 128)  # for a tile id this cuBLASLt's table does not know (rows say tile_source)


def parse_op(key: str) -> tuple[str, str, bool]:
    """'linear:TN+bias' -> ('linear', 'TN', True)."""
    op, _, rest = key.partition(":")
    layout, bias = rest.removesuffix("+bias"), rest.endswith("+bias")
    if op not in ("mm", "linear", "bmm") or layout not in T.LAYOUTS or (bias and op != "linear"):
        raise DevcharError(f"unknown gemm_configs op {key!r}; expected e.g. 'mm:NN', 'linear:TN+bias', 'bmm:NN'")
    return op, layout, bias


def config_points(tile_m: int, tile_n: int, split_k: int, slots: int, waves: tuple[int, ...], k_values: tuple[int, ...],
                  max_outputs: int, max_point_flops: float, bmm: bool) -> list[tuple[int, int, int, int]]:
    """(batch, M, N, K) filling whole waves: w waves are w * slots CTAs, split-K puts split_k CTAs
    on each output tile, so w * slots // split_k tiles, laid out as squarely as possible (a bmm
    spreads them over up to 8 matrices). Larger wave counts stop at max_outputs elements."""
    pts: list[tuple[int, int, int, int]] = []
    for w in waves:
        tiles = w * slots // max(split_k, 1)
        if tiles < 1:
            continue
        b = math.gcd(tiles, 8) if bmm else 1
        tm, tn = near_square(tiles // b, tile_m, tile_n)
        m, n = tm * tile_m, tn * tile_n
        if b * m * n > max_outputs and pts:
            break
        pts += [(b, m, n, k) for k in k_values if 2 * b * m * n * k <= max_point_flops or k == k_values[0]]
    return pts


def discovery_shapes(op: str, profile: Profile) -> list[tuple[int, int, int, int]]:
    """(batch, M, N, K) at which the heuristic is asked; a bmm asks at batch 8, dims up to 1024."""
    if op != "bmm":
        return [(1, m, n, k) for m, n, k in profile.gemm_config_shapes]
    return list(dict.fromkeys((8, min(m, 1024), min(n, 1024), min(k, 1024)) for m, n, k in profile.gemm_config_shapes))


def torch_shapes(op: str, layout: str, b: int, m: int, n: int, k: int) -> tuple[tuple, tuple, tuple]:
    """(x, w, out) shapes; a bmm keeps its batch dimension even for one matrix (torch.bmm
    wants 3-D operands; the memory is the same as the 2-D problem cuBLASLt is given)."""
    xs, ws, outs = T.operand_shapes(layout, b if op == "bmm" else 1, m, n, k)
    if op == "bmm" and b == 1:
        xs, ws, outs = (1, *xs), (1, *ws), (1, *outs)
    return xs, ws, outs


def _tensors(op: str, layout: str, bias: bool, dtype: str, b: int, m: int, n: int, k: int, device: str = "cuda"):
    import torch

    from pipeline.harness.dtypes import torch_dtype

    torch.manual_seed(0)
    kw = dict(dtype=torch_dtype(dtype), device=device)
    xs, ws, outs = torch_shapes(op, layout, b, m, n, k)
    bvec = torch.randn(n, **kw) if bias else None
    return torch.randn(xs, **kw), torch.randn(ws, **kw), torch.empty(outs, **kw), bvec


def _torch_fn(op: str, layout: str, x, w, bias):
    """What torch itself runs for this problem (its kernel choice is the one to predict)."""
    import torch

    xe = x if layout[1] == "N" else x.transpose(-1, -2)
    if op == "linear" and layout == "TN":
        return lambda: torch.nn.functional.linear(x, w, bias)
    we = w if layout[0] == "N" else w.transpose(-1, -2)
    return (lambda: torch.bmm(xe, we)) if op == "bmm" else (lambda: torch.mm(xe, we))


def selection_shapes(op: str, profile: Profile, seed: int = 1) -> list[tuple[int, int, int, int]]:
    """(batch, M, N, K) at which the heuristic's choice is recorded (not timed): the discovery
    shapes plus random ones in the held-out ranges (another seed than held-out's)."""
    rng = np.random.default_rng(seed)
    return discovery_shapes(op, profile) + random_shapes(op, profile, profile.gemm_config_selection, rng)


def pick_configs(chosen: list[str], alternates: list[str], max_configs: int) -> list[str]:
    """The configurations to sweep: those the heuristic picks most often first (they cover
    the most shapes), then alternates (its runners-up, enumerated ones), max_configs in all."""
    ranked = [c for c, _ in Counter(chosen).most_common()]
    return list(dict.fromkeys(ranked + alternates))[:max_configs]


def _alternates(lt, op: str, layout: str, bias: bool, dtype: str, profile: Profile) -> list[dict]:
    found: dict[str, dict] = {}
    for b, m, n, k in discovery_shapes(op, profile):
        with lt.problem(dtype, layout, b, m, n, k, bias) as prob:
            cands = [dict(c, config_source="heuristic") for c in lt.heuristic(prob, profile.gemm_config_heuristic_top)]
            if profile.gemm_config_enumerate and not found:
                cands += [dict(c, config_source="enumerated")
                          for c in lt.enumerate(prob, profile.gemm_config_enumerate)]
        for c in cands:
            found.setdefault(c["config_id"], c)
    return list(found.values())


def _discover(lt, key: tuple, profile: Profile) -> tuple[list[dict], list[dict]]:
    """(configurations to sweep, gemm_config_choices rows): the heuristic's first choice at
    every selection shape, which the offline selector learns from."""
    op, layout, bias, dtype = key
    configs: dict[str, dict] = {}
    choices = []
    for b, m, n, k in selection_shapes(op, profile):
        with lt.problem(dtype, layout, b, m, n, k, bias) as prob:
            top = lt.heuristic(prob, 1)
        if not top:
            continue
        cfg = configs.setdefault(top[0]["config_id"], dict(top[0], config_source="heuristic"))
        tile_m, tile_n = T.torch_tile(cfg) if cfg["tile_rows"] else NOMINAL_TILE
        choices.append({"op": op, "layout": layout, "bias": bias, "dtype": dtype, "batch": b, "m": m, "n": n, "k": k,
                        "kernel": cfg["config_id"], "tile_m": tile_m, "tile_n": tile_n,
                        "split_k": max(cfg["split_k"], 1)})
    alternates = _alternates(lt, op, layout, bias, dtype, profile)
    for c in alternates:
        configs.setdefault(c["config_id"], c)
    picked = pick_configs([c["kernel"] for c in choices], [c["config_id"] for c in alternates],
                          profile.gemm_config_max_configs)
    for c in choices:
        c["swept"] = c["kernel"] in picked
    return [configs[c] for c in picked], choices


def _row(dev: DeviceIdentity, cfg: dict, key: tuple, point: tuple, res, meas, profile: Profile, **extra) -> dict:
    op, layout, bias, dtype = key
    b, m, n, k = point
    tile_m, tile_n = T.torch_tile(cfg) if cfg["tile_rows"] else NOMINAL_TILE
    blocks = math.ceil(m / tile_m) * math.ceil(n / tile_n) * b * max(cfg["split_k"], 1)
    return {
        "op": op, "dtype": dtype, "layout": layout, "bias": bias, "batch": b, "m": m, "n": n, "k": k,
        "kernel": cfg["config_id"], "tile_m": tile_m, "tile_n": tile_n, "split_k": max(cfg["split_k"], 1),
        "slots": dev.sm_count, "blocks": blocks, "waves": math.ceil(blocks / dev.sm_count),
        "flops": 2 * b * m * n * k, "held_out": False,
        "tile_source": "cublaslt" if cfg["tile_rows"] else "nominal", "config_source": cfg.get("config_source"),
        **{c: cfg[c] for c in ("algo_id", "tile_id", "tile_rows", "tile_cols", "stages_id", "stages", "reduction",
                               "swizzle", "custom", "inner_shape", "cluster_shape")},
        "lt_waves_count": float(res.wavesCount), "lt_workspace_bytes": int(res.workspaceSize),
        "lt_kernel": cfg.get("lt_kernel"), "torch_kernel": None, "selection_match": None,
        **extra, **meas.row(profile.gemm_timing.cv_threshold),
    }


def _measure_config(lt, dev, cfg, key, point, workspace, profile):
    """Time one configuration at one point; None when AlgoCheck rejects it there."""
    op, layout, bias, dtype = key
    b, m, n, k = point
    with lt.problem(dtype, layout, b, m, n, k, bias) as prob:
        res = lt.check(prob, lt.algo_from_config(cfg, dtype))
        if res is None:
            return None
        x, w, out, bvec = _tensors(op, layout, bias, dtype, b, m, n, k)
        fn = lt.runner(prob, cfg, x, w, out, workspace, bvec)
        if cfg.get("lt_kernel") is None:  # the kernel name behind this config, once: links it to torch's
            cfg["lt_kernel"] = kernel_name(fn, dev)
        meas = measure(fn, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0)
        return _row(dev, cfg, key, point, res, meas, profile)


def _heldout_row(lt, dev, key, point, workspace, profile, torch_kernel: str):
    """The heuristic's first choice on a random shape, timed, beside the kernel torch runs there."""
    op, layout, bias, dtype = key
    b, m, n, k = point
    with lt.problem(dtype, layout, b, m, n, k, bias) as prob:
        top = lt.heuristic(prob, 1)
    if not top:
        return None
    cfg = dict(top[0], config_source="heuristic", lt_kernel=None)
    row = _measure_config(lt, dev, cfg, key, point, workspace, profile)
    if row is not None:
        row.update(held_out=True, torch_kernel=torch_kernel, selection_match=torch_kernel == row["lt_kernel"])
    return row


def _torch_kernels(dev: DeviceIdentity, held: list[tuple]):
    """name((key, point), fn) -> the kernel torch itself runs there, every point named up front in
    one profiler session (a CUDA-only sweep, so fn is never needed)."""
    def make(item):
        (op, layout, bias, dtype), (b, m, n, k) = item
        set_tf32(dtype)
        x, w, _, bvec = _tensors(op, layout, bias, dtype, b, m, n, k)
        return _torch_fn(op, layout, x, w, bvec)

    return kernel_namer(dev, held, make)


def sweep_gemm_configs(dev: DeviceIdentity, profile: Profile, log=None) -> dict[str, list[dict]]:
    """{"gemm_config_samples": rows, "gemm_config_choices": rows}."""
    if dev.kind != "cuda":
        raise DevcharError(f"gemm_configs needs a CUDA device (cuBLASLt); {dev.slug!r} is {dev.kind}")
    import torch

    from pipeline.sweeps.cublaslt import Lt

    keys = [(*parse_op(o), dt) for o in profile.gemm_config_ops for dt in profile.gemm_config_dtypes]
    held = heldout_points(dev, replace(profile, heldout_per_op=profile.gemm_config_heldout))
    rows: list[dict] = []
    with Lt() as lt:
        workspace = torch.empty(lt.workspace_bytes, dtype=torch.uint8, device="cuda")
        plan, choices = [], []
        for key in keys:
            set_tf32(key[3])
            configs, picked = _discover(lt, key, profile)
            choices += picked
            for cfg in configs:
                tm, tn = T.torch_tile(cfg) if cfg["tile_rows"] else NOMINAL_TILE
                pts = config_points(tm, tn, max(cfg["split_k"], 1), dev.sm_count, profile.gemm_config_waves,
                                    profile.gemm_config_k, profile.max_gemm_outputs, profile.max_point_flops,
                                    key[0] == "bmm")
                plan += [(key, cfg, p) for p in pts]
            plan += [(key, None, (p.batch, p.m, p.n, p.k)) for p in held if p.op == key[0] and p.dtype == key[3]]
        torch_kernels = _torch_kernels(dev, [(key, point) for key, cfg, point in plan if cfg is None])
        prog, skipped = Progress("gemm_config_samples", len(plan), log), 0
        for key, cfg, point in plan:
            set_tf32(key[3])
            row = (_measure_config(lt, dev, cfg, key, point, workspace, profile) if cfg is not None
                   else _heldout_row(lt, dev, key, point, workspace, profile, torch_kernels((key, point), None)))
            if row is None:
                skipped += 1
            else:
                rows.append({**row, "cublaslt_version": lt.version()})
            prog.step(f"{key[0]}:{key[1]}{'+bias' if key[2] else ''} {key[3]} {point}")
    if skipped:
        (log or print)(f"gemm_config_samples: {skipped} points skipped (AlgoCheck rejected the config there, "
                       "or the heuristic had nothing)")
    if not rows:
        raise DevcharError("gemm_configs measured nothing: cuBLASLt returned no usable configuration")
    version = rows[0]["cublaslt_version"]
    timed = {(r["op"], r["layout"], r["bias"], r["dtype"], r["kernel"]) for r in rows if not r["held_out"]}
    for c in choices:  # swept = it has a table (AlgoCheck may have rejected every point of a picked one)
        c["swept"] = (c["op"], c["layout"], c["bias"], c["dtype"], c["kernel"]) in timed
    return {"gemm_config_samples": rows, "gemm_config_choices": [dict(c, cublaslt_version=version) for c in choices]}
