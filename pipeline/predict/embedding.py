"""The DLRM paper's embedding-lookup heuristic (III-B1), with a measured bandwidth.

Per bag ("warp": one output vector of B x T) the batched lookup moves, in 32-byte sectors,

    table_offsets 32 B + offsets 64 B + indices ceil(ib L / 32) 32 + weights L ceil(eb D / 32) 32
    + outputs ceil(eb D / 32) 32,

eb the element bytes of the dtype (the paper's 4) and ib the index bytes (8: torch takes int64
indices; the paper's kernel reads int32). The backward (gradient plus SGD update) reads and
writes every looked-up row: weights 2 L ceil(eb D / 32) 32, outputs become grad_outputs. The
weights term carries L as in the authors' code (the text's forward formula drops it). Plain
model: time = overhead + B T (sum of the above) / BW.

L2 hit-rate enhancement: with rows_per_block bags per CTA and one CTA per SM,
num_tables = ceil(rows_per_block x #SM / B) tables are being read at once, each keeping
cached = min(L2 / (num_tables x D x eb), E) rows in L2, and the probability that a bag's L
lookups all hit is p = C(cached, L) / C(E, L). table_offsets, offsets and p x weights are L2
traffic; indices, outputs and (1 - p) x weights DRAM traffic;
time = overhead + DRAM / BW_DRAM + L2 / BW_L2.

Per-row hit model (ours, a CPU analog; the fit keeps it only where its training error is
lower than the paper's): each looked-up row hits with probability cached / E rather than all L
of a bag together, and a missed row costs `us_per_miss` beyond its bytes. With the paper's p a
bag of L = 100 rows almost never "hits", so a 30 000-row table that mostly fits in the cache is
priced like a 1 000 000-row one; offline on seven CPUs' calibrations (2026-11-29) it moved
DLRM's `e2e_shared` geomean from 17.0 / 19.6 / 22.3 / 14.3 / 7.6 / 24.9 / 13.3 % to 15.7 / 12.7
/ 21.9 / 13.5 / 6.2 / 24.9 / 11.5 % (docs/methods.md).

"Measured bandwidth": instead of a spec sheet, per (direction, dtype) the per-byte costs and a
fixed per-call overhead are fitted to the *training* rows by non-negative least squares on the
relative error, with L2 no slower than DRAM. CPU analogs: the cache is a CPU cache level and
#SM the thread count, one bag per thread at a time (rows_per_block = 1). The fit tries the
cache sizes the sweep recorded (per-core L2 x threads, and the shared last-level cache) and
keeps the one with the lower training error; a GPU has one candidate, its L2. On the GPU
rows_per_block = 4: torch's EmbeddingBag kernel computes blockDim.y = 4 bags per CTA.

Prediction is vectorized numpy (no torch).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import gammaln

from pipeline.core.dtypes import check_dtype, element_bytes
from pipeline.core.errors import BadShapeError, MissingModelError
from pipeline.predict.fitting import nnls_relative
from pipeline.predict.serialize import keyed, records

DIRECTIONS = ("forward", "backward")
INDEX_BYTES = 8  # int64 indices and offsets
SECTOR = 32
TABLE_OFFSETS_BYTES, OFFSETS_BYTES = 32, 64
DEFAULT_ROWS_PER_BLOCK = {"cuda": 4, "cpu": 1}
LARGE_E = 100_000  # Table IV's "L": tables larger than this


def _sectors(nbytes) -> np.ndarray:
    return np.ceil(np.asarray(nbytes, float) / SECTOR) * SECTOR


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise BadShapeError(f"unknown embedding direction {direction!r}; expected one of {DIRECTIONS}")
    return direction


def check_positive(**dims) -> list[np.ndarray]:
    """Arrays of the named dims; BadShapeError naming the first dim with a non-positive value."""
    out = []
    for name, value in dims.items():
        a = np.asarray(value)
        if a.dtype.kind not in "iuf" or (a.size and (~np.isfinite(a.astype(float))).any()):
            raise BadShapeError(f"dimension {name}={value!r} is not a number")
        if a.size and (a <= 0).any():
            raise BadShapeError(f"dimension {name}={a[a <= 0].ravel()[0]} must be positive")
        out.append(a.astype(float))
    return out


def hit_rate(B, E, L, D, elem_bytes: int, cache_bytes: float, units: int, rows_per_block: int,
             per_row: bool = False) -> np.ndarray:
    """The paper's p = C(cached, L) / C(E, L): the chance that all L rows of a bag are in the cache.
    per_row: the chance that one row is, cached / E (ours, see the module's docstring)."""
    B, E, L, D = (np.asarray(x, float) for x in (B, E, L, D))
    num_tables = np.ceil(rows_per_block * units / B)
    cached = np.minimum(np.floor(cache_bytes / (num_tables * D * elem_bytes)), E)
    if per_row:
        return cached / E
    ok = (cached >= L) & (cached < E)
    xs, es = np.where(ok, cached, L), np.where(ok, E, L + 1)  # safe arguments where the formula is not used
    ratio = np.exp(gammaln(xs + 1) - gammaln(xs - L + 1) - gammaln(es + 1) + gammaln(es - L + 1))
    return np.where(cached >= E, 1.0, np.where(ok, ratio, 0.0))


def embedding_traffic(direction: str, dtype: str, B, E, T, L, D, cache_bytes: float | None = None,
                      units: int = 1, rows_per_block: int = 1, index_bytes: int = INDEX_BYTES,
                      per_row: bool = False):
    """(DRAM bytes, L2 bytes). Without cache_bytes: the plain model, everything from DRAM.
    per_row: the weights' bytes split by the per-row hit rate, not the paper's all-L p."""
    check_direction(direction)
    eb = element_bytes(dtype)
    B, E, T, L, D = check_positive(B=B, E=E, T=T, L=L, D=D)
    row = _sectors(eb * D)
    weights = (2.0 if direction == "backward" else 1.0) * L * row
    fixed = TABLE_OFFSETS_BYTES + OFFSETS_BYTES
    streamed = _sectors(index_bytes * L) + row  # indices and outputs (or grad_outputs)
    bags = B * T
    if cache_bytes is None:
        return bags * (fixed + streamed + weights), np.zeros(np.broadcast(B, E, T, L, D).shape)
    p = hit_rate(B, E, L, D, eb, cache_bytes, units, rows_per_block, per_row)
    return bags * (streamed + (1 - p) * weights), bags * (fixed + p * weights)


class EmbeddingModel:
    """Per (direction, dtype): the plain fit {overhead_us, us_per_byte} and the hit-rate fit
    {overhead_us, dram_us_per_byte, l2_us_per_byte, cache_bytes}."""

    name = "embedding_model"

    def __init__(self, groups: dict[tuple[str, str], dict], units: int, rows_per_block: int,
                 index_bytes: int = INDEX_BYTES, cold_groups: dict[tuple[str, str], dict] | None = None,
                 context_cache_bytes: float = 0.0, backward_call_us: float = 0.0):
        self.groups, self.units, self.rows_per_block, self.index_bytes = groups, units, rows_per_block, index_bytes
        # CPU: the same fits on the cold rows (timed after a cache flush), and the cache a
        # model's tables share between two lookups of one table (the reported last level)
        self.cold_groups, self.context_cache_bytes = cold_groups or {}, float(context_cache_bytes)
        # CPU: what the sweep's one backward() call per row cost beyond its work, taken off the
        # backward rows before the fit (sweeps/embedding.backward_call_us): predict() prices a
        # lookup inside a step, whose one backward() serves every table; predict_rows() adds it
        # back to compare with the sweep's own rows
        self.backward_call_us = float(backward_call_us)

    @staticmethod
    def fit(samples: pd.DataFrame, cache_bytes: float | None = None, units: int | None = None,
            rows_per_block: int | None = None) -> "EmbeddingModel":
        """samples: embedding_samples rows (training only; held-out rows are refused). The device
        parameters come from the rows' columns unless given."""
        if samples.empty:
            raise ValueError("EmbeddingModel.fit got no rows")
        if bool(samples["held_out"].any()):
            raise ValueError("EmbeddingModel.fit got held-out rows; fit on training rows only")
        for name, given in (("units", units), ("rows_per_block", rows_per_block)):
            if given is None and name not in samples:
                raise ValueError(f"EmbeddingModel.fit: the rows have no {name!r} column; pass {name}=")
        units = int(units if units is not None else samples["units"].iloc[0])
        rpb = int(rows_per_block if rows_per_block is not None else samples["rows_per_block"].iloc[0])
        ib = int(samples["index_bytes"].iloc[0]) if "index_bytes" in samples else INDEX_BYTES
        if cache_bytes is not None:
            candidates = [float(cache_bytes)]
        else:
            cols = [c for c in ("l2_bytes", "llc_bytes", "cache_bytes") if c in samples]
            # No cache size known (a GPU whose L2 torch does not report): cache 0, every lookup a miss.
            candidates = sorted({float(v) for c in cols for v in samples[c].unique() if v and v > 0}) or [0.0]
        call = backward_call_of(samples)
        if call:
            samples = samples.assign(median_us=np.where(
                samples["direction"] == "backward",
                # the floor only guards against a call timed slower than a row's whole time (noise)
                np.maximum(samples["median_us"] - call, CALL_FLOOR * samples["median_us"]), samples["median_us"]))
        cold = samples["cold"].fillna(False).astype(bool).to_numpy() if "cold" in samples else np.zeros(len(samples), bool)
        hot_groups = _fit_groups(samples[~cold], candidates, units, rpb, ib)
        cold_groups = _fit_groups(samples[cold], candidates, units, rpb, ib) if cold.any() else {}
        context = float(samples["llc_bytes"].max()) if "llc_bytes" in samples else 0.0
        return EmbeddingModel(hot_groups, units, rpb, ib, cold_groups, context, call)

    def cached_share(self, working_set_bytes: float, cache_bytes: float | None = None) -> float | None:
        """The share of a working set (what passes through the cache between two lookups of one
        table) that `cache_bytes` (default: the reported last level) holds; None without cold
        fits: the model prices as its sweep measured, hot."""
        if not self.cold_groups or working_set_bytes <= 0:
            return None
        measured = cache_bytes is not None and math.isfinite(cache_bytes) and cache_bytes > 0
        cache = cache_bytes if measured else self.context_cache_bytes
        return float(min(1.0, cache / working_set_bytes))

    def bandwidth_gbps(self, direction: str, dtype: str, hit_rate: bool = False) -> float:
        """The fitted effective DRAM bandwidth (inf when the fit gave bytes no cost)."""
        g = self._group(direction, dtype)
        c = g["hit"]["dram_us_per_byte"] if hit_rate else g["plain"]["us_per_byte"]
        return 1e-3 / c if c > 0 else float("inf")

    def _group(self, direction: str, dtype: str, groups: dict | None = None) -> dict:
        check_direction(direction)
        check_dtype(dtype)
        groups = self.groups if groups is None else groups
        key = (direction, "float32" if dtype == "tf32" else dtype)
        if key not in groups:
            raise MissingModelError(f"no embedding calibration for direction={direction!r} dtype={dtype!r}; "
                                    f"have {sorted(groups)}")
        return groups[key]

    def predict(self, direction: str, dtype: str, B, E, T, L, D, hit_rate: bool = True,
                cached_share: float | None = None) -> np.ndarray:
        """Predicted microseconds (arrays broadcast); hit_rate=False is the plain DRAM-only model.
        cached_share (0..1, with cold fits): the share of the table traffic that finds its rows as
        the sweep's repeated call did; the rest costs what the cold fit charges per byte and per
        lookup beyond the hot one. The per-call overhead stays the hot fit's: a flush evicts the
        call's own small tensors and code too, which inside a model stay in cache (on the EPYC VM
        a cold fit's overhead priced DLRM-MLPerf's 26 one-row lookups at 4x their traced time).
        cached_share=0.0 with overhead too is what a row timed cold measured (predict_rows)."""
        hot_g = self._group(direction, dtype)
        hot = self._predict(hot_g, direction, dtype, B, E, T, L, D, hit_rate)
        if cached_share is None or not self.cold_groups or cached_share >= 1.0:
            return hot
        cold_g = self._group(direction, dtype, self.cold_groups)
        cold = self._predict(cold_g, direction, dtype, B, E, T, L, D, hit_rate)
        overhead = "hit" if hit_rate else "plain"
        extra = (cold - cold_g[overhead]["overhead_us"]) - (hot - hot_g[overhead]["overhead_us"])
        return hot + (1.0 - cached_share) * np.maximum(extra, 0.0)

    def predict_cold(self, direction: str, dtype: str, B, E, T, L, D, hit_rate: bool = True) -> np.ndarray:
        """What a call timed right after a flush takes (the cold fit as it is; the hot one without)."""
        groups = self.cold_groups if self.cold_groups else self.groups
        return self._predict(self._group(direction, dtype, groups), direction, dtype, B, E, T, L, D, hit_rate)

    def _predict(self, g: dict, direction: str, dtype: str, B, E, T, L, D, hit_rate: bool) -> np.ndarray:
        check_positive(B=B, E=E, T=T, L=L, D=D)
        dtype = "float32" if dtype == "tf32" else dtype
        if not hit_rate:
            plain, _ = embedding_traffic(direction, dtype, B, E, T, L, D, index_bytes=self.index_bytes)
            return g["plain"]["overhead_us"] + plain * g["plain"]["us_per_byte"]
        h = g["hit"]
        per_row = bool(h.get("per_row", False))  # a model saved before it: the paper's p
        dram, l2 = embedding_traffic(direction, dtype, B, E, T, L, D, h["cache_bytes"], self.units,
                                     self.rows_per_block, self.index_bytes, per_row)
        lookups = np.asarray(B, dtype=float) * np.asarray(T, dtype=float) * np.asarray(L, dtype=float)
        misses = lookups * _row_miss(B, E, L, D, dtype, h["cache_bytes"], self.units, self.rows_per_block) \
            if per_row else 0.0
        return (h["overhead_us"] + dram * h["dram_us_per_byte"] + l2 * h["l2_us_per_byte"]
                + lookups * h.get("us_per_lookup", 0.0) + misses * h.get("us_per_miss", 0.0))

    def to_dict(self) -> dict:
        d = {"kind": "embedding_model", "units": self.units, "rows_per_block": self.rows_per_block,
             "index_bytes": self.index_bytes, "groups": records(self.groups, ("direction", "dtype"))}
        if self.cold_groups:  # a model without cold fits saves as it always did
            d.update(cold_groups=records(self.cold_groups, ("direction", "dtype")),
                     context_cache_bytes=self.context_cache_bytes)
        if self.backward_call_us:
            d["backward_call_us"] = self.backward_call_us
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EmbeddingModel":
        if d.get("kind") != "embedding_model":
            raise MissingModelError(f"not an embedding model: kind={d.get('kind')!r}")
        cold = keyed(d["cold_groups"], ("direction", "dtype")) if d.get("cold_groups") else None
        return cls(keyed(d["groups"], ("direction", "dtype")), int(d["units"]), int(d["rows_per_block"]),
                   int(d["index_bytes"]), cold, float(d.get("context_cache_bytes", 0.0)),
                   float(d.get("backward_call_us", 0.0)))


CALL_FLOOR = 0.1  # a backward row keeps at least this share of its time when the call is taken off


def backward_call_of(samples: pd.DataFrame) -> float:
    """The backward() call cost the sweep recorded on its backward rows (their median), 0 where
    none was (GPU rows, or a sweep from before 2026-11-28)."""
    if "backward_call_us" not in samples:
        return 0.0
    call = samples.loc[samples["direction"] == "backward", "backward_call_us"].dropna()
    call = call[call > 0]  # a broken timing (the contract refuses it on load) is no call to take off
    return float(call.median()) if len(call) else 0.0


def _row_miss(B, E, L, D, dtype: str, cache_bytes: float, units: int, rpb: int) -> np.ndarray:
    """The share of looked-up rows that miss the cache under the per-row hit model."""
    return 1.0 - hit_rate(B, E, L, D, element_bytes(dtype), cache_bytes, units, rpb, per_row=True)


def _fit_groups(samples: pd.DataFrame, candidates: list[float], units: int, rpb: int, ib: int) -> dict:
    groups = {}
    for (direction, dtype), g in samples.groupby(["direction", "dtype"]):
        shape = [g[c].to_numpy() for c in ("B", "E", "T", "L", "D")]
        y = g["median_us"].to_numpy(float)
        plain, _ = embedding_traffic(direction, dtype, *shape, index_bytes=ib)
        (c0, c1), plain_err = nnls_relative(np.stack([np.ones_like(y), plain], axis=1), y)
        best = None
        lookups = shape[0] * shape[2] * shape[3]  # B x T x L rows gathered (or scattered back)
        for cache, per_row in ((c, r) for c in candidates for r in (False, True)):
            dram, l2 = embedding_traffic(direction, dtype, *shape, cache, units, rpb, ib, per_row)
            # t = c0 + a (dram + l2) + b dram + c lookups: L2 costs a per byte, DRAM a + b >= a.
            # The per-lookup term is ours, not the paper's: a CPU's backward sorts and
            # coalesces the indices, work that grows with lookups, not bytes (0 where bytes
            # explain the time, as the paper finds on GPUs). The per-row hit model adds a
            # cost per missed row: a CPU's random row read waits on memory latency, not bandwidth.
            cols = [np.ones_like(y), dram + l2, dram, lookups]
            if per_row:
                cols.append(lookups * _row_miss(shape[0], shape[1], shape[3], shape[4], dtype, cache, units, rpb))
            coef, err = nnls_relative(np.stack(cols, axis=1), y)
            if best is None or err < best["train_rms_rel_err"]:
                h0, a, b, c = coef[:4]
                best = {"overhead_us": float(h0), "dram_us_per_byte": float(a + b), "l2_us_per_byte": float(a),
                        "us_per_lookup": float(c), "cache_bytes": cache, "train_rms_rel_err": err,
                        **({"per_row": True, "us_per_miss": float(coef[4])} if per_row else {})}
        groups[(str(direction), str(dtype))] = {
            "plain": {"overhead_us": float(c0), "us_per_byte": float(c1), "train_rms_rel_err": plain_err},
            "hit": best,
            "n": int(len(y))}
    return groups


def predict_rows(model: EmbeddingModel, direction: str, dtype: str, rows: pd.DataFrame,
                 hit_rate: bool = True) -> np.ndarray:
    """Predicted µs for embedding_samples rows: hot rows as the sweep's repeated call, rows
    timed cold (column `cold`) with the cold fits."""
    shape = [rows[c].to_numpy() for c in ("B", "E", "T", "L", "D")]
    pred = model.predict(direction, dtype, *shape, hit_rate=hit_rate)
    cold = rows["cold"].fillna(False).astype(bool).to_numpy() if "cold" in rows else np.zeros(len(rows), bool)
    if cold.any() and model.cold_groups:
        pred = np.where(cold, model.predict_cold(direction, dtype, *shape, hit_rate=hit_rate), pred)
    return pred + (model.backward_call_us if direction == "backward" else 0.0)  # each row paid one call


def kernel_error_stats(predicted, measured) -> dict:
    """Table IV's columns: GMAE (geometric mean of |relative error|), mean and std of |relative error|."""
    e = np.abs((np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(measured, float))
    if e.size == 0:
        return {"n": 0, "gmae": float("nan"), "mean": float("nan"), "std": float("nan")}
    return {"n": int(e.size), "gmae": float(np.exp(np.mean(np.log(np.maximum(e, 1e-12))))),
            "mean": float(e.mean()), "std": float(e.std(ddof=1)) if e.size > 1 else 0.0}


def table_iv_rows(model: EmbeddingModel, heldout_df: pd.DataFrame) -> pd.DataFrame:
    """Table IV for the rows given (pass the held-out ones): per (direction, dtype) the kernels
    EL-F / EL-FL / EL-FH / EL-FHL (B for backward): plain or hit-rate (H) model, all tables or
    only large ones (L: E > 100000). Errors are fractions (0.05 = 5%)."""
    out = []
    for (direction, dtype), g in heldout_df.groupby(["direction", "dtype"], sort=False):
        large = g["E"].to_numpy() > LARGE_E
        for hit in (False, True):
            pred = predict_rows(model, direction, dtype, g, hit_rate=hit)
            for only_large in (False, True):
                sel = large if only_large else np.ones(len(g), bool)
                if not sel.any():
                    continue
                kernel = "EL-" + direction[0].upper() + ("H" if hit else "") + ("L" if only_large else "")
                out.append({"kernel": kernel, "dtype": dtype,
                            **kernel_error_stats(pred[sel], g["median_us"].to_numpy(float)[sel])})
    return pd.DataFrame(out, columns=["kernel", "dtype", "n", "gmae", "mean", "std"])
