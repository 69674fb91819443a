"""CUDA code paths: run wherever a GPU is at hand (skipped elsewhere by conftest)."""
from dataclasses import replace

import pandas as pd
import pytest

from pipeline import runner


@pytest.mark.gpu
def test_tiny_sweeps_on_cuda(tmp_path):
    assert runner.main(["device", "gemm", "utility", "--device", "cuda", "--profile", "tiny", "--out",
                        str(tmp_path)]) == 0
    dev = pd.read_parquet(tmp_path / "devices.parquet")
    assert dev["kind"].iloc[0] == "cuda" and dev["sm_count"].iloc[0] > 0
    gemm = pd.read_parquet(tmp_path / "gemm_samples.parquet")
    assert set(gemm["dtype"]) == {"float32", "tf32", "bfloat16", "float16"}
    assert not gemm["kernel"].str.startswith("cpu-").any()  # the profiler's kernel names
    assert (gemm["median_us"] > 0).all()
    assert (gemm["timing_method"] == "cuda_graph").all()  # every GEMM captures: no spin fallback


@pytest.mark.gpu
def test_capture_on_cuda_attributes_kernels_and_extracts_t1_to_t5():
    import torch

    from pipeline.predict.critical_path import critical_path
    from pipeline.predict.overheads import OverheadModel
    from pipeline.workloads.capture import capture
    from pipeline.workloads.host_time import gpu_overheads

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda().eval()
    x = torch.randn(32, 256, device="cuda")
    with torch.inference_mode():
        graph, info = capture(lambda: model(x), warmup=2)
    kernels = graph.kernels()
    # runtime API (cudaLaunchKernel) or driver API (cuLaunchKernel, as cuBLAS launches some)
    assert kernels and all(k.launch.startswith(("cuda", "cu")) for k in kernels)
    assert any(op.name in ("aten::addmm", "aten::mm") and op.kernels for op in graph)
    rows = gpu_overheads(info)
    assert {"T1", "T2", "T3", "T4"} <= set(rows["type"])
    e2e = critical_path(graph, OverheadModel.fit(rows))
    assert e2e.e2e_us >= e2e.active_us > 0


