"""Run a sweep where the device is: `python -m pipeline.runner SWEEP --device auto --out DIR`.

Needs only torch and numpy (pyarrow if present; JSON lines otherwise), and dagster-pipes
when launched by a Dagster Pipes client, so it runs on a bare GPU node. Writes one file per
sweep: DIR/<table>.parquet (or .jsonl), each row carrying `device` and `run_id`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
import uuid
from pathlib import Path

SWEEPS = {  # sweep name -> table it fills
    "device": "devices",
    "gemm": "gemm_samples",
    "utility": "utility_samples",
    "attention": "attention_samples",
    "embedding": "embedding_samples",
    "memory": "memory_samples",
    "workloads": "workload_runs",
    "traces": "workload_graphs",  # and overhead_samples: one capture fills both
    "reference": "reference_timings",  # the peer (NeuSight, Vidur) GEMM shapes timed here
    "gemm_configs": "gemm_config_samples",  # cuBLASLt configurations one by one (CUDA only)
    "opencl": "opencl_launches",
}
ALSO_WRITES = {"traces": ("overhead_samples",), "gemm_configs": ("gemm_config_choices",)}
# sweep -> (module, function(dev, profile, log), which SPELL_ANCHORED's also take calibration_usual=);
# imported only when that sweep runs, so a bare GPU node needs none of the others' dependencies
SWEEP_FUNCS = {
    "gemm": ("pipeline.sweeps.gemm", "sweep_gemm"),
    "utility": ("pipeline.sweeps.utility", "sweep_utility"),
    "attention": ("pipeline.sweeps.attention", "sweep_attention"),
    "embedding": ("pipeline.sweeps.embedding", "sweep_embedding"),
    "memory": ("pipeline.sweeps.memory", "sweep_memory"),
    "workloads": ("pipeline.sweeps.workload_runs", "sweep_workloads"),
    "traces": ("pipeline.sweeps.traces", "sweep_traces"),
    "reference": ("pipeline.sweeps.reference_gemms", "sweep_reference"),
    "gemm_configs": ("pipeline.sweeps.gemm_configs", "sweep_gemm_configs"),
}


# sweeps whose spell test also reads the calibration's usual probe times (--usual-probes,
# harness/spells.anchored_usual): the steps and traces scored against the kernel tables
# the predictors are fitted on, whose GEMM sweep's readings (the stored one's, or this run's) say
# how fast the machine ran then
SPELL_ANCHORED = ("workloads", "traces")


def tables_of(sweep: str) -> tuple[str, ...]:
    """Every table a sweep fills, its main one (SWEEPS) first."""
    return (SWEEPS[sweep], *ALSO_WRITES.get(sweep, ()))


def fix_threads(dev) -> None:
    """Pin the CPU thread count for the whole run, so every timing uses the same parallelism."""
    import torch

    if dev.kind == "cpu" and dev.threads:
        torch.set_num_threads(dev.threads)


def with_threads(dev, threads: int):
    from dataclasses import replace

    from pipeline.core.errors import DevcharError

    if not threads:
        return dev
    if dev.kind != "cpu":
        raise DevcharError(f"--threads {threads}: only a CPU takes a thread count; {dev.slug} is a {dev.kind} device")
    if not 0 < threads <= (dev.threads or 0):
        raise DevcharError(f"--threads {threads}: a CPU can be measured with 1 to its {dev.threads} threads; "
                           f"{dev.slug} is a {dev.kind} device")
    return replace(dev, threads=threads)


def warn_if_busy(dev, log=None) -> None:
    """CPU timings need the cores to ourselves: a thread that waits for a core stalls each
    parallel region by a scheduler tick (~4-8 ms), steadily, so the noise flag misses it."""
    if dev.kind != "cpu" or not hasattr(os, "getloadavg"):
        return
    load = os.getloadavg()[0]
    if load > (dev.threads or 1):
        msg = (f"warning: load average {load:.1f} on {dev.threads} threads: other work is running; "
               "CPU timings from this sweep will be inflated")
        _say(msg, log)


def _warn_if_scaled(sweep: str, log=None) -> None:
    from pipeline.harness.timer import TIMING_SCALE_ENV, timing_scale

    if (scale := timing_scale()) != 1.0:
        _say(f"warning: {sweep}: every time budget x{scale:g} (${TIMING_SCALE_ENV}): a test of what the sweep "
             "fills, not a calibration", log)


def _say(msg: str, log=None) -> None:
    """To the run's log (Dagster Pipes) where there is one, else to stderr."""
    (log or (lambda m: print(m, file=sys.stderr)))(msg)


def run_sweep(sweep: str, device: str = "auto", profile: str = "quick", run_id: str | None = None,
              log=None, out_dir: str | Path | None = None) -> list[dict]:
    """The rows of the sweep's main table (run_sweep_tables has all of them)."""
    return run_sweep_tables(sweep, device, profile, run_id, log, out_dir)[SWEEPS[sweep]]


