"""Before/after on the same captures: GPT-2 and DLRM predictions from one device's warehouse,
with the GEMM and embedding models refitted under each variant (utility and memory models as
saved). Nothing is measured and nothing is written.

    .venv/bin/python scripts/e2e_ablation.py [--device SLUG] [--only VARIANT ...]

Variants, each adding one fix of issue 14 to the one before:
  before           the whole-wave GEMM table with its aspect grid; embeddings as timed hot
  +unaligned       the GEMM twins' correction for rows that end mid cache line
  +cold            embedding lookups blended hot/cold by the share of the graph's tables cached
  +faults          GEMM tables fitted without their rows' page faults, charged back by output size
  +cold_weights    mm / linear priced with their weights read from memory for the share of a
                   graph's GEMM weights the measured weight cache cannot hold
  +batch           bmm charged the batch grid's per-kernel correction by batch, side and K
  +copy_layout     copies priced by their captured strides (transposing, row gather, broadcast)
                   rather than all as transposing copies
  +bmm_aspect      bmm's own aspect grid at its batch (sweeps/gemm_points.py BMM_ASPECT_BATCH):
                   skinny and unaligned batched matrices priced from it, not from bmm's table
  +backward_call   the embedding backward rows' null backward() call taken off before the fit: a
                   step's one backward() serves every table (predict/embedding.py)
  +narrow          every whole N under a cache line off the aspect lattice priced by the narrow
                   grid's correction (predict/gemm_narrow.py)
Prints the GEMM held-out error per (op, dtype), each run's e2e_shared error and Table V.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.core.config import duckdb_path, model_store_root  # noqa: E402
from pipeline.predict import store  # noqa: E402
from pipeline.predict.embedding import EmbeddingModel  # noqa: E402
from pipeline.predict.evaluate import error_table, gemm_predictions  # noqa: E402
from pipeline.predict.gemm import GemmModel  # noqa: E402
from pipeline.predict.gemm_alias import ALIAS_GRID  # noqa: E402
from pipeline.predict.gemm_grids import TWIN_GRIDS, hot_rows  # noqa: E402
from pipeline.predict.gemm_narrow import NARROW_GRID  # noqa: E402
from pipeline.predict.graph_predict import free_probe, predict_runs, table_v  # noqa: E402


def _is_twin(grid: pd.Series) -> pd.Series:
    """The unaligned twins' rows and their bases a line wider (the selector reads them too)."""
    return grid.isin(TWIN_GRIDS)


def _no_twins(g: pd.DataFrame) -> pd.DataFrame:
    return g[~_is_twin(g["grid"].astype(str))]


def _hot(e: pd.DataFrame) -> pd.DataFrame:
    return e[~e["cold"].fillna(False).astype(bool)] if "cold" in e else e


def _no_batch(g: pd.DataFrame) -> pd.DataFrame:
    return g[g["grid"].astype(str) != "batch"]


def _no_strides(graphs: pd.DataFrame) -> pd.DataFrame:
    """The captures as if taken before strides were recorded: every copy a transposing one."""
    def strip(text: str) -> str:
        d = json.loads(text)
        d.pop("strides", None)
        return json.dumps(d)

    return graphs.assign(graph_json=graphs["graph_json"].map(strip))


def _no_faults(g: pd.DataFrame) -> pd.DataFrame:
    return g.drop(columns=[c for c in ("faults_per_call", "fault_us_per_page") if c in g])


def _no_bmm_aspect(g: pd.DataFrame) -> pd.DataFrame:
    """Without bmm's aspect lattice and its twins (every other grid of bmm stays)."""
    grid = g["grid"].astype(str)
    return g[~((g["op"] == "bmm") & ((grid == "aspect") | _is_twin(grid)))]


def _no_narrow(g: pd.DataFrame) -> pd.DataFrame:
    """Without the narrow grid (the twins it reads as narrow rows stay: without it they are only twins)."""
    return g[g["grid"].astype(str) != NARROW_GRID]


