"""The what-if transforms (what_if.py): a third batch size, fused embedding bags."""
from __future__ import annotations

import math

import pytest

from pipeline.workloads.dlrm import TINY_CONFIGS
from pipeline.predict.price import classify_graph
from pipeline.predict.price_recsys import EMB_BWD, EMB_FWD, RecsysOps
from pipeline.predict.what_if import fuse_embedding_bags, with_batch

SPEC = TINY_CONFIGS[0]


def test_batch_what_if_solves_shapes_of_a_third_batch(dlrm_captures):
    (g4, i4), (g8, i8), (g16, i16) = dlrm_captures[4], dlrm_captures[8], dlrm_captures[16]
    shapes, report = with_batch(g4, i4["shapes"], 4, i8["shapes"], g8, 8, 16)
    assert report["unaligned_ops"] <= len(g4) // 10
    names4, names16 = [o.name for o in g4], [o.name for o in g16]
    if names4 != names16:
        pytest.skip("batch 4 and 16 ran different op sequences; no one-to-one check")
    checked = 0
    for a, b in zip(g4, g16):
        if a.name in (EMB_FWD, EMB_BWD, "aten::addmm", "aten::bmm", "aten::index_select"):
            assert shapes[a.id] == i16["shapes"][b.id], a.name
            checked += 1
    assert checked >= 2 * len(SPEC.table_rows)


def test_fuse_embedding_bags(dlrm_captures, flat):
    graph, info = dlrm_captures[8]
    fused, shapes, scalars = fuse_embedding_bags(graph, info["shapes"], info["scalars"])
    fwd, bwd = fused.by_name(EMB_FWD), fused.by_name(EMB_BWD)
    assert len(fwd) == 1 and len(bwd) == 1
    T, E = len(SPEC.table_rows), sum(SPEC.table_rows)
    assert shapes[fwd[0].id][0] == [E, SPEC.embedding_dim]
    assert math.prod(shapes[fwd[0].id][2]) == T * 8  # one bag per (table, sample)
    extra = RecsysOps(flat, flat)
    cls = classify_graph(fused, shapes, scalars, extra)
    assert cls[bwd[0].id][2][:2] == (T * 8, E)
    assert len(fused.top_level()) < len(graph.top_level())
    with pytest.raises(ValueError, match="nothing to fuse"):
        fuse_embedding_bags(fused, shapes, scalars)


def test_returned_sizes_scale_with_the_batch_tensor_by_tensor():
    from pipeline.predict.what_if import returned_at_batch

    # logits of 4 x 1000 float32 per sample, and a scalar loss that does not grow
    assert returned_at_batch([16_000, 4], [32_000, 4], 1, 2, 8) == [128_000, 4]
    assert returned_at_batch([16_000], [32_000, 4], 1, 2, 8) == [16_000]  # not aligned: as captured
    assert returned_at_batch([16_001], [32_000], 2, 4, 8) == [16_001]  # not affine in the batch: as captured
    assert returned_at_batch([16_001, 40], [32_000, 80], 2, 4, 8) == [16_001, 160]  # each size on its own
    assert returned_at_batch([], [], 1, 2, 8) == []
