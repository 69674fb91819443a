"""CUDA code paths: run wherever a GPU is at hand (skipped elsewhere by conftest)."""
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
    assert kernels and all(k.launch.startswith("cuda") for k in kernels)
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


# -- cuBLASLt configurations (pipeline/sweeps/cublaslt.py, gemm_configs.py) --------------------
# Written on a machine without a GPU: these are the first time that code meets cuBLASLt.
_LT_TOL = {"float32": 1e-5, "tf32": 5e-3, "bfloat16": 2e-2, "float16": 5e-3}  # ||out - ref|| / ||ref||


def _lt_case(lt, dtype, layout, batch, m, n, k, bias, cfg=None):
    """Run cfg (default: the heuristic's first) on fresh random tensors; relative error vs float64."""
    import torch

    from pipeline.dtypes import torch_dtype
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
