"""End-to-end prediction of a captured workload: re-price its graph, then Algorithm 1 with
host overheads that never come from the workload's own trace (no torch, no dagster).

Three predictors per (workload, config, batch, seq), as the DLRM paper's Table V:
  kernel_only     the sum of predicted kernel times (GPU active time; PM2Lat's method);
  e2e_individual  Algorithm 1 with the overheads of the same model (config) traced at its
                  *other* batch sizes / sequence lengths — never this run's own trace;
  e2e_shared      Algorithm 1 with overheads pooled over every *other* workload config
                  (leave-one-workload-out), what a never-seen model gets.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from pipeline.core.errors import DevcharError
from pipeline.predict.critical_path import critical_path
from pipeline.core.graph import ExecutionGraph
from pipeline.predict.overheads import OverheadModel
from pipeline.predict.page_faults import PAGE_BYTES
from pipeline.predict.price import price_graph
from pipeline.predict.price_recsys import RecsysOps

KEY = ["workload", "config", "batch", "seq", "mode"]
PREDICTORS = ("kernel_only", "e2e_individual", "e2e_shared")


def load_graph(graph_json: str) -> tuple[ExecutionGraph, dict, dict, dict]:
    """(graph, shapes, scalars, strides) from a workload_graphs row; JSON turned op-id keys into
    strings. Graphs captured before 2026-11-25 20:00 carry no strides ({})."""
    try:
        d = json.loads(graph_json)
        graph = ExecutionGraph.from_dict(d["graph"])
        shapes, scalars, strides = ({int(k): v for k, v in d.get(part, {}).items()}
                                    for part in ("shapes", "scalars", "strides"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DevcharError(f"workload graph JSON is unreadable: {e}") from None
    return graph, shapes, scalars, strides


def returned_of(graph_json: str) -> list[int]:
    """Bytes of each tensor the captured step returned (captures before 2026-11-26: none known)."""
    try:
        return [int(b) for b in json.loads(graph_json).get("returned_bytes", [])]
    except (ValueError, TypeError, AttributeError) as e:
        raise DevcharError(f"workload graph JSON is unreadable: {e}") from None


def free_probe(device_row: pd.Series) -> dict:
    """A devices row's free probe (free_us_per_page, free_from_bytes); empty for a row measured
    before the probe (2026-11-26)."""
    return {k: device_row[k] for k in ("free_us_per_page", "free_from_bytes")
            if k in device_row.index and pd.notna(device_row[k])}


def output_free_us(returned: list[int], free: dict | None) -> float:
    """Host µs a loop of steps spends freeing what each returns, after its last op, where no op
    or gap between ops holds it: each block of at least `free_from_bytes` pays `free_us_per_page`
    a page, as the device row's probe measured (harness/free_cost.py). 0 without a probe."""
    per_page, from_bytes = (free or {}).get("free_us_per_page"), (free or {}).get("free_from_bytes")
    if per_page is None or from_bytes is None or per_page != per_page or from_bytes != from_bytes:
        return 0.0
    return float(sum(b / PAGE_BYTES * per_page for b in returned if b >= from_bytes))


def overheads_for(samples: pd.DataFrame, key: dict) -> dict[str, OverheadModel | None]:
    """The two overhead models for one run (None where no trace qualifies)."""
    same_cfg = (samples["workload"] == key["workload"]) & (samples["config"] == key["config"])
    this_run = same_cfg & (samples["batch"] == key["batch"]) & (samples["seq"] == key["seq"])
    individual = samples[same_cfg & ~this_run]
    shared = samples[~same_cfg]
    return {"e2e_individual": OverheadModel.fit(individual) if len(individual) else None,
            "e2e_shared": OverheadModel.fit(shared) if len(shared) else None}


def predict_graph(graph: ExecutionGraph, shapes: dict, scalars: dict, models: dict, dtype: str,
                  overheads: dict[str, OverheadModel | None], synchronous: bool, strides: dict | None = None,
                  free_us: float = 0.0) -> dict:
    """Predicted µs per predictor, plus the priced graph's coverage (price.py). `free_us`: the
    host time a step spends freeing its outputs (output_free_us), added to the end-to-end
    predictors; kernel_only sums the ops alone."""
    extra = RecsysOps(models.get("embedding_model"), models.get("memory_model"))
    priced, cov = price_graph(graph, shapes, models["gemm_model"], models["utility_model"], dtype,
                              scalars=scalars, extra=extra, synchronous=synchronous, strides=strides)
    out = {"kernel_only": critical_path(priced, OverheadModel({}, {}), synchronous=synchronous).active_us}
    for name, model in overheads.items():
        if model is not None:
            e2e = critical_path(priced, model, synchronous=synchronous)
            out[name] = e2e.e2e_us + free_us
            out[f"{name}_bound"] = e2e.bound
    out["coverage"] = cov
    return out


