"""A small ctypes binding to libcublasLt: PM2Lat III-B's cublasLtMatmulAlgoGetHeuristic, the
algorithms beyond it (AlgoGetIds / AlgoInit / AlgoCheck), each configuration decoded into a
plain dict, and running one chosen configuration on torch tensors on the current torch stream.

UNTESTED ON A GPU: written from the cuBLASLt API reference on a machine without CUDA. The
struct layouts, enum tables, id round trip and operand mapping are unit-tested on the CPU
(tests/test_cublaslt.py); the calls themselves are exercised only by tests/test_gpu.py.
Torch and numpy only; the library is loaded on first use, never at import.
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_float, c_int, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p
from pathlib import Path

from pipeline.sweeps import cublaslt_tables as T
from pipeline.sweeps.cublaslt_lib import WORKSPACE_BYTES, Problem, check_status, load
from pipeline.sweeps.cublaslt_tables import CublasLtError, HeuristicResult, MatmulAlgo

__all__ = ["Lt", "Problem", "load", "library_path", "WORKSPACE_BYTES", "CublasLtError"]


class Lt:
    """A cuBLASLt handle plus a preference capped at `workspace_bytes` of workspace."""

    def __init__(self, workspace_bytes: int = WORKSPACE_BYTES):
        self.lib = load()
        self.workspace_bytes = int(workspace_bytes)
        self.handle, self.pref = c_void_p(), c_void_p()
        check_status(self.lib.cublasLtCreate(byref(self.handle)), "cublasLtCreate")
        check_status(self.lib.cublasLtMatmulPreferenceCreate(byref(self.pref)), "cublasLtMatmulPreferenceCreate")
        ws = c_uint64(self.workspace_bytes)
        check_status(self.lib.cublasLtMatmulPreferenceSetAttribute(self.pref, T.PREF_MAX_WORKSPACE_BYTES, byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)")

    def version(self) -> int:
        return int(self.lib.cublasLtGetVersion())

    def problem(self, dtype: str, layout: str, batch: int, m: int, n: int, k: int, bias: bool = False) -> Problem:
        return Problem(self, dtype, layout, batch, m, n, k, bias)

    def close(self) -> None:
        if self.pref:
            self.lib.cublasLtMatmulPreferenceDestroy(self.pref)
        if self.handle:
            self.lib.cublasLtDestroy(self.handle)
        self.handle, self.pref = c_void_p(), c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- configurations ------------------------------------------------------------------------
    def heuristic(self, prob: Problem, max_algos: int = 8) -> list[dict]:
        """The heuristic's configurations for this problem, best first (PM2Lat III-B)."""
        results, got = (HeuristicResult * max_algos)(), c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, *prob.descriptors(), self.pref, max_algos,
                                                         results, byref(got))
        if status == 15:  # NOT_SUPPORTED: no algorithm for this problem at all
            return []
        check_status(status, f"cublasLtMatmulAlgoGetHeuristic({prob})")
        return [self.decode(r.algo, r) for r in results[:got.value] if r.state == 0]

    def decode(self, algo: MatmulAlgo, result: HeuristicResult | None = None) -> dict:
        cfg = {name: self._config_get(algo, name) for name in T.CONFIG_ATTRS}
        cfg["tile_rows"], cfg["tile_cols"] = T.tile_of(cfg["tile_id"])
        cfg["stages"] = T.stages_name(cfg["stages_id"])
        cfg["reduction_name"] = T.REDUCTION.get(cfg["reduction"], str(cfg["reduction"]))
        cfg["config_id"] = T.config_id(cfg)
        cfg["waves_count"] = float(result.wavesCount) if result is not None else float("nan")
        cfg["workspace_bytes"] = int(result.workspaceSize) if result is not None else 0
        cfg["algo_hex"] = bytes(algo).hex()  # the exact struct, to run this config again
        return cfg

    def _config_get(self, algo: MatmulAlgo, name: str) -> int:
        attr, nbytes, signed = T.CONFIG_ATTRS[name]
        # Ask the library for the size it stores, then read exactly that many bytes (a size that
        # does not match is INVALID_VALUE); if the size query itself fails, the documented width.
        need = c_size_t(0)
        if self.lib.cublasLtMatmulAlgoConfigGetAttribute(byref(algo), attr, None, 0, byref(need)) or not need.value:
            need = c_size_t(nbytes)
        buf, wrote = (ctypes.c_uint8 * max(need.value, nbytes))(), c_size_t(0)
        check_status(self.lib.cublasLtMatmulAlgoConfigGetAttribute(byref(algo), attr, buf, need.value, byref(wrote)),
               f"cublasLtMatmulAlgoConfigGetAttribute({name})")
        return int.from_bytes(bytes(buf)[:wrote.value], "little", signed=signed)

    def _cap_list(self, algo: MatmulAlgo, attr: int) -> list[int]:
        """An array capability (TILE_IDS, STAGES_IDS) as uint32 values."""
        need = c_size_t(0)
        check_status(self.lib.cublasLtMatmulAlgoCapGetAttribute(byref(algo), attr, None, 0, byref(need)),
               f"cublasLtMatmulAlgoCapGetAttribute({attr}) size")
        buf = (c_uint32 * max(need.value // 4, 1))()
        check_status(self.lib.cublasLtMatmulAlgoCapGetAttribute(byref(algo), attr, buf, need.value, byref(need)),
               f"cublasLtMatmulAlgoCapGetAttribute({attr})")
        return list(buf)[: need.value // 4] or [0]

    def algo_ids(self, dtype: str, max_ids: int = 512) -> list[int]:
        data, compute = T.lt_types(dtype)
        ids, got = (c_int * max_ids)(), c_int(0)
        check_status(self.lib.cublasLtMatmulAlgoGetIds(self.handle, compute, T.CUDA_R_32F, data, data, data, data,
                                                 max_ids, ids, byref(got)), f"cublasLtMatmulAlgoGetIds({dtype})")
        return list(ids[:got.value])

    def algo_from_config(self, cfg: dict, dtype: str) -> MatmulAlgo:
        """The exact struct when the config carries it (from a heuristic), else AlgoInit + the
        config attributes set one by one (an id parsed from config_id)."""
        if cfg.get("algo_hex"):
            return MatmulAlgo.from_buffer_copy(bytes.fromhex(cfg["algo_hex"]))
        data, compute = T.lt_types(dtype)
        algo = MatmulAlgo()
        check_status(self.lib.cublasLtMatmulAlgoInit(self.handle, compute, T.CUDA_R_32F, data, data, data, data,
                                               int(cfg["algo_id"]), byref(algo)),
               f"cublasLtMatmulAlgoInit({cfg['algo_id']})")
        for name, (attr, nbytes, _) in T.CONFIG_ATTRS.items():
            if name != "algo_id" and name in cfg:
                val = (c_uint16 if nbytes == 2 else c_uint32)(int(cfg[name]))
                check_status(self.lib.cublasLtMatmulAlgoConfigSetAttribute(byref(algo), attr, byref(val), nbytes),
                       f"cublasLtMatmulAlgoConfigSetAttribute({name}={cfg[name]})")
        return algo

    def check(self, prob: Problem, algo: MatmulAlgo) -> HeuristicResult | None:
        """AlgoCheck: the result (workspace, waves) if the algo can run this problem within the
        workspace, None if it cannot."""
        res = HeuristicResult()
        status = self.lib.cublasLtMatmulAlgoCheck(self.handle, *prob.descriptors(), byref(algo), byref(res))
        ok = status == 0 and res.state == 0 and res.workspaceSize <= self.workspace_bytes
        return res if ok else None

    def enumerate(self, prob: Problem, max_configs: int = 16):
        """Configurations beyond the heuristic: every algo id x its tiles x its stages, split-K 1,
        no swizzle, custom option 0 (cuBLASLt's own 'custom find' pattern), kept if AlgoCheck passes."""
        found = 0
        for algo_id in self.algo_ids(prob.dtype):
            try:  # an id this problem's types cannot use is skipped, not fatal
                base = self.algo_from_config({"algo_id": algo_id}, prob.dtype)
                tiles, stage_ids = self._cap_list(base, T.CAP_TILE_IDS), self._cap_list(base, T.CAP_STAGES_IDS)
            except CublasLtError:
                continue
            for tile in tiles:
                for stages in stage_ids:
                    cfg = {"algo_id": algo_id, "tile_id": tile, "stages_id": stages, "split_k": 1, "reduction": 0,
                           "swizzle": 0, "custom": 0}
                    try:
                        algo = self.algo_from_config(cfg, prob.dtype)
                    except CublasLtError:
                        continue
                    res = self.check(prob, algo)
                    if res is not None:
                        yield self.decode(algo, res)
                        found += 1
                        if found >= max_configs:
                            return

    # -- running ---------------------------------------------------------------------------------
    def runner(self, prob: Problem, cfg: dict, x, w, out, workspace, bias=None):
        """A zero-argument callable running `cfg` on torch tensors: out = x' @ w' (+ bias), with
        x, w, out shaped as cublaslt_tables.operand_shapes says. Checked once here (shapes,
        dtypes, contiguity, AlgoCheck), so the timed call is one cublasLtMatmul."""
        import torch

        want = T.operand_shapes(prob.layout, prob.batch, prob.m, prob.n, prob.k)
        tdt = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        given = [("x", x, want[0]), ("w", w, want[1]), ("out", out, want[2])]
        for name, t, shape in given + ([("bias", bias, (prob.n,))] if bias is not None else []):
            if tuple(t.shape) != shape or t.dtype != tdt[prob.dtype] or not t.is_contiguous() or not t.is_cuda:
                raise CublasLtError(f"{name} must be a contiguous CUDA {prob.dtype} tensor of shape {shape} for "
                                    f"{prob}; got {tuple(t.shape)} {t.dtype}")
        if prob.bias != (bias is not None):
            raise CublasLtError(f"{prob}: bias tensor {'missing' if prob.bias else 'given'} for this problem")
        if bias is not None:  # set before the check, as it will be when the kernel runs
            prob._set(T.DESC_BIAS_POINTER, c_void_p(bias.data_ptr()))
        algo = self.algo_from_config(cfg, prob.dtype)
        if self.check(prob, algo) is None:
            raise CublasLtError(f"config {cfg.get('config_id', cfg)} fails cublasLtMatmulAlgoCheck for {prob}")
        desc, la, lb, lc, ld = prob.descriptors()
        alpha, beta = c_float(1.0), c_float(0.0)
        args = (self.handle, desc, byref(alpha), c_void_p(w.data_ptr()), la, c_void_p(x.data_ptr()), lb,
                byref(beta), c_void_p(out.data_ptr()), lc, c_void_p(out.data_ptr()), ld, byref(algo),
                c_void_p(workspace.data_ptr()), c_size_t(workspace.numel() * workspace.element_size()))
        fn, keep = self.lib.cublasLtMatmul, (x, w, out, workspace, bias, algo, alpha, beta)

        def call() -> None:
            stream = torch.cuda.current_stream().cuda_stream  # the caller's stream, as torch ops use
            status = fn(*args, c_void_p(stream))
            if status:  # the message is built only on failure: this call is what gets timed
                check_status(status, f"cublasLtMatmul({prob})")
        call.keep = keep  # the tensors and ctypes values the pointers refer to stay alive
        return call

    def run(self, prob: Problem, cfg: dict, x, w, out, workspace, bias=None) -> None:
        self.runner(prob, cfg, x, w, out, workspace, bias)()


def library_path() -> str:
    """Which libcublasLt file was loaded (for the rows and the report)."""
    return str(Path(load()._name))
