"""One answer from a fresh interpreter: `python -m MODULE ARGS`, whose last stdout line is a JSON
object. For measurements that must not inherit this process's state (its heap, its threads):
a workload step (workloads/isolated.py), the page-fault ladder (harness/page_faults.py)."""
from __future__ import annotations

import json
import subprocess
import sys


class ChildError(RuntimeError):
    """The child hung, failed, or printed no JSON object last; the message says which."""


def run_module_json(module: str, args: list[str], timeout_s: float) -> dict:
    """The JSON object a fresh `python -m module *args` printed last. Raises ChildError naming
    the timeout, the exit status with the child's last stderr line (its exception), or the
    tail of what it printed instead."""
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ChildError(f"no answer in {timeout_s:g} s") from exc
    except OSError as exc:
        raise ChildError(f"could not start: {exc!r}") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]  # the exception's own line
        raise ChildError(f"failed (exit {done.returncode}): {last}")
    try:
        out = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):  # JSONDecodeError is a ValueError
        out = None
    if not isinstance(out, dict):
        raise ChildError(f"no result line in {done.stdout[-200:]!r}")
    return out
