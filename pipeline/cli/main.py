"""`devchar`: run (characterize + fit + predict the local device), predict, sql, ui, load."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from pipeline.cli.common import local_slug, prepare_home, warehouse
from pipeline.cli.run_plan import LOCAL_KINDS, load_reference_only_tables, reference_plan, skipping
from pipeline.core.config import REPO_ROOT, devchar_home, mlflow_uri
from pipeline.core.errors import DevcharError



def cmd_run(args) -> int:
    prepare_home()
    import dagster as dg

    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import devices

    if args.device in LOCAL_KINDS:
        from pipeline.device.discover import identify

        slug, source, selection = identify(args.device).slug, "measured", None
        args.skip = [*(getattr(args, "skip", None) or []), *_unusable_opencl(slug, args)]
    else:
        slug, selection = reference_plan(args.device)
        from resources.devices import reference_dir

        source = f"from its committed calibration {reference_dir(slug)}"
    if getattr(args, "skip", None):
        selection = skipping(selection, args.skip, getattr(args, "expect_failing", None) or [])
    instance = dg.DagsterInstance.get()
    if not instance.has_dynamic_partition(devices.name, slug):
        instance.add_dynamic_partitions(devices.name, [slug])
    run_config = run_config_for(args, reference=args.device not in LOCAL_KINDS)
    print(f"devchar: characterizing {slug} ({source}; profile {run_profile(run_config)}); "
          f"state in {devchar_home()}", flush=True)
    if args.in_process:
        result = defs.resolve_job_def("characterize_device").execute_in_process(
            partition_key=slug, instance=instance, raise_on_error=False, run_config=run_config,
            asset_selection=selection)
    else:
        from pipeline.cli.launch import launch

        result = launch(instance, "characterize_device", partition_key=slug, run_config=run_config,
                        asset_selection=selection)
        print(f"devchar: run {result.run_id} of code location {result.location}: "
              "in the UI's Runs, re-executable from there", flush=True)
    if args.device not in LOCAL_KINDS:
        load_reference_only_tables(slug)
    print(summary(slug, result.run_id))
    return _report_run(result, slug, set(getattr(args, "expect_failing", []) or []))


def _unusable_opencl(slug: str, args=None) -> list[str]:
    """["opencl_launches"] when this machine's OpenCL device cannot run the launch sweep (no
    pyopencl, no device, or a compiler that cannot build for this CPU; the reason printed): the
    rest of the run characterizes the device without it, as `python -m pipeline.runner all`
    does, instead of failing at that one sweep. Checks of the OpenCL assets that --expect-failing
    names are dropped with a note: they cannot fail in a run that leaves them out."""
    opencl = {"opencl_launches", "opencl_models"}
    if args is not None and "opencl_launches" in (getattr(args, "skip", None) or []):
        return []  # left out already
    from pipeline.opencl.sweep.execute import opencl_device_type, opencl_unusable

    why = opencl_unusable(opencl_device_type(slug))
    if why is None:
        return []
    print(f"devchar: {why}; the OpenCL launch sweep cannot run on this machine", flush=True)
    expected, asked = getattr(args, "expect_failing", None) or [], set(getattr(args, "skip", None) or [])
    # a check of an asset the user skipped stays: `skipping` names that clash as one error
    dropped = [c for c in expected if c.split(".")[0] in opencl - asked]
    if dropped:
        args.expect_failing = [c for c in expected if c not in dropped]
        print(f"devchar: --expect-failing {', '.join(dropped)}: not run here, dropped", flush=True)
    return ["opencl_launches"]


def run_config_for(args, reference: bool) -> dict:
    """The run config of `devchar run`: the console's log level, and the device_runner's
    settings that the command line gives (--profile; a reference calibration for --device
    <slug>) over what the code location configures (DEVCHAR_PROFILE, resources/env.py)."""
    runner = {**({"profile": args.profile} if args.profile else {}), **({"source": "reference"} if reference else {}),
              **({"threads": args.threads} if getattr(args, "threads", 0) else {})}
    run_config = {"loggers": {"console": {"config": {"log_level": args.log_level}}}}
    if runner:
        run_config["resources"] = {"device_runner": {"config": runner}}
    return run_config


def run_profile(run_config: dict) -> str:
    """The profile the run sweeps with: run config's, else the code location's device_runner's."""
    from resources.devices import DeviceRunner
    from resources.env import resolved

    given = run_config.get("resources", {}).get("device_runner", {}).get("config", {}).get("profile")
    return given or resolved(DeviceRunner).profile


