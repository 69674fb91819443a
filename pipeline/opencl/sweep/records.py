"""Rows of `opencl_launches`, and the checkpoint that lets a long sweep resume.

The checkpoint is a JSON-lines file: every finished launch row as it arrives, plus a marker
line when a (kernel, method) unit is complete, so a resumed sweep skips finished units
without redoing their memory analysis and skips finished launches inside a partial unit.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pipeline.harness.timer import Measurement
from pipeline.opencl.sweep.worker import element_dtype

_NAN_TIMES = {"median_us": math.nan, "p20_us": math.nan, "p80_us": math.nan, "cv": math.nan, "reps": 0,
              "noisy": False}


def args_json(args: list[dict]) -> str:
    """The `args` column: name, type, kind and elements (buffers) or value (scalars)."""
    keep = ("name", "type", "kind", "elements", "value")
    return json.dumps([{k: a[k] for k in keep if k in a} for a in args])


def buffer_bytes(args: list[dict]) -> int:
    total = 0
    for a in args:
        if a["kind"] == "global":
            dtype, lanes = element_dtype(a["element"])
            total += a["elements"] * lanes * np.dtype(dtype).itemsize
    return total


def launch_row(kernel: dict, method: str, args: list[dict], gsize: int, lsize: int, compute_units: int,
               input_size: int, result, regime: str, plan: str = "") -> dict:
    """One row; `kernel` holds kernel_id, source_hash, suite, family, kernel_name, source."""
    row = {**kernel, "arg_method": method, "args": args_json(args), "gsize": int(gsize), "lsize": int(lsize),
           "work_groups": int(gsize // max(lsize, 1)), "compute_units": int(compute_units),
           "input_size": int(input_size), "regime": regime, "arg_plan": plan, "status": result.status,
           "error": result.error}
    if result.status == "ok" and result.times_us is not None and len(result.times_us):
        m = Measurement(np.asarray(result.times_us, float))
        row.update(median_us=m.median_us, p20_us=m.p20_us, p80_us=m.p80_us, cv=m.cv, reps=m.reps, noisy=m.noisy())
    else:
        row.update(_NAN_TIMES)
    return row


def row_key(row: dict) -> tuple:
    return (row["kernel_id"], row["arg_method"], row["args"], row["gsize"], row["lsize"])


class Checkpoint:
    """Append-only JSONL of finished rows and units; a no-op without a path."""

    def __init__(self, path: Path | None):
        self.path, self.rows, self.units = path, [], set()
        self._by_unit: dict[tuple, list[dict]] = {}
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill: that launch is redone
                    continue
                if "_unit" in rec:
                    self.units.add(tuple(rec["_unit"]))
                else:
                    self._keep(rec)
        self.keys = {row_key(r) for r in self.rows}
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a")

    def _keep(self, row: dict) -> None:
        self.rows.append(row)
        self._by_unit.setdefault((row["kernel_id"], row["arg_method"]), []).append(row)

    def add(self, row: dict) -> None:
        self._keep(row)
        self.keys.add(row_key(row))
        self._write(row)

    def unit_rows(self, kernel_id: str, method: str) -> list[dict]:
        return self._by_unit.get((kernel_id, method), [])

    def finish_unit(self, *unit: str) -> None:
        self.units.add(tuple(unit))
        self._write({"_unit": list(unit)})

    def _write(self, rec: dict) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(rec) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
