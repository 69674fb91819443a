"""How the spell probe's scaling of training rows (pipeline/predict/probe_scaling.py) moves the
held-out error, beta by beta, beside the beta the fit's cross-validation chooses.

Each CPU row carries `probe_us` (harness/spells.py: a 128^3 mm timed just before and after it).
For every model fitted from a sample table (assets/models.py) this refits with every training
row's times scaled by (the training rows' median probe reading / the row's own) ** beta and
scores the held-out rows as measured (raw): nothing is measured, nothing is written.

    .venv/bin/python scripts/probe_normalize_ablation.py WAREHOUSE.duckdb|REFERENCE_DIR ...

A REFERENCE_DIR is a committed calibration (models_store/reference/<slug>/). Prints the mean
|error| per (op, dtype) for every beta in probe_scaling.BETAS, and the one cross-validation
picks (what `devchar run` fits with for the models declared probe_scaled: utility, attention).
"""
from __future__ import annotations

import os
import sys

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.predict.attention import AttentionModel, on_base_grid  # noqa: E402
from pipeline.predict import embedding, memory  # noqa: E402
from pipeline.predict.evaluate import (attention_predictions, embedding_predictions, error_table,  # noqa: E402
                                       gemm_predictions, memory_predictions, utility_predictions)
from pipeline.predict.gemm import GemmModel  # noqa: E402
from pipeline.predict.probe_scaling import BETAS, choose_beta, probed, scaled  # noqa: E402
from pipeline.predict.utility import UtilityModel  # noqa: E402

# sample table -> (fit, predict, the rows cross-validation scores), as assets/models.py declares them
MODELS = {"gemm_samples": (GemmModel.fit, gemm_predictions, None),
          "utility_samples": (UtilityModel.fit, utility_predictions, None),
          "attention_samples": (AttentionModel.fit, attention_predictions, on_base_grid),
          "embedding_samples": (embedding.EmbeddingModel.fit, embedding_predictions, None),
          "memory_samples": (memory.MemoryModel.fit, memory_predictions, None)}


def sample_rows(source: str, table: str) -> pd.DataFrame | None:
    """The table's rows from a warehouse file or a reference folder; None where it has none."""
    if source.endswith(".duckdb") and os.path.isfile(source):
        with duckdb.connect(source, read_only=True) as con:
            have = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
            return con.execute(f"SELECT * FROM {table}").df() if table in have else None
    parquet = os.path.join(source, f"{table}.parquet")
    return pd.read_parquet(parquet) if os.path.isfile(parquet) else None


def ablate(table: str, rows: pd.DataFrame) -> pd.DataFrame:
    fit, predict, scored = MODELS[table]
    rows = rows.assign(held_out=rows["held_out"].astype(bool))
    train, held = rows[~rows["held_out"]], rows[rows["held_out"]]
    choice = choose_beta(train, fit, predict, scored=scored)
    print(f"   {table}: cross-validation chose {choice.summary()}")
    cols = {}
    for beta in BETAS:
        err = error_table(predict(fit(scaled(train, beta, choice.reference_us)), held), ["op", "dtype"])
        cols[f"beta={beta:g}"] = err.set_index(["op", "dtype"])["mean_rel_err"]
    return pd.DataFrame(cols)


def main(sources: list[str]) -> int:
    if not sources:
        print(__doc__)
        return 2
    for source in sources:
        if not (source.endswith(".duckdb") and os.path.isfile(source) or os.path.isdir(source)):
            raise SystemExit(f"{source}: neither a warehouse file (.duckdb) nor a reference folder")
        found = {table: sample_rows(source, table) for table in MODELS}
        if all(rows is None for rows in found.values()):
            raise SystemExit(f"{source}: holds none of {', '.join(MODELS)}")
        print(f"== {source}: held-out mean |error|")
        for table, rows in found.items():
            if rows is None or not probed(rows).any():
                print(f"   {table}: {'no rows' if rows is None else 'no probe readings (taken before 2026-11-27 19:00)'}")
                continue
            print(ablate(table, rows).round(3).to_string())
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
