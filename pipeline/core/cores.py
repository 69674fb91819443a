"""How many cores this process may run on: its CPU affinity, not the machine's count (a
container or `taskset` may allow fewer). Here, below every layer that needs it: the device
identity's thread count and the MLP searches' worker count."""
from __future__ import annotations

import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
