"""workload_runs: the real measured forward latency of GPT-2-family models (PM2Lat's protocol)."""
from __future__ import annotations

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.sweeps.profiles import Profile
from pipeline.workloads.gpt2 import configs_for


def sweep_workloads(dev: DeviceIdentity, profile: Profile, log=None, dtype: str = "float32") -> list[dict]:
    from pipeline.workloads.gpt2_run import measure_forward

    todo = [(s, b, q) for s in configs_for(profile.workload_configs) for b in profile.workload_batches
            for q in profile.workload_seqs]
    prog = Progress("workload_runs", len(todo), log)
    rows = []
    for spec, batch, seq in todo:
        m = measure_forward(spec, batch, seq, dtype, dev.torch_device, profile.workload_warmup, profile.workload_reps)
        rows.append({
            "workload": "gpt2", "config": spec.name, "n_layer": spec.n_layer, "n_embd": spec.n_embd,
            "n_head": spec.n_head, "vocab_size": spec.vocab_size, "batch": batch, "seq": seq, "mode": "forward",
            "dtype": dtype, "measured_ms": m.median_us / 1e3, "p20_ms": m.p20_us / 1e3, "p80_ms": m.p80_us / 1e3,
            "cv": m.cv, "reps": m.reps,
        })
        prog.step(f"{spec.name} b={batch} s={seq} {m.median_us / 1e3:.1f} ms")
    return rows
