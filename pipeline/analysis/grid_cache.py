"""NAS-scale prediction cache (PM2Lat IV-D2): one MatMul layer's latency for every
(in_features, out_features, batch, seq) of a grid, streamed into DuckDB chunk by chunk.

The grid never exists in memory: it is cut into chunks of a million shapes, each one
vectorized prediction, streamed into DuckDB. The device's previous rows for that op and
dtype are replaced in the same transaction, so an interrupted run leaves the old cache intact.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from pipeline.core.errors import BadShapeError, check_dims

TABLE = "layer_grid_predictions"
# PM2Lat's example: 14 feature choices, batch 1..256, sequence 64..8192.
DEFAULT_FEATURES = (128, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192)


@dataclass(frozen=True)
class LayerGrid:
    features: tuple[int, ...] = DEFAULT_FEATURES
    batch_max: int = 256
    seq_min: int = 64
    seq_max: int = 8192
    seq_step: int = 64

    def __post_init__(self):
        check_dims(batch_max=self.batch_max, seq_min=self.seq_min, seq_max=self.seq_max, seq_step=self.seq_step)
        for f in self.features:
            check_dims(feature=f)
        if self.seq_min > self.seq_max:
            raise BadShapeError(f"seq_min={self.seq_min} exceeds seq_max={self.seq_max}")

    @property
    def seqs(self) -> np.ndarray:
        return np.arange(self.seq_min, self.seq_max + 1, self.seq_step, dtype=np.int64)

    @property
    def rows(self) -> int:
        return len(self.features) ** 2 * self.batch_max * self.seqs.size

    def chunks(self, rows_per_chunk: int = 1 << 20) -> Iterator[dict[str, np.ndarray]]:
        """The grid in flat-index order, rows_per_chunk rows at a time."""
        feats, seqs = np.asarray(self.features, np.int64), self.seqs
        dims = (feats.size, feats.size, self.batch_max, seqs.size)
        for lo in range(0, self.rows, rows_per_chunk):
            fi, fo, bi, si = np.unravel_index(np.arange(lo, min(lo + rows_per_chunk, self.rows)), dims)
            yield {"in_features": feats[fi], "out_features": feats[fo], "batch": bi + 1, "seq": seqs[si]}


def write_grid(con, gemm, device: str, grid: LayerGrid, op: str = "linear", dtype: str = "float32",
               log=print) -> tuple[int, float]:
    """Predict and store the whole grid; returns (rows, seconds). `con` is a DuckDB connection.

    DuckDB pulls the chunks from an Arrow stream inside one INSERT, so the grid is never
    materialised, and the delete of the old rows and the insert commit together.
    """
    import pyarrow as pa

    gemm.check(op, dtype)  # fail before writing anything if the model lacks this op/dtype
    schema = pa.schema([(c, pa.int64()) for c in ("in_features", "out_features", "batch", "seq")]
                       + [("predicted_us", pa.float64())])
    start, done, last = time.perf_counter(), 0, time.perf_counter()

    def batches():
        nonlocal done, last
        for c in grid.chunks():
            pred = gemm.predict(op, dtype, c["batch"] * c["seq"], c["out_features"], c["in_features"], 1)
            yield pa.record_batch({**c, "predicted_us": pred}, schema=schema)
            done += pred.size
            if time.perf_counter() - last > 3:
                last = time.perf_counter()
                log(f"[predict-grid] {done:,}/{grid.rows:,} rows ({done / (last - start):,.0f} rows/s)")

    con.register("grid_stream", pa.RecordBatchReader.from_batches(schema, batches()))
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (device VARCHAR, op VARCHAR, dtype VARCHAR, "
                    "in_features BIGINT, out_features BIGINT, batch BIGINT, seq BIGINT, predicted_us DOUBLE)")
        con.execute(f"DELETE FROM {TABLE} WHERE device = ? AND op = ? AND dtype = ?", [device, op, dtype])
        con.execute(f"INSERT INTO {TABLE} SELECT ?, ?, ?, * FROM grid_stream", [device, op, dtype])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        con.unregister("grid_stream")
    return done, time.perf_counter() - start
