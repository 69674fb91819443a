"""Sweep profiles: how much to measure. `tiny` is for tests, `quick` the CPU default, `full` the paper's ranges."""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.errors import DevcharError
from pipeline.harness.timer import TimingSpec, timing_scale


@dataclass(frozen=True)
class Profile:
    name: str
    k_values: tuple[int, ...]  # PM2Lat: powers of two 32 ... 8192
    wave_step: int  # whole waves measured per K: 1, step, step^2, ... while the output fits
    max_gemm_outputs: int  # ... in this many output elements (M x N x batch)
    max_point_flops: float  # larger (waves, K) points are skipped and filled at fit time
    heldout_per_op: int  # random shapes per (op, dtype), never used for fitting
    heldout_max_mn: int
    heldout_max_k: int
    heldout_max_bmm: int
    utility_max_elems: int
    utility_heldout_per_op: int
    gemm_timing: TimingSpec
    utility_timing: TimingSpec
    workload_configs: str  # "quick" or "full" GPT-2 config set
    workload_batches: tuple[int, ...]
    workload_seqs: tuple[int, ...]
    stall_wait_s: float = 60.0  # after a sweep, how long to wait for a quiet machine to re-measure stalled rows
    workload_warmup: int = 5
    workload_reps: int = 25
    # CPU: the workload list timed this many times, a whole pass apart; each row keeps its
    # quicker pass (sweeps/workload_runs.py: a shared VM's slow spells outlast one row)
    workload_passes: int = 2
    # CPU: every point of the GEMM, utility, memory and attention sweeps timed on this many visits, a
    # shuffled pass apart; each keeps its quicker visit (harness/revisit.py)
    visits: int = 2
    # CPU: each workload step timed in a process of its own, its allocator in a stated state
    # (workloads/isolated.py); the tiny profile's toy models skip the interpreter start
    workloads_in_own_process: bool = True
    # DLRM training steps (workload_runs, mode "train") and the traces of every workload
    dlrm_configs: str = "quick"  # DLRM config set (workloads/dlrm.py)
    dlrm_batches: tuple[int, ...] = (32, 128, 512)
    trace_warmup: int = 3  # calls before a workload's trace is captured
    reference_shapes_per_source: int = 40  # peer GEMM shapes timed per (source, op); 0 = all
    # held-out GEMM rows per (op, dtype) timed a second time at the end of the sweep: how well
    # the machine repeats itself (harness/repeat.py); 0 = none
    gemm_repeats_per_group: int = 12
    # times the CPU tile probe runs (sweeps/tile_probe.py), keeping the step found most often;
    # the tiny profile's one round saves ~13 s of each test materialization (bf16 in software)
    tile_probe_rounds: int = 3
    utility_repeats_per_group: int = 3  # the same per (op, dtype) of utility_samples (13 ops) and memory_samples
    # attention_samples: seq (q = kv) in powers of two from 32, batch in powers of the step (8 heads)
    attention_max_seq: int = 256
    attention_max_batch: int = 4
    attention_batch_step: int = 2
    attention_max_point_flops: float = 1e8  # larger (batch, seq) points are skipped and filled at fit time
    # CPU only: scan every seq in one range for the kv alignment period and, where there is one,
    # time the grid again at seq - 1 (sweeps/attention.py, predict/attention_align.py)
    attention_seq_scan: bool = False
    # CPU only: K values of the aspect grid (M and N over powers of 4, off the whole-wave
    # diagonal), from which the GEMM model learns how skinny or wide shapes run against the
    # near-square ones at the same output size (predict/gemm_table.py, GemmTable.with_aspect)
    gemm_aspect_k: tuple[int, ...] = ()
    gemm_aspect_max: int = 16384  # the largest M or N of the aspect grid
    # CPU: FLOP caps of the whole-wave and aspect grids' points (None: max_point_flops). An LM
    # head's output (GPT-2 at batch 8: 1024 x 50257, 206 MB) is larger than the cap lets the
    # grids hold at its K; priced from the small-K cells there, the Xeon VM's ran 15 % under
    # its measured time. A CPU GEMM of 4e10 FLOPs takes ~0.1 s, so these rows are few and cheap.
    max_wave_flops: float | None = None
    max_aspect_flops: float | None = None
    # CPU: the aspect grid's cells past max_gemm_outputs, up to this many outputs (counted over
    # the batch), at the twin K alone (none if it is not an aspect K), with their N twins and no
    # FLOP cap (sweeps/gemm_points.py _lattice); None: none past max_gemm_outputs
    max_aspect_outputs: int | None = None
    # CPU: the longest one call of a GEMM point may take at its dtype's rate, measured at the
    # start of the sweep (sweeps/gemm.py). The FLOP caps assume the dtype runs in hardware; a CPU
    # without bf16 instructions runs it in ATen's scalar loop (AMD EPYC family 25 model 1, AVX2:
    # 1.3 GFLOP/s at 512^3 against float32's 72), where the 4e10-FLOP cells took 40 s a call and the
    # quick sweep's estimate passed four hours. Points over it are left out and filled at fit time.
    gemm_max_call_s: float = 0.5
    # CPU only: the aspect K at which the unaligned twins are timed (None: the smallest)
    gemm_twin_k: int | None = None
    # CPU only: the (M, K) cells at which the narrow grid times every whole N under a cache line
    # off the aspect lattice (sweeps/gemm_points.py narrow_points, predict/gemm_narrow.py)
    gemm_narrow_cells: tuple[tuple[int, int], ...] = ()
    # CPU only: time the aspect grid's mm and linear cells at its largest K (and the held-out
    # shapes) again with their weights rotated through memory, as inside a model
    # (harness/weight_rotation.py), after a probe of how much the cache holds
    gemm_cold_weights: bool = False
    # CPU only: K values of the bmm batch grid (batch 1 ... 256 x square matrices 4 ... 1024),
    # from which the GEMM model learns what many small matrices cost (predict/gemm_batch.py)
    gemm_batch_k: tuple[int, ...] = ()
    attention_heldout: int = 12  # random shapes per (backend, dtype), never used for fitting
    attention_timing: TimingSpec = TimingSpec(warmup_s=0.005, budget_s=0.02, min_reps=3, max_reps=50, min_block_s=2e-4)
    # opencl_launches (LLMPerf II): generated kernels x {simple, memory} argument plans x work-group
    # sizes x N_WG draws (25:60:15) + IQR-rebalancing points; benchmark kernels at several sizes.
    opencl_kernels: int = 24  # generated kernels (of corpus.corpus_size())
    opencl_lsizes: int = 2  # work-group sizes per (kernel, method)
    opencl_settings: int = 4  # N_WG draws per (plan, lsize), before duplicates are dropped
    opencl_rebalance: int = 2  # IQR-rebalancing bins per (plan, lsize)
    opencl_memory_plans: int = 1  # valid scalar combinations kept per (kernel, lsize)
    opencl_max_combos: int = 12  # scalar combinations probed per (kernel, lsize)
    opencl_full_k: int = 8  # the full-utilization point is k * N_CU work-groups
    opencl_max_lsize: int = 256
    opencl_max_buffer_mb: int = 64  # launches needing more buffer memory are not generated
    opencl_bench_sizes: tuple[int, ...] = (1 << 10, 1 << 13, 1 << 16)  # benchmark input sizes
    opencl_launch_timeout_s: float = 2.0  # one run of one launch; a hung kernel costs this much
    opencl_timing: TimingSpec = TimingSpec(warmup_s=0.0, budget_s=0.01, min_reps=5, max_reps=25)
    # gemm_config_samples (CUDA only): cuBLASLt configurations, each swept at whole waves x K.
    # The defaults are the GPU quick profile (~3-5 min on an H100); timing is gemm_timing.
    gemm_config_ops: tuple[str, ...] = ("mm:NN", "linear:TN", "mm:NT", "bmm:NN")  # op:layout[+bias]
    gemm_config_dtypes: tuple[str, ...] = ("float32", "tf32", "bfloat16", "float16")
    gemm_config_shapes: tuple[tuple[int, int, int], ...] = (  # (M, N, K) where the heuristic is asked
        (4096, 4096, 4096), (1024, 1024, 1024), (256, 4096, 4096), (4096, 256, 4096), (128, 128, 8192),
        (8192, 8192, 128))
    gemm_config_heuristic_top: int = 1  # configurations taken per shape, best first
    gemm_config_enumerate: int = 0  # plus this many AlgoGetIds configurations passing AlgoCheck
    gemm_config_max_configs: int = 2  # distinct configurations swept per (op, layout, dtype)
    gemm_config_waves: tuple[int, ...] = (1, 4)
    gemm_config_k: tuple[int, ...] = (32, 128, 512, 2048, 8192)
    gemm_config_heldout: int = 6  # random shapes per (op, dtype): heuristic's choice vs torch's kernel
    gemm_config_selection: int = 300  # random shapes per (op, layout, dtype) whose heuristic choice is recorded


