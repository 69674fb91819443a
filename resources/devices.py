"""How a sweep reaches its device.

- `subprocess` (the default): `python -m pipeline.runner` through Dagster Pipes, one fresh
  process per sweep, so a CUDA crash or a hung kernel kills a child, not the run.
- `in_process`: the local device, in the Dagster run's own process (quicker to start).
- `k8s`: a device listed in `k8s.devices` runs each sweep in a pod of its own on its GPU node
  (resources/k8s.py, dagster-k8s' PipesK8sClient; docs/kubernetes.md); any other partition is
  handled as in `subprocess` mode. The tables come back as files on a shared volume, named by
  the runner's Pipes messages (read_results, which the subprocess mode reads through too).
- A partition key that is not a local device but has a committed reference calibration
  (models_store/reference/<device>/<table>.parquet, measured on a GPU node by the same
  runner) is loaded from there; `source="reference"` loads it even where the device is local
  (`devchar run --device <slug>`: CI replays committed calibrations on any machine).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import ClassVar, Literal

import dagster as dg
import pandas as pd
from pydantic import field_validator

from pipeline.core.config import REPO_ROOT, reference_root
from pipeline.core.errors import UnknownDeviceError
from pipeline.runner import SWEEPS, tables_of, usual_probes_args
from pipeline.core.slugs import SLUG, check_slug, under
from resources.env import as_text, number
from resources.k8s import K8sSettings, run_pod, sweep_pod
from resources.pipes_reader import WholeLineMessageReader


def read_rows(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_json(path, lines=True)


def read_results(messages: list, out_dir: Path, sweep: str) -> dict[str, pd.DataFrame]:
    """The tables a runner wrote under `out_dir` for `sweep`: from the files its Pipes custom
    messages name ({"table", "path", "rows"}), each checked to lie under `out_dir` and to hold
    the rows it reported; a table with no message (a runner without Pipes) from out_dir/<table>.*."""
    root = Path(out_dir).resolve()
    reported = {m["table"]: m for m in messages if isinstance(m, dict) and "table" in m and "path" in m}
    tables = {}
    for table in tables_of(sweep):
        if table in reported:
            path = Path(reported[table]["path"]).resolve()
            if not path.is_relative_to(root) or not path.is_file():
                raise RuntimeError(f"runner reported {table} at {path}, not a file under {root}")
            rows = read_rows(path)
            if "rows" in reported[table] and len(rows) != int(reported[table]["rows"]):
                raise RuntimeError(f"runner reported {reported[table]['rows']} {table} rows; {path} holds {len(rows)}")
        else:
            files = sorted(root.glob(f"{table}.*"))
            if not files:
                raise RuntimeError(f"runner wrote no {table} for sweep {sweep!r} under {root}")
            rows = read_rows(files[0])
        tables[table] = rows
    return tables


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
    ENV: ClassVar[dict[str, str]] = {"profile": "DEVCHAR_PROFILE", "train_device": "DEVCHAR_TRAIN_DEVICE",
                                     "threads": "DEVCHAR_THREADS", "timing_scale": "DEVCHAR_TIMING_SCALE"}

    profile: str = "quick"  # sweep size: tiny (tests), quick or full (pipeline/sweeps/profiles.py)
    # A fresh process per sweep: each starts from the same allocator and cache state (a long
    # in-process run leaves glibc's mmap threshold raised, which hides the page faults large
    # outputs pay in a real run), and a crashing or hung kernel takes down only the child.
    # "k8s": a pod per sweep for the devices in `k8s.devices` (resources/k8s.py)
    mode: Literal["in_process", "subprocess", "k8s"] = "subprocess"
    # "auto": a local device is measured, any other partition loads its reference calibration;
    # "reference": the committed calibration always, never a measurement
    source: Literal["auto", "reference"] = "auto"
    # where fits that train on a device (the OpenCL prompt models) run; empty: the GPU when
    # torch sees one, else the CPU
    train_device: str = ""
    # > 0: measure a CPU with this many of its threads, under the same slug (a changed setting
    # that a re-calibration's drift check should see); 0: every thread the slug names
    threads: int = 0
    # every time budget of the sweeps times this (harness/timer.py): CI's slow tier runs the quick
    # profile's whole grids on a quarter of them; a calibration keeps 1. Text, as Dagster has no
    # float source for $DEVCHAR_TIMING_SCALE (resources/env.py)
    timing_scale: str = "1"
    k8s: K8sSettings = K8sSettings()  # mode "k8s": image, node selector and limits per device

    _scale_text = field_validator("timing_scale", mode="before")(as_text)

    def scale(self) -> float:
        """timing_scale as a number (one error naming the field and its variable otherwise)."""
        return number(self, "timing_scale")

    def run(self, context: dg.AssetExecutionContext, sweep: str, device: str,
            usual_probes: tuple[float | None, float | None] | None = None) -> pd.DataFrame:
        """The sweep's main table."""
        return self.run_tables(context, sweep, device, usual_probes)[SWEEPS[sweep]]

    def run_tables(self, context: dg.AssetExecutionContext, sweep: str, device: str,
                   usual_probes: tuple[float | None, float | None] | None = None) -> dict[str, pd.DataFrame]:
        """Every table the sweep fills (runner.tables_of), by name. `usual_probes`: the spell
        probes' usual times in the device's calibration (runner --usual-probes)."""
        from pipeline.device.discover import local_devices

        if self.source != "reference" and self.mode == "k8s" and device in self.k8s.devices:
            return self._run_k8s(context, sweep, device, usual_probes)
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
        if self.mode in ("subprocess", "k8s"):
            return self._run_subprocess(context, sweep, device, usual_probes)
        from pipeline.runner import run_sweep_tables, timing_scale_set

        with timing_scale_set(self.scale()):
            tables = run_sweep_tables(sweep, device, self.profile, context.run.run_id[:12], log=context.log.info,
                                      threads=self.threads, usual_probes=usual_probes)
        return {t: pd.DataFrame(rows) for t, rows in tables.items()}

    def _run_subprocess(self, context: dg.AssetExecutionContext, sweep: str, device: str,
                        usual_probes: tuple[float | None, float | None] | None = None) -> dict[str, pd.DataFrame]:
        with tempfile.TemporaryDirectory(prefix="devchar-runner-") as out:
            cmd = [sys.executable, "-m", "pipeline.runner", sweep, "--device", device, "--profile",
                   self.profile, "--out", out, "--run-id", context.run.run_id[:12], "--threads", str(self.threads),
                   "--timing-scale", repr(self.scale()), *usual_probes_args(usual_probes)]
            client = dg.PipesSubprocessClient(cwd=str(REPO_ROOT), message_reader=WholeLineMessageReader())
            invocation = client.run(command=cmd, context=context)
            return read_results(list(invocation.get_custom_messages()), Path(out), sweep)

    def _run_k8s(self, context: dg.AssetExecutionContext, sweep: str, device: str,
                 usual_probes: tuple[float | None, float | None] | None = None) -> dict[str, pd.DataFrame]:
        """One pod for the sweep on the device's node; its tables read back from the shared volume."""
        out = Path(self.k8s.results_dir) / context.run.run_id / f"{sweep}-{uuid.uuid4().hex[:8]}"
        pod = sweep_pod(self.k8s, device, sweep, self.profile, context.run.run_id[:12], out, self.scale(),
                        usual_probes)
        context.log.info(f"{device}: sweep {sweep} in a pod ({pod.image}, nodes {pod.base_pod_spec['node_selector']})")
        try:
            return read_results(run_pod(context, self.k8s, pod), out, sweep)
        finally:
            shutil.rmtree(out, ignore_errors=True)  # the tables are in the warehouse now (or the run failed)
