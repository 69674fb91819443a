"""Held-out GEMM bias by dimension band over several calibrations: each device's GEMM model in
each warehouse refitted on its training rows, its held-out rows priced, and per (layer type, dim,
band) the rows and the geometric mean of predicted / measured, pooled over the calibrations, and
the spread of the per-calibration values. Nothing is measured and nothing is written.

    .venv/bin/python scripts/heldout_bias.py HOME [HOME ...] [--dtype float32]

HOME: a DEVCHAR_HOME (its devchar.duckdb) or a directory holding one. A band whose pooled ratio
sits off 1 in most warehouses is a bias of the tables there, not noise (model_evaluation shows
one device's table as `heldout_bias_by_dim`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.predict.compare import bias_by_dim  # noqa: E402
from pipeline.predict.evaluate import gemm_predictions  # noqa: E402
from pipeline.predict.gemm import GemmModel  # noqa: E402


def one(home: Path) -> list[pd.DataFrame]:
    """Each device of the warehouse at `home`: its own model, its own held-out rows."""
    db = home / "devchar.duckdb" if home.is_dir() else home
    if not db.is_file():
        raise SystemExit(f"heldout_bias: no devchar.duckdb at {home}")
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT * FROM gemm_samples").df()
    out = []
    for device, mine in rows.groupby("device"):
        if not mine["held_out"].any():
            print(f"heldout_bias: {db} has no held-out GEMM rows for {device}; left out", file=sys.stderr)
            continue
        model = GemmModel.fit(mine[~mine["held_out"]])
        out.append(bias_by_dim(gemm_predictions(model, mine[mine["held_out"]])).assign(home=f"{home}:{device}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("homes", nargs="+", type=Path)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    np.seterr(all="ignore")
    parts = [t for h in args.homes for t in one(h)]
    if not parts:
        raise SystemExit("heldout_bias: no warehouse had held-out GEMM rows")
    t = pd.concat(parts)
    t = t[t["dtype"] == args.dtype]
    if t.empty:
        raise SystemExit(f"heldout_bias: no held-out rows of dtype {args.dtype!r}")
    t["log_sum"] = np.log(t["ratio_geomean"]) * t["n"]
    keys = ["layer_type", "dim", "band"]
    pooled = t.groupby(keys, observed=True).agg(n=("n", "sum"), log_sum=("log_sum", "sum"),
                                                 lo=("ratio_geomean", "min"), hi=("ratio_geomean", "max"),
                                                 calibrations=("home", "nunique"))
    pooled["ratio_geomean"] = np.exp(pooled.pop("log_sum") / pooled["n"])
    pd.set_option("display.width", 200)
    print(f"{args.dtype}, {t['home'].nunique()} calibrations: predicted / measured by band "
          "(geometric mean pooled over rows; lo-hi over calibrations)")
    print(pooled[["n", "calibrations", "ratio_geomean", "lo", "hi"]].round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