def run_sweep_tables(sweep: str, device: str = "auto", profile: str = "quick", run_id: str | None = None,
                     log=None, out_dir: str | Path | None = None, threads: int = 0,
                     usual_probes: tuple[float | None, float | None] | None = None) -> dict[str, list[dict]]:
    """`threads` > 0: a CPU measured with fewer threads than it has (the slug, its partition,
    stays the same; device_spec records the count used): a calibration under a changed
    setting, as the drift check sees it. `usual_probes`: the spell probes' usual times in the
    device's calibration, for the SPELL_ANCHORED sweeps."""
    from pipeline.device.discover import identify, resolve
    from pipeline.core.errors import DevcharError
    from pipeline.sweeps.profiles import get_profile

    if sweep not in SWEEPS:
        raise DevcharError(f"unknown sweep {sweep!r}; expected one of {sorted(SWEEPS)}")
    dev = identify(device) if device in ("auto", "cpu", "cuda") else resolve(device)
    prof = get_profile(profile, dev.kind)
    dev = with_threads(dev, threads)
    fix_threads(dev)
    warn_if_busy(dev, log)
    _warn_if_scaled(sweep, log)
    run_id = run_id or uuid.uuid4().hex[:12]
    before = _canary(dev, sweep)
    if sweep == "device":
        from pipeline.device.peaks import device_row

        from pipeline.harness.timer import timing_scale

        # a calibration taken at a scaled budget (a test's) says so in the device's own row
        result = [{**device_row(dev, quick=prof.name != "full"), "timing_scale": timing_scale()}]
    elif sweep == "opencl":  # resumable: a checkpoint under out_dir
        from pipeline.opencl.sweep.sweep import sweep_opencl

        result = sweep_opencl(dev, prof, log, out_dir)
    else:
        from pipeline.harness import random_pool

        module, func = SWEEP_FUNCS[sweep]
        try:
            anchor = {"calibration_usual": usual_probes} if sweep in SPELL_ANCHORED and usual_probes else {}
            result = getattr(importlib.import_module(module), func)(dev, prof, log, **anchor)
        finally:
            random_pool.release()  # the pools hold the sweep's largest inputs
    # a sweep returns its main table's rows, or {table: rows} when one run fills several
    tables = result if isinstance(result, dict) else {SWEEPS[sweep]: result}
    speed = {}
    if before:
        from pipeline.harness.canary import sweep_speed

        probe_us, stalled = sweep_speed(before, _canary(dev, sweep))
        speed = {"canary_us": probe_us}
        if stalled:
            _say(f"warning: {sweep}: {stalled}", log)
    for table, rows in tables.items():
        stamp = speed if table in CANARY_TABLES else {}
        for r in rows:
            r.update(device=dev.slug, run_id=run_id, **stamp)
    return tables


# Tables whose rows carry the probe's time during their sweep (harness/canary.py): what the
# summary sets side by side to tell a drifting machine from a model's error.
CANARY_TABLES = ("gemm_samples", "utility_samples", "attention_samples", "embedding_samples", "memory_samples",
                 "workload_runs")


def _canary(dev, sweep: str) -> float | None:
    if dev.kind != "cpu" or SWEEPS[sweep] not in CANARY_TABLES:
        return None
    from pipeline.harness.canary import canary_us

    return canary_us()


