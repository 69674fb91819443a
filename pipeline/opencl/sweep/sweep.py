"""The `opencl` sweep -> `opencl_launches` (LLMPerf section II).

For each generated kernel and each argument method (simple; memory = Algorithm 1), for a few
work-group sizes: N_WG drawn idle : under : full = 25 : 60 : 15 against the device's compute
units, then IQR-rebalancing points where the execution times leave gaps (Fig. 1). Then the
benchmark kernels at each input size of the profile. Every build and launch runs in the
contained worker (execute.py); failures are rows with their status, and the sweep goes on.
With an output directory, finished rows go to a checkpoint as they arrive and a rerun
resumes from it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pipeline.harness.progress import Progress
from pipeline.harness.timer import scaled
from pipeline.opencl.sweep import benchmarks, corpus
from pipeline.opencl.sweep.arguments import memory_plans, simple_plan
from pipeline.opencl.sweep.clang_ast import KernelParseError, kernel_params, parse_kernel
from pipeline.opencl.sweep.errors import NoValidArgumentsError
from pipeline.opencl.sweep.execute import NOT_RUN, KernelRunner, Launch, LaunchResult, Limits, opencl_device_type
from pipeline.opencl.sweep.records import Checkpoint, args_json, buffer_bytes, launch_row
from pipeline.opencl.sweep.settings import iqr_rebalance, lsize_choices, sample_work_groups
from pipeline.opencl.sweep.worker import element_dtype

SEED = 20261122
CHECKPOINT = "checkpoint-opencl.jsonl"  # not "opencl_launches.*": the runner's output glob


def _rng(*parts: str) -> np.random.Generator:
    """A generator per unit of work, independent of the order units run in (resume-safe)."""
    return np.random.default_rng([SEED, int(hashlib.sha256("/".join(parts).encode()).hexdigest()[:15], 16)])


def _kernel_cols(k) -> dict:
    return {"kernel_id": k.kernel_id, "source_hash": k.source_hash, "suite": k.suite, "family": k.family,
            "kernel_name": k.name, "source": k.source}


class _Sweep:
    def __init__(self, runner: KernelRunner, info: dict, profile, ck: Checkpoint):
        self.runner, self.info, self.p, self.ck = runner, info, profile, ck
        self.max_bytes = profile.opencl_max_buffer_mb << 20

    def _run(self, kcols: dict, method: str, todo: list[tuple], input_size=None, plan: str = "") -> list[dict]:
        """Runs (launch, regime) pairs not in the checkpoint, ascending gsize; returns their rows."""
        todo = sorted(((la, reg) for la, reg in todo if (kcols["kernel_id"], method, args_json(la.args), la.gsize,
                                                         la.lsize) not in self.ck.keys),
                      key=lambda t: (t[0].gsize, t[0].lsize))
        if not todo:
            return []
        results = self.runner.run(kcols["source"], kcols["kernel_name"], [la for la, _ in todo])
        rows = []
        for (la, regime), res in zip(todo, results):
            if res.status == NOT_RUN:
                continue
            row = launch_row(kcols, method, la.args, la.gsize, la.lsize, self.info["compute_units"],
                             la.gsize if input_size is None else input_size, res, regime, plan)
            self.ck.add(row)
            rows.append(row)
        return rows

    def _launches(self, plan, lsize: int, n_wgs, regime) -> list[tuple]:
        out = []
        for n in sorted(set(int(v) for v in n_wgs)):
            args = plan.args(n * lsize, lsize)
            if buffer_bytes(args) <= self.max_bytes:
                out.append((Launch(n * lsize, lsize, args), regime if isinstance(regime, str) else regime[n]))
        return out

    def kernel(self, k, method: str) -> None:
        kcols, p = _kernel_cols(k), self.p
        rng = _rng(k.kernel_id, method)
        lsizes = lsize_choices(self.info["preferred_multiple"], self.info["max_work_group_size"], p.opencl_lsizes,
                               rng, p.opencl_max_lsize)
        for lsize in lsizes:
            try:
                if method == "simple":
                    plans = [simple_plan(k.source, k.name)]
                else:
                    probes = (2 * lsize, 4 * lsize, 8 * lsize)
                    found = memory_plans(k.source, k.name, self.runner, probes, lsize, p.opencl_max_combos, rng)
                    plans = [found[i] for i in sorted(rng.permutation(len(found))[: p.opencl_memory_plans])]
                    if not plans:
                        raise NoValidArgumentsError(f"no valid scalar combination among {p.opencl_max_combos} probed")
            except (KernelParseError, NoValidArgumentsError) as exc:
                self._run_invalid(kcols, method, lsize, str(exc))
                continue
            for plan in plans:
                draws = sample_work_groups(self.info["compute_units"], p.opencl_settings, rng, p.opencl_full_k)
                regimes = dict(draws[::-1])  # N_WG -> its regime (first draw wins)
                self._run(kcols, method, self._launches(plan, lsize, regimes, regimes), plan=plan.key())
                ok = [r for r in self.ck.unit_rows(k.kernel_id, method) if r["lsize"] == lsize
                      and r["arg_plan"] == plan.key() and r["status"] == "ok" and r["regime"] != "rebalance"]
                extra = iqr_rebalance([r["work_groups"] for r in ok], [r["median_us"] for r in ok], p.opencl_rebalance)
                limit = 16 * p.opencl_full_k * max(self.info["compute_units"], 1)  # 4x the sampled full range
                self._run(kcols, method, self._launches(plan, lsize, [n for n in extra if n <= limit], "rebalance"),
                          plan=plan.key())

    def _run_invalid(self, kcols: dict, method: str, lsize: int, error: str) -> None:
        row = launch_row(kcols, method, [], 0, lsize, self.info["compute_units"], 0,
                         LaunchResult("invalid_args", error[:300]), "none")
        if (row["kernel_id"], method, row["args"], 0, lsize) not in self.ck.keys:
            self.ck.add(row)

    def benchmark(self, b) -> None:
        kcols = {**_kernel_cols(corpus.Kernel(b.kernel_id, b.name, b.name, b.source, "benchmark"))}
        params = kernel_params(parse_kernel(b.source, b.name)[1])
        todo = []
        for size in self.p.opencl_bench_sizes:
            gsize, values = b.build(size, _rng(b.name, str(size)))
            args, data = [], {}
            for i, prm in enumerate(params):
                a = {"name": prm.name, "type": prm.type, "kind": prm.kind, "element": prm.element}
                v = values[prm.name]
                if prm.kind == "scalar":
                    a["value"] = v
                elif prm.kind == "local":
                    a["elements"] = b.lsize
                else:
                    a["elements"] = int(v.size) // element_dtype(prm.element)[1]
                    data[i] = v
                args.append(a)
            if buffer_bytes(args) <= self.max_bytes:
                todo.append((Launch(gsize, b.lsize, args, data), "benchmark", size))
        for la, regime, size in todo:  # one job per size: each row carries its own input_size
            self._run(kcols, "simple", [(la, regime)], input_size=size)


def sweep_opencl(dev, profile, log=None, out_dir: Path | None = None) -> list[dict]:
    """Rows of `opencl_launches` for this device (the runner adds device and run_id)."""
    ck = Checkpoint(Path(out_dir) / CHECKPOINT if out_dir else None)
    kernels = corpus.generate(profile.opencl_kernels, seed=SEED)
    limits = Limits(launch_timeout_s=profile.opencl_launch_timeout_s)
    with KernelRunner(limits, scaled(profile.opencl_timing), device_type=opencl_device_type(dev.kind)) as runner:
        sweep = _Sweep(runner, runner.device_info(), profile, ck)
        units = [(k, m) for k in kernels for m in ("simple", "memory")]
        progress = Progress("opencl", len(units) + len(benchmarks.BENCHMARKS), log)
        for k, method in units:
            if (k.kernel_id, method) not in ck.units:
                sweep.kernel(k, method)
                ck.finish_unit(k.kernel_id, method)
            progress.step(f"{len(ck.rows)} launches")
        for b in benchmarks.BENCHMARKS.values():
            if (b.kernel_id, "benchmark") not in ck.units:
                sweep.benchmark(b)
                ck.finish_unit(b.kernel_id, "benchmark")
            progress.step(f"{len(ck.rows)} launches")
    ck.close()
    return [dict(r) for r in ck.rows]