def predict_runs(runs: pd.DataFrame, graphs: pd.DataFrame, samples: pd.DataFrame, models: dict,
                 synchronous: bool, free: dict | None = None) -> pd.DataFrame:
    """One row per (measured run with a captured graph) x predictor: the `predictions` rows.
    `free`: the device row's free probe (free_us_per_page, free_from_bytes), if it has one."""
    g_by_key = {tuple(r[k] for k in KEY): r for r in graphs.to_dict("records")}
    rows = []
    for run in runs.to_dict("records"):
        g = g_by_key.get(tuple(run[k] for k in KEY))
        if g is None:
            continue
        graph, shapes, scalars, strides = load_graph(g["graph_json"])
        key = {k: run[k] for k in KEY}
        got = predict_graph(graph, shapes, scalars, models, run["dtype"], overheads_for(samples, key), synchronous,
                            strides, output_free_us(returned_of(g["graph_json"]), free))
        cov = got["coverage"]
        # the profiler's host cost lengthens a CPU op's inline work, never a GPU kernel
        per_event = per_event_us(samples, key) if synchronous else 0.0
        active_measured = traced_active_us(graph, cov["ops"], per_event) / 1e3
        for p in PREDICTORS:
            if p not in got:
                continue
            rows.append({**key, "dtype": run["dtype"], "predictor": p, "predicted_ms": got[p] / 1e3,
                         "measured_ms": float(run["measured_ms"]), "kernel_only_ms": got["kernel_only"] / 1e3,
                         "active_measured_ms": active_measured, "bound": got.get(f"{p}_bound", ""),
                         "priced_share": cov["priced_share"] + cov["covered_share"],
                         "dropped_share": cov["dropped_share"]})
    out = pd.DataFrame(rows)
    if out.empty:
        raise DevcharError("no measured run has a captured graph: materialize workload_runs and overhead_samples "
                           "with the same profile")
    return out.assign(rel_err=(out["predicted_ms"] - out["measured_ms"]) / out["measured_ms"])


def per_event_us(samples: pd.DataFrame, key: dict) -> float:
    """The profiler's cost per recorded event that the traces sweep measured with this run's
    trace (overhead_samples.profiler_overhead_us); 0 where it was not recorded."""
    if "profiler_overhead_us" not in samples or samples.empty:
        return 0.0
    mine = samples
    for k, v in key.items():
        if k in samples:
            mine = mine[mine[k] == v]
    values = pd.to_numeric((mine if len(mine) else samples)["profiler_overhead_us"], errors="coerce").dropna()
    return float(values.median()) if len(values) else 0.0


def traced_active_us(graph: ExecutionGraph, ops: list[dict], per_event: float = 0.0) -> float:
    """The traced self time of the ops the models price or cover (coverage records), less the
    profiler's cost of each event nested directly in them: an event's cost falls in the interval
    it starts in (DLRM paper §III-C, as the T1 gaps are corrected), so an op's self time carries
    one per child. Small where events are cheap (Xeon VM, 0.88 us an event: DLRM's geomean
    active-time error 50.6 -> 45.4 %); what remains there is the traced run itself running slower
    than the untraced step (mlperf batch 512: 58 ms of priced self time in a 21 ms step)."""
    total = 0.0
    for r in ops:
        if r["status"] in ("priced", "covered"):
            total += max(float(r["measured_us"]) - per_event * len(graph.op(r["id"]).children), 0.0)
    return total


def op_breakdown(coverage: dict) -> pd.DataFrame:
    """Per (op, model op, fate): count, traced self time, predicted time and their ratio, largest
    traced first: where a kernel sum parts from the run its graph was captured from."""
    ops = pd.DataFrame(coverage["ops"])
    if ops.empty:
        return ops
    ops["model_op"] = ops["model_op"].fillna("-")
    out = (ops.groupby(["name", "model_op", "status"], as_index=False)
           .agg(count=("id", "size"), traced_us=("measured_us", "sum"), predicted_us=("predicted_us", "sum")))
    out["predicted_over_traced"] = out["predicted_us"] / out["traced_us"].where(out["traced_us"] > 0)
    out["share_of_traced"] = out["traced_us"] / max(float(out["traced_us"].sum()), 1e-9)
    return out.sort_values("traced_us", ascending=False).reset_index(drop=True)


def table_v(pred: pd.DataFrame) -> pd.DataFrame:
    """Per predictor: geomean, min and max |relative error| (DLRM paper Table V), the mean
    |error| beside them (a geomean is ruled by its smallest row: one step predicted within
    0.2 % halves it), plus the active-time error of the kernel sum against the traced time of
    the same ops."""
    rows = []
    for p, g in pred.groupby("predictor", sort=False):
        err = np.abs(g["rel_err"].to_numpy())
        rows.append({"predictor": p, "n": len(g), **_abs_err_stats(err)})
    k = pred[pred["predictor"] == "kernel_only"]
    if len(k):
        err = np.abs((k["kernel_only_ms"] - k["active_measured_ms"]) / k["active_measured_ms"]).to_numpy()
        rows.append({"predictor": "active_time (kernel sum vs traced)", "n": len(k), **_abs_err_stats(err)})
    return pd.DataFrame(rows)


def _abs_err_stats(err: np.ndarray) -> dict:
    return {"geomean_abs_err": _geomean(err), "mean_abs_err": float(err.mean()), "min_abs_err": float(err.min()),
            "max_abs_err": float(err.max())}


def _geomean(err: np.ndarray) -> float:
    err = np.maximum(err, 1e-6)  # an exact hit would send the log to -inf
    return float(math.exp(np.log(err).mean()))
