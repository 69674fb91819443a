"""The text summary `devchar run` prints: device, held-out model errors, GPT-2 predicted vs measured."""
from __future__ import annotations


def _present(x) -> bool:
    import pandas as pd

    return not pd.isna(x)


def _fmt_flops(x) -> str:
    """TFLOP/s, or GFLOP/s below one (a CPU's bf16 in software: 0.001 TFLOP/s read "0.00")."""
    if not _present(x):
        return "-"
    return f"{x / 1e12:.2f} TFLOP/s" if x >= 999.5e9 else f"{x / 1e9:.3g} GFLOP/s"


def render_summary(warehouse, device: str, run_id: str | None = None) -> str:
    """run_id: the run just finished; Table II comes from its own evaluation, or, when a failed
    check stopped that, from the fits' own held-out errors (never a previous run's table)."""
    lines = [f"\n== device {device} =="]
    if warehouse.has_table("devices"):
        d = warehouse.query("SELECT * FROM devices WHERE device = ?", [device])
        if not d.empty:
            r = d.iloc[0]
            units = f"{r['sm_count']} SMs" if r["kind"] == "cuda" else f"{r['threads']} threads"
            lines.append(f"{r['model']} ({r['kind']}, {units}), torch {r['torch_version']}")
            peaks = ", ".join(f"{dt} {_fmt_flops(r[f'peak_flops_{dt}'])}" for dt in
                              ("float32", "tf32", "bfloat16", "float16") if _present(r.get(f"peak_flops_{dt}")))
            lines.append(f"measured peaks: {peaks}; copy bandwidth {r['bandwidth_gbps']:.1f} GB/s")
    e = None
    if warehouse.has_table("model_errors"):
        e = warehouse.query("SELECT model, layer_type, dtype, n, mean_rel_err, max_rel_err, run_id FROM model_errors "
                            "WHERE device = ? ORDER BY dtype, layer_type", [device])
        if run_id is not None and "run_id" in e:
            e = e[e["run_id"].astype(str) == run_id[:12]]
        e = e.drop(columns="run_id", errors="ignore")
    own = None
    if e is None or not (e["model"] == "devchar").any():
        lines.append(_fitted_errors(device))  # model_evaluation did not run: what each fit measured itself
    if e is not None and not e.empty:
        own = e[e["model"] == "devchar"].drop(columns="model")
        if not own.empty:  # else the fits' own errors above stand in (a table of nothing says nothing)
            lines.append("\n-- held-out error per layer type (PM2Lat Table II analog; shapes never fitted) --")
            lines.append(own.to_string(index=False, formatters={"mean_rel_err": "{:.1%}".format,
                                                                "max_rel_err": "{:.1%}".format}))
        if e["model"].nunique() > 1:
            lines.append("\n-- mean relative error, devchar beside the baselines --")
            pivot = e.pivot_table(index=["layer_type", "dtype"], columns="model", values="mean_rel_err")
            lines.append(pivot.map(lambda v: "-" if v != v else f"{v:.1%}").to_string())
    lines += _repeat_lines(warehouse, device, own)
    if warehouse.has_table("predictions"):
        p = warehouse.query("SELECT * FROM predictions WHERE device = ? ORDER BY workload, config, batch, seq",
                            [device])
        if run_id is not None and "run_id" in p:
            stale = sorted(set(p["workload"]) - set(p.loc[p["run_id"].astype(str) == run_id[:12], "workload"]))
            p = p[p["run_id"].astype(str) == run_id[:12]]
            lines += [f"\n-- {_TITLES.get(w, w)}: not predicted in this run (a failed check or step stopped it) --"
                      for w in stale]
        p, spread = _with_pass_spread(warehouse, device, p)
        for workload, g in p.groupby("workload", sort=False):
            lines.append(_workload_section(workload, g))
        lines += spread + _speed_drift(warehouse, device) + _probe_speeds(warehouse, device)
    return "\n".join(lines)


def _repeat_lines(warehouse, device: str, own) -> list[str]:
    """The GEMM, utility and memory sweeps' repeat timings beside devchar's held-out errors (analysis/repeat.py)."""
    import pandas as pd

    from pipeline.analysis.repeat import repeat_section
    from pipeline.predict.memory import kernel_name

    # memory kernels go by the DLRM paper's names (as in model_errors); the others by PM2Lat's types
    kinds = {"gemm_samples": None, "utility_samples": None, "memory_samples": kernel_name}
    held = []
    for table, kind in kinds.items():
        if not warehouse.has_table(table):
            continue
        # one run's rows per device: a re-materialization replaces them
        h = warehouse.query(f"SELECT * FROM {table} WHERE device = ? AND held_out", [device])
        if "repeat_us" in h:
            held.append(h.assign(layer_type=h["op"].map(kind)) if kind else h)
    return repeat_section(pd.concat(held, ignore_index=True), own) if held else []


