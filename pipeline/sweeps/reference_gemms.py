"""reference_timings: the peer GEMM shapes (NeuSight fp32, Vidur fp16; pipeline/analysis/reference.py)
timed here, so devchar's error on them can be told apart from lab-to-lab difference.

NeuSight measured with TF32 off: float32 rows run with TF32 off. The profile caps the number
of shapes per (source, op) with a fixed-seed sample; `full` times every shape.
"""
from __future__ import annotations

import pandas as pd

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.harness.timer import measure
from pipeline.analysis.reference import REFERENCE_SHAPES, SHAPE_COLS
from pipeline.sweeps.gemm import gemm_callable, kernel_namer, set_tf32
from pipeline.sweeps.profiles import Profile


def reference_points(profile: Profile) -> pd.DataFrame:
    shapes = pd.read_csv(REFERENCE_SHAPES)
    cap = profile.reference_shapes_per_source
    if cap:
        keep = [i for _, g in shapes.groupby(["source", "op"]) for i in g.sample(min(cap, len(g)), random_state=0).index]
        shapes = shapes.loc[sorted(keep)]
    return shapes.reset_index(drop=True)


def sweep_reference(dev: DeviceIdentity, profile: Profile, log=None) -> list[dict]:
    pts = reference_points(profile)

    def make(i: int):
        p = pts.iloc[i]  # a Series: p.dtype would be the Series' own dtype, so columns by name
        set_tf32(p["dtype"])  # float32 -> TF32 off, as NeuSight measured
        return gemm_callable(p["op"], p["dtype"], int(p["batch"]), int(p["m"]), int(p["n"]), int(p["k"]),
                             dev.torch_device)

    name = kernel_namer(dev, list(range(len(pts))), make)
    prog = Progress("reference_timings", len(pts), log)
    rows = []
    for i, p in enumerate(pts.itertuples()):
        fn = make(i)
        meas = measure(fn, profile.gemm_timing, dev.torch_device, dev.l2_bytes or 0)
        rows.append({**{c: getattr(p, c) for c in SHAPE_COLS}, "kernel": name(i, fn),
                     **meas.row(profile.gemm_timing.cv_threshold)})
        prog.step(f"{p.source} {p.op} {p.dtype} b={p.batch} {p.m}x{p.n}x{p.k}")
    return rows
