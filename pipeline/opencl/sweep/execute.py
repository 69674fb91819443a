"""Contained OpenCL execution: builds and launches run in a worker process, never in the sweep's.

A generated kernel may loop forever, dereference garbage or fail to compile. The sweep
talks to one worker process (pyopencl on the device's OpenCL platform, PoCL's CPU device
here) over a pipe: a job is one kernel source plus its launches; the worker builds once
(program cache keyed by source) and answers each launch in turn. The parent waits with a
time-out on every answer: a worker that overruns is killed (status "timeout"), one that
dies (segfault, abort, RLIMIT_AS) is reaped (status "crash"), and the next job gets a
fresh worker. A worker serves many kernels, so no process start is paid per launch.

Times come from OpenCL profiling events (CL_QUEUE_PROFILING_ENABLE), end - start.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.errors import DevcharError
from pipeline.harness.timer import TimingSpec

_REPO_ROOT = Path(__file__).resolve().parents[3]

NOT_RUN = "not_run"  # a launch skipped after an earlier one of its job timed out


class OpenCLUnusableError(DevcharError, RuntimeError):
    """The OpenCL device is there but cannot build a one-line kernel (its compiler's error named)."""


def opencl_device_type(device: str) -> str:
    """The OpenCL device the sweep uses for a device slug or kind: a CUDA device's GPU, else the CPU."""
    return "gpu" if device.startswith("cuda") else "cpu"


def opencl_unusable(device_type: str = "cpu") -> str | None:
    """Why the OpenCL sweep cannot run on this machine's `device_type` ("cpu": PoCL, "gpu"): no
    pyopencl, no device, or a device whose compiler cannot build a one-line probe kernel; None
    when the probe builds. Asked in a worker, as the sweep asks, ~1 s. Any other failure (a
    worker that dies or hangs) raises: it is a fault to see, not a machine to skip. PoCL 3.0's
    LLVM names a CPU it does not know "generic" and then refuses that name (an AMD family-26
    EPYC, 2026-11-29): without this, a whole `devchar run` failed at opencl_launches."""
    import importlib.util

    if importlib.util.find_spec("pyopencl") is None:
        return "pyopencl is not installed here"
    try:
        with KernelRunner(Limits(), device_type=device_type) as runner:
            runner.device_info()
    except OpenCLUnusableError as exc:
        return str(exc)
    return None


@dataclass
class Launch:
    gsize: int
    lsize: int
    args: list[dict]  # {"name","type","kind","element", "elements" (buffers) | "value" (scalars)}
    data: dict[int, np.ndarray] = field(default_factory=dict)  # explicit buffer contents by arg index
    readback: int | None = None  # arg index whose buffer comes back after one run (memory analysis)
    timed: bool = True  # False: one run, no timing loop


@dataclass
class LaunchResult:
    status: str  # "ok" | "build_error" | "launch_error" | "timeout" | "crash" | NOT_RUN
    error: str = ""
    times_us: np.ndarray | None = None
    readback: np.ndarray | None = None


@dataclass(frozen=True)
class Limits:
    launch_timeout_s: float = 5.0  # one run of one launch may take this long
    build_timeout_s: float = 30.0
    mem_limit_mb: int = 4096  # RLIMIT_AS of the worker


class KernelRunner:
    """Owns the worker process; `run(source, name, launches)` returns one LaunchResult per launch."""

    def __init__(self, limits: Limits = Limits(), timing: TimingSpec = TimingSpec(), device_type: str = "cpu",
                 recycle_after: int = 200):
        """device_type: "cpu" or "gpu", the OpenCL device to use (the first of that type)."""
        self.limits, self.timing, self.recycle_after = limits, timing, recycle_after
        self.device_type = device_type
        self._proc = self._conn = None
        self._stderr = None  # the worker's stderr, a file: its last line says why it died
        self._jobs = 0
        self.restarts = 0

    def __enter__(self) -> "KernelRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def device_info(self) -> dict:
        """name, compute_units, max_work_group_size, preferred_multiple, global_mem_bytes of the device."""
        self._ensure()
        try:
            self._conn.send(("info",))
        except OSError:  # it died starting (no pyopencl, no platform, RLIMIT_AS): _recv says how
            pass
        msg = self._recv(self.limits.build_timeout_s)
        if msg == "timeout":
            raise RuntimeError("OpenCL worker did not answer the device query")
        if isinstance(msg, tuple) and msg[0] == "crash":
            raise RuntimeError(f"OpenCL worker died before answering the device query: {msg[1]}")
        if isinstance(msg, tuple) and msg[0] == "unusable":
            reason = msg[1] if msg[1].startswith("no OpenCL") else f"the OpenCL {self.device_type} device cannot " \
                f"build a kernel: {msg[1]}"
            raise OpenCLUnusableError(reason)
        return msg

    def run(self, source: str, name: str, launches: list[Launch]) -> list[LaunchResult]:
        results: list[LaunchResult] = []
        crashes = 0
        while len(results) < len(launches):
            todo = launches[len(results):]
            got, fatal = self._run_job(source, name, todo)
            results += got
            left = len(launches) - len(results)
            if fatal in ("timeout", "build"):  # later launches are larger or cannot build: skip
                results += [LaunchResult(NOT_RUN, f"skipped after a {fatal} in this job")] * left
            elif fatal == "crash":
                crashes += 1
                if crashes >= 2:  # the kernel crashes the worker reproducibly: stop feeding it
                    results += [LaunchResult(NOT_RUN, "skipped after two worker crashes")] * left
        return results

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._conn.send(None)
                self._proc.wait(2.0)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    # -- internals -------------------------------------------------------------------------------

    def _ensure(self) -> None:
        if self._proc is not None and (self._proc.poll() is not None or self._jobs >= self.recycle_after):
            self.close()
        if self._proc is None:
            # A plain `python -m ...worker` child, not multiprocessing: it starts from a clean
            # interpreter (no fork of a process holding torch's or PoCL's threads) and does not
            # re-import the caller's __main__. A socket pair carries pickled messages.
            ours, theirs = socket.socketpair()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO_ROOT),
                                                                              os.environ.get("PYTHONPATH")]))}
            env.pop("PYTHONFAULTHANDLER", None)  # its stack dump would bury glibc's last line
            # Its stderr goes to a file, not the terminal: a kernel that writes past its buffers
            # makes glibc abort the worker with "free(): corrupted unsorted chunks", which read
            # like devchar crashing in the middle of `devchar run`; the crash row carries it.
            self._stderr = tempfile.TemporaryFile()
            self._proc = subprocess.Popen(self._worker_argv(theirs.fileno()), pass_fds=[theirs.fileno()], env=env,
                                          stdin=subprocess.DEVNULL, stderr=self._stderr)
            theirs.close()
            self._conn, self._jobs = Connection(ours.detach()), 0
            self._conn.send((self.limits.mem_limit_mb, self.timing, self.device_type))

    @staticmethod
    def _worker_argv(fd: int) -> list[str]:
        return [sys.executable, "-m", "pipeline.opencl.sweep.worker", str(fd)]

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._conn.close()
            self.restarts += 1
        if self._stderr is not None:
            self._stderr.close()
        self._proc = self._conn = self._stderr = None

    def _last_words(self) -> str:
        """The last line the dead worker wrote to stderr (glibc's abort message, a Python
        traceback's last line), or nothing."""
        try:
            self._stderr.flush()
            self._stderr.seek(max(self._stderr.seek(0, os.SEEK_END) - 4096, 0))
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        except (OSError, ValueError, AttributeError):
            return ""
        return f": {lines[-1].strip()[:200]}" if lines else ""

    def _recv(self, timeout_s: float):
        """The next message, or "timeout" / ("crash", text) when the worker overran or died."""
        try:
            if self._conn.poll(timeout_s):
                return self._conn.recv()
        except (EOFError, OSError):
            pass
        try:
            code = self._proc.wait(1.0)
        except subprocess.TimeoutExpired:  # alive but silent: overran its time
            self._kill()
            return "timeout"
        why = (f"worker died (exit code {code})" if code and code > 0
               else f"worker killed by signal {-(code or 0)}") + self._last_words()
        self._kill()
        return ("crash", why)

    def _run_job(self, source: str, name: str, launches: list[Launch]) -> tuple[list[LaunchResult], str | None]:
        self._ensure()
        self._jobs += 1
        self._conn.send(("job", source, name, launches))
        msg = self._recv(self.limits.build_timeout_s)
        if msg == "timeout":
            return [LaunchResult("timeout", "build timed out")], "build"
        if msg[0] == "crash":
            return [LaunchResult("crash", msg[1] + " during build")], "build"
        if msg[0] == "build_error":
            return [LaunchResult("build_error", msg[1])] * len(launches), None
        results = []
        for _launch in launches:
            msg = self._recv(self.limits.launch_timeout_s)  # the first run (or the error)
            if isinstance(msg, tuple) and msg[0] == "tick":  # first run done: allow the timed reps
                _, first_s, reps = msg
                msg = self._recv(self.limits.launch_timeout_s + 2.0 * first_s * reps)
            if msg == "timeout":
                late = LaunchResult("timeout", f"no answer within {self.limits.launch_timeout_s:g}s")
                return results + [late], "timeout"
            if msg[0] == "crash":
                return results + [LaunchResult("crash", msg[1])], "crash"
            if msg[0] == "ok":
                results.append(LaunchResult("ok", "", msg[1], msg[2]))
            else:
                results.append(LaunchResult(msg[0], msg[1]))
        return results, None