def _no_call(e: pd.DataFrame) -> pd.DataFrame:
    return e.drop(columns="backward_call_us", errors="ignore")


def _no_alias(g: pd.DataFrame) -> pd.DataFrame:
    """Without the short-K twins off 4 KiB (predict/gemm_alias.py)."""
    return g[g["grid"].astype(str) != ALIAS_GRID]


def _old(gemm, emb):
    """A variant before the last four: bmm without its aspect grid, embeddings without the call,
    no narrow grid, no alias twins."""
    return (lambda g: gemm(_no_alias(_no_narrow(_no_bmm_aspect(g))))), (lambda e: emb(_no_call(e)))


def _all(x):
    return x


VARIANTS = {"before": _old(lambda g: _no_faults(_no_twins(hot_rows(_no_batch(g)))), _hot),
            "+unaligned": _old(lambda g: _no_faults(hot_rows(_no_batch(g))), _hot),
            "+cold": _old(lambda g: _no_faults(hot_rows(_no_batch(g))), _all),
            "+faults": _old(lambda g: hot_rows(_no_batch(g)), _all),
            "+cold_weights": _old(_no_batch, _all), "+batch": _old(_all, _all), "+copy_layout": _old(_all, _all),
            "+bmm_aspect": (lambda g: _no_alias(_no_narrow(g)), _no_call),
            "+backward_call": (lambda g: _no_alias(_no_narrow(g)), _all), "+narrow": (_no_alias, _all),
            "+alias": (_all, _all)}


STRIDED = ("+copy_layout", "+bmm_aspect", "+backward_call", "+narrow")  # the variants that price copies by their strides


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="these variants alone (default: every one)")
    args = ap.parse_args()
    con = duckdb.connect(str(duckdb_path()), read_only=True)
    device = args.device or con.execute("SELECT device FROM devices LIMIT 1").fetchone()[0]
    rows = lambda t: con.execute(f"SELECT * FROM {t} WHERE device = ?", [device]).df()  # noqa: E731
    gemm, emb = rows("gemm_samples"), rows("embedding_samples")
    runs, graphs, samples = rows("workload_runs"), rows("workload_graphs"), rows("overhead_samples")
    others = {m: store.load(model_store_root(), device, m) for m in ("utility_model", "memory_model")}
    free = free_probe(rows("devices").iloc[0])  # as the pipeline's graph_predictions asset charges it
    pd.set_option("display.width", 200)
    summary = []
    for name, (pick_gemm, pick_emb) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        gemm_model = GemmModel.fit(pick_gemm(gemm[~gemm["held_out"]]))
        emb_model = EmbeddingModel.fit(pick_emb(emb[~emb["held_out"]]))
        err = error_table(gemm_predictions(gemm_model, gemm[gemm["held_out"]]), ["op", "dtype"])
        print(f"\n== {name}: GEMM held-out |error| per (op, dtype)")
        print(err.round(3).to_string(index=False))
        models = {"gemm_model": gemm_model, "embedding_model": emb_model, **others}
        pred = predict_runs(runs, graphs if name in STRIDED else _no_strides(graphs), samples, models,
                            synchronous=True, free=free)
        shared = pred[pred["predictor"] == "e2e_shared"]
        print(shared[["workload", "config", "batch", "predicted_ms", "measured_ms", "rel_err"]]
              .round(3).to_string(index=False))
        for workload, g in pred.groupby("workload"):
            for r in table_v(g).itertuples():
                summary.append({"variant": name, "workload": workload, "predictor": r.predictor,
                                "geomean": f"{r.geomean_abs_err:.1%}", "mean": f"{r.mean_abs_err:.1%}",
                                "max": f"{r.max_abs_err:.1%}"})
    print("\n== Table V per variant")
    print(pd.DataFrame(summary).to_string(index=False))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
