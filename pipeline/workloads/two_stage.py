"""A causal LM split in two and run as a two-stage pipeline on this CPU (`devchar plan --measure`).

Each stage is its own process (spawned), pinned to its own cores with its own torch thread
count, so two CPU "devices" (e.g. two 1-thread halves, each characterized as cpu-...-1c) run
side by side as two devices would. Both build the same model from its config (random
weights, same seed) and keep their blocks: the first stage keeps the embedding and blocks
[0, k) (final norm and lm_head replaced by identities, so its output is block k-1's
activation); the second keeps blocks [k, L), norm and lm_head, and its embedding returns the
activation it received. The link is a shared-memory buffer of two slots: the first stage
copies its activation into a free slot (the transfer, timed as part of its stage) and passes
the slot's index on a queue; the second runs from the slot and gives it back when done.

N requests are all queued at the start. Each stage records, per request, its start, its end
and its process CPU time; nothing is profiled.
"""
from __future__ import annotations

import os
import queue as queue_mod
import re
import statistics
import time
from dataclasses import dataclass

from pipeline.core.errors import BadConfigError, DevcharError, UnknownDeviceError, check_dims

SLOTS = 2
START_TIMEOUT_S = 600.0  # building a model and warming up, per stage


class PipelineRunError(DevcharError, RuntimeError):
    """A stage process failed or stalled."""


def local_cpu_threads(slug: str) -> int:
    """The thread count a CPU slug of *this* machine's CPU names (cpu-<name>[-<signature>]-<N>c), or
    UnknownDeviceError saying why it cannot run here."""
    from pipeline.device.discover import cpu_threads, identify_cpu

    me = identify_cpu()
    stem = me.slug.rsplit("-", 1)[0]
    m = re.fullmatch(rf"{re.escape(stem)}-(\d+)c", slug)
    if not m:
        raise UnknownDeviceError(f"--measure runs both stages here, on this CPU ({me.model}); {slug!r} is not one of "
                                 f"its slugs ({stem}-<threads>c)")
    n = int(m.group(1))
    if not 1 <= n <= cpu_threads():
        raise UnknownDeviceError(f"{slug!r} needs {n} threads; this process may run on {cpu_threads()} cores")
    return n