def _report_run(result, slug: str, expected: set[str] = frozenset()) -> int:
    """cmd_run's verdict on a finished run: 0, 130 for an interrupted one (told as such, not as
    the steps the interrupt stopped), 1 for a failure, explained (pipeline/analysis/run_report.py).
    expected: blocking checks ("asset.check") known to fail; failing exactly those is a 0."""
    from pipeline.analysis.run_report import (describe_checks, device_threads, explain_failure, failures,
                                              interrupted_steps, noisy_shares, report_expected)
    from resources.env import resolved
    from resources.quality import QualityGates

    interrupted = interrupted_steps(result.all_events)
    if interrupted is not None:
        where = f" in {interrupted}" if interrupted else ""
        print(f"devchar: run {result.run_id} interrupted{where}; each table and model is written whole or not "
              "at all, so what finished before it is kept: run `devchar run` again to finish", file=sys.stderr)
        return 130
    checks, steps = failures(result.all_events)
    if expected:
        return report_expected(result.run_id, checks, steps, expected)
    if not result.success or any(c.blocking for c in checks):
        wh = warehouse()
        where = [c.asset for c in checks if c.blocking] + [s.step for s in steps]
        print(f"devchar: run {result.run_id} failed at {where}; its logs: `make ui`", file=sys.stderr)
        print(explain_failure(checks, steps, noisy_shares(wh, slug), device_threads(wh, slug),
                              resolved(QualityGates).gates()), file=sys.stderr)
        return 1
    if checks:  # the run succeeded; its warnings (drift, sweep noise) are still worth a line each
        print(f"devchar: run {result.run_id} succeeded with {len(checks)} check warning(s):")
        print(describe_checks(checks))
    return 0


def summary(device: str, run_id: str | None = None) -> str:
    from pipeline.analysis.report import render_summary

    return render_summary(warehouse(), device, run_id)


def cmd_predict(args) -> int:
    if args.hf_config or args.module:
        from pipeline.cli.predict import predict_captured

        return predict_captured(args)
    if getattr(args, "breakdown", False):
        raise DevcharError("--breakdown needs a captured model: give --hf-config or --module")
    from pipeline.cli.predict import champion_model, say_fallbacks
    from pipeline.predict.workload import extrapolation, extrapolation_warnings, predict_ops
    from pipeline.workloads.gpt2 import GPT2Spec, gpt2_ops
    from pipeline.core.dtypes import check_dtype

    spec = GPT2Spec(args.name, args.layers, args.hidden, args.heads, args.vocab)
    ops = gpt2_ops(spec, args.batch, args.seq, bias_copy=args.device.startswith("cpu"))  # validates first
    # the MLflow registry's champion (the store version it records), else the store's latest passing
    gemm, utility = champion_model(args.device, "gemm_model"), champion_model(args.device, "utility_model")
    dtype = check_dtype(args.dtype)
    total, by_type = predict_ops(ops, dtype, gemm, utility)
    parts = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(by_type.items()))
    print(f"{spec.name} batch={args.batch} seq={args.seq} on {args.device}: predicted {total / 1e3:.2f} ms ({parts})")
    for line in extrapolation_warnings(extrapolation(ops, dtype, gemm)):
        print(f"devchar: warning: {line}", file=sys.stderr)
    say_fallbacks()
    return 0


def cmd_sql(args) -> int:
    """One read-only statement (DuckDBWarehouse.user_query); errors are one line."""
    import pandas as pd

    df = warehouse().user_query(args.query)
    with pd.option_context("display.max_rows", 200, "display.width", 200, "display.max_columns", 30):
        print(df.to_string(index=False))
    return 0


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def cmd_ui(args) -> int:
    prepare_home()
    if not _is_loopback(args.host):
        print(f"devchar: warning: --host {args.host} serves the Dagster UI and its GraphQL API, which has no "
              "authentication, to the network: anyone who reaches the port can launch runs and wipe partitions. "
              "Serve it on 127.0.0.1, or behind a proxy that authenticates.", file=sys.stderr)
    print(f"Dagster UI on http://{args.host}:{args.port}  (MLflow: mlflow ui --backend-store-uri {mlflow_uri()})")
    return subprocess.call([sys.executable, "-m", "dagster", "dev", "-w", str(REPO_ROOT / "workspace.yaml"),
                            "-h", args.host, "-p", str(args.port)], cwd=REPO_ROOT)


