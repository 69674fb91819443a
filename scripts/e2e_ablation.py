"""Before/after on the same captures: GPT-2 and DLRM predictions from one device's warehouse
with the GEMM model refitted under each variant (the other kernel models as saved).

    .venv/bin/python scripts/e2e_ablation.py [--device SLUG]

Variants: `table+aspect` (the whole-wave table and its aspect grid, no unaligned twins) and
`+unaligned` (the twins' correction too). Prints each run's e2e_shared error and Table V, and
the GEMM held-out mean error per (op, dtype) of each variant. Nothing is written.
"""
from __future__ import annotations

import argparse
import os
import sys

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.core.config import model_store_root  # noqa: E402
from pipeline.predict import store  # noqa: E402
from pipeline.predict.evaluate import error_table, gemm_predictions  # noqa: E402
from pipeline.predict.gemm import GemmModel  # noqa: E402
from pipeline.predict.graph_predict import predict_runs, table_v  # noqa: E402

VARIANTS = {"table+aspect": lambda g: g[~g["grid"].astype(str).str.startswith("unaligned")], "+unaligned": lambda g: g}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    home = os.environ.get("DEVCHAR_HOME", ".devchar")
    con = duckdb.connect(os.path.join(home, "devchar.duckdb"), read_only=True)
    device = args.device or con.execute("SELECT device FROM devices LIMIT 1").fetchone()[0]
    rows = lambda t: con.execute(f"SELECT * FROM {t} WHERE device = ?", [device]).df()  # noqa: E731
    gemm, runs, graphs, samples = rows("gemm_samples"), rows("workload_runs"), rows("workload_graphs"), \
        rows("overhead_samples")
    others = {m: store.load(model_store_root(), device, m) for m in ("utility_model", "embedding_model",
                                                                      "memory_model")}
    pd.set_option("display.width", 200)
    for name, pick in VARIANTS.items():
        model = GemmModel.fit(pick(gemm[~gemm["held_out"]]))
        err = error_table(gemm_predictions(model, gemm[gemm["held_out"]]), ["op", "dtype"])
        print(f"\n== {name}: GEMM held-out mean |error| per (op, dtype)")
        print(err.to_string(index=False))
        pred = predict_runs(runs, graphs, samples, {"gemm_model": model, **others}, synchronous=True)
        shared = pred[pred["predictor"] == "e2e_shared"]
        print(shared[["workload", "config", "batch", "predicted_ms", "measured_ms", "rel_err"]]
              .round(3).to_string(index=False))
        for workload, g in pred.groupby("workload"):
            tv = table_v(g)
            print(workload, "; ".join(f"{r.predictor} geomean {r.geomean_abs_err:.1%} max {r.max_abs_err:.1%}"
                                      for r in tv.itertuples()))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