def assign_cores(threads: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Disjoint cores for the two stages (first stage the lowest), or UnknownDeviceError when the
    cores this process may use are too few to run both stages without sharing one."""
    cores = sorted(os.sched_getaffinity(0))
    a, b = threads
    if a + b > len(cores):
        raise UnknownDeviceError(f"the two stages need {a} + {b} cores to run side by side without sharing one; "
                                 f"this process may use {len(cores)} ({cores}): a fair pipeline cannot run here")
    return tuple(cores[:a]), tuple(cores[a:a + b])


@dataclass(frozen=True)
class StageSpec:
    config: dict
    batch: int
    seq: int
    dtype: str
    after_block: int
    seed: int = 0


def build_stage(spec: StageSpec, role: int):
    """(stage module, its input ids, the Inject embedding for role 2 else None)."""
    import torch

    from pipeline.workloads.blocks import decoder_parts
    from pipeline.workloads.predict_callable import build_causal_lm

    model = build_causal_lm(spec.config, spec.dtype, seed=spec.seed)
    base, _embed, layers, _norm, _head = decoder_parts(model)
    k = spec.after_block
    inject = None
    if role == 1:
        base.layers = torch.nn.ModuleList(layers[:k])
        base.norm, model.lm_head = torch.nn.Identity(), torch.nn.Identity()
    else:
        base.layers = torch.nn.ModuleList(layers[k:])
        inject = _make_inject()
        base.embed_tokens = inject
    ids = torch.randint(0, model.config.vocab_size, (spec.batch, spec.seq),
                        generator=torch.Generator().manual_seed(spec.seed))
    return model.eval(), ids, inject


def _make_inject():
    """An embedding that returns the activation the previous stage sent (set `.value`)."""
    import torch

    class Inject(torch.nn.Module):
        value = None

        def forward(self, input_ids):
            return self.value

    return Inject()


def check_splittable(config) -> None:
    """The second stage indexes layer_types from 0: only models whose blocks are all alike split."""
    kinds = set(getattr(config, "layer_types", None) or ())
    if len(kinds) > 1:
        raise BadConfigError(f"model_type {config.model_type!r} mixes block kinds {sorted(kinds)}; the measured "
                             "pipeline splits only models whose blocks are all alike")


def _stage_main(role, spec, cores, threads, buf, full_q, free_q, result_q, barrier, n, warmup):
    import torch

    try:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
        stage, ids, inject = build_stage(spec, role)
        rows = []
        with torch.inference_mode():
            if inject is not None:
                inject.value = torch.zeros_like(buf[0])
            for _ in range(warmup):
                out = stage(input_ids=ids, use_cache=False).logits
                if role == 1 and out.shape != buf[0].shape:
                    raise PipelineRunError(f"stage 1 sends {tuple(out.shape)}, the link holds {tuple(buf[0].shape)}")
            barrier.wait(timeout=START_TIMEOUT_S)
            for r in range(n):
                if role == 1:
                    t0, c0 = time.perf_counter(), time.process_time()
                    out = stage(input_ids=ids, use_cache=False).logits
                    t1, c1 = time.perf_counter(), time.process_time()
                    slot = free_q.get()
                    t2 = time.perf_counter()
                    buf[slot].copy_(out)
                    t3 = time.perf_counter()
                    full_q.put((r, slot))
                    rows.append({"request": r, "start": t0, "end": t3, "busy_s": (t1 - t0) + (t3 - t2),
                                 "copy_s": t3 - t2, "wait_s": t2 - t1, "cpu_s": c1 - c0})
                else:
                    _, slot = full_q.get()
                    t0, c0 = time.perf_counter(), time.process_time()
                    inject.value = buf[slot]
                    stage(input_ids=ids, use_cache=False)
                    t1, c1 = time.perf_counter(), time.process_time()
                    free_q.put(slot)
                    rows.append({"request": r, "start": t0, "end": t1, "busy_s": t1 - t0, "cpu_s": c1 - c0})
        result_q.put((role, rows, None))
    except BaseException as exc:  # reported to the parent, which raises one clear error
        result_q.put((role, None, f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class PipelineRun:
    """One measured run of N requests (seconds)."""

    stage1: list[dict]
    stage2: list[dict]
    cores: tuple[tuple[int, ...], tuple[int, ...]]
    load_before: float
    load_after: float

    @property
    def stage1_s(self) -> float:
        """Median busy time of stage 1 per request: compute + the copy into the link."""
        return statistics.median(r["busy_s"] for r in self.stage1)

    @property
    def stage2_s(self) -> float:
        return statistics.median(r["busy_s"] for r in self.stage2)

    @property
    def copy_s(self) -> float:
        return statistics.median(r["copy_s"] for r in self.stage1)

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage1_s, self.stage2_s)

    def stage_cpu_s(self, stage: int) -> float:
        """Median process CPU time per request (stage 1: its compute; the copy is in busy_s):
        the work the stage did on its cores, without the time another process held them."""
        return statistics.median(r["cpu_s"] for r in (self.stage1 if stage == 1 else self.stage2))

    @property
    def cpu_bottleneck_s(self) -> float:
        return max(self.stage_cpu_s(1) + self.copy_s, self.stage_cpu_s(2))

    @property
    def period_s(self) -> float:
        """Median gap between consecutive completions: the pipeline's observed pace."""
        ends = [r["end"] for r in self.stage2]
        gaps = [b - a for a, b in zip(ends, ends[1:])]
        return statistics.median(gaps) if gaps else float("nan")

    @property
    def total_s(self) -> float:
        return self.stage2[-1]["end"] - self.stage1[0]["start"]

    def cpu_share(self, stage: int) -> float:
        """Process CPU seconds per busy wall second over the stage's compute (about its thread
        count when it had its cores; less when it waited for one)."""
        rows = self.stage1 if stage == 1 else self.stage2
        busy = sum(r["busy_s"] - r.get("copy_s", 0.0) for r in rows)
        return sum(r["cpu_s"] for r in rows) / busy if busy > 0 else float("nan")


def run_pipeline(spec: StageSpec, threads: tuple[int, int], n_requests: int, warmup: int = 2,
                 hidden: int | None = None) -> PipelineRun:
    """Run the split model as a two-stage pipeline for `n_requests` (see the module doc)."""
    import torch
    import torch.multiprocessing as mp

    check_dims(requests=n_requests, batch=spec.batch, seq=spec.seq)
    cores = assign_cores(threads)
    hidden = hidden or int(spec.config["hidden_size"])
    from pipeline.harness.dtypes import torch_dtype

    buf = torch.zeros((SLOTS, spec.batch, spec.seq, hidden), dtype=torch_dtype(spec.dtype)).share_memory_()
    ctx = mp.get_context("spawn")
    full_q, free_q, result_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    for s in range(SLOTS):
        free_q.put(s)
    barrier = ctx.Barrier(2)
    load_before = os.getloadavg()[0]
    procs = [ctx.Process(target=_stage_main, daemon=True,
                         args=(role, spec, cores[role - 1], threads[role - 1], buf, full_q, free_q, result_q,
                               barrier, n_requests, warmup)) for role in (1, 2)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + START_TIMEOUT_S + 60.0 * n_requests
    try:
        while len(got) < 2:
            try:
                role, rows, err = result_q.get(timeout=5.0)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    why = f"exit code {dead[0].exitcode}" if dead else "no result before the deadline"
                    raise PipelineRunError(f"the two-stage pipeline failed: a stage process stopped ({why})")
                continue
            if err is not None:
                raise PipelineRunError(f"stage {role} of the pipeline failed: {err}")
            got[role] = rows
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return PipelineRun(got[1], got[2], cores, load_before, os.getloadavg()[0])


def measure_copy_gbps(nbytes: int, threads: int, dtype: str = "float32") -> float:
    """The link between two CPU "devices" in shared memory is a memory copy: the median GB/s of
    copying `nbytes` into a shared-memory tensor at the sender's thread count (5 warm-up, 25 timed)."""
    import torch

    from pipeline.harness.dtypes import torch_dtype
    from pipeline.harness.timer import TimingSpec, measure_step

    check_dims(nbytes=nbytes, threads=threads)
    t = torch_dtype(dtype)
    n = max(1, nbytes // torch.empty((), dtype=t).element_size())
    src, dst = torch.randn(n).to(t), torch.empty(n, dtype=t).share_memory_()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m = measure_step(lambda: dst.copy_(src), TimingSpec.fixed(5, 25))
    finally:
        torch.set_num_threads(before)
    return nbytes / (m.median_us * 1e3)
