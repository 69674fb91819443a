"""workload_runs: real measured steps — GPT-2-family forward passes and DLRM training steps
(PM2Lat's protocol: 5 warm-up, 25 timed, median), one build per (config, batch); on the CPU
each in a process of its own (workloads/isolated.py: the allocator state of the workloads
before it would move its step's page faults).

On a CPU the whole list is timed `profile.workload_passes` times, one pass after the other, and
each row keeps the pass with the quicker median. A shared VM has slow spells tens of seconds
long that no spread within 25 steps shows: on the Xeon VM (2026-11-27, `make run` at 11:31) the
DLRM steps measured 1.5-2.2x what the same steps measured minutes before and after (ddp batch
128: 7.3 ms in the run, 6.0 and 7.8 ms re-timed idle; default batch 128: 44 ms, 20 ms in the
run of 10:08), while the speed probe before and after the sweep read 2.7 % apart. A row whose
passes, a whole pass apart, both land in a spell is rarer than one that does. Each row records
how far its passes were apart (`pass_spread`), which the summary prints: the repeat of the
ground truth the predictions are scored against. A step whose passes differ by more than three
times its repetitions' cv is timed once more after the passes (the kernel sweeps' test for a
disturbed row), and keeps the quickest of its timings.

A step is also timed once more when its kept timing ran in a slow spell of either probe
(harness/spells.py): the GEMM probe, or the host probe, which reads the per-op host work that a
step of many small ops is made of (on the Zen 3 EPYC VM a DLRM step at batch 32 ran 2.6-3.1 ms
for minutes while the host probe read 3.6 µs a call, and 4.7-7.8 ms while it read 6.6-9). Each
probe's usual time is the lower quartile of its readings around every timing of the sweep, all
passes, or the calibration's where that is lower (spells.anchored_usual: a spell as long as the
runs is its own lower quartile; the Zen 5 EPYC VM's runs of 2026-11-30 16:21 read the GEMM probe
at 35 us throughout against 23 in the GEMM sweep), and before the extra timing the sweep waits
for both probes to read it again, at most the profile's `stall_wait_s` over all such steps
together. Once a wait runs out in the spell, the steps flagged for a spell alone keep their
timing (spells.again_when_usual).
"""
from __future__ import annotations

import math

from pipeline.device.discover import DeviceIdentity
from pipeline.harness.progress import Progress
from pipeline.harness.spells import again_when_usual, pair_in_spell, read_both_around, sweep_usual
from pipeline.harness.stalls import passes_disagree
from pipeline.harness.timer import Measurement
from pipeline.sweeps.catalog import WorkloadEntry, workload_entries
from pipeline.sweeps.profiles import Profile


