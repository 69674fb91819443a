"""What `devchar run` says when a run does not succeed: which check or step failed and why,
how noisy the sweeps were, how busy the machine was, and what to do next. No dagster import:
a run's events are read by their attributes (event_type_value, event_specific_data)."""
from __future__ import annotations

import os
import sys
import re
from dataclasses import dataclass, field

from pipeline.core.errors import DevcharError
from pipeline.analysis.quality import Gates

SAMPLE_TABLES = ("gemm_samples", "utility_samples", "attention_samples", "embedding_samples", "memory_samples",
                 "workload_runs")
CV_NOISY = 0.1  # a table without the harness's `noisy` flag (workload_runs): noisy when its cv is above this

# how Dagster words a step stopped by a blocking check (1.13: "1 blocking asset check failed
# with ERROR severity"); such a step is reported once, as its check
BLOCKING_CHECK = re.compile(r"blocking (asset )?checks? .*failed", re.IGNORECASE)


@dataclass
class FailedCheck:
    asset: str
    check: str
    blocking: bool
    metadata: dict = field(default_factory=dict)


@dataclass
class FailedStep:
    step: str
    message: str


INTERRUPTS = ("KeyboardInterrupt", "DagsterExecutionInterruptedError")


def interrupted_steps(events) -> list[str] | None:
    """The steps an interrupt (Ctrl-C, a termination) stopped, [] when only the run says it was
    interrupted or canceled, None when it was not: Dagster records an interrupted step as a
    STEP_FAILURE whose error source is INTERRUPT, the run as RUN_CANCELED or a RUN_FAILURE
    'interrupted unexpectedly'."""
    steps, run = [], False
    for e in events:
        data = e.event_specific_data
        if e.event_type_value == "STEP_FAILURE":
            source = getattr(getattr(data, "error_source", None), "value", None)
            if source == "INTERRUPT" or getattr(getattr(data, "error", None), "cls_name", None) in INTERRUPTS:
                steps.append(e.step_key)
        elif e.event_type_value == "RUN_CANCELED":
            run = True
        elif e.event_type_value == "RUN_FAILURE":
            run = run or "interrupted" in (getattr(e, "message", None) or "").lower()
    return steps if steps or run else None


def failures(events) -> tuple[list[FailedCheck], list[FailedStep]]:
    """(failed checks, failed steps) from a run's events, as plain records."""
    checks, steps = [], []
    for e in events:
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed:
            ev = e.event_specific_data
            meta = {k: getattr(v, "value", v) for k, v in (ev.metadata or {}).items()}
            checks.append(FailedCheck(ev.asset_key.to_user_string(), ev.check_name, bool(ev.blocking), meta))
        elif e.event_type_value == "STEP_FAILURE":
            msg = getattr(getattr(e.event_specific_data, "error", None), "message", "") or ""
            if not BLOCKING_CHECK.search(msg):  # already told as the failed check itself
                steps.append(FailedStep(e.step_key, msg))
    return checks, steps


def device_threads(warehouse, device: str) -> int | None:
    """The thread count device_spec recorded (None for a GPU, or when there is no row)."""
    try:
        row = warehouse.device_rows("devices", device).iloc[0]
        return int(row["threads"]) if row.get("threads") == row.get("threads") else None
    except (DevcharError, KeyError, TypeError, ValueError):
        return None


def noisy_shares(warehouse, device: str) -> dict[str, tuple[float, float]]:
    """table -> (share of rows still noisy, share that stalled waiting for a core)."""
    out = {}
    for table in SAMPLE_TABLES:
        if not warehouse.has_table(table):
            continue
        cols = set(warehouse.query(f"SELECT * FROM {table} LIMIT 0").columns)  # table from a fixed list
        stalled = "avg(CAST(stalled AS DOUBLE))" if "stalled" in cols else "0.0"
        noisy = "avg(CAST(noisy AS DOUBLE))" if "noisy" in cols else f"avg(CAST(cv > {CV_NOISY} AS DOUBLE))"
        got = warehouse.query(f"SELECT count(*) AS n, {noisy} AS noisy, {stalled} AS stalled "
                              f"FROM {table} WHERE device = ?", [device])
        if int(got["n"].iloc[0]):
            out[table] = (float(got["noisy"].iloc[0] or 0.0), float(got["stalled"].iloc[0] or 0.0))
    return out