POW2_K = tuple(2**i for i in range(5, 14))  # 32 ... 8192, PM2Lat's grid
# The CPU also measures K = 1 ... 16: skinny GEMMs are common there, and on bfloat16 they are
# where ATen's own kernel takes over from oneDNN's (a second kernel with its own table).
CPU_K = tuple(2**i for i in range(0, 5)) + POW2_K

_CPU_TIMING = TimingSpec(warmup_s=0.01, budget_s=0.04, min_reps=5, max_reps=100, min_block_s=2e-4)

PROFILES = {
    "tiny": Profile(
        name="tiny", k_values=(4, 32, 128, 512), wave_step=4, max_gemm_outputs=1 << 12, max_point_flops=1e12,
        gemm_aspect_k=(32,), gemm_aspect_max=256, gemm_narrow_cells=((16, 32),),
        heldout_per_op=4, heldout_max_mn=256, heldout_max_k=512, heldout_max_bmm=64, utility_max_elems=1 << 16,
        utility_heldout_per_op=2, gemm_timing=TimingSpec(warmup_s=0.0, budget_s=0.005, min_reps=3, max_reps=20),
        utility_timing=TimingSpec(warmup_s=0.0, budget_s=0.005, min_reps=3, max_reps=20),
        workload_configs="tiny", workload_batches=(1, 2), workload_seqs=(16,), workload_warmup=1, workload_reps=3,
        workload_passes=1, visits=1, workloads_in_own_process=False, stall_wait_s=2.0,
        dlrm_configs="tiny", dlrm_batches=(4, 8), trace_warmup=1, reference_shapes_per_source=2,
        gemm_repeats_per_group=2, utility_repeats_per_group=1, tile_probe_rounds=1,
        attention_max_seq=64, attention_max_batch=2, attention_max_point_flops=1e7, attention_heldout=2,
        attention_timing=TimingSpec(warmup_s=0.0, budget_s=0.002, min_reps=3, max_reps=10),
        opencl_kernels=6, opencl_lsizes=1, opencl_settings=3, opencl_rebalance=0, opencl_max_combos=6,
        opencl_max_lsize=64, opencl_max_buffer_mb=16, opencl_bench_sizes=(1 << 10,), opencl_launch_timeout_s=2.0,
        opencl_timing=TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=5),
        gemm_config_shapes=((1024, 1024, 1024),), gemm_config_max_configs=1, gemm_config_waves=(1,),
        gemm_config_k=(32, 256), gemm_config_heldout=1, gemm_config_selection=8,
    ),
    "quick": Profile(
        name="quick", k_values=CPU_K, wave_step=4, max_gemm_outputs=1 << 25, max_point_flops=4e9,
        heldout_per_op=40, heldout_max_mn=2048, heldout_max_k=2048, heldout_max_bmm=512, utility_max_elems=1 << 22,
        utility_heldout_per_op=12, gemm_timing=_CPU_TIMING, utility_timing=_CPU_TIMING, gemm_aspect_k=(64, 256, 1024), gemm_aspect_max=65536,
        max_wave_flops=4e10, max_aspect_flops=1.6e10, max_aspect_outputs=1 << 26,
        gemm_twin_k=256, gemm_cold_weights=True, gemm_batch_k=(16, 64, 256, 1024),
        gemm_narrow_cells=((64, 256), (1024, 64)),
        workload_configs="quick", workload_batches=(1, 4, 8), workload_seqs=(128,),
        attention_max_seq=256, attention_max_batch=4, attention_max_point_flops=1e8, attention_heldout=12,
        attention_seq_scan=True,
    ),
    # PM2Lat's protocol and evaluation ranges: >= 25 runs and ~500 ms per point; 1000 held-out shapes.
    "full": Profile(
        name="full", k_values=POW2_K, wave_step=2, max_gemm_outputs=1 << 26, max_point_flops=1e15,
        heldout_per_op=1000, heldout_max_mn=8192, heldout_max_k=2000, heldout_max_bmm=1024,
        utility_max_elems=16384 * 16384,
        utility_heldout_per_op=200, gemm_aspect_k=(64, 256, 1024, 4096), gemm_aspect_max=65536, gemm_cold_weights=True,
        gemm_batch_k=(16, 64, 256, 1024), gemm_narrow_cells=((64, 256), (256, 1024), (1024, 64)),
        gemm_max_call_s=5.0, gemm_timing=TimingSpec(warmup_s=0.1, budget_s=0.5, min_reps=25, max_reps=10000, flush_l2=True),
        utility_timing=TimingSpec(warmup_s=0.05, budget_s=0.2, min_reps=25, max_reps=10000, flush_l2=True),
        workload_configs="full", workload_batches=(1, 4, 8), workload_seqs=(128, 512),
        dlrm_configs="full", dlrm_batches=(512, 1024, 2048, 4096), reference_shapes_per_source=0,
        attention_max_seq=8192, attention_max_batch=64, attention_max_point_flops=1e15, attention_heldout=200,
        attention_timing=TimingSpec(warmup_s=0.05, budget_s=0.2, min_reps=25, max_reps=10000, flush_l2=True),
        attention_seq_scan=True,
        # the whole corpus (~2400 kernels) x 2 methods x 4 lsizes x (16 + 4): ~10^5-10^6 launches, resumable
        opencl_kernels=1_000_000, opencl_lsizes=4, opencl_settings=16, opencl_rebalance=4, opencl_memory_plans=4,
        opencl_max_combos=36, opencl_max_lsize=1024, opencl_max_buffer_mb=512,
        opencl_bench_sizes=tuple(1 << i for i in range(10, 23)), opencl_launch_timeout_s=10.0,
        opencl_timing=TimingSpec(warmup_s=0.01, budget_s=0.1, min_reps=10, max_reps=100),
        # ~45 min on an H100: 20 (op, dtype) x 6 configurations x 4 wave counts x 9 K x ~0.6 s
        gemm_config_ops=("mm:NN", "linear:TN", "linear:TN+bias", "mm:NT", "bmm:NN"), gemm_config_heuristic_top=4,
        gemm_config_enumerate=8, gemm_config_max_configs=6, gemm_config_waves=(1, 2, 4, 8), gemm_config_k=POW2_K,
        gemm_config_heldout=100, gemm_config_selection=2000,
    ),
}


