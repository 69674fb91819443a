"""Copies priced by their tensors' layouts (price.copy_layout): a transposing copy, a gather of
contiguous rows (heads permuted) and a broadcast (a bias copied into a GEMM's output) run at
very different speeds, and the execution trace records the strides that tell them apart."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.predict.price import classify_graph, copy_layout
from pipeline.predict.utility import UtilityModel

HEADS = [8, 8, 128, 64]


def test_a_copy_is_told_by_its_source_and_destination_strides():
    # q permuted from (B, S, H, D) to (B, H, S, D): rows of head_dim, gathered at a stride
    assert copy_layout("aten::copy_", [HEADS, HEADS, None], [[65536, 8192, 64, 1], [65536, 64, 512, 1], None]) \
        == ("copy_rows", (8192, 64))
    # k transposed for q @ k^T: the source's innermost dim is strided: every element moves alone
    kt = [8, 8, 64, 128]
    assert copy_layout("aten::copy_", [kt, kt, None], [[65536, 8192, 128, 1], [65536, 64, 1, 512], None])[0] == "copy"
    # a bias broadcast into addmm's output: one row read, every row written
    assert copy_layout("aten::copy_", [[1024, 768], [1024, 768]], [[768, 1], [0, 1]]) == ("copy_bcast", (1024, 768))
    # repeat_kv's expand: a middle dim broadcast, each (S, D) block contiguous
    assert copy_layout("aten::clone", [[1, 3, 3, 128, 64], None], [[24576, 8192, 0, 64, 1], None]) \
        == ("copy_bcast", (9, 8192))
    # a column broadcast ((n, 1) expanded to (n, m)): each row a fill, not a transpose
    assert copy_layout("aten::clone", [[16, 32]], [[1, 0]]) == ("copy_bcast", (16, 32))
    # a contiguous clone is one run; size-1 dims never break it
    assert copy_layout("aten::clone", [[1, 4, 16]], [[999, 16, 1]]) == ("copy_rows", (1, 64))
    # written into a strided destination (a transposed view): a transposing copy
    assert copy_layout("aten::copy_", [[64, 32], [64, 32]], [[1, 64], [32, 1]])[0] == "copy"


def test_without_usable_strides_a_copy_is_priced_as_before():
    assert copy_layout("aten::copy_", [HEADS, HEADS], None) is None
    assert copy_layout("aten::copy_", [HEADS, HEADS], [[1, 2, 3, 4]]) is None  # the source's are missing
    assert copy_layout("aten::copy_", [HEADS, HEADS], [[65536, 8192, 64, 1], [64, 1]]) is None  # rank mismatch
    assert copy_layout("aten::relu", [HEADS], [[65536, 8192, 64, 1]]) is None


def test_a_calibration_from_before_the_layouts_prices_them_as_a_copy():
    rows = [dict(op="copy", dtype="float32", rows=r, cols=c, median_us=1 + r * c / 1000, held_out=False)
            for r in (1, 16, 256) for c in (64, 256, 1024)]
    model = UtilityModel.fit(pd.DataFrame(rows))
    for op in ("copy_rows", "copy_bcast"):
        assert float(model.predict(op, "float32", 256, 64)) == pytest.approx(float(model.predict("copy", "float32",
                                                                                                256, 64)))
    with pytest.raises(Exception, match="no utility calibration"):
        model.predict("relu", "float32", 16, 16)


def test_the_capture_records_strides_and_the_pricing_reads_them():
    torch = pytest.importorskip("torch")
    from pipeline.workloads.capture import capture

    x, bias, a, w = torch.randn(2, 16, 4, 8), torch.randn(24), torch.randn(32, 12), torch.randn(12, 24)

    def step():
        return x.permute(0, 2, 1, 3).contiguous(), x.transpose(-1, -2).contiguous(), torch.addmm(bias, a, w)

    graph, info = capture(step, warmup=1)
    classes = classify_graph(graph, info["shapes"], info.get("scalars"), None, info["strides"])
    priced = sorted(c[1] for c in classes.values() if c[0] == "priced" and c[1] and c[1].startswith("copy"))
    assert priced == ["copy", "copy_bcast", "copy_rows"]
    blind = classify_graph(graph, info["shapes"], info.get("scalars"))  # a graph captured without strides
    assert sorted(c[1] for c in blind.values() if c[0] == "priced" and c[1] and c[1].startswith("copy")) == ["copy"] * 3


@pytest.mark.parametrize("op", ["copy", "copy_rows", "copy_bcast"])
def test_the_sweeps_copies_write_what_their_source_holds(op):
    pytest.importorskip("torch")
    from pipeline.sweeps.utility import _utility_callable

    out = _utility_callable(op, "float32", 16, 8, "cpu")()
    assert tuple(out.shape) == (16, 8) and out.is_contiguous()
    if op == "copy_bcast":
        assert (out == out[0]).all()
