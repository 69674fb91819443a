"""DLRM workloads as plain data: the three models of the DLRM paper's Table III (no torch here).

Widths follow facebookresearch/dlrm's `--arch-mlp-*` strings, with one difference: the
Table III bottom string starts with the dense input width ("13-512-256-128" is 13 dense
features into Linear 13->512->256->128), which we keep apart as `dense_features`, so both
`bottom_mlp` and `top_mlp` list only layer output widths. The top MLP's input width is
derived, as dlrm_s_pytorch does: bottom output + n(n-1)/2 dot products, n = tables + 1.

Pooling L (lookups per bag, fixed per bag) is what the paper's own launch script passes
(DLRM_default: --num-indices-per-lookup=100 --num-indices-per-lookup-fixed; DLRM_DDP: the
fixed flag with dlrm_s_pytorch's default of 10) and, for DLRM_MLPerf, the one-hot
categorical features of Criteo (one lookup per table).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import BadShapeError, check_dims


@dataclass(frozen=True)
class DLRMSpec:
    name: str
    dense_features: int
    bottom_mlp: tuple[int, ...]
    num_tables: int
    rows_per_table: int | tuple[int, ...]  # one count for all tables, or one per table
    embedding_dim: int
    pooling: int  # L: lookups summed into each bag
    top_mlp: tuple[int, ...]

    def __post_init__(self):
        check_dims(dense_features=self.dense_features, num_tables=self.num_tables,
                   embedding_dim=self.embedding_dim, pooling=self.pooling)
        for label, widths in (("bottom_mlp", self.bottom_mlp), ("top_mlp", self.top_mlp)):
            if not isinstance(widths, tuple) or not widths:
                raise BadShapeError(f"{self.name}: {label}={widths!r} must be a non-empty tuple of widths")
            check_dims(**{f"{label}[{i}]": w for i, w in enumerate(widths)})
        # The dot interaction stacks the bottom output beside the embeddings as one more
        # "feature" vector, so the two must have the same length.
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise BadShapeError(f"{self.name}: bottom_mlp[-1]={self.bottom_mlp[-1]} must equal "
                                f"embedding_dim={self.embedding_dim} for the dot interaction")
        # One click probability per sample (sigmoid + BCE).
        if self.top_mlp[-1] != 1:
            raise BadShapeError(f"{self.name}: top_mlp[-1]={self.top_mlp[-1]} must be 1 (one click probability)")
        if isinstance(self.rows_per_table, tuple):
            if len(self.rows_per_table) != self.num_tables:
                raise BadShapeError(f"{self.name}: rows_per_table has {len(self.rows_per_table)} entries, "
                                    f"expected num_tables={self.num_tables}")
            check_dims(**{f"rows_per_table[{i}]": r for i, r in enumerate(self.rows_per_table)})
        else:
            check_dims(rows_per_table=self.rows_per_table)

    @property
    def table_rows(self) -> tuple[int, ...]:
        rows = self.rows_per_table
        return tuple(rows) if isinstance(rows, tuple) else (rows,) * self.num_tables

    @property
    def num_features(self) -> int:
        """Vectors entering the dot interaction: the bottom output plus one per table."""
        return self.num_tables + 1

    @property
    def interaction_dim(self) -> int:
        """Top MLP input: the bottom output concatenated with the strictly-lower triangle of Z."""
        n = self.num_features
        return self.bottom_mlp[-1] + n * (n - 1) // 2


def check_batch(spec: DLRMSpec, batch: int) -> None:
    check_dims(batch=batch)


# MLPerf DLRM (Criteo Terabyte, --max-ind-range=40000000) vocabulary sizes of the 26
# categorical features, as in facebookresearch/dlrm and the MLPerf reference.
MLPERF_TERABYTE_ROWS: tuple[int, ...] = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)
# Table III says "up to 14M" rows: the five ~26-40M tables are capped there. That also
# keeps the model at ~74M rows x 128 x 4 B = 38 GB, which fits one 80 GB GPU with the
# sparse SGD dlrm uses (the uncapped 188M rows would be 96 GB).
MLPERF_ROW_CAP = 14_000_000
MLPERF_ROWS: tuple[int, ...] = tuple(min(r, MLPERF_ROW_CAP) for r in MLPERF_TERABYTE_ROWS)

FULL_CONFIGS: tuple[DLRMSpec, ...] = (
    DLRMSpec("DLRM_default", dense_features=512, bottom_mlp=(512, 64), num_tables=8,
             rows_per_table=1_000_000, embedding_dim=64, pooling=100, top_mlp=(1024, 1024, 1024, 1)),
    DLRMSpec("DLRM_MLPerf", dense_features=13, bottom_mlp=(512, 256, 128), num_tables=26,
             rows_per_table=MLPERF_ROWS, embedding_dim=128, pooling=1, top_mlp=(1024, 1024, 512, 256, 1)),
    DLRMSpec("DLRM_DDP", dense_features=128, bottom_mlp=(128, 128, 128), num_tables=8,
             rows_per_table=80_000, embedding_dim=128, pooling=10, top_mlp=(512, 512, 512, 256, 1)),
)

# Sized for a 2-core CPU, keeping each model's shape: the same tables, layers and L, every
# width and embedding dim halved (MLPerf keeps Criteo's 13 dense features), rows cut where a
# table set is big (default /10; MLPerf /100 keeping its skew, small tables as they are; DDP's
# 80k rows kept). Rows change only cache behaviour and build time: the sparse SGD update
# touches looked-up rows only. Tables stay above the LLC (8 x 100k x 32 x 4 B = 102 MB),
# as the full ones are above a GPU's L2. Measured on the 2-core dev machine (5 warm-up + 25
# steps, one build per batch size): default 9/30 ms, mlperf 4/9 ms, ddp 3/6 ms at batch
# 64/256, ~5 s for all six runs with builds. Full widths would take ~9 s.
QUICK_CONFIGS: tuple[DLRMSpec, ...] = (
    DLRMSpec("dlrm_default-cpu", dense_features=256, bottom_mlp=(256, 32), num_tables=8,
             rows_per_table=100_000, embedding_dim=32, pooling=100, top_mlp=(512, 512, 512, 1)),
    DLRMSpec("dlrm_mlperf-cpu", dense_features=13, bottom_mlp=(256, 128, 64), num_tables=26,
             rows_per_table=tuple(max(r // 100, min(r, 100)) for r in MLPERF_ROWS), embedding_dim=64,
             pooling=1, top_mlp=(512, 512, 256, 128, 1)),
    DLRMSpec("dlrm_ddp-cpu", dense_features=64, bottom_mlp=(64, 64, 64), num_tables=8,
             rows_per_table=80_000, embedding_dim=64, pooling=10, top_mlp=(256, 256, 256, 128, 1)),
)
# For tests: builds and trains in milliseconds.
TINY_CONFIGS: tuple[DLRMSpec, ...] = (
    DLRMSpec("dlrm-tiny", dense_features=8, bottom_mlp=(16, 8), num_tables=3, rows_per_table=(50, 20, 7),
             embedding_dim=8, pooling=4, top_mlp=(16, 8, 1)),
)

CONFIG_SETS = {"tiny": TINY_CONFIGS, "quick": QUICK_CONFIGS, "full": FULL_CONFIGS}


def configs_for(name: str) -> tuple[DLRMSpec, ...]:
    if name not in CONFIG_SETS:
        raise BadShapeError(f"unknown DLRM config set {name!r}; expected one of {sorted(CONFIG_SETS)}")
    return CONFIG_SETS[name]
