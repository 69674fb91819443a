"""`devchar advise` (pipeline/predict/advise.py, lm_shape.py, pipeline/analysis/advice.py,
pipeline/cli/advise.py): the quantization arithmetic on the co-design paper's hand-worked
cases, the parameter budget, bad input. No timing: made-up models with an A100-like table
(tile 128 x 128, 108 SMs, constant throughput, so time is padded FLOPs)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import BadConfigError, BadShapeError
from pipeline.core.ops import UTILITY_OPS
from pipeline.predict import advise
from pipeline.predict.gemm import GemmModel, GemmTable
from pipeline.predict.lm_shape import from_hf_config, gpt2_config, to_hf_config
from pipeline.predict.selector import KernelSelector
from pipeline.predict.shape_catalog import case
from pipeline.predict.utility import UtilityModel
from pipeline.analysis import advice

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
DTYPES = ("float16", "float32")


@pytest.fixture(scope="module")
def a100():
    """GEMM tables with tile 128 x 128 on 108 slots and one constant throughput; utility ops
    priced by bytes. Every op of every dtype the tests use."""
    tables, labels = {}, []
    for op in ("mm", "bmm", "linear"):
        for dt in DTYPES:
            tables[(op, dt, "k")] = GemmTable(op, dt, "k", 128, 128, 108, np.array([1.0, 1e9]), np.array([1.0, 1e9]),
                                              np.full((2, 2), 1e8))
            labels += [dict(op=op, dtype=dt, m=m, n=64, k=64, batch=1, kernel="k") for m in (64, 128)]
    gemm = GemmModel(tables, KernelSelector.fit(pd.DataFrame(labels)))
    regimes = {(op, dt): {"split": None, "coefs": [np.array([1.0, 1e-4, 0.0, 0.0])]}
               for op in UTILITY_OPS for dt in DTYPES}
    return gemm, UtilityModel(regimes)


def test_alignment_is_the_papers_128_byte_rule():
    assert advise.alignment("float16") == advise.alignment("bfloat16") == 64
    assert advise.alignment("tf32") == advise.alignment("float32") == 32


@pytest.mark.parametrize("name,params", [("gpt3-2.7b", 2_774_968_320), ("llama-2-7b", 6_738_415_616),
                                         ("pythia-410m", 405_334_016), ("pythia-1b", 1_011_781_632),
                                         ("nanogpt-124m", 124_439_808)])
def test_parameter_counts_are_the_published_models(name, params):
    assert from_hf_config(case(name).config, name).params() == params


def test_gpt3_27b_lm_head_waves_and_tail_by_hand(a100):
    """m = b*s = 2048, n = 50257 on 128 x 128 tiles: 16 x 393 = 6288 blocks, 59 waves of 108,
    the last holding 6288 - 58 * 108 = 24 blocks (22 %); the last tile column is 81/128 full."""
    gemm, utility = a100
    shape = from_hf_config(case("gpt3-2.7b").config)
    rows = advise.explain(shape, 1, 2048, "float16", gemm, utility).set_index("gemm")
    head = rows.loc["lm_head"]
    assert (head["blocks"], head["waves"]) == (6288, 59)
    assert head["tail_util"] == pytest.approx(24 / 108)
    assert head["tile_eff"] == pytest.approx(50257 / (393 * 128))
    assert head["aligned"] == "no: n=50257"
    # head_dim 80: the attention BMMs break the 64-element rule; 20 heads (head_dim 128) do not
    assert rows.loc["attn.score", "aligned"] == "no: k=80" and rows.loc["attn.over_value", "aligned"] == "no: n=80"
    twenty = advise.explain(shape.with_(heads=20, kv_heads=20), 1, 2048, "float16", gemm, utility).set_index("gemm")
    assert twenty.loc["attn.score", "aligned"] == "yes" and twenty.loc["attn.score", "batch"] == 20
    assert rows["share"].sum() < 1  # the utility ops hold the rest of the step


def test_nanogpt_vocab_padding_by_hand(a100):
    """50257 -> 50304 = 786 x 64: aligned for 16-bit types, the same 393 tile columns, so on
    this table the padding is free (tile efficiency 100 %), and it is a search candidate."""
    gemm, utility = a100
    shape = from_hf_config(case("nanogpt-124m").config)
    assert 50304 % 64 == 0 and -(-50257 // 64) * 64 == 50304
    padded = advise.explain(shape.with_(vocab=50304), 1, 1024, "float16", gemm, utility).set_index("gemm")
    assert padded.loc["lm_head", "aligned"] == "yes" and padded.loc["lm_head", "tile_eff"] == pytest.approx(1.0)
    table = advise.search(shape, 1, 1024, "float16", gemm, utility, dims=("vocab",))
    assert 50304 in set(table["value"]) and (table["value"] >= 50257).all()
    # padded FLOPs are the same, the real FLOPs more: the padded vocab costs nothing here
    row = table.set_index("value").loc[50304]
    assert row["predicted_speedup"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("tolerance", [0.005, 0.02, 0.05])
def test_search_honours_the_parameter_budget(a100, tolerance):
    gemm, utility = a100
    shape = from_hf_config(case("llama-2-7b").config)
    table = advise.search(shape, 2, 256, "float16", gemm, utility, tolerance)
    assert (table["params_change"].abs() <= tolerance + 1e-12).all() and table["in_budget"].all()
    ffn = table[table["dimension"] == "ffn"]["value"]
    assert 11008 in set(ffn) and ffn.diff().dropna().max() <= 1 or len(ffn) >= advise.MAX_CANDIDATES
    heads = table[table["dimension"] == "heads"]
    assert ((4096 // heads["value"]) % 64 == 0).all() and heads["value"].between(16, 64).all()
    for _, r in advise.best_per_dimension(table).iterrows():  # a row turns back into the shape it prices
        assert abs(advise.shape_for(r, shape).params() / shape.params() - 1) <= tolerance + 1e-12


def test_proposal_outside_the_budget_is_priced_and_flagged(a100):
    gemm, utility = a100
    _, table, rows = advice.advise_model("gpt3-2.7b", case("gpt3-2.7b").config, gemm, utility, "float16", 1, 512,
                                         0.02, {"heads": 20, "hidden": 4096})
    got = {(r["dimension"], r["proposed"]): r for r in rows}
    assert got[("heads", "20")]["params_change"] == pytest.approx(0.0)
    assert got[("hidden", "4096")]["note"] == "outside the parameter budget"
    assert got[("hidden", "4096")]["params_change"] > 0.5


def test_config_round_trip_keeps_the_other_keys():
    base = json.loads((FIXTURES / "qwen3-0.6b.json").read_text())
    shape = from_hf_config(base)
    assert shape.explicit_head_dim and shape.attn_width == 2048 and shape.kv_heads == 8
    new = shape.with_(ffn=3000, heads=8, kv_heads=4, head_dim=256)
    cfg = to_hf_config(base, new)
    assert from_hf_config(cfg) == new and cfg["rope_theta"] == base["rope_theta"]
    assert to_hf_config(gpt2_config(2, 128, 2, 500), from_hf_config(gpt2_config(2, 128, 2, 500)).with_(ffn=600))[
        "n_inner"] == 600


@pytest.mark.parametrize("config,why", [
    ({"model_type": "llama", "hidden_size": 1000, "num_attention_heads": 3, "num_hidden_layers": 2,
      "intermediate_size": 64, "vocab_size": 100}, "not divisible by 3 attention heads"),
    ({"model_type": "llama", "hidden_size": 0, "num_attention_heads": 2, "num_hidden_layers": 2,
      "intermediate_size": 64, "vocab_size": 100}, "hidden_size=0 must be positive"),
    ({"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": -1, "vocab_size": 100}, "n_layer=-1 must be positive"),
    ({"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1}, "vocab_size"),
    ({"n_embd": 64}, "no model_type"),
])
def test_bad_configs_are_one_clear_error(config, why):
    with pytest.raises(BadConfigError, match=why):
        from_hf_config(config, "bad")


def test_bad_proposals_and_sizes(a100):
    gemm, utility = a100
    for item in ("heads", "heads=x", "layers=2", "vocab=0"):
        with pytest.raises(BadShapeError):
            advice.parse_proposals([item])
    shape = from_hf_config(case("nanogpt-124m").config)
    with pytest.raises(BadShapeError, match="seq=0"):
        advise.search(shape, 1, 0, "float16", gemm, utility)
    with pytest.raises(BadShapeError, match="tolerance"):
        advise.search(shape, 1, 8, "float16", gemm, utility, tolerance=-0.1)


def _main(argv, capsys):
    from pipeline.cli.main import main

    rc = main(argv)
    return rc, capsys.readouterr()


def test_cli_unknown_device_is_one_line(capsys):
    rc, out = _main(["advise", "--device", "no-such-device", "--layers", "1", "--hidden", "64", "--heads", "2"],
                    capsys)
    assert rc == 2 and out.err.count("\n") == 1 and "unknown device 'no-such-device'" in out.err


def test_cli_bad_heads_is_one_line(capsys):
    rc, out = _main(["advise", "--device", "no-such-device", "--hidden", "100", "--heads", "3"], capsys)
    assert rc == 2 and out.err.count("\n") == 1 and "not divisible by 3" in out.err


def test_cli_advises_on_saved_models(a100, capsys, tmp_path, devchar_home):
    from pipeline.core.config import model_store_root
    from pipeline.predict import store

    gemm, utility = a100
    for name, model in (("gemm_model", gemm), ("utility_model", utility)):
        store.save(model_store_root(), "gpu-a100-like", name, model, {}, "20260101T000000-x")
    png = tmp_path / "advice.png"
    rc, out = _main(["advise", "--device", "gpu-a100-like", "--case", "gpt3-2.7b", "--dtype", "float16",
                     "--seq", "2048", "--propose", "heads=20", "--plot", str(png)], capsys)
    assert rc == 0, out.err
    assert "lm_head" in out.out and "no: n=50257" in out.out and "heads       32       20" in out.out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_measured_advice_is_recorded_for_this_machine_only(a100, capsys, monkeypatch, devchar_home):
    """--measure writes its rows, measured speed-ups included, into shape_advice for this
    machine's partition (replacing that model's rows), and records nothing for another device."""
    from pipeline.cli import common
    from pipeline.core.config import model_store_root
    from pipeline.predict import store
    from pipeline.workloads import advise_measure
    from resources.warehouse import DuckDBWarehouse

    for device in ("gpu-a100-like", "gpu-other"):
        for name, model in zip(("gemm_model", "utility_model"), a100):
            store.save(model_store_root(), device, name, model, {}, "20260101T000000-x")
    timed = []

    def fake_measure_ab(variants, seq, dtype, **kw):  # no timing here: original 10 us/token, others 8
        timed.append(sorted(variants))
        return advise_measure.ABResult(list(variants), {lb: np.full(3, 10.0 if lb == "original" else 8.0)
                                                        for lb in variants})

    monkeypatch.setattr(advise_measure, "measure_ab", fake_measure_ab)
    monkeypatch.setattr(common, "local_slug", lambda device=None: device or "gpu-a100-like")
    argv = ["advise", "--case", "gpt3-2.7b", "--dtype", "float16", "--seq", "256", "--dims", "heads",
            "--propose", "heads=20", "--measure", "--measure-layers", "1", "--rounds", "3", "--reps", "1"]
    for _ in range(2):  # twice: the second replaces the first's rows
        rc, out = _main([*argv, "--device", "gpu-a100-like"], capsys)
        assert rc == 0, out.err
    got = DuckDBWarehouse().query("SELECT device, model, dimension, proposed, measured_speedup, verdict "
                                  "FROM shape_advice")
    heads20 = got[(got["dimension"] == "heads") & (got["proposed"] == "20")]
    assert len(heads20) == 1 and heads20["measured_speedup"].iloc[0] == pytest.approx(1.25)
    assert set(got["device"]) == {"gpu-a100-like"} and set(got["model"]) == {"gpt3-2.7b"}
    rc, out = _main([*argv, "--device", "gpu-other"], capsys)
    assert rc == 0 and "not recorded" in out.err
    assert len(DuckDBWarehouse().query("SELECT * FROM shape_advice")) == len(got) and len(timed) == 3


def test_catalog_skips_a_model_the_calibration_does_not_cover(a100):
    from pipeline.predict.shape_catalog import CASES

    gemm, utility = a100
    no_rms = UtilityModel({k: v for k, v in utility.regimes.items() if k[0] != "rmsnorm"})
    rows, tables = advice.catalog_rows(list(CASES), gemm, no_rms, "float16", 1, 256, 0.02)
    assert "llama-2-7b" not in tables and "gpt3-2.7b" in tables
    assert set(rows["model"]) == {"gpt3-2.7b", "nanogpt-124m", "pythia-410m", "pythia-1b"}
    assert rows.loc[rows["dimension"] == "model", "proposed"].tolist() == ["pythia-1b"]