def _load_parts(directory: Path) -> list[tuple]:
    """(table, device, rows) for every runner file in `directory`, each checked against the
    table contract (pipeline/core/tables.py) before anything is written. The runner's resume file
    (checkpoint-*.jsonl) and files that are not .parquet/.jsonl are passed over."""
    from pipeline.runner import SWEEPS, tables_of
    from pipeline.core.tables import validate
    from resources.devices import read_rows

    if not directory.is_dir():
        raise DevcharError(f"no such directory: {directory}")
    known, seen, parts = sorted({t for sweep in SWEEPS for t in tables_of(sweep)}), {}, []
    for path in sorted(directory.iterdir()):
        if path.suffix not in (".parquet", ".jsonl") or path.name.startswith("checkpoint-") or not path.is_file():
            continue
        table = path.stem
        if table not in known:
            raise DevcharError(f"{path}: no table {table!r}; runner files are <table>.parquet or .jsonl for {known}")
        if table in seen:
            raise DevcharError(f"{path}: {table} is also in {seen[table]}; keep one file per table")
        seen[table] = path.name
        try:
            df = read_rows(path)
        except (OSError, ValueError) as exc:
            raise DevcharError(f"{path}: cannot read it: {' '.join(str(exc).split())}") from exc
        validate(table, df, str(path))
        parts += [(table, str(device), rows) for device, rows in df.groupby("device", sort=True)]
    if not parts:
        raise DevcharError(f"{directory} holds no runner output (<table>.parquet or .jsonl for {known})")
    return parts


def cmd_load(args) -> int:
    """Load a runner output directory (e.g. a GPU node's parquet) into the warehouse: every file
    is validated first, then all of them replace their devices' rows in one transaction."""
    parts = _load_parts(Path(args.dir))
    warehouse().replace_partitions(parts)
    for table, device, rows in parts:
        print(f"loaded {table}: {len(rows)} rows for {device}")
    return 0


def cmd_bench_predict(args) -> int:
    from pipeline.analysis.bench import bench_predict
    from pipeline.core.config import model_store_root
    from pipeline.predict import store

    device = local_slug(args.device)
    gemm = store.load(model_store_root(), device, "gemm_model")
    baselines = {}
    for name in store.BASELINES:
        try:
            baselines[name] = store.load(model_store_root(), device, name)
        except DevcharError as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
    for name, per_s in bench_predict(gemm, baselines, n_vector=args.n).items():
        print(f"{name}: {per_s:,.0f} predictions/s")
    return 0


def cmd_predict_grid(args) -> int:
    from pipeline.analysis.grid_cache import TABLE, LayerGrid, write_grid
    from pipeline.cli.predict import champion_model, say_fallbacks

    device = local_slug(args.device)
    grid = LayerGrid(tuple(int(f) for f in args.features.split(",")) if args.features else LayerGrid.features,
                     args.batch_max, args.seq_min, args.seq_max, args.seq_step)
    gemm = champion_model(device, "gemm_model")
    say_fallbacks()
    print(f"predict-grid: {grid.rows:,} {args.op} {args.dtype} shapes for {device} -> {TABLE}", flush=True)
    with warehouse().connect() as con:
        rows, secs = write_grid(con, gemm, device, grid, args.op, args.dtype)
    print(f"predict-grid: {rows:,} rows in {secs:.1f} s ({rows / secs:,.0f} rows/s)")
    return 0