def sweep_workloads(dev: DeviceIdentity, profile: Profile, log=None, dtype: str = "float32",
                    calibration_usual: tuple[float | None, float | None] | None = None) -> list[dict]:
    """Every evaluated workload step timed; `calibration_usual`: the spell probes' usual times in the
    device's calibration (harness/spells.anchored_usual), so a spell as long as the runs is seen."""
    todo = workload_entries(profile, evaluated_only=True)
    # a GPU's step is timed by the device, not by a host that other tenants slow down
    passes = max(profile.workload_passes, 1) if dev.kind == "cpu" else 1
    prog = Progress("workload_runs", len(todo) * passes, log)
    kept: list[Measurement | None] = [None] * len(todo)
    medians: list[list[float]] = [[] for _ in todo]
    readings: list[tuple[float, float]] = []  # (GEMM probe, host probe) around every timing
    cpu = dev.kind == "cpu"

    def timed(i: int, what: str) -> None:
        e = todo[i]
        if cpu:  # in this process, around the step's own: the machine's state while it ran
            m, m.probe_us, m.host_probe_us = read_both_around(lambda: _measure(dev, profile, e, dtype))
            readings.append((m.probe_us, m.host_probe_us))
        else:
            m = _measure(dev, profile, e, dtype)
        medians[i].append(m.median_us)
        if kept[i] is None or m.median_us < kept[i].median_us:
            kept[i] = m
        counted = math.isfinite(m.faults_per_call)  # NaN on CUDA: no host page faults counted
        faults = f", {m.faults_per_call:.0f} page faults a step" if counted else ""
        prog.step(f"{e.workload} {e.config} b={e.batch} s={e.seq} {m.median_us / 1e3:.1f} ms{faults}{what}")

    for p in range(passes):
        for i in range(len(todo)):
            timed(i, f" (pass {p + 1}/{passes})" if passes > 1 else "")
    # passes further apart than a step's own spread explains: at least one ran in a spell, and
    # maybe both; one more timing, as the kernel sweeps re-measure a disturbed row
    # or kept a timing a probe says ran in a slow spell (harness/spells.py): both passes can
    # land in one (2026-11-27 18:13, every DLRM step 1.5x its time re-measured at 18:30, passes
    # 2-12 % apart)
    usual, anchored = sweep_usual(readings, passes, calibration_usual)
    if anchored:
        prog.log(f"[workload_runs] {anchored}")
    spell = [pair_in_spell(m.probe_us, m.host_probe_us, usual) for m in kept]
    disagree = [passes > 1 and passes_disagree(medians[i], kept[i].cv) for i in range(len(todo))]
    again = [i for i in range(len(todo)) if disagree[i] or spell[i]]
    prog.total += len(again)
    spell_only = {i for i in again if not disagree[i]}
    waited, left = again_when_usual(again, usual, profile.stall_wait_s,
                                    lambda i: timed(i, " (passes disagreed or ran in a spell: timed again)"), spell_only)
    prog.total -= left  # left as they were: never stepped
    if again:
        prog.log(f"[workload_runs] {len(again)} steps whose passes disagreed beyond their spread, or whose quicker "
                 f"pass ran in a slow spell of a probe ({sum(spell)}): {len(again) - left} timed once more after "
                 f"{waited:.0f} s waiting for the probes' usual times" +
                 (f", {left} left as they were when the wait ran out in the spell" if left else ""))
    return [_row(e, m, meds, dtype) for e, m, meds in zip(todo, kept, medians)]


def _measure(dev: DeviceIdentity, profile: Profile, e: WorkloadEntry, dtype: str) -> Measurement:
    import torch

    from pipeline.workloads.isolated import measure_here, measure_in_child

    if dev.kind == "cpu" and profile.workloads_in_own_process:
        return measure_in_child(e.workload, e.spec, e.batch, e.seq, dtype, torch.get_num_threads(),
                                profile.workload_warmup, profile.workload_reps)
    return measure_here(e.workload, e.spec, e.batch, e.seq, dtype, dev.torch_device, profile.workload_warmup,
                        profile.workload_reps)


def _row(e: WorkloadEntry, m: Measurement, medians: list[float], dtype: str) -> dict:
    """The row of the kept timing; `passes` how many the step had, `pass_spread` the slowest one's
    median over the quickest's, less 1."""
    extra = {"n_layer": e.spec.n_layer, "n_embd": e.spec.n_embd, "n_head": e.spec.n_head,
             "vocab_size": e.spec.vocab_size} if e.workload == "gpt2" else {}
    counted = math.isfinite(m.faults_per_call)
    return {"workload": e.workload, "config": e.config, **extra, "batch": e.batch, "seq": e.seq,
            "mode": e.mode, "dtype": dtype, "measured_ms": m.median_us / 1e3, "p20_ms": m.p20_us / 1e3,
            "p80_ms": m.p80_us / 1e3, "cv": m.cv, "reps": m.reps, "passes": len(medians),
            **({"probe_us": m.probe_us} if math.isfinite(m.probe_us) else {}),
            **({"host_probe_us": m.host_probe_us} if math.isfinite(m.host_probe_us) else {}),
            "pass_spread": max(medians) / min(medians) - 1.0,
            **({"faults_per_step": m.faults_per_call} if counted else {})}
