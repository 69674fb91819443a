"""pipeline/predict/plan.py: the two-device partition (PM2Lat §IV-D.1), on hand-worked examples."""
import math

import pytest

from pipeline.core.graph import ExecutionGraph, Kernel, Op
from pipeline.predict.overheads import OverheadModel
from pipeline.predict.plan import (Link, PlanError, StageCosts, best_split, pipelined_total_us, plan, segment_times,
                                   splits)


def test_link_transfer_time():
    # 1 GB/s moves 1e3 bytes per µs: 2 MB take 2,000 µs, plus the fixed 5 µs
    assert Link(1.0, 5.0).transfer_us(2e6) == pytest.approx(2005.0)
    assert Link(10.0).transfer_us(0) == 0.0


def test_the_best_split_minimises_the_larger_stage():
    # blocks 10 20 30 40 on both; head 5 on the first, tail 15 on the second; 1,000 B at 1 GB/s = 1 µs
    a = StageCosts("a", (10, 20, 30, 40), head_us=5)
    b = StageCosts("b", (10, 20, 30, 40), tail_us=15)
    every = splits(a, b, 1000, Link(1.0))
    # k=1: s1 = 5+10+1 = 16,  s2 = 20+30+40+15 = 105
    # k=2: s1 = 5+30+1 = 36,  s2 = 30+40+15 = 85
    # k=3: s1 = 5+60+1 = 66,  s2 = 40+15 = 55
    assert [(s.after_block, s.stage1_us, s.stage2_us) for s in every] == [(1, 16, 105), (2, 36, 85), (3, 66, 55)]
    best = best_split(every)
    assert (best.after_block, best.bottleneck_us, best.bottleneck_stage, best.fill_us) == (3, 66, 1, 121)
    assert best.throughput_per_s == pytest.approx(1e6 / 66)


def test_a_faster_second_device_takes_more_blocks():
    # the second device is 3x faster: blocks 30 each on the first, 10 on the second; no transfer cost
    a, b = StageCosts("slow", (30,) * 8), StageCosts("fast", (10,) * 8)
    best, every = plan(a, b, 0, Link(100.0))
    # k blocks on the slow one: max(30k, 10(8-k)) is smallest at k=2 (60 vs 60)
    assert best.after_block == 2 and best.bottleneck_us == 60 and len(every) == 7


def test_transfer_sizes_per_boundary_and_the_link_move_the_split():
    a, b = StageCosts("a", (10, 10, 10)), StageCosts("b", (10, 10, 10))
    # the boundary after block 1 sends 20,000 B (20 µs at 1 GB/s), after block 2 nothing
    every = splits(a, b, [20_000, 0], Link(1.0))
    assert [s.stage1_us for s in every] == [30, 20] and [s.transfer_us for s in every] == [20, 0]
    assert best_split(every).after_block == 2


def test_ties_go_to_the_shorter_fill_then_the_earlier_point():
    a = StageCosts("a", (10, 10, 10, 10))
    b = StageCosts("b", (10, 10, 10, 10))
    # k=2: 20 | 20 ; k=1: 10 | 30 ; k=3: 30 | 10: one minimum
    assert best_split(splits(a, b, 0, Link(1.0))).after_block == 2
    # a flat tie: k=1 and k=2 both have bottleneck 30
    a2, b2 = StageCosts("a", (0, 30, 0)), StageCosts("b", (30, 0, 0), tail_us=30)
    every = splits(a2, b2, 0, Link(1.0))  # k=1: 0|30 ; k=2: 30|30
    assert [s.bottleneck_us for s in every] == [30, 30]
    assert best_split(every).after_block == 1  # fill 30 beats fill 60


def test_pipelined_total_is_fill_plus_n_minus_one_bottlenecks():
    assert pipelined_total_us(121, 66, 1) == 121
    assert pipelined_total_us(121, 66, 100) == 121 + 99 * 66
    s = best_split(splits(StageCosts("a", (10, 20, 30, 40), head_us=5), StageCosts("b", (10, 20, 30, 40), tail_us=15),
                          1000, Link(1.0)))
    assert s.total_us(10) == 121 + 9 * 66


