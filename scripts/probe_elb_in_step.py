"""What a DLRM training step spends on its embedding tables' backward and sparse SGD update
(EL-B), untraced, beside what the model prices for it (issue 14's "what the micro-benchmarks
miss inside a real model"): a measurement to run, not a model.

    .venv/bin/python scripts/probe_elb_in_step.py [--configs quick] [--batch 32 128 512]
        [--rounds 3] [--steps 25]           (DEVCHAR_HOME with a warehouse: the model's price too)

Per (config, batch) it builds the model twice from one seed and times a training step over the
same pool of batches, in interleaved rounds, keeping each build's quickest median:

- full: the step as `make run` times it;
- frozen: the tables' weights with requires_grad off, so no gradient reaches them and the
  optimizer holds only the dense weights (on a CPU SGD steps them one tensor at a time either
  way: torch's foreach path is for GPU tensors).

full - frozen is what the tables' backward and update cost inside the step, autograd nodes
included, and a little more: without a gradient the lookups run torch's forward-only kernel,
which skips some of the forward's bookkeeping (small beside EL-B). Both builds are alive at
once, so the full configs (tables of tens of GB) are refused. With a warehouse, the model's EL-B
price for the same config's capture (embedding backward, priced with its cache blend) and its
traced time (EL-B with the ops it covers) are printed beside it. On the Zen 3 EPYC VM
(2026-12-01, its 5th take's models) DDP's tables cost 2.1 / 5.0 / 11.5 ms of the step at batch
32 / 128 / 512, priced 1.0 / 2.1 / 6.7 (docs/methods.md, "EL-B timed over a pool of index
sets"). Run it on the machine the warehouse calibrated, idle: it is a timing.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_ms(fn, steps: int, warmup: int = 5) -> float:
    """A step's median over `steps` after `warmup`, timed as the workload runs time it."""
    from pipeline.harness.timer import TimingSpec, measure_step

    return measure_step(fn, TimingSpec.fixed(warmup, steps), "cpu").median_us / 1e3


def _variants(spec, batch: int):
    """name -> a training step of the two builds, each over the same pool of batches."""
    from pipeline.workloads.dlrm_run import build_dlrm, make_batches, training_steps

    batches = make_batches(spec, batch)
    frozen = build_dlrm(spec)
    for table in frozen.tables:
        table.weight.requires_grad_(False)
    return {"full": training_steps(build_dlrm(spec), batches), "frozen": training_steps(frozen, batches)}


def _priced(device: str | None) -> dict:
    """(config, batch) -> (priced EL-B ms, traced EL-B ms) of the warehouse's DLRM captures; {}
    without a warehouse."""
    from pipeline.analysis.captures import priced_captures
    from pipeline.core.config import duckdb_path

    found = priced_captures(str(duckdb_path()), "dlrm", device)
    out = {}
    for g, ops in found[1] if found else []:
        elb = ops[ops["model_op"] == "embedding:backward"]
        traced = elb["measured_us"].sum() + ops.loc[ops["status"] == "covered", "measured_us"].sum()
        out[(g["config"], int(g["batch"]))] = (elb["predicted_us"].sum() / 1e3, traced / 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="quick", help="DLRM config set (tiny or quick)")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--device", default=None, help="the warehouse's device (default: its first)")
    args = ap.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be positive, got {getattr(args, name)}")
    bad = [b for b in args.batch if b < 1]
    if bad:
        ap.error(f"--batch must be positive, got {bad[0]}")

    from pipeline.core.errors import DevcharError
    from pipeline.workloads.dlrm import configs_for

    if args.configs == "full":
        ap.error("--configs full: two builds of tables of tens of GB each would be alive at once")
    try:
        specs = configs_for(args.configs)
    except DevcharError as e:
        ap.error(str(e))
    priced = _priced(args.device)
    print("config, batch: untraced step ms (quickest median of each variant); the tables' share; "
          + ("the model's EL-B price and traced EL-B for the warehouse's capture" if priced else "no warehouse"))
    for spec in specs:
        for batch in args.batch:
            steps = _variants(spec, batch)
            times = {name: [] for name in steps}
            for _ in range(args.rounds):  # interleaved: a slow spell must not land on one variant
                for name, fn in steps.items():
                    times[name].append(_median_ms(fn, args.steps))
            best = {name: min(t) for name, t in times.items()}
            line = (f"{spec.name} {batch}: full {best['full']:.2f}, frozen {best['frozen']:.2f} -> tables "
                    f"{best['full'] - best['frozen']:.2f} ms")
            if (spec.name, batch) in priced:
                line += " | EL-B priced {:.2f}, traced {:.2f} ms".format(*priced[(spec.name, batch)])
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
