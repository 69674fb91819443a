"""Fresh processes for CPU workload steps without a fresh interpreter's imports each time.

A fresh interpreter spent ~2 s importing torch and ~4.5 s more for transformers' GPT-2 before
it timed anything: ~80 s of the quick profile's 18 steps on the Xeon VM. The server here
imports them once and forks one child per request. The child starts where a fresh
interpreter stands after those imports: the server runs no torch op, so there is no OpenMP
pool for the fork to lose, and its allocator holds only what the imports left.

Protocol, one request at a time: the parent writes one JSON line (the request) to the
server's stdin; the server forks; the child runs the handler and writes its JSON answer into
a pipe of its own; the server passes on that answer as one line, or {"error": ...} when the
child died without one. A parent that gets no answer in time kills the server's process
group, child included, and the next request starts another server.

multiprocessing's "forkserver" does the forking too, but its child imports the parent's
__main__ again: a script without a main guard would start its sweep over in every child.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
from typing import Callable

READY = "ready"
START_TIMEOUT_S = 600.0  # the imports: seconds on an idle machine, minutes on a swapping one


class ForkServer:
    """The parent's side: one server process, started on the first request."""

    def __init__(self, module: str):
        self.module = module  # run as `python -m <module> --serve`
        self._proc: subprocess.Popen | None = None
        atexit.register(self.close)

    def request(self, payload, timeout_s: float) -> dict | None:
        """The child's answer (a dict; {"error": ...} when it failed); None when none came in
        `timeout_s` (the server and its child are killed then). A server found dead (killed
        since the last request, or before it answered) is started again, once."""
        for _ in range(2):  # a dead server is started again once
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            try:
                self._proc.stdin.write(json.dumps(payload) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                self.close()
                continue
            line = self._read_line(timeout_s)
            if line is None:
                self.close()
                return None
            if line:
                return json.loads(line)
            self.close()  # end of file: the server itself died
        return {"error": "the fork server died twice before answering"}

    def _start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", self.module, "--serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
        if self._read_line(START_TIMEOUT_S) != READY:
            self.close()
            raise RuntimeError(f"the fork server `python -m {self.module} --serve` did not start "
                               f"in {START_TIMEOUT_S:.0f} s")

    def _read_line(self, timeout_s: float) -> str | None:
        """The server's next line, stripped; "" at end of file; None after `timeout_s`."""
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        return self._proc.stdout.readline().strip() if ready else None

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        for f in (self._proc.stdin, self._proc.stdout):
            try:
                f.close()
            except OSError:  # the server is gone: its unflushed stdin has nowhere to go
                pass
        self._proc = None


def serve(preload: list[str], handler: Callable[[object], dict]) -> int:
    """The server's loop: import `preload` (a module it cannot import is skipped), then fork
    one child per request line on stdin, which answers handler(request) down a pipe."""
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    print(READY, flush=True)
    for line in sys.stdin:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(json.loads(line), handler, w)
        os.close(w)
        with os.fdopen(r) as f:
            answer = f.read()
        _, status = os.waitpid(pid, 0)
        if not answer:
            answer = json.dumps({"error": f"it died without a result (exit {os.waitstatus_to_exitcode(status)})"})
        print(answer.replace("\n", " "), flush=True)
    return 0


def _child(request, handler: Callable[[object], dict], w: int) -> None:
    """Run the handler and exit: never back into the server's loop."""
    code = 1
    try:
        os.dup2(2, 1)  # stray prints of the step go to stderr, not into the server's answers
        # A collection writes into every tracked object's header: done now, it copies the pages
        # the child shares with the server once, before anything is timed, instead of inside
        # whichever timed step the collector's oldest generation first runs in (~600 faults a
        # step more than a fresh interpreter had, DLRM-default batch 512 on the Xeon VM)
        gc.collect()
        try:
            answer, code = handler(request), 0
        except BaseException as exc:  # noqa: BLE001 - argparse's SystemExit too: the parent names the step
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(answer))
    finally:
        os._exit(code)
