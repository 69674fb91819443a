"""cuBLASLt binding and the per-configuration sweep: everything that needs no GPU (the calls
themselves run in tests/test_gpu.py on a GPU machine)."""
import ctypes
import math

import pytest

from pipeline.core.errors import DevcharError, UnknownDtypeError
from pipeline.predict.geometry import blocks
from pipeline.sweeps import cublaslt_tables as T
from pipeline.sweeps.gemm_configs import config_points, discovery_shapes, parse_op
from pipeline.sweeps.profiles import get_profile


def test_struct_layouts_match_the_header():
    assert ctypes.sizeof(T.MatmulAlgo) == 64  # uint64_t data[8]
    r = T.HeuristicResult
    assert (r.algo.offset, r.workspaceSize.offset, r.state.offset, r.wavesCount.offset, r.reserved.offset) == \
        (0, 64, 72, 76, 80)
    assert ctypes.sizeof(r) == 96
    assert ctypes.sizeof(r * 4) == 4 * 96  # the heuristic fills a plain C array of them


def test_tile_table_against_header_values():
    # enum values read from cublasLt.h (CUDA 12.8): both irregular and generated stretches
    known = {0: (0, 0), 1: (8, 8), 15: (64, 64), 20: (128, 128), 23: (128, 256), 24: (256, 128), 30: (160, 128),
             31: (192, 128), 35: (256, 32), 36: (8, 128), 46: (8, 768), 47: (16, 64), 71: (32, 192), 79: (32, 768),
             116: (64, 192), 123: (64, 768), 133: (72, 640), 151: (96, 192), 176: (128, 320), 193: (160, 64),
             208: (192, 64), 232: (256, 192), 233: (264, 64), 264: (384, 128), 265: (392, 64), 279: (504, 64),
             280: (520, 64), 311: (768, 64), 312: (64, 16), 392: (64, 760), 393: (128, 8), 447: (128, 512),
             448: (192, 8), 485: (192, 336), 486: (256, 8), 513: (256, 256), 536: (320, 200), 555: (384, 168),
             570: (448, 128), 587: (512, 128), 600: (576, 112), 611: (640, 96), 621: (704, 88), 630: (768, 80),
             631: (256, 512), 632: (256, 1024), 633: (512, 512), 634: (512, 1024)}
    assert {i: T.tile_of(i) for i in known} == known
    assert len(T.TILES) == 635 and len(set(T.TILES)) == 635  # every tile once
    assert T.tile_of(635) == (0, 0) and T.tile_of(-1) == (0, 0)  # a newer library's id: unknown, not a crash


def test_stages_and_enum_values():
    assert T.stages_name(0) == "undefined"
    assert T.stages_name(1) == "16x1" and T.stages_name(18) == "64x6" and T.stages_name(24) == "128x6"
    assert T.stages_name(31) == "8x3" and T.stages_name(36) == "128xAUTO" and T.stages_name(30) == "64x80"
    assert T.stages_name(99) == "id99"
    assert T.lt_types("tf32") == (T.CUDA_R_32F, 77) and T.lt_types("float32") == (0, 68)
    assert T.lt_types("bfloat16") == (14, 68) and T.lt_types("float16") == (2, 68)
    with pytest.raises(UnknownDtypeError, match="'int8'"):
        T.lt_types("int8")
    widths = {name: nbytes for name, (_, nbytes, _) in T.CONFIG_ATTRS.items()}
    assert widths["inner_shape"] == widths["cluster_shape"] == 2 and widths["tile_id"] == 4
    assert [a for a, _, _ in T.CONFIG_ATTRS.values()] == list(range(9))


def test_config_id_round_trip():
    cfg = {"algo_id": 66, "tile_id": 23, "stages_id": 36, "split_k": 1, "reduction": 0, "swizzle": 1, "custom": 3,
           "inner_shape": 0, "cluster_shape": 5}
    cid = T.config_id(cfg)
    assert cid == "lt-a66-t128x256-s36-k1-r0-z1-c3-i0-g5"
    assert T.parse_config_id(cid) == cfg
    assert T.config_id(T.parse_config_id(cid)) == cid
    for bad in ("lt-a1-t128x256", "cpu", "lt-a1-t100x100-s0-k1-r0-z0-c0-i0-g0"):
        with pytest.raises(T.CublasLtError):
            T.parse_config_id(bad)


@pytest.mark.parametrize("layout", ["NN", "TN", "NT", "TT"])
def test_row_major_mapping_is_the_transposed_problem(layout):
    """Check the mapping with numpy: read each torch operand's bytes as cuBLAS's column-major
    matrix, apply cuBLAS's ops, and the column-major product must be torch's row-major out."""
    import numpy as np

    b, m, n, k = 3, 5, 7, 4
    rng = np.random.default_rng(0)
    xs, ws, outs = T.operand_shapes(layout, b, m, n, k)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    xe = x if layout[1] == "N" else np.swapaxes(x, -1, -2)
    we = w if layout[0] == "N" else np.swapaxes(w, -1, -2)
    ref = xe @ we
    assert ref.shape == outs

    spec = T.lt_problem(layout, b, m, n, k)
    assert (spec["m"], spec["n"], spec["k"]) == (n, m, k)

    def colmajor(buf, rows, cols, ld, stride, i):
        flat = buf.ravel()[i * stride:]
        return np.array([[flat[c * ld + r] for c in range(cols)] for r in range(rows)])

    for i in range(b):
        a_mat = colmajor(w, *spec["a"], i)  # cuBLAS A is torch w
        b_mat = colmajor(x, *spec["b"], i)  # cuBLAS B is torch x
        a_op = a_mat if spec["transa"] == 0 else a_mat.T
        b_op = b_mat if spec["transb"] == 0 else b_mat.T
        d = a_op @ b_op  # (n, m), column-major in memory
        rows, cols, ld, _ = spec["c"]
        assert d.shape == (rows, cols) and ld == n
        np.testing.assert_allclose(d.T, ref[i])  # column-major (n, m) bytes = row-major (m, n)
    with pytest.raises(T.CublasLtError, match="'XN'"):
        T.lt_problem("XN", 1, 1, 1, 1)