def _lazy(name: str):
    """A command from cli_predict, imported only when it runs (keeps `devchar --help` quick)."""
    from pipeline.cli import predict as cli_predict

    return getattr(cli_predict, name)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="devchar", description="Characterize a device and predict DL workload latency.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="characterize a device, fit, predict, print a summary")
    r.add_argument("--device", default="auto",
                   help="auto, cpu or cuda (measure this machine), or the slug of a committed reference "
                        "calibration under models_store/reference/ (fit and predict from it, measure nothing)")
    r.add_argument("--profile", default=None, help="tiny, quick (default) or full")
    r.add_argument("--log-level", default="INFO", help="Dagster console log level (DEBUG shows every event)")
    r.add_argument("--threads", type=int, default=0,
                   help="measure this CPU with fewer of its threads, under the same device slug: a changed "
                        "setting whose re-calibration the drift check flags (default: all of them)")
    r.add_argument("--in-process", action="store_true",
                   help="run the steps in this process (for a debugger) instead of launching the run through "
                        "the code location; such a run is not listed under the UI's Jobs")
    r.add_argument("--expect-failing", action="append", default=[], metavar="ASSET.CHECK",
                   help="a blocking check this calibration is known to fail (repeatable): exit 0 when exactly "
                        "these fail, 1 when another fails or one of them now passes (make check-references "
                        "reads them from a reference's expected_check_failures)")
    r.add_argument("--skip", action="append", default=[], metavar="ASSET",
                   help="leave this asset and everything downstream of it out of the run (repeatable), e.g. "
                        "opencl_models on a machine where its fit is not wanted")
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("predict", help="predict a GPT-2-family forward pass with a device's saved models")
    p.add_argument("--device", required=True, help="device slug (see `devchar sql 'select name from devices'`)")
    p.add_argument("--name", default="custom")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hf-config", default=None, help="a Hugging Face config.json (any causal LM; random weights)")
    p.add_argument("--module", default=None, help="pkg.module:factory returning (module_or_callable, inputs)")
    p.add_argument("--measure", action="store_true", help="also run it here and print the measured time")
    p.add_argument("--breakdown", action="store_true",
                   help="with --hf-config/--module: per op kind, traced self time in the captured run beside "
                        "the predicted time")
    p.set_defaults(fn=cmd_predict)
    s = sub.add_parser("sql", help="run one read-only SQL statement against the DuckDB warehouse")
    s.add_argument("query", help="exactly one statement; it can read the warehouse's tables and nothing else")
    s.set_defaults(fn=cmd_sql)
    u = sub.add_parser("ui", help="serve the Dagster UI (dagster dev)")
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=3000)
    u.set_defaults(fn=cmd_ui)
    bp = sub.add_parser("bench-predict", help="predictions per second: vectorized, per-shape loop, baselines")
    bp.add_argument("--device", default=None, help="device slug (default: the local device)")
    bp.add_argument("--n", type=int, default=10_000_000, help="shapes for the vectorized run")
    bp.set_defaults(fn=cmd_bench_predict)
    pg = sub.add_parser("predict-grid", help="cache one MatMul layer's predictions over a NAS grid in DuckDB")
    pg.add_argument("--device", default=None, help="device slug (default: the local device)")
    pg.add_argument("--op", default="linear")
    pg.add_argument("--dtype", default="float32")
    pg.add_argument("--features", default=None, help="comma-separated in/out feature choices (default: 14 sizes)")
    pg.add_argument("--batch-max", type=int, default=256)
    pg.add_argument("--seq-min", type=int, default=64)
    pg.add_argument("--seq-max", type=int, default=8192)
    pg.add_argument("--seq-step", type=int, default=64, help="1 gives PM2Lat's full 400M-row grid")
    pg.set_defaults(fn=cmd_predict_grid)
    w = sub.add_parser("what-if", help="predict a captured workload at another batch size or with fused lookups")
    w.add_argument("--device", default=None, help="device slug (default: the local device)")
    w.add_argument("--config", required=True, help="a traced config, e.g. dlrm_default-cpu or gpt2-2l-256")
    w.add_argument("--batch", type=int, required=True, help="the captured batch size to start from")
    w.add_argument("--new-batch", type=int, default=None, help="predict at this batch size instead")
    w.add_argument("--fuse-embeddings", action="store_true", help="one batched EmbeddingBag (DLRM paper Fig. 11)")
    w.add_argument("--measure", action="store_true", help="also run the transformed DLRM here and time it")
    w.add_argument("--breakdown", action="store_true",
                   help="per op kind: traced self time in the captured run beside the predicted time")
    w.set_defaults(fn=lambda a: _lazy("cmd_what_if")(a))
    rf = sub.add_parser("reference", help="devchar's GEMM error on the peer H100 shapes (NeuSight fp32, Vidur fp16)")
    rf.add_argument("--device", default=None, help="device slug (default: the local device)")
    rf.set_defaults(fn=lambda a: _lazy("cmd_reference")(a))
    ld = sub.add_parser("load", help="validate a `python -m pipeline.runner` output directory, then load it into "
                                     "DuckDB (all or nothing)")
    ld.add_argument("dir", help="holds <table>.parquet or <table>.jsonl files")
    ld.set_defaults(fn=cmd_load)
    __import__("pipeline.cli.advise", fromlist=["register"]).register(sub)
    __import__("pipeline.cli.plan", fromlist=["register"]).register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    ap.add_argument("--debug", action="store_true", help="show a traceback instead of a one-line error")
    args = ap.parse_args(argv)
    # As the runner does: torch's C++ warnings (the execution-trace observer announces each
    # capture of `predict --hf-config/--module`) would bury the answer; errors still print.
    # Read when torch loads, which no command has done yet.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        return args.fn(args)
    except DevcharError as exc:
        if args.debug:
            raise
        print(f"devchar: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"devchar: {args.cmd} interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