@pytest.mark.gpu
def test_traces_and_reference_sweeps_on_cuda(tmp_path):
    assert runner.main(["traces", "reference", "--device", "cuda", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    ovh = pd.read_parquet(tmp_path / "overhead_samples.parquet")
    assert {"T2", "T4"} <= set(ovh["type"])  # launches exist on a GPU
    ref = pd.read_parquet(tmp_path / "reference_timings.parquet")
    assert (ref["median_us"] > 0).all()


# -- the kernel timer against CUPTI -----------------------------------------------------------
def _timer_cases():
    import torch

    def linear(m, n, k, dt):
        a, w, b = (torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt),
                   torch.randn(n, device="cuda", dtype=dt))
        return lambda: torch.nn.functional.linear(a, w, b)

    x = torch.randn(4096, 4096, device="cuda")
    ln = torch.nn.LayerNorm(4096).cuda()
    small = torch.randn(64, 256, device="cuda", dtype=torch.float16)
    return {
        "linear 1408x1536x32 bf16": linear(1408, 1536, 32, torch.bfloat16),
        "linear 768x2304x512 fp32": linear(768, 2304, 512, torch.float32),
        "linear 4096x4096x4096 bf16": linear(4096, 4096, 4096, torch.bfloat16),
        "layernorm 4096x4096": lambda: ln(x),
        "rmsnorm 64x256 fp16": lambda: torch.nn.functional.rms_norm(small, (256,)),
        "gelu 4096x4096": lambda: torch.nn.functional.gelu(x),
        "add 64x256 fp16": lambda: small + small,
    }


@pytest.mark.gpu
@pytest.mark.parametrize("flush", [False, True])
def test_graph_timer_agrees_with_cupti(flush):
    """Issue 10's acceptance: graph replay vs the profiler's device time, within 10 % or 0.5 us."""
    import torch

    from pipeline.harness.cuda_timer import GRAPH
    from pipeline.harness.kernel_names import cupti_us
    from pipeline.harness.timer import _L2Flusher, measure
    from pipeline.sweeps.profiles import GPU_QUICK_TIMING

    torch.backends.cuda.matmul.allow_tf32 = True
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    spec = GPU_QUICK_TIMING if flush else replace(GPU_QUICK_TIMING, flush_l2=False)
    report = []
    for name, fn in _timer_cases().items():
        m = measure(fn, spec, "cuda", l2)
        ref = cupti_us(fn, calls=30, flush=_L2Flusher(l2, "cuda") if flush else None)
        report.append((name, m.median_us, ref, m.method))
        print(f"{name}: graph {m.median_us:.2f} us, CUPTI {ref:.2f} us ({m.method}, cv {m.cv:.3f})")
    for name, got, ref, method in report:
        assert method == GRAPH, name
        assert abs(got - ref) <= max(0.10 * ref, 0.5), (name, got, ref)


@pytest.mark.gpu
def test_kernel_names_for_many_points_in_one_session():
    import torch

    from pipeline.harness.kernel_names import pick_gemm_kernel, record_kernels

    shapes = [(64, 64, 64), (1024, 1024, 1024), (4096, 128, 4096)]
    got = record_kernels(shapes, lambda s: (lambda a=torch.randn(s[0], s[2], device="cuda"),
                                             b=torch.randn(s[2], s[1], device="cuda"): a @ b))
    for s in shapes:
        assert len(got[s]) >= 1 and all(d > 0 for _, d in got[s]), s
        assert pick_gemm_kernel([n for n, _ in got[s]]) != "unknown"


# -- cuBLASLt configurations (pipeline/sweeps/cublaslt.py, gemm_configs.py) --------------------
# Written on a machine without a GPU: these are the first time that code meets cuBLASLt.
_LT_TOL = {"float32": 1e-5, "tf32": 5e-3, "bfloat16": 2e-2, "float16": 5e-3}  # ||out - ref|| / ||ref||


def _lt_case(lt, dtype, layout, batch, m, n, k, bias, cfg=None):
    """Run cfg (default: the heuristic's first) on fresh random tensors; relative error vs float64."""
    import torch

    from pipeline.harness.dtypes import torch_dtype
    from pipeline.sweeps.cublaslt_tables import operand_shapes

    torch.manual_seed(1)
    kw = dict(dtype=torch_dtype(dtype), device="cuda")
    xs, ws, outs = operand_shapes(layout, batch, m, n, k)
    x, w, out = torch.randn(xs, **kw), torch.randn(ws, **kw), torch.full(outs, float("nan"), **kw)
    bvec = torch.randn(n, **kw) if bias else None
    workspace = torch.empty(lt.workspace_bytes, dtype=torch.uint8, device="cuda")
    with lt.problem(dtype, layout, batch, m, n, k, bias) as prob:
        cfg = cfg or lt.heuristic(prob, 1)[0]
        lt.run(prob, cfg, x, w, out, workspace, bvec)
        torch.cuda.synchronize()
    xe = x.double() if layout[1] == "N" else x.double().transpose(-1, -2)
    we = w.double() if layout[0] == "N" else w.double().transpose(-1, -2)
    ref = xe @ we + (bvec.double() if bias else 0)
    assert not out.isnan().any(), f"{cfg['config_id']} left outputs unwritten"
    return float((out.double() - ref).norm() / ref.norm()), cfg


@pytest.mark.gpu
def test_cublaslt_heuristic_returns_configs_for_each_dtype():
    from pipeline.sweeps.cublaslt import Lt
    from pipeline.sweeps.cublaslt_tables import config_id, parse_config_id

    with Lt() as lt:
        assert lt.version() > 0
        for dtype in ("float32", "tf32", "bfloat16", "float16"):
            with lt.problem(dtype, "NN", 1, 4096, 4096, 4096) as prob:
                cfgs = lt.heuristic(prob, 8)
            assert cfgs, f"no heuristic configuration for {dtype}"
            for c in cfgs:
                print(dtype, c["config_id"], c["stages"], c["reduction_name"], c["waves_count"], c["workspace_bytes"])
                assert c["workspace_bytes"] <= lt.workspace_bytes and c["waves_count"] > 0
                assert config_id(parse_config_id(c["config_id"])) == c["config_id"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout,batch,bias", [("NN", 1, False), ("TN", 1, False), ("TN", 1, True), ("NT", 1, False),
                                               ("NN", 3, False)])