def test_torch_tile_swaps_orientation():
    assert T.torch_tile({"tile_rows": 128, "tile_cols": 256}) == (256, 128)


def test_config_points_fill_whole_waves():
    slots, tile_m, tile_n = 132, 256, 128
    for split_k in (1, 2, 3, 4):
        pts = config_points(tile_m, tile_n, split_k, slots, (1, 2, 4), (32, 1024), 1 << 30, 1e15, bmm=False)
        assert len(pts) == 6 and {p[3] for p in pts} == {32, 1024}
        for (b, m, n, k), w in zip(pts[::2], (1, 2, 4)):
            assert m % tile_m == 0 and n % tile_n == 0
            ctas = int(blocks(m, n, b, tile_m, tile_n)) * split_k
            assert ctas == w * slots // split_k * split_k  # whole tiles, split_k CTAs each
            assert math.ceil(ctas / slots) == w  # ... filling exactly w waves
    bmm = config_points(128, 128, 1, 132, (1, 2), (64,), 1 << 30, 1e15, bmm=True)
    assert [p[0] for p in bmm] == [4, 8]  # gcd(tiles, 8) matrices share the tiles
    assert all(int(blocks(m, n, b, 128, 128)) == w * 132 for (b, m, n, _), w in zip(bmm, (1, 2)))


def test_config_points_caps():
    # beyond max_outputs the wave counts stop (the first one is always kept); large K is
    # dropped past the FLOP cap, the smallest K always kept
    pts = config_points(128, 128, 1, 132, (1, 4, 16), (32, 8192), 132 * 128 * 128 * 4, 1e15, bmm=False)
    assert sorted({p[1] * p[2] for p in pts}) == [132 * 128 * 128, 4 * 132 * 128 * 128]
    pts = config_points(128, 128, 1, 132, (1,), (32, 8192), 1, 2 * 132 * 128 * 128 * 100, bmm=False)
    assert [p[3] for p in pts] == [32]
    assert config_points(128, 128, 200, 132, (1,), (32,), 1 << 30, 1e15, bmm=False) == []  # split-K > slots


def test_op_keys_and_discovery_shapes():
    assert parse_op("mm:NN") == ("mm", "NN", False)
    assert parse_op("linear:TN+bias") == ("linear", "TN", True)
    for bad in ("mm", "conv:NN", "mm:NN+bias", "bmm:XY"):
        with pytest.raises(DevcharError):
            parse_op(bad)
    prof = get_profile("quick", "cuda")
    for key in prof.gemm_config_ops + get_profile("full", "cuda").gemm_config_ops:
        parse_op(key)
    assert all(b == 1 for b, *_ in discovery_shapes("mm", prof))
    assert all(b == 8 and max(d) <= 1024 for b, *d in discovery_shapes("bmm", prof))


def test_sweep_and_runner_refuse_without_cuda():
    from pipeline import runner
    from pipeline.device.discover import identify
    from pipeline.sweeps.gemm_configs import sweep_gemm_configs

    assert "gemm_configs" not in runner.all_sweeps("cpu")
    assert "gemm_configs" in runner.all_sweeps("cuda")
    with pytest.raises(DevcharError, match="needs a CUDA device"):
        sweep_gemm_configs(identify("cpu"), get_profile("tiny"))


def test_library_not_found_is_one_clear_error(monkeypatch):
    """On this CPU-only machine the real search finds nothing either; the message says what to set."""
    from pipeline.sweeps import cublaslt, cublaslt_lib

    monkeypatch.setattr(cublaslt_lib, "_LIB", None)
    monkeypatch.setattr(cublaslt_lib, "_candidates", lambda: ["/nonexistent/libcublasLt.so.12"])
    with pytest.raises(T.CublasLtError, match="libcublasLt not found.*DEVCHAR_CUBLASLT"):
        cublaslt.Lt()  # the handle loads the library lazily: nothing happened at import


@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
@pytest.mark.parametrize("batch", [1, 3])
def test_torch_operands_run_every_held_out_batch(layout, batch):
    """The H100 run crashed at the first bmm held-out shape with batch 1 (2-D operands)."""
    import torch

    from pipeline.sweeps.gemm_configs import _tensors, _torch_fn

    for op in ("mm", "bmm"):
        b = batch if op == "bmm" else 1
        x, w, out, _ = _tensors(op, layout, False, "float32", b, 5, 6, 7, device="cpu")
        got = _torch_fn(op, layout, x, w, None)()
        assert tuple(got.shape) == tuple(out.shape) and got.shape[-2:] == (5, 6)
        assert torch.isfinite(got).all()