def test_a_simulated_pipeline_agrees_with_the_formula():
    # two stages, all requests queued at 0: finish times by the recurrence
    for s1, s2 in ((3.0, 5.0), (5.0, 3.0), (4.0, 4.0)):
        end1 = end2 = 0.0
        for _ in range(7):
            end1 += s1
            end2 = max(end2, end1) + s2
        assert end2 == pipelined_total_us(s1 + s2, max(s1, s2), 7)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_request_counts(bad):
    with pytest.raises(PlanError, match="requests"):
        pipelined_total_us(10, 5, bad)


@pytest.mark.parametrize("gbps", [0, -3.0, math.nan, math.inf])
def test_bad_bandwidth(gbps):
    with pytest.raises(PlanError, match="bandwidth"):
        Link(gbps)


def test_bad_latency_and_sizes():
    with pytest.raises(PlanError, match="latency"):
        Link(1.0, -1.0)
    with pytest.raises(PlanError, match="transfer bytes"):
        splits(StageCosts("a", (1, 1)), StageCosts("b", (1, 1)), -5, Link(1.0))
    with pytest.raises(PlanError, match="2 transfer sizes for 1"):
        splits(StageCosts("a", (1, 1)), StageCosts("b", (1, 1)), [1, 2], Link(1.0))


def test_a_model_needs_two_blocks_and_the_same_blocks_on_both():
    with pytest.raises(PlanError, match="1 block"):
        plan(StageCosts("a", (5,)), StageCosts("b", (5,)), 0, Link(1.0))
    with pytest.raises(PlanError, match="not one model"):
        plan(StageCosts("a", (5, 5)), StageCosts("b", (5, 5, 5)), 0, Link(1.0))


@pytest.mark.parametrize("bad", [-1.0, math.nan, "3"])
def test_bad_block_times(bad):
    with pytest.raises(PlanError, match="block 1"):
        StageCosts("a", (1.0, bad))


def test_segment_times_add_up_to_the_whole_on_the_cpu():
    ops = [Op(0, "aten::embedding", kernels=[Kernel("e", 3.0, launch="inline")]),
           Op(1, "aten::linear"), Op(2, "aten::addmm", parent=1, kernels=[Kernel("g", 10.0, launch="inline")]),
           Op(3, "aten::add", kernels=[Kernel("a", 2.0, launch="inline")]),
           Op(4, "aten::linear", kernels=[Kernel("h", 7.0, launch="inline")])]
    graph = ExecutionGraph(ops)
    over = OverheadModel(individual={}, shared={"T1": 1.0, "T2": 0.0, "T3": 0.0, "T4": 0.0, "T5": 0.5})
    seg = {0: "embed", 1: "block0", 3: "block0", 4: "lm_head"}
    got = segment_times(graph, seg, over, synchronous=True)
    # T1 = 1 per top-level op; every op here has kernels, so no T5 (one kernel each)
    assert got == {"embed": 4.0, "block0": 14.0, "lm_head": 8.0}
    from pipeline.predict.critical_path import critical_path

    assert sum(got.values()) == pytest.approx(critical_path(graph, over, synchronous=True).e2e_us)
    with pytest.raises(Exception, match="no segment"):
        segment_times(graph, {0: "embed"}, over)
    # T1 5x after any op of 2 us or more (every op here): each gap but the first follows the op
    # that really precedes it, across the segments' borders too
    from dataclasses import replace

    from pipeline.predict.overheads import AfterOp

    slow = replace(over, t1_after=AfterOp([0.0, 1.0], [1.0, 5.0]))
    got = segment_times(graph, seg, slow, synchronous=True)
    assert sum(got.values()) == pytest.approx(critical_path(graph, slow, synchronous=True).e2e_us)
    assert got == {"embed": 4.0, "block0": 1 * 5 + 10 + 1 * 5 + 2, "lm_head": 5 + 7.0}


# -- devchar plan: bad input is one line, a tiny model is planned end to end ---------------------

# the made-up gemm and utility models of test_cli (no sweep), for DEVICE
from test_cli import DEVICE, device_models as plan_models  # noqa: E402,F401


def _config(tmp_path, layers=3):
    path = tmp_path / f"tiny-{layers}.json"
    path.write_text('{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, '
                    '"num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100, "max_position_embeddings": 256, '
                    f'"num_hidden_layers": {layers}, "tie_word_embeddings": true}}')
    return str(path)