DETAIL_KEYS = ("over_threshold", "worst_median", "overall_mean", "max_median_allowed", "max_mean_allowed",
               "bad_rows", "noisy_share", "val_mape", "max_allowed", "flagged", "ops_moved_alone", "tables_flagged",
               "tables_compared")


def describe_checks(checks: list[FailedCheck]) -> str:
    """One line per failed check: blocking or a warning, and the metadata that says why."""
    lines = []
    for c in checks:
        kind = "blocking check" if c.blocking else "check (warning)"
        detail = ", ".join(f"{k} {v}" for k, v in c.metadata.items() if k in DETAIL_KEYS)
        lines.append(f"  {kind} {c.asset}.{c.check} failed: {detail or 'see its metadata in the UI'}")
    return "\n".join(lines)


def explain_failure(checks: list[FailedCheck], steps: list[FailedStep], noisy: dict[str, tuple[float, float]],
                    threads: int | None, gates: Gates = Gates()) -> str:
    """`gates`: the thresholds the run's checks applied (the quality_gates resource)."""
    lines = [describe_checks(checks)] if checks else []
    for s in steps:
        lines.append(f"  step {s.step} failed: {s.message.strip().splitlines()[0][:300] if s.message else '?'}")
    if noisy:
        parts = [f"{t} {n:.0%}" + (f" (stalled {st:.0%})" if st else "") for t, (n, st) in noisy.items()]
        flag = " - above DEVCHAR_MAX_NOISY_SHARE" if any(n > gates.max_noisy_share for n, _ in noisy.values()) else ""
        lines.append(f"  noisy rows after one re-measure: {', '.join(parts)}{flag}")
    if hasattr(os, "getloadavg"):
        one, five, _ = os.getloadavg()
        busy = " - the machine was busy: timings are inflated" if threads and five > threads else ""
        lines.append(f"  load average now {one:.1f} (1 min), {five:.1f} (5 min) on {threads or '?'} threads{busy}")
    lines.append("  what to do: re-run on an otherwise idle machine (another process on the cores stalls "
                 "timings); `devchar run --profile full` measures more points; the held-out gates are "
                 f"DEVCHAR_MAX_HELDOUT_ERR={gates.max_heldout_err} (median per op and dtype) and "
                 f"DEVCHAR_MAX_HELDOUT_MEAN_ERR={gates.max_heldout_mean_err} (mean over all shapes)")
    return "\n".join(lines)


def report_expected(run_id: str, checks, steps, expected: set[str]) -> int:
    """A calibration committed with known failures (--expect-failing) still guards what runs:
    any other failed check or step, or a known one that now passes (so the list is stale),
    fails the run. What depends on a failed blocking check does not run, so it is not guarded;
    the verdict says so."""
    failed = {f"{c.asset}.{c.check}" for c in checks if c.blocking}
    if failed == expected and not steps:
        print(f"devchar: run {run_id} failed exactly its expected checks {sorted(expected)}, as committed; "
              "what depends on them did not run and is unchecked:")
        print(describe_checks([c for c in checks if c.blocking]))
        return 0
    if failed - expected or steps:
        print(f"devchar: run {run_id} failed beyond its expected checks: {sorted(failed - expected)}"
              f"{' and steps ' + str([s.step for s in steps]) if steps else ''}", file=sys.stderr)
        print(describe_checks(checks), file=sys.stderr)
    if expected - failed:
        print(f"devchar: run {run_id}: expected failing checks now pass: {sorted(expected - failed)}; "
              "remove them from the reference's expected_check_failures", file=sys.stderr)
    return 1
