"""Peer GEMM measurements on H100 (NeuSight fp32, Vidur fp16) as devchar's external yardstick.

Three numbers per (source, op, dtype), all mean relative errors:
  devchar vs peer   devchar's prediction (from a calibration of our H100) against their lab;
  ours vs peer      the same shapes timed on our H100 against their lab: lab-to-lab spread;
  devchar vs ours   the prediction against our own timing: devchar's own error.
The peer data stay in ../shared/reference (PEER_DIR; `devchar reference` takes
$DEVCHAR_REFERENCE_DIR instead where set); only their shapes are
committed (REFERENCE_SHAPES), so a GPU node can time them with the runner's `reference`
sweep without the peer files. No torch here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.config import REPO_ROOT
from pipeline.core.errors import DevcharError

REFERENCE_SHAPES = REPO_ROOT / "pipeline" / "sweeps" / "reference_shapes.csv"
SHAPE_COLS = ["source", "op", "dtype", "batch", "m", "n", "k"]
# Vidur's GEMMs per layer (README there): input width, output width, both before the TP split.
_VIDUR_GEMMS = {
    "attn_pre_proj": lambda r: (r["n_embd"], (r["n_head"] + 2 * r["n_kv_head"]) * (r["n_embd"] // r["n_head"])),
    "attn_post_proj": lambda r: (r["n_embd"], r["n_embd"]),
    "mlp_up_proj": lambda r: (r["n_embd"], r["n_expanded_embd"] * (2 if r["use_gated_mlp"] else 1)),
    "mlp_down_proj": lambda r: (r["n_expanded_embd"], r["n_embd"]),
}


PEER_DIR = REPO_ROOT.parent / "shared" / "reference"  # holds neusight-h100/ and vidur-h100/


def _need(path: Path) -> Path:
    if not path.is_file():
        raise DevcharError(f"peer reference file {path} is missing; set DEVCHAR_REFERENCE_DIR to the "
                           "folder holding neusight-h100/ and vidur-h100/")
    return path


def neusight_kernels(root: Path = PEER_DIR) -> pd.DataFrame:
    """NeuSight's linear and bmm kernels (fp32, TF32 off): shape columns and peer_us."""
    frames = []
    for op in ("linear", "bmm"):
        df = pd.read_csv(_need(root / "neusight-h100" / "kernels" / f"{op}.csv"))
        frames.append(pd.DataFrame({"source": "neusight", "op": op, "dtype": "float32", "batch": df["B"],
                                    "m": df["M"], "n": df["N"], "k": df["K"], "peer_us": df["Latency"] * 1e3,
                                    "peer_kernel": df["Kernel Name"]}))
    return pd.concat(frames, ignore_index=True)


def vidur_gemms(root: Path = PEER_DIR) -> pd.DataFrame:
    """Vidur's fp16 GEMMs (linear without bias is close enough: the epilogue adds ~nothing)."""
    rows = []
    for name in ("llama-2-7b-mlp", "phi-2-mlp"):
        df = pd.read_csv(_need(root / "vidur-h100" / f"{name}.csv"))
        for r in df.to_dict("records"):
            tp = int(r["num_tensor_parallel_workers"])
            for op, widths in _VIDUR_GEMMS.items():
                k_in, n_out = widths(r)
                # column-parallel layers split the output, row-parallel ones the input
                k, n = (k_in // tp, n_out) if op in ("attn_post_proj", "mlp_down_proj") else (k_in, n_out // tp)
                rows.append({"source": f"vidur-{name}", "op": "linear", "dtype": "float16", "batch": 1,
                             "m": int(r["num_tokens"]), "n": int(n), "k": int(k), "layer": op,
                             "peer_us": r[f"time_stats.{op}.median"] * 1e3})
    return pd.DataFrame(rows)


def peers(root: Path = PEER_DIR) -> pd.DataFrame:
    return pd.concat([neusight_kernels(root), vidur_gemms(root)], ignore_index=True)


def write_shapes(path: Path = REFERENCE_SHAPES, root: Path = PEER_DIR) -> int:
    shapes = peers(root)[SHAPE_COLS].drop_duplicates().sort_values(SHAPE_COLS)
    shapes.to_csv(path, index=False)
    return len(shapes)


def compare(gemm_model, peer: pd.DataFrame, ours: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean (and median) relative errors per (source, op, dtype); see the module doc."""
    df = peer.copy()
    df["devchar_us"] = np.nan
    for (op, dtype), idx in df.groupby(["op", "dtype"]).groups.items():
        g = df.loc[idx]
        try:
            df.loc[idx, "devchar_us"] = gemm_model.predict(op, dtype, g["m"], g["n"], g["k"], g["batch"])
        except DevcharError:
            pass  # no calibration for this (op, dtype): its columns stay empty
    if ours is not None and len(ours):
        df = df.merge(ours[SHAPE_COLS + ["median_us"]].rename(columns={"median_us": "ours_us"}),
                      on=SHAPE_COLS, how="left")
    else:
        df["ours_us"] = np.nan
    rel = lambda a, b: (df[a] - df[b]).abs() / df[b]  # noqa: E731
    df = df.assign(devchar_vs_peer=rel("devchar_us", "peer_us"), ours_vs_peer=rel("ours_us", "peer_us"),
                   devchar_vs_ours=rel("devchar_us", "ours_us"))
    return df.groupby(["source", "op", "dtype"]).agg(
        n=("peer_us", "size"), devchar_vs_peer=("devchar_vs_peer", "mean"),
        devchar_vs_peer_median=("devchar_vs_peer", "median"), ours_vs_peer=("ours_vs_peer", "mean"),
        devchar_vs_ours=("devchar_vs_ours", "mean")).reset_index()


if __name__ == "__main__":  # an entry point: where the peer files are is the caller's setting
    import os

    print(f"{write_shapes(root=Path(os.environ.get('DEVCHAR_REFERENCE_DIR', PEER_DIR)))} shapes -> "
          f"{REFERENCE_SHAPES}")