def test_cublaslt_run_reproduces_torch(dtype, layout, batch, bias):
    from pipeline.sweeps.cublaslt import Lt

    with Lt() as lt:
        for m, n, k in ((192, 320, 256), (1024, 512, 2048)):
            err, cfg = _lt_case(lt, dtype, layout, batch, m, n, k, bias)
            assert err < _LT_TOL[dtype], f"{dtype} {layout} b={batch} {m}x{n}x{k} {cfg['config_id']}: {err:.2e}"


@pytest.mark.gpu
def test_cublaslt_config_rebuilt_from_its_id_and_enumerated_configs_run():
    """AlgoInit + ConfigSetAttribute from a parsed id (no saved struct), and AlgoGetIds configs."""
    from pipeline.sweeps.cublaslt import Lt
    from pipeline.sweeps.cublaslt_tables import parse_config_id

    with Lt() as lt:
        with lt.problem("bfloat16", "TN", 1, 1024, 1024, 1024) as prob:
            top = lt.heuristic(prob, 1)[0]
            extra = list(lt.enumerate(prob, 4))
        rebuilt = dict(parse_config_id(top["config_id"]), config_id=top["config_id"])
        err, _ = _lt_case(lt, "bfloat16", "TN", 1, 1024, 1024, 1024, False, rebuilt)
        assert err < _LT_TOL["bfloat16"]
        assert extra, "AlgoGetIds/AlgoCheck found no configuration"
        for cfg in extra:
            err, _ = _lt_case(lt, "bfloat16", "TN", 1, 1024, 1024, 1024, False, cfg)
            assert err < _LT_TOL["bfloat16"], f"{cfg['config_id']}: {err:.2e}"


@pytest.mark.gpu
def test_gemm_configs_tiny_sweep_writes_rows(tmp_path):
    assert runner.main(["gemm_configs", "--device", "cuda", "--profile", "tiny", "--out", str(tmp_path)]) == 0
    df = pd.read_parquet(tmp_path / "gemm_config_samples.parquet")
    assert set(df["dtype"]) == {"float32", "tf32", "bfloat16", "float16"}
    assert {"NN", "TN", "NT"} <= set(df["layout"]) and "bmm" in set(df["op"])
    assert df["kernel"].str.startswith("lt-a").all() and df["lt_kernel"].notna().all()
    assert (df["median_us"] > 0).all()
    train, held = df[~df["held_out"]], df[df["held_out"]]
    assert (train["waves"] == 1).all()  # the tiny profile sweeps one whole wave of each config's tile
    assert len(held) and held["torch_kernel"].notna().all()
    print(df.groupby(["op", "layout", "dtype"])["kernel"].nunique(), "selection match:", held["selection_match"].mean())
    choices = pd.read_parquet(tmp_path / "gemm_config_choices.parquet")
    assert len(choices) and choices["kernel"].str.startswith("lt-a").all() and choices["swept"].any()
    pytest.importorskip("sklearn")  # the selector's fit; a bare GPU node may not have it
    from pipeline.predict.gemm_configs import GemmConfigModel

    model = GemmConfigModel.fit(train, choices)
    ev = model.evaluate(held)
    assert len(ev) and (ev["predicted_us"] > 0).all()
    print("selector vs heuristic on held-out shapes:", ev["selector_agrees"].mean())