def wave_counts(profile: Profile, slots: int, tile_m: int, tile_n: int) -> list[int]:
    counts, w = [], 1
    while w * slots * tile_m * tile_n <= profile.max_gemm_outputs or not counts:
        counts.append(w)
        w *= profile.wave_step
    return counts


# A GPU runs the same profile names with GPU-sized grids: whole waves of 132 SMs x 128^2
# tiles are large. Kernels are timed by graph replay (harness/cuda_timer.py): budget_s bounds
# the device time of the replays, and a point costs about that plus two graph captures on the
# host (~20-30 us a call on the H100 VM), so budgets are milliseconds, not the 0.1 s that
# per-call events needed to average their noise away. The flush (2 x L2) runs before every call.
GPU_QUICK_TIMING = TimingSpec(warmup_s=0.0, warmup_min=3, budget_s=0.005, min_reps=7, max_reps=50, flush_l2=True,
                              replay_s=0.0005, min_calls=3, max_calls=100)
# PM2Lat's protocol asks >= 25 runs per point: 25 replays of >= 3 calls each.
GPU_FULL_TIMING = TimingSpec(warmup_s=0.005, warmup_min=3, budget_s=0.02, min_reps=25, max_reps=400, flush_l2=True,
                             replay_s=0.001, min_calls=3, max_calls=200)
