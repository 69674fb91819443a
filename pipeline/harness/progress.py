"""Progress lines for long sweeps: count, percent and ETA, at most one line every few seconds."""
from __future__ import annotations

import sys
import time
from typing import Callable


class Progress:
    def __init__(self, label: str, total: int, log: Callable[[str], None] | None = None, every_s: float = 3.0):
        self.label, self.total, self.every_s = label, max(total, 1), every_s
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.done, self.start, self.last = 0, time.perf_counter(), 0.0

    def step(self, note: str = "") -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done)
            pct = 100.0 * self.done / self.total
            line = f"[{self.label}] {self.done}/{self.total} ({pct:.0f}%) {elapsed:.0f}s elapsed, ~{eta:.0f}s left"
            self.log(f"{line} {note}".rstrip())
