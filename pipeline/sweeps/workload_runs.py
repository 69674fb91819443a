"""workload_runs: real measured steps — GPT-2-family forward passes and DLRM training steps
(PM2Lat's protocol: 5 warm-up, 25 timed, median), one build per (config, batch); on the CPU
each in a process of its own (workloads/isolated.py: the allocator state of the workloads
before it would move its step's page faults)."""
from __future__ import annotations

import math

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.sweeps.profiles import Profile
from pipeline.sweeps.catalog import workload_entries


def sweep_workloads(dev: DeviceIdentity, profile: Profile, log=None, dtype: str = "float32") -> list[dict]:
    import torch

    from pipeline.workloads.isolated import measure_here, measure_in_child

    todo = workload_entries(profile, evaluated_only=True)
    prog = Progress("workload_runs", len(todo), log)
    rows = []
    for e in todo:
        if dev.kind == "cpu" and profile.workloads_in_own_process:
            m = measure_in_child(e.workload, e.spec, e.batch, e.seq, dtype, torch.get_num_threads(),
                                 profile.workload_warmup, profile.workload_reps)
        else:
            m = measure_here(e.workload, e.spec, e.batch, e.seq, dtype, dev.torch_device, profile.workload_warmup,
                             profile.workload_reps)
        extra = {"n_layer": e.spec.n_layer, "n_embd": e.spec.n_embd, "n_head": e.spec.n_head,
                 "vocab_size": e.spec.vocab_size} if e.workload == "gpt2" else {}
        counted = math.isfinite(m.faults_per_call)  # NaN on CUDA: no host page faults counted
        rows.append({"workload": e.workload, "config": e.config, **extra, "batch": e.batch, "seq": e.seq,
                     "mode": e.mode, "dtype": dtype, "measured_ms": m.median_us / 1e3, "p20_ms": m.p20_us / 1e3,
                     "p80_ms": m.p80_us / 1e3, "cv": m.cv, "reps": m.reps,
                     **({"faults_per_step": m.faults_per_call} if counted else {})})
        faults = f", {m.faults_per_call:.0f} page faults a step" if counted else ""
        prog.step(f"{e.workload} {e.config} b={e.batch} s={e.seq} {m.median_us / 1e3:.1f} ms{faults}")
    return rows
