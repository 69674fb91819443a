"""The second timing of held-out rows (harness/repeat.py) and its summary (analysis/repeat.py)."""
import numpy as np
import pandas as pd
import pytest

from pipeline.analysis.repeat import repeat_section, repeat_spread
from pipeline.harness.repeat import repeat_sample, retime
from pipeline.harness.timer import TimingSpec


def test_sample_takes_up_to_n_eligible_rows_per_group_the_same_every_time():
    groups = ["a"] * 10 + ["b"] * 3 + ["c"] * 5
    eligible = [True] * 10 + [True, False, True] + [False] * 5
    picked = repeat_sample(groups, eligible, per_group=4)
    assert picked == repeat_sample(groups, eligible, per_group=4)
    assert sum(groups[i] == "a" for i in picked) == 4
    assert {i for i in picked if groups[i] == "b"} == {10, 12}  # fewer eligible than asked: all of them
    assert all(eligible[i] for i in picked)
    assert repeat_sample(groups, eligible, per_group=0) == []
    with pytest.raises(ValueError, match="-1"):
        repeat_sample(groups, eligible, per_group=-1)


def test_retime_sets_a_second_median_on_the_picked_rows_only():
    rows = [{"median_us": 1.0} for _ in range(5)]
    calls = []
    makers = [lambda i=i: (lambda: calls.append(i)) for i in range(5)]
    spec = TimingSpec(warmup_s=0.0, budget_s=0.001, min_reps=3, max_reps=3)
    assert retime(rows, makers, [1, 3], spec, "cpu") == 2
    assert set(calls) == {1, 3} and calls[:2] in ([1, 1], [3, 3])  # one untimed call first
    assert [("repeat_us" in r) for r in rows] == [False, True, False, True, False]
    assert rows[1]["repeat_us"] > 0 and rows[1]["repeat_stalled"] in (True, False)


def _rows(first, second, op="mm", dtype="float32", **extra):
    return pd.DataFrame({"op": op, "dtype": dtype, "median_us": first, "repeat_us": second, **extra})


def test_spread_is_the_mean_absolute_change_and_skips_stalled_or_untimed_rows():
    df = pd.concat([_rows([100.0, 100.0, 100.0, 100.0], [110.0, 80.0, np.nan, 500.0],
                          repeat_stalled=[False, False, False, True]),
                    _rows([10.0], [10.0], op="bmm", repeat_stalled=[False])])
    s = repeat_spread(df).set_index("layer_type")
    assert s.loc["MM", "n"] == 2 and s.loc["MM", "repeat_err"] == pytest.approx(0.15)
    assert s.loc["MM", "repeat_ratio"] == pytest.approx(0.95)
    assert s.loc["BMM", "repeat_err"] == 0.0
    assert repeat_spread(df.drop(columns="repeat_us")).empty


def test_section_sets_the_spread_beside_the_heldout_error():
    df = _rows([100.0, 100.0], [130.0, 70.0])
    errors = pd.DataFrame({"layer_type": ["MM", "Linear"], "dtype": ["float32"] * 2, "mean_rel_err": [0.32, 0.1]})
    text = "\n".join(repeat_section(df, errors))
    assert "30.0%" in text and "32.0%" in text and "Linear" not in text
    assert repeat_section(df.drop(columns="repeat_us"), errors) == []


def test_utility_rows_pool_by_layer_type():
    df = pd.concat([_rows([10.0], [12.0], op="relu"), _rows([10.0], [9.0], op="add"),
                    _rows([10.0], [10.0], op="softmax")])
    s = repeat_spread(df).set_index("layer_type")
    assert s.loc["Vector", "n"] == 2 and s.loc["Vector", "repeat_err"] == pytest.approx(0.15)
    assert s.loc["Softmax", "repeat_err"] == 0.0


def test_rows_that_name_their_layer_type_keep_it():
    """Memory kernels go by the DLRM paper's names (model_errors' layer types), not PM2Lat's."""
    gemm = _rows([10.0], [11.0], op="mm")
    memory = _rows([10.0, 10.0], [13.0, 10.0], op="transpose").assign(layer_type="transpose")
    s = repeat_spread(pd.concat([gemm, memory], ignore_index=True)).set_index("layer_type")
    assert set(s.index) == {"MM", "transpose"}
    assert s.loc["transpose", "n"] == 2 and s.loc["transpose", "repeat_err"] == pytest.approx(0.15)


def test_the_memory_sweep_times_a_sample_of_its_heldout_rows_again(cpu):
    from pipeline.sweeps.memory import sweep_memory

    rows = pd.DataFrame(sweep_memory(cpu, "tiny"))
    again = rows[rows["repeat_us"].notna()] if "repeat_us" in rows else rows.iloc[:0]
    assert len(again) and again["held_out"].all() and (again["repeat_us"] > 0).all()
    # the tiny profile's one row per (op, dtype)
    assert not again.duplicated(["op", "dtype"]).any()
    assert set(again["op"]) == set(rows.loc[rows["held_out"], "op"])
