"""A warehouse's captured graphs of one workload, each priced op by op with its device's fitted
models: what the probe scripts under scripts/ compare their own timings with."""
from __future__ import annotations

import os

import pandas as pd

KERNEL_MODELS = ("gemm_model", "utility_model", "embedding_model", "memory_model")


def priced_captures(db: str, workload: str, device: str | None = None) -> tuple[str, list[tuple[dict, pd.DataFrame]]] | None:
    """(device, [(capture row, its ops as priced)]) from the warehouse file `db`, the device's
    models loaded from the model store; None where `db` is not a file. `device` defaults to the
    warehouse's first. The ops are predict_graph's coverage rows (no host overheads: the kernels
    alone, synchronous), so `measured_us` is the traced time and `predicted_us` the price."""
    if not os.path.isfile(db):
        return None
    import duckdb

    from pipeline.core.config import model_store_root
    from pipeline.predict import store
    from pipeline.predict.graph_predict import load_graph, predict_graph

    with duckdb.connect(db, read_only=True) as con:
        device = device or con.execute("SELECT device FROM devices LIMIT 1").fetchone()[0]
        graphs = con.execute("SELECT * FROM workload_graphs WHERE device = ? AND workload = ?",
                             [device, workload]).df()
    if graphs.empty:
        return device, []
    models = {m: store.load(model_store_root(), device, m) for m in KERNEL_MODELS}
    priced = []
    for g in graphs.to_dict("records"):
        graph, shapes, scalars, strides = load_graph(g["graph_json"])
        got = predict_graph(graph, shapes, scalars, models, g["dtype"], {}, True, strides)
        priced.append((g, pd.DataFrame(got["coverage"]["ops"])))
    return device, priced