def _speed_drift(warehouse, device: str) -> list[str]:
    """One line: how much slower or faster the machine ran the workloads than the GEMM sweep,
    by the probe each sweep timed (harness/canary.py); nothing without both probes."""
    from pipeline.harness.canary import STALLED_RATIO, apart, drift

    med = _medians(warehouse, device, ("gemm_samples", "workload_runs"), "canary_us")
    if len(med) < 2:
        return []
    if apart(med["gemm_samples"], med["workload_runs"]):  # e.g. a take whose GEMM probe stalled
        return [f"\nmachine speed: the speed probe read {med['gemm_samples']:.0f} us during the GEMM sweep and "
                f"{med['workload_runs']:.0f} us during the workload runs, more than {STALLED_RATIO:g}x apart: a "
                "stalled probe, not the machine drifting; no drift read from it"]
    d = drift(med["gemm_samples"], med["workload_runs"])
    return [f"\nmachine speed: the speed probe ran {abs(d):.1%} {'slower' if d > 0 else 'faster'} during the "
            f"workload runs than during the GEMM sweep; predictions {'under' if d > 0 else 'over'} the measured "
            f"steps by about that much are the machine drifting, not the model"]


def _medians(warehouse, device: str, tables: tuple[str, ...], column: str) -> dict[str, float]:
    """table -> the median of `column` over the device's rows, for the tables that have readings in it."""
    import pandas as pd

    med = {}
    for table in tables:
        if warehouse.has_table(table):
            rows = warehouse.query(f"SELECT * FROM {table} WHERE device = ?", [device])
            if column in rows and rows[column].notna().any():
                med[table] = float(pd.to_numeric(rows[column]).median())
    return med


PROBE_SPEED_APART = 0.10  # a probe's medians closer than this: no line (the host probe's two states are ~2x apart)
# where the spell probes are read (harness/spells.py), in the order a take runs them: table -> when
PROBE_PHASES = {"gemm_samples": "the GEMM sweep", "utility_samples": "the utility sweep",
               "attention_samples": "the attention sweep", "embedding_samples": "the embedding sweep",
               "memory_samples": "the memory sweep", "workload_graphs": "the traces",
               "workload_runs": "the workload runs"}


def _probe_speeds(warehouse, device: str) -> list[str]:
    """Two lines at most: how fast the machine ran in each sweep of the take (the kernel sweeps the
    tables are fitted on, the traces the shared overheads come from, the workload runs they are
    scored against) by each spell probe's median per table (harness/spells.py). A probe's line
    only with the runs' readings, when the phases it compares are PROBE_SPEED_APART or more apart:
    for the GEMM probe the GEMM sweep, the traces and the runs (what prices, adds to and is scored;
    a spell in the embedding sweep alone says nothing about them), for the host probe every phase.
    The GEMM probe's line since a take (Zen 5 EPYC VM, 2026-11-30 16:21) whose probe read 35 us
    through the workload runs against 23 us in every sweep before them, its steps 1.3-1.6x the
    reference take's, while the speed probe (canary.py) before and after the runs read 3 % apart."""
    lines = []
    for column, against, head, digits, why in (
            ("probe_us", ("gemm_samples", "workload_graphs", "workload_runs"),
             "machine spells: the spell probe (a 128^3 mm, its median) took", 1,
             "a step timed while it read slow ran slow with it, so an error of about the ratio between the "
             "workload runs and the GEMM sweep is the machine's state, not the model"),
            ("host_probe_us", tuple(PROBE_PHASES), "host speed: a tiny op took (the host probe's median)", 2,
             "the steps of many small ops (DLRM, batch 1) and their shared overheads move with it, and small "
             "memory-bound kernels may; an error of about the ratio between the traces and the runs is the "
             "host's state, not the model")):
        med = _medians(warehouse, device, tuple(PROBE_PHASES), column)
        compared = [us for t, us in med.items() if t in against]
        if "workload_runs" in med and len(compared) > 1 and max(compared) >= (1 + PROBE_SPEED_APART) * min(compared):
            said = ", ".join(f"{us:.{digits}f} us during {PROBE_PHASES[t]}" for t, us in med.items())
            lines.append(f"{head} {said}: {why}")
    return lines