CUDA_OVERRIDES = {
    "quick": dict(k_values=POW2_K, wave_step=2, max_gemm_outputs=1 << 27, max_point_flops=2e12, max_wave_flops=None,
                  max_aspect_flops=None, heldout_max_mn=8192,
                  heldout_max_k=2000, heldout_max_bmm=1024, utility_max_elems=1 << 26, gemm_timing=GPU_QUICK_TIMING,
                  utility_timing=GPU_QUICK_TIMING, workload_configs="full",
                  dlrm_configs="full", dlrm_batches=(512, 1024, 2048), reference_shapes_per_source=300,
                  attention_max_seq=8192, attention_max_batch=64, attention_batch_step=4,
                  attention_max_point_flops=2e12, attention_heldout=40, attention_timing=GPU_QUICK_TIMING,
                  opencl_full_k=40),  # the paper's N_WG > 40 x N_SM
    "full": dict(gemm_timing=GPU_FULL_TIMING, utility_timing=GPU_FULL_TIMING, attention_timing=GPU_FULL_TIMING,
                 opencl_full_k=40),
}


def get_profile(name: str, kind: str = "cpu") -> Profile:
    if name not in PROFILES:
        raise DevcharError(f"unknown profile {name!r}; expected one of {sorted(PROFILES)}")
    prof = PROFILES[name]
    prof = replace(prof, **CUDA_OVERRIDES.get(name, {})) if kind == "cuda" else prof
    scale = timing_scale()  # DEVCHAR_TIMING_SCALE: the timing specs scale where they are used
    if scale == 1.0:
        return prof
    # A point's repetition counts stay (min_reps), so the largest GEMMs cost the same at any
    # scale: on a slow CPU (the model-85 VM, bf16 emulated at 0.05 TFLOP/s) the points over
    # 4e9 FLOPs were two thirds of the slow tier's GEMM sweep. A scaled run skips them as it
    # skips any point past a cap, and the fit fills them: the grids keep their cells below.
    shrink = min(scale, 1.0)  # a scale above 1 buys repetitions, never a larger grid
    caps = dict(max_point_flops=prof.max_point_flops * shrink,
                max_wave_flops=prof.max_wave_flops and prof.max_wave_flops * shrink,
                max_aspect_flops=prof.max_aspect_flops and prof.max_aspect_flops * shrink,
                gemm_max_call_s=prof.gemm_max_call_s * shrink,
                # the aspect cells past the whole-wave outputs take no FLOP cap: a scaled run
                # leaves the class out, as it leaves out the points past its shrunk caps
                max_aspect_outputs=prof.max_aspect_outputs if shrink >= 1.0 else None)
    return replace(prof, stall_wait_s=prof.stall_wait_s * scale,  # and a workload step's counts here
                   workload_warmup=max(1, round(prof.workload_warmup * scale)),
                   workload_reps=max(3, round(prof.workload_reps * scale)),
                   workload_passes=max(1, round(prof.workload_passes * scale)),
                   visits=max(1, round(prof.visits * scale)),
                   tile_probe_rounds=max(1, round(prof.tile_probe_rounds * shrink)), **caps)  # never more: a tie