def write_rows(rows: list[dict], out_dir: Path, table: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = out_dir / f"{table}.parquet"
        # every column any row has: from_pylist takes its columns from the first row alone, and
        # dropped a column only later rows carry (gemm_samples' kept_us of faulting outputs)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), path)
    except ImportError:  # a bare GPU node: JSON lines, which devchar loads the same way
        path = out_dir / f"{table}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(path: Path, columns: tuple[str, ...] | None = None) -> list[dict]:
    """The rows of a file write_rows wrote, .parquet or .jsonl, as dicts; `columns` keeps those
    (a column the file lacks is absent from every row). Torch- and dagster-free, for scripts that
    read a device take's files where only pyarrow (or nothing, for JSON lines) is installed."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return rows if columns is None else [{c: r[c] for c in columns if c in r} for r in rows]
    import pyarrow.parquet as pq

    have = None if columns is None else [c for c in columns if c in pq.read_schema(path).names]
    return pq.read_table(path, columns=have).to_pylist()


@contextlib.contextmanager
def timing_scale_set(scale: float | None):
    """$DEVCHAR_TIMING_SCALE (harness/timer.py) set to `scale` for what runs inside, the sweeps'
    own child processes too; None leaves the environment as it is."""
    from pipeline.harness.timer import TIMING_SCALE_ENV, timing_scale

    if scale is None:
        yield
        return
    old = os.environ.get(TIMING_SCALE_ENV)
    os.environ[TIMING_SCALE_ENV] = repr(float(scale))
    try:
        timing_scale()  # one clear error for a bad value, before anything runs
        yield
    finally:
        if old is None:
            os.environ.pop(TIMING_SCALE_ENV, None)
        else:
            os.environ[TIMING_SCALE_ENV] = old


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.runner", description=__doc__)
    ap.add_argument("sweeps", nargs="+", help=f"one or more of {sorted(SWEEPS)} or 'all'")
    from pipeline.core.slugs import device_arg

    ap.add_argument("--device", default="auto", type=device_arg, help="auto, cpu, cuda, or a device slug")
    ap.add_argument("--profile", default=os.environ.get("DEVCHAR_PROFILE", "quick"))
    ap.add_argument("--out", default="runner-out", help="directory for the output files")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--threads", type=int, default=0,
                    help="a CPU measured with this many threads (default 0: all it has); the slug stays")
    ap.add_argument("--timing-scale", type=float, default=None,
                    help="every time budget of the sweeps times this, and below 1 the FLOP caps per point (tests: "
                         "0.25 runs the profile's grids faster, measured less well, the largest points left to the "
                         "fit); default: $DEVCHAR_TIMING_SCALE, else 1")
    ap.add_argument("--usual-probes", default=None, metavar="GEMM_US,HOST_US",
                    help="the spell probes' usual times in the device's calibration (the GEMM sweep's lower "
                         "quartiles; either may be empty): the workloads and traces sweeps then also flag a "
                         "step timed in a spell as long as their own run")
    args = ap.parse_args(argv)
    # torch's C++ warnings (the execution-trace observer announces itself on every capture)
    # would bury the progress lines; errors still print. Set before torch is imported.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from pipeline.core.errors import DevcharError
    from pipeline.harness.spells import usual_of_rows

    names = all_sweeps(args.device) if args.sweeps == ["all"] else args.sweeps
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(timing_scale_set(args.timing_scale))
            usual = parse_usual_probes(args.usual_probes)
        except DevcharError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if usual and not set(names) & set(SPELL_ANCHORED):
            print(f"warning: --usual-probes: none of {names} tests spells against them (only {SPELL_ANCHORED})",
                  file=sys.stderr)
        pipes = _open_pipes(stack)
        log = pipes.log.info if pipes else None
        start = time.perf_counter()
        try:
            for name in names:
                t0 = time.perf_counter()
                tables = run_sweep_tables(name, args.device, args.profile, args.run_id, log, args.out,
                                          args.threads, usual)
                if name == "gemm" and usual is None:  # the runs and traces after it test spells against it too
                    usual = usual_of_rows(tables["gemm_samples"])
                for table, rows in tables.items():
                    path = write_rows(rows, Path(args.out), table)
                    print(f"{name}: {len(rows)} {table} rows -> {path} in {time.perf_counter() - t0:.1f}s",
                          file=sys.stderr, flush=True)
                    if pipes:
                        pipes.report_custom_message({"table": table, "path": str(path), "rows": len(rows)})
            if len(names) > 1:
                print(f"runner: {len(names)} sweeps in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
        except DevcharError as exc:  # bad input: one clear line, not a traceback
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def parse_usual_probes(text: str | None) -> tuple[float | None, float | None] | None:
    """`--usual-probes GEMM_US,HOST_US` as a pair (an empty field: None); None without it."""
    from pipeline.core.errors import DevcharError

    if text is None:
        return None
    fields = text.split(",")
    try:
        pair = tuple(float(f) if f.strip() else None for f in fields)
    except ValueError:
        pair = ()
    if len(pair) != 2 or any(u is not None and not 0 < u < float("inf") for u in pair):
        raise DevcharError(f"--usual-probes {text!r}: expected two positive times in us, GEMM_US,HOST_US "
                           "(either may be empty)")
    return pair if any(u is not None for u in pair) else None


def usual_probes_args(usual: tuple[float | None, float | None] | None) -> list[str]:
    """The runner's `--usual-probes` arguments for `usual` (parse_usual_probes' inverse); none for None."""
    if not usual:
        return []
    return ["--usual-probes", ",".join("" if u is None else repr(float(u)) for u in usual)]


def all_sweeps(device: str) -> list[str]:
    """What `all` means on this device: every sweep that applies to it. The peer references are
    H100 measurements and gemm_configs calls cuBLASLt (both CUDA only); the OpenCL sweep needs
    pyopencl (absent on a bare GPU node) and a device that builds a probe kernel."""
    from pipeline.opencl.sweep.execute import opencl_unusable

    cuda = device.startswith("cuda") or (device == "auto" and _cuda_available())
    names = [s for s in SWEEPS if s not in ("reference", "gemm_configs") or cuda]
    why = opencl_unusable("gpu" if cuda else "cpu")  # no pyopencl, no device, or no compiler for it
    if why:
        print(f"all: {why}: skipping the opencl sweep", file=sys.stderr)
        names.remove("opencl")
    return names


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _open_pipes(stack: contextlib.ExitStack):
    """Talk back to Dagster when launched through Pipes; plain stderr otherwise."""
    if "DAGSTER_PIPES_CONTEXT" not in os.environ:
        return None
    from dagster_pipes import open_dagster_pipes

    return stack.enter_context(open_dagster_pipes())


if __name__ == "__main__":
    sys.exit(main())