_TITLES = {"gpt2": "GPT-2 forward", "dlrm": "DLRM training step"}


PASSES_APART = "passes_apart"  # the summary's column: how far a step's timed passes were apart


def _with_pass_spread(warehouse, device: str, p):
    """The predictions with each measured step's pass spread (workload_runs' `pass_spread`, the
    slowest pass over the quickest), and a line on how well the steps repeated; the predictions
    unchanged and no line where the runs were timed once (a GPU, the tiny profile, an older take)."""
    import pandas as pd

    if not warehouse.has_table("workload_runs"):
        return p, []
    runs = warehouse.query("SELECT * FROM workload_runs WHERE device = ?", [device])
    if "pass_spread" not in runs or runs["pass_spread"].isna().all() or runs["passes"].max() < 2:
        return p, []
    key = ["workload", "config", "batch", "seq"]
    runs = runs[key + ["pass_spread", "passes"]].rename(columns={"pass_spread": PASSES_APART})
    merged = p.merge(runs.drop(columns="passes"), on=key, how="left")
    # a prediction without its run's spread would drop out of the sections' pivot: keep the column
    # only where every row has one
    p = merged if merged[PASSES_APART].notna().all() else p
    s = pd.to_numeric(runs[PASSES_APART])
    worst = runs.loc[s.idxmax()]
    passes = int(runs["passes"].min())
    extra = int((runs["passes"] > passes).sum())
    again = f", and {extra} timed once more where their passes disagreed" if extra else ""
    return p, [f"\nworkload steps timed in {passes} passes, a whole pass apart{again}: their timings differed by "
               f"{s.median():.1%} (median over steps), at most {s.max():.1%} ({worst['workload']} "
               f"{worst['config']} b={worst['batch']}); each step keeps its quickest. An error near a step's "
               f"`{PASSES_APART}` is what this machine's timings let any prediction score."]


def _workload_section(workload: str, p) -> str:
    """Predicted vs measured per run, one column per predictor, and Table V's summary."""
    from pipeline.predict.graph_predict import table_v

    index = ["config", "batch", "seq", "measured_ms"] + ([PASSES_APART] if PASSES_APART in p else [])
    wide = p.pivot_table(index=index, columns="predictor", values="rel_err")
    wide = wide.reset_index()
    fmt = {c: "{:+.1%}".format for c in wide.columns if c not in index}
    fmt["measured_ms"] = "{:.2f}".format
    if PASSES_APART in wide:
        fmt[PASSES_APART] = "{:.1%}".format
    tv = table_v(p)
    out = [f"\n-- {_TITLES.get(workload, workload)}: error of each predictor against the measured step (ms) --",
           wide.to_string(index=False, formatters=fmt),
           "\nper predictor (DLRM paper Table V style): geomean / min / max |error|, and the mean"]
    out += [f"  {r.predictor}: {r.geomean_abs_err:.1%} / {r.min_abs_err:.1%} / {r.max_abs_err:.1%} "
            f"(n={r.n}; mean {r.mean_abs_err:.1%})"
            for r in tv.itertuples()]
    return "\n".join(out)


FITTED = ("gemm_model", "utility_model", "attention_model")


def _fitted_errors(device: str) -> str:
    """Held-out errors from each model's newest saved version, passed or not: the Table II
    section is never empty when a fit ran but a failed check stopped the evaluation."""
    import json

    import pandas as pd

    from pipeline.core.config import model_store_root
    from pipeline.core.errors import DevcharError
    from pipeline.predict import store
    from pipeline.core.slugs import under

    frames = []
    for name in FITTED:
        try:
            found = store.versions(model_store_root(), device, name)
        except DevcharError:
            found = []
        if not found:
            continue
        meta = json.loads(under(model_store_root(), device, name, found[-1], "meta.json").read_text())
        verdict = "passed" if meta.get("heldout_check_passed", True) else "FAILED its check"
        frames.append(pd.DataFrame(meta.get("errors", [])).assign(model=f"{name} ({verdict})"))
    if not frames:
        return "\n-- held-out error: no model was fitted --"
    df = pd.concat(frames, ignore_index=True)
    cols = [c for c in ("model", "op", "dtype", "n", "median_rel_err", "mean_rel_err", "max_rel_err") if c in df]
    pct = {c: "{:.1%}".format for c in cols if c.endswith("_rel_err")}
    return ("\n-- held-out error per (op, dtype), from each fit (the evaluation did not run) --\n"
            + df[cols].to_string(index=False, formatters=pct))
