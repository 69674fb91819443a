"""The worker process behind execute.KernelRunner: pyopencl lives here and only here.

Started by execute.KernelRunner as `python -m pipeline.opencl.sweep.worker FD`.
Messages in: (mem_limit_mb, TimingSpec, "cpu" | "gpu") first, then ("info",) |
("job", source, name, launches) | None (exit).
Messages out per job: ("built",) or ("build_error", log); then per launch
("tick", first_run_s, reps) once the warm-up ran, and ("ok", times_us, readback) or
("launch_error", text).
"""
from __future__ import annotations

import re
import resource
import time

import numpy as np

DTYPES = {"char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16, "int": np.int32,
          "uint": np.uint32, "long": np.int64, "ulong": np.uint64, "float": np.float32, "double": np.float64,
          "size_t": np.uint64}


def element_dtype(element: str) -> tuple[type, int]:
    """numpy dtype and lane count of an OpenCL element type ("float4" -> float32, 4; 3 lanes take 4)."""
    base = element.rstrip("0123456789")
    lanes = int(element[len(base):] or 1)
    if base not in DTYPES:
        from pipeline.opencl.sweep.errors import UnsupportedArgError

        raise UnsupportedArgError(f"unsupported OpenCL element type {element!r}")
    return DTYPES[base], 4 if lanes == 3 else lanes


