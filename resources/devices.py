"""How a sweep reaches its device.

- `subprocess` (the default): `python -m pipeline.runner` through Dagster Pipes, one fresh
  process per sweep, so a CUDA crash or a hung kernel kills a child, not the run.
- `in_process`: the local device, in the Dagster run's own process (quicker to start).
- A partition key that is not a local device but has a committed reference calibration
  (models_store/reference/<device>/<table>.parquet, measured on a GPU node by the same
  runner) is loaded from there; `source="reference"` loads it even where the device is local
  (`devchar run --device <slug>`: CI replays committed calibrations on any machine).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import ClassVar, Literal

import dagster as dg
import pandas as pd

from pipeline.core.config import REPO_ROOT, reference_root
from pipeline.core.errors import UnknownDeviceError
from pipeline.runner import SWEEPS, tables_of
from pipeline.core.slugs import SLUG, check_slug, under


def read_rows(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_json(path, lines=True)


def reference_dir(device: str) -> Path:
    """models_store/reference/<device>, for a valid slug only (a partition key like '../../x'
    or an absolute path never reaches outside the reference root)."""
    return under(reference_root(), check_slug(device))


def committed_references() -> list[str]:
    """Slugs with a committed calibration (a devices table at least)."""
    root = reference_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and SLUG.fullmatch(p.name) and reference_file(p.name, "devices"))


def reference_tables(device: str) -> set[str]:
    """The tables a committed reference calibration holds."""
    folder = reference_dir(device)
    return {p.name.split(".")[0] for p in folder.glob("*.*") if p.suffix in (".parquet", ".jsonl")}


def reference_file(device: str, table: str) -> Path | None:
    for suffix in (".parquet", ".jsonl"):
        p = reference_dir(device) / f"{table}{suffix}"
        if p.is_file():
            return p
    return None


class DeviceRunner(dg.ConfigurableResource):
    # the variables that feed these fields where set (resources/env.py)
    ENV: ClassVar[dict[str, str]] = {"profile": "DEVCHAR_PROFILE", "train_device": "DEVCHAR_TRAIN_DEVICE"}

    profile: str = "quick"  # sweep size: tiny (tests), quick or full (pipeline/sweeps/profiles.py)
    # A fresh process per sweep: each starts from the same allocator and cache state (a long
    # in-process run leaves glibc's mmap threshold raised, which hides the page faults large
    # outputs pay in a real run), and a crashing or hung kernel takes down only the child.
    mode: Literal["in_process", "subprocess"] = "subprocess"
    # "auto": a local device is measured, any other partition loads its reference calibration;
    # "reference": the committed calibration always, never a measurement
    source: Literal["auto", "reference"] = "auto"
    # where fits that train on a device (the OpenCL prompt models) run; empty: the GPU when
    # torch sees one, else the CPU
    train_device: str = ""

    def run(self, context: dg.AssetExecutionContext, sweep: str, device: str) -> pd.DataFrame:
        """The sweep's main table."""
        return self.run_tables(context, sweep, device)[SWEEPS[sweep]]

    def run_tables(self, context: dg.AssetExecutionContext, sweep: str, device: str) -> dict[str, pd.DataFrame]:
        """Every table the sweep fills (runner.tables_of), by name."""
        from pipeline.device.discover import local_devices

        if self.source == "reference" or device not in local_devices():
            out = {}
            for table in tables_of(sweep):
                ref = reference_file(device, table)
                if ref is None:
                    raise UnknownDeviceError(f"device {device!r} is neither local nor has a reference calibration "
                                             f"for {table} under {reference_root() / device}")
                context.log.info(f"{device}: loading its reference calibration {ref}")
                out[table] = read_rows(ref).assign(device=device)
            return out
        if self.mode == "subprocess":
            return self._run_subprocess(context, sweep, device)
        from pipeline.runner import run_sweep_tables

        tables = run_sweep_tables(sweep, device, self.profile, context.run.run_id[:12], log=context.log.info)
        return {t: pd.DataFrame(rows) for t, rows in tables.items()}

    def _run_subprocess(self, context: dg.AssetExecutionContext, sweep: str, device: str) -> dict[str, pd.DataFrame]:
        with tempfile.TemporaryDirectory(prefix="devchar-runner-") as out:
            cmd = [sys.executable, "-m", "pipeline.runner", sweep, "--device", device, "--profile",
                   self.profile, "--out", out, "--run-id", context.run.run_id[:12]]
            dg.PipesSubprocessClient(cwd=str(REPO_ROOT)).run(command=cmd, context=context).get_results()
            tables = {}
            for table in tables_of(sweep):
                files = sorted(Path(out).glob(f"{table}.*"))
                if not files:
                    raise RuntimeError(f"runner wrote no {table} for sweep {sweep!r} on {device!r}")
                tables[table] = read_rows(files[0])
            return tables
