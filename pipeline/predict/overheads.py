"""Host-side overheads T1–T5 (DLRM paper §III-C, Fig. 6) and the model that averages them.

Labels follow the paper's list and Fig. 6 exactly (note T3/T4 order):
  T1  CPU gap between two consecutive top-level ops (charged to the op that follows)
  T2  op start -> start of its first launch
  T3  end of its last launch -> op end
  T4  the launch call itself (cudaLaunchKernel, cudaMemcpyAsync, ...): its CPU duration
  T5  end of one launch -> start of the next, inside an op. An op that launches nothing
      has one T5 = its whole CPU time: that is what Algorithm 1 line 19 adds for it
      (the paper's released code, get_overheads, records it so).

A "launch" is a runtime call (cat cuda_runtime/cuda_driver) whose correlation id matches a
device event (kernel, gpu_memcpy, gpu_memset); other runtime calls are just CPU time.

CPU traces have no launches and no device events: T2–T5 do not exist there. Only T1 is
extracted; each op's duration (its inline compute) comes from `op_durations`.

Profiler overhead (§III-C: "subtracting them from the execution time of each event"; 2 µs
per CPU event on their machine): every recorded CPU event is charged once, to the interval
it starts in — a top-level op's to the T1 gap before it, a launch's to its own T4, nested
events to the T2/T5/T3 interval holding their start. Results are clipped at 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import DevcharError
from pipeline.predict.serialize import DataclassJSON

TYPES = ("T1", "T2", "T3", "T4", "T5")
PAPER_CPU_EVENT_OVERHEAD_US = 2.0  # §III-C, "an empirical value of 2 µs"; platform-specific
IQR_K = 1.5  # §IV-B: outliers outside (Q1 - 1.5 IQR, Q3 + 1.5 IQR) are removed per type
T5_NO_KERNELS = "T5_no_kernels"  # shared-table key: pooled T5 of ops that launch nothing

_RUNTIME = {"cuda_runtime", "cuda_driver"}
_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
_EPS_US = 1e-3  # Chrome-trace times are µs with ns digits; tolerate rounding in containment


class OverheadError(DevcharError, ValueError):
    """Bad overhead samples or trace."""


def inliers(values, k: float = IQR_K) -> np.ndarray:
    """Which values lie inside [Q1 - k·IQR, Q3 + k·IQR] (numpy's linear quantiles)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return np.zeros(0, bool)
    q1, q3 = np.percentile(v, [25, 75])
    iqr = q3 - q1
    return (v >= q1 - k * iqr) & (v <= q3 + k * iqr)


def remove_outliers(values, k: float = IQR_K) -> np.ndarray:
    """Keep values inside [Q1 - k·IQR, Q3 + k·IQR] (numpy's linear quantiles)."""
    v = np.asarray(values, dtype=float)
    return v[inliers(v, k)]


@dataclass(frozen=True)
class OverheadModel(DataclassJSON):
    """Mean overhead per (op type, T-type) — "individual" — with a pooled "shared" fallback.

    `individual[op][T]` is the mean after per-(op, T) IQR filtering; `shared[T]` pools those
    filtered samples over all op types, so an op never seen in a trace still gets a value.
    Fitting on samples from several workloads gives the paper's shared_E2E setting (§IV-C).
    Samples whose T1 rows carry `prev_us` (the previous top-level op's duration: CPU captures,
    host_time.py) also fit `t1_after`, the slowdown of a gap after a long op.
    """

    name = "overhead_model"  # not annotated: a class attribute, not a field
    individual: dict[str, dict[str, float]]
    shared: dict[str, float]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # T1's slowdown by how long the op before ran (AfterOp); with it, the T1 entries above are
    # the gaps after a short op. None: T1 is one mean per op, as the paper has it.
    t1_after: "AfterOp | None" = None

    @classmethod
    def fit(cls, samples: pd.DataFrame, k: float = IQR_K) -> "OverheadModel":
        missing = {"op", "type", "us"} - set(samples.columns)
        if missing:
            raise OverheadError(f"overhead samples lack columns {sorted(missing)}")
        if samples.empty:
            raise OverheadError("no overhead samples to fit")
        bad = sorted(set(samples["type"]) - set(TYPES))
        if bad:
            raise OverheadError(f"unknown overhead type(s) {bad}; expected {TYPES}")
        us = samples["us"].to_numpy(dtype=float)
        if not np.all(np.isfinite(us)) or (us < 0).any():
            raise OverheadError(f"overhead us must be finite and >= 0, got min {np.nanmin(us)!r}")
        individual: dict[str, dict[str, float]] = {}
        counts: dict[str, dict[str, int]] = {}
        pooled: dict[str, list[np.ndarray]] = {}
        launching = set(samples.loc[samples["type"] == "T2", "op"])  # T2 exists iff an op launches
        for (op, t), g in samples.groupby(["op", "type"], sort=True):
            kept = remove_outliers(g["us"], k)
            individual.setdefault(op, {})[t] = float(kept.mean())
            counts.setdefault(op, {})[t] = int(kept.size)
            # T5 means two things (gap between launches / whole CPU time of a launch-less op):
            # pool them apart so an unseen op borrows the right one.
            key = T5_NO_KERNELS if t == "T5" and op not in launching else t
            pooled.setdefault(key, []).append(kept)
        shared = {t: float(np.concatenate(v).mean()) for t, v in sorted(pooled.items())}
        fitted = AfterOp.fit(samples, k) if "prev_us" in samples else None
        t1_after = None
        if fitted is not None:  # the T1 entries become the gaps after a short op
            t1_after, base, pooled = fitted
            individual = {op: {**ts, **({"T1": base[op]} if op in base else {})} for op, ts in individual.items()}
            shared = {**shared, "T1": pooled}
        return cls(individual, shared, counts, t1_after)

    def get(self, op: str, t: str, has_kernels: bool = True, prev_us: float | None = None) -> float:
        """Mean T-type overhead for an op type; unseen -> shared; absent everywhere -> 0.
        T1 with `t1_after` fitted: times the slowdown after a previous op of `prev_us`."""
        if t not in TYPES:
            raise OverheadError(f"unknown overhead type {t!r}; expected {TYPES}")
        if t in self.individual.get(op, {}):
            value = self.individual[op][t]
        else:
            key = T5_NO_KERNELS if t == "T5" and not has_kernels else t
            # 0 for a type no trace had: e.g. T2–T5 on the CPU, where there are no launches.
            value = self.shared.get(key, 0.0)
        if t == "T1" and self.t1_after is not None and prev_us is not None:
            value *= self.t1_after.factor(prev_us)
        return value

    def lookup(self, op: str, has_kernels: bool = True, prev_us: float | None = None) -> dict[str, float]:
        """Algorithm 1 line 5: T1..T5 for one op (`prev_us`: how long the op before it ran)."""
        return {t: self.get(op, t, has_kernels, prev_us) for t in TYPES}

    def to_dict(self) -> dict:
        d = {"version": 1, **super().to_dict()}
        if self.t1_after is None:
            d.pop("t1_after")  # a model without it saves as it always did
        else:
            d["t1_after"] = self.t1_after.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OverheadModel":
        try:
            after = AfterOp.from_dict(d["t1_after"]) if d.get("t1_after") else None
            model = super().from_dict({k: v for k, v in d.items() if k != "t1_after"})
            return replace(model, t1_after=after)  # the annotations coerce the values; "version" is skipped
        except (KeyError, AttributeError, TypeError, ValueError) as e:
            raise OverheadError(f"bad overhead model JSON: {e}") from None


MIN_BIN_SAMPLES = 30  # T1 gaps per bin of the previous op's duration; smaller bins merge upward


@dataclass(frozen=True)
class AfterOp(DataclassJSON):
    """How much longer the host gap before an op (T1) runs after a long previous op.

    On a CPU the previous op streams its operands through the caches and evicts the
    interpreter's and the framework's own state, which the next gap then reads back from
    memory: on the Xeon VM a chain of ten small nn.Linear calls took 52 us after a 1 MB copy,
    85 after 4 MB, 110 after 16 MB and 185 after 64 MB (untraced), and traced T1 gaps rose from
    a median of 1.5-3.5 us after ops under 2 us to 30-40 us after ops of 1-10 ms, in GPT-2, DLRM
    and the MLP alike. Modelled as T1 = base[op] x factor(previous op's duration): `base` is
    the gap after a short op (OverheadModel's T1 entries), `factor` a step function over log2
    duration bins (each holding at least MIN_BIN_SAMPLES gaps), 1 in the first bin and never
    falling, fitted on the gaps IQR-filtered per bin by alternating the two (iterative
    proportional fitting).
    """

    log2_us: np.ndarray  # (B,) lower edge of each bin, floor(log2(previous op us)), ascending
    slowdown: np.ndarray  # (B,) factor on the base gap in that bin; 1 in the first bin with gaps

    def __post_init__(self):
        object.__setattr__(self, "log2_us", np.asarray(self.log2_us, float))
        object.__setattr__(self, "slowdown", np.asarray(self.slowdown, float))

    def __eq__(self, other) -> bool:  # the generated one would compare arrays elementwise
        return isinstance(other, AfterOp) and np.array_equal(self.log2_us, other.log2_us) \
            and np.array_equal(self.slowdown, other.slowdown)

    def factor(self, prev_us: float) -> float:
        at = np.searchsorted(self.log2_us, math.floor(math.log2(max(float(prev_us), 1.0))), side="right") - 1
        return float(self.slowdown[max(int(at), 0)])

    @staticmethod
    def fit(samples: pd.DataFrame, k: float = IQR_K,
            iters: int = 20) -> "tuple[AfterOp, dict[str, float], float] | None":
        """From the T1 rows with a `prev_us`: the slowdown, each op's gap after a short op and the
        same pooled over ops (what an op never traced gets); None with fewer than two bins' worth."""
        t1 = samples[(samples["type"] == "T1") & samples["prev_us"].notna()]
        if len(t1) < 2 * MIN_BIN_SAMPLES:
            return None
        lb = np.floor(np.log2(np.maximum(t1["prev_us"].to_numpy(float), 1.0)))
        edges = _bins(lb)
        t1 = t1.assign(bin=np.searchsorted(edges, lb, side="right") - 1)
        # outliers per bin, among gaps after ops of about the same length: per op, the gaps after
        # the few long ops an op follows would sit past its upper quartile and be dropped (the
        # very effect fitted here); per (op, bin), most groups are too small for an IQR to trim
        # the stalls that a mean then carries (Xeon reference, DLRM e2e_shared: per bin 4.6 %,
        # per (op, bin) 6.2 %)
        kept = [g[inliers(g["us"], k)] for _, g in t1.groupby("bin", sort=True)]
        t1 = pd.concat(kept)
        us, b = t1["us"].to_numpy(float), t1["bin"].to_numpy(int)
        ops, o = np.unique(t1["op"].to_numpy(str), return_inverse=True)
        slow = np.ones(edges.size)
        for _ in range(iters):
            base = np.bincount(o, us) / np.maximum(np.bincount(o, slow[b]), 1e-12)
            slow = np.bincount(b, us, edges.size) / np.maximum(np.bincount(b, base[o], edges.size), 1e-12)
            # 1 in the first bin whose gaps are not all 0 (T1 is clipped at 0 after the
            # profiler's cost comes off), so `base` stays the gap after a short op
            first = slow[slow > 0][0] if (slow > 0).any() else 1.0
            slow = np.maximum.accumulate(np.maximum(slow / first, 1e-3))
        base = np.bincount(o, us) / np.maximum(np.bincount(o, slow[b]), 1e-12)
        return (AfterOp(edges, slow), {str(op): float(v) for op, v in zip(ops, base)},
                float(us.sum() / max(slow[b].sum(), 1e-12)))


def _bins(lb: np.ndarray) -> np.ndarray:
    """Lower edges of consecutive log2 bins holding >= MIN_BIN_SAMPLES values each (a short
    last bin joins the one below)."""
    values, counts = np.unique(lb, return_counts=True)
    edges, held = [], 0
    for v, c in zip(values, counts):
        if held == 0:
            edges.append(v)
        held += c
        if held >= MIN_BIN_SAMPLES:
            held = 0
    if held and len(edges) > 1:
        edges.pop()
    return np.asarray(edges, float)


# ---- Chrome trace (torch.profiler export_chrome_trace) -------------------------------------

def load_trace(trace) -> list[dict]:
    """Events from a path, a parsed Chrome-trace dict ({"traceEvents": [...]}) or a list."""
    if isinstance(trace, (str, Path)):
        with open(trace) as f:
            trace = json.load(f)
    if isinstance(trace, dict):
        trace = trace.get("traceEvents")
    if not isinstance(trace, list):
        raise OverheadError("a Chrome trace is a list of events or a dict with 'traceEvents'")
    return trace


def _end(e: dict) -> float:
    return e["ts"] + e["dur"]


def _parse(trace):
    """(top-level ops with their nested host events, launch events, has_device_activity)."""
    events = [e for e in load_trace(trace) if e.get("ph") == "X" and "ts" in e and "dur" in e]
    device_corr = {e.get("args", {}).get("correlation") for e in events if e.get("cat") in _DEVICE}
    device_corr.discard(None)
    launch_ids = {id(e) for e in events if e.get("cat") in _RUNTIME
                  and e.get("args", {}).get("correlation") in device_corr}
    host = [e for e in events if e.get("cat") == "cpu_op" or e.get("cat") in _RUNTIME]
    host.sort(key=lambda e: (str(e.get("pid")), str(e.get("tid")), e["ts"], -e["dur"]))  # parents first
    tops: list[tuple[dict, list[dict]]] = []
    cur = None
    for e in host:
        if cur is not None and (e.get("pid"), e.get("tid")) == (cur[0].get("pid"), cur[0].get("tid")) \
                and e["ts"] >= cur[0]["ts"] and _end(e) <= _end(cur[0]) + _EPS_US:
            cur[1].append(e)  # nested in the current top-level op (any depth)
        elif e.get("cat") == "cpu_op":
            cur = (e, [])
            tops.append(cur)
        # else: a runtime call outside any op (e.g. a sync from Python) — no op to charge it to
    return tops, launch_ids, bool(device_corr) or bool(launch_ids)


def _check_ovh(value) -> float:
    ovh = float(value)
    if not math.isfinite(ovh) or ovh < 0:
        raise OverheadError(f"cpu_event_overhead_us={value!r} must be a finite number >= 0")
    return ovh


def extract_overheads(trace, cpu_event_overhead_us: float = 0.0) -> pd.DataFrame:
    """One row per host-side gap: columns op (top-level op name), type (T1..T5), us.

    `cpu_event_overhead_us` is the profiler's cost per recorded CPU event, subtracted as the
    module docstring says (the paper used PAPER_CPU_EVENT_OVERHEAD_US); 0 keeps raw gaps.
    """
    ovh = _check_ovh(cpu_event_overhead_us)
    tops, launch_ids, on_device = _parse(trace)
    rows: list[tuple[str, str, float]] = []

    def add(op, t, us):
        rows.append((op, t, round(max(float(us), 0.0), 3)))  # trace clocks tick in ns

    prev = None
    for op, nested in tops:
        name = op["name"]
        same_thread = prev is not None and (prev.get("pid"), prev.get("tid")) == (op.get("pid"), op.get("tid"))
        if same_thread:
            add(name, "T1", op["ts"] - _end(prev) - ovh)
        prev = op
        if not on_device:
            continue  # CPU trace: no launches, so T2–T5 do not exist
        launches = [e for e in nested if id(e) in launch_ids]
        others = [e for e in nested if id(e) not in launch_ids]
        if not launches:
            add(name, "T5", op["dur"] - ovh * len(others))  # Algorithm 1 line 19's T5
            continue

        def n_between(lo, hi):  # nested non-launch events that start in [lo, hi)
            return sum(lo <= e["ts"] < hi for e in others)

        first, last = launches[0], launches[-1]
        add(name, "T2", first["ts"] - op["ts"] - ovh * n_between(-math.inf, first["ts"]))
        for a, b in zip(launches, launches[1:]):
            add(name, "T5", b["ts"] - _end(a) - ovh * n_between(_end(a), b["ts"]))
        for lc in launches:
            add(name, "T4", lc["dur"] - ovh)
        add(name, "T3", _end(op) - _end(last) - ovh * n_between(_end(last), math.inf))
    return pd.DataFrame(rows, columns=["op", "type", "us"])


def op_durations(trace, cpu_event_overhead_us: float = 0.0) -> pd.DataFrame:
    """Top-level ops' CPU durations (columns op, us): on the CPU, each op's inline compute."""
    ovh = _check_ovh(cpu_event_overhead_us)
    tops, _, _ = _parse(trace)
    return pd.DataFrame([(op["name"], round(max(op["dur"] - ovh * len(nested), 0.0), 3)) for op, nested in tops],
                        columns=["op", "us"])