def fill(element: str, elements: int, seed: int, modulo: int | None = None) -> np.ndarray:
    """Host data for a buffer: floats in [0, 1); integers a permutation of 0..elements-1 taken
    modulo `modulo` (the launch's gsize), so an integer array used as indices stays inside
    arrays of gsize elements, the simple method's and the memory probes' assumption."""
    dtype, lanes = element_dtype(element)
    n = elements * lanes
    if np.issubdtype(dtype, np.floating):
        gen_dtype = np.float32 if dtype == np.float32 else np.float64
        return np.random.default_rng(seed).random(n, dtype=gen_dtype).astype(dtype, copy=False)
    step = 1_000_003 if elements % 1_000_003 else 999_983  # coprime with n: (i*step) mod n is a permutation
    vals = (np.arange(n, dtype=np.int64) // lanes * step + seed) % max(min(elements, modulo or elements), 1)
    return vals.astype(dtype)


def _scalar(element: str, value):
    dtype, lanes = element_dtype(element)
    return dtype(value) if lanes == 1 else np.full(lanes, value, dtype=dtype)


class _Device:
    def __init__(self, device_type: str):
        import pyopencl as cl

        self.cl = cl
        want = cl.device_type.GPU if device_type == "gpu" else cl.device_type.CPU
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
        self.dev = next((d for d in devices if d.type & want), devices[0])
        self.ctx = cl.Context([self.dev])
        self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.programs: dict[str, object] = {}
        self.kernels: dict[tuple[str, str], object] = {}

    def info(self) -> dict:
        d = self.dev
        probe = self.build("__kernel void probe(__global int* a) { a[get_global_id(0)] = 0; }")
        pref = probe.probe.get_work_group_info(self.cl.kernel_work_group_info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, d)
        return {"name": d.name.strip(), "platform": d.platform.name.strip(), "compute_units": d.max_compute_units,
                "max_work_group_size": d.max_work_group_size, "preferred_multiple": int(pref),
                "global_mem_bytes": d.global_mem_size, "max_alloc_bytes": d.max_mem_alloc_size}

    def build(self, source: str):
        if source not in self.programs:
            if len(self.programs) > 64:
                self.programs.clear()
            self.programs[source] = self.cl.Program(self.ctx, source).build()
        return self.programs[source]

    def kernel(self, source: str, name: str):
        """One cl.Kernel per (source, name): pyopencl's attribute access makes a new one each time."""
        key = (source, name)
        if key not in self.kernels:
            if len(self.kernels) > 64:
                self.kernels.clear()
            self.kernels[key] = self.cl.Kernel(self.build(source), name)
        return self.kernels[key]

    def launch(self, kernel, launch, timing, send) -> tuple[list[float], np.ndarray | None]:
        cl, mf = self.cl, self.cl.mem_flags
        bufs, out = {}, None
        for i, a in enumerate(launch.args):
            if a["kind"] == "scalar":
                kernel.set_arg(i, _scalar(a["element"], a["value"]))
            elif a["kind"] == "local":
                dtype, lanes = element_dtype(a["element"])
                kernel.set_arg(i, cl.LocalMemory(max(a["elements"], 1) * lanes * np.dtype(dtype).itemsize))
            else:
                host = launch.data.get(i)
                if host is None:
                    host = fill(a["element"], max(a["elements"], 1), seed=i, modulo=launch.gsize)
                bufs[i] = cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(host))
                kernel.set_arg(i, bufs[i])
        run = lambda: cl.enqueue_nd_range_kernel(self.queue, kernel, (launch.gsize,), (launch.lsize,))
        t0 = time.perf_counter()
        ev = run()
        ev.wait()
        first_s = time.perf_counter() - t0
        if launch.readback is not None:
            host = launch.data.get(launch.readback)
            out = np.empty_like(host)
            cl.enqueue_copy(self.queue, out, bufs[launch.readback]).wait()
        times = []
        if launch.timed:
            calls, ev = 1, run()  # a second warm-up call: the first also paid for lsize specialization
            ev.wait()
            while calls < timing.warmup_min or time.perf_counter() - t0 < timing.warmup_s:
                ev = run()
                ev.wait()
                calls += 1
            per_call_s = (ev.profile.end - ev.profile.start) / 1e9 + 20e-6  # + host launch overhead
            reps = int(min(max(timing.budget_s / per_call_s, timing.min_reps), timing.max_reps))
            send(("tick", first_s, reps))
            for _ in range(reps):
                ev = run()
                ev.wait()
                times.append((ev.profile.end - ev.profile.start) / 1e3)
        for b in bufs.values():
            b.release()
        return times, out


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the sweep process dies, so a kernel spinning in an
    endless loop cannot outlive a killed sweep on a shared machine."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(conn) -> None:
    mem_limit_mb, timing, device_type = conn.recv()
    # Containment: a runaway allocation fails here instead of taking the machine's memory,
    # and a crash leaves no core file behind.
    limit = int(mem_limit_mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _die_with_parent()
    try:
        device = _Device(device_type)
    except Exception as exc:  # no platform or device: the device query says so, anything else dies
        if conn.recv()[:1] == ("info",):
            conn.send(("unusable", f"no OpenCL {device_type} device: {_short(exc)}"))
            return
        raise
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "info":  # builds a probe kernel: a compiler that cannot target this CPU says so here
            try:
                conn.send(device.info())
            except Exception as exc:  # noqa: BLE001 - the reason goes back whole, as one line
                conn.send(("unusable", build_log_errors(exc)))
            continue
        _, source, name, launches = msg
        try:
            kernel = device.kernel(source, name)
        except Exception as exc:  # compile errors: clang's error lines from the build log
            found = re.findall(r"error: \S*?:(\d+:\d+: [^\n]+)", str(exc))
            conn.send(("build_error", _short("; ".join(found)) if found else _short(exc)))
            continue
        conn.send(("built",))
        for launch in launches:
            try:
                times, out = device.launch(kernel, launch, timing, conn.send)
                conn.send(("ok", np.asarray(times), out))
            except Exception as exc:
                conn.send(("launch_error", _short(exc)))


def build_log_errors(exc: Exception) -> str:
    """The build log's `error:` lines (PoCL: "unknown target CPU 'generic'" where its LLVM does
    not know the host CPU), else the exception: pyopencl's own message ends with the build
    options, which say nothing."""
    found = list(dict.fromkeys(m.strip() for m in re.findall(r"error: ([^\n]+)", str(exc))))
    return _short("; ".join(found)) if found else _short(exc)


def _short(exc: Exception | str, limit: int = 300) -> str:
    text = " ".join((exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    serve(Connection(int(sys.argv[1])))
