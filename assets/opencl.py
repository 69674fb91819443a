"""opencl_launches' checks and report: the OpenCL launch dataset (LLMPerf section II) of a
device (the asset is declared with the other sample tables in assets/samples.py).

The `opencl` sweep runs where the device is (pipeline/opencl/sweep): generated kernels
with simple and memory-analysis arguments over 25:60:15 launch settings plus IQR
rebalancing, and benchmark kernels over input sizes. Failed launches (build errors,
time-outs, crashes, invalid arguments) are rows too, with their status.
"""
import numpy as np
import pandas as pd

import dagster as dg
from assets.common import device_check, md_table
from assets.factories import Checks

MAX_FAILED_SHARE = 0.10  # above this the sweep's kernels or limits need a look (a warning)


def launch_check_specs(name: str) -> list[dg.AssetCheckSpec]:
    return [
        device_check("finite_positive", name, blocking=True,
                     description="every successful launch has a finite timing > 0"),
        device_check("some_launches_ok", name, blocking=True,
                     description="at least one launch succeeded"),
        device_check("failed_share", name,
                     description=f"share of launches that did not succeed <= {MAX_FAILED_SHARE:.0%}"),
    ]


def launch_checks(df: pd.DataFrame, gates=None) -> list[dg.AssetCheckResult]:
    """`gates`, the run's quality gates, is not used: the launch sweep's limit is its own."""
    ok = df["status"] == "ok"
    t = df.loc[ok, ["median_us", "p20_us", "p80_us"]].to_numpy(float)
    bad = int((~np.isfinite(t) | (t <= 0)).any(axis=1).sum())
    failed = float((~ok).mean()) if len(df) else 1.0
    return [
        dg.AssetCheckResult(check_name="finite_positive", passed=bad == 0, metadata={"bad_rows": bad}),
        dg.AssetCheckResult(check_name="some_launches_ok", passed=bool(ok.any()), metadata={"ok_rows": int(ok.sum())}),
        dg.AssetCheckResult(check_name="failed_share", passed=failed <= MAX_FAILED_SHARE,
                            severity=dg.AssetCheckSeverity.WARN, metadata={"failed_share": failed}),
    ]


LAUNCH_CHECKS = Checks(launch_check_specs, launch_checks)


def launch_report(df: pd.DataFrame) -> dict:
    """Kernels, successful launches, rows per status, and per generated-kernel family."""
    by_status = df.groupby(["suite", "status"]).size().rename("rows").reset_index()
    by_family = (df[df["status"] == "ok"].groupby(["suite", "family", "arg_method"])
                 .agg(rows=("median_us", "size"), kernels=("kernel_id", "nunique"),
                      median_us=("median_us", "median")).reset_index())
    return {"kernels": int(df["kernel_id"].nunique()), "ok_rows": int((df["status"] == "ok").sum()),
            "rows_by_status": md_table(by_status), "ok_by_family": md_table(by_family)}