def _plan(*args):
    from pipeline.cli.main import main

    return main(["plan", *args])


def _one_line(capsys, needle):
    err = capsys.readouterr().err.strip()
    assert err.startswith("devchar: error: ") and "\n" not in err and needle in err, err


@pytest.mark.parametrize("more, needle", [(["--batch", "0"], "batch=0"), (["--seq", "-2"], "seq=-2"),
                                          (["--requests", "0"], "requests=0"), (["--link-gbps", "0"], "bandwidth"),
                                          (["--link-gbps", "-1"], "bandwidth")])
def test_plan_bad_numbers(plan_models, tmp_path, capsys, more, needle):
    assert _plan("--hf-config", _config(tmp_path), "--devices", DEVICE, DEVICE, *more) == 2
    _one_line(capsys, needle)


def test_plan_unknown_device_and_one_block(plan_models, tmp_path, capsys):
    assert _plan("--hf-config", _config(tmp_path), "--devices", DEVICE, "cpu-nope", "--link-gbps", "5") == 2
    _one_line(capsys, "unknown device 'cpu-nope'")
    assert _plan("--hf-config", _config(tmp_path, 1), "--devices", DEVICE, DEVICE, "--link-gbps", "5") == 2
    _one_line(capsys, "1 transformer block")


def test_plan_measure_needs_this_machines_cpu(plan_models, tmp_path, capsys):
    assert _plan("--hf-config", _config(tmp_path), "--devices", DEVICE, DEVICE, "--measure") == 2
    _one_line(capsys, "not one of its slugs")
    assert _plan("--hf-config", _config(tmp_path), "--devices", DEVICE, DEVICE) == 2  # no --link-gbps
    _one_line(capsys, "give --link-gbps")


def test_plan_a_tiny_model_end_to_end(plan_models, tmp_path, capsys):
    assert _plan("--hf-config", _config(tmp_path), "--devices", DEVICE, DEVICE, "--seq", "8", "--link-gbps", "5",
                 "--requests", "4") == 0
    out = capsys.readouterr().out
    assert "3 blocks" in out and "best split: blocks 0–" in out and "4 requests" in out, out


def test_the_two_stages_compose_to_the_whole_model(tmp_path):
    """two_stage.build_stage: stage 2 fed stage 1's activation gives the unsplit model's logits."""
    import json

    import torch

    from pipeline.workloads.predict_callable import build_causal_lm
    from pipeline.workloads.two_stage import StageSpec, build_stage

    config = json.loads(open(_config(tmp_path, 4)).read())
    spec = StageSpec(config, batch=2, seq=8, dtype="float32", after_block=3)
    (one, ids, _), (two, _, inject) = build_stage(spec, 1), build_stage(spec, 2)
    whole = build_causal_lm(config).eval()
    with torch.inference_mode():
        inject.value = one(input_ids=ids, use_cache=False).logits
        assert inject.value.shape == (2, 8, 64)
        got = two(input_ids=ids, use_cache=False).logits
        want = whole(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want)


def test_blocks_are_told_apart_and_the_pieces_add_up_to_the_whole(plan_models, tmp_path):
    """blocks.price_blocks: every block gets its ops, and on the CPU the pieces sum to the whole
    graph's Algorithm 1 prediction (predict_callable.predict_module on the same model)."""
    import json

    import torch

    from pipeline.cli.plan import _device_models
    from pipeline.workloads.blocks import price_blocks
    from pipeline.workloads.predict_callable import build_causal_lm, predict_module

    model = build_causal_lm(json.loads(open(_config(tmp_path, 3)).read()))
    inputs = {"input_ids": torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0)),
              "use_cache": False}
    m = _device_models(DEVICE)
    prices = price_blocks(model, inputs, "float32", {DEVICE: m})
    pieces = prices.pieces[DEVICE]
    assert {"embed", "block0", "block1", "block2", "lm_head"} <= set(pieces) and prices.n_blocks == 3
    assert all(pieces[f"block{i}"] > 0 for i in range(3))
    assert prices.transfer_bytes == (8 * 64 * 4, 8 * 64 * 4)
    whole = predict_module(model, inputs, m["gemm"], m["utility"], m["overheads"], extra=m["extra"])
    assert sum(pieces.values()) == pytest.approx(whole["e2e_us"], rel=1e-9)
