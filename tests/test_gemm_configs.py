"""gemm_config_model: per-configuration tables and a selector learned from the heuristic's
choices. No GPU here, so the rows come from a made-up device whose timings and heuristic are
known formulas; the CUDA sweep that fills them for real is tested in test_gpu.py."""
import dagster as dg
import numpy as np
import pandas as pd
import pytest

from pipeline.predict.gemm import GemmModel
from pipeline.predict.gemm_configs import GemmConfigModel, problem_key
from pipeline.predict.geometry import waves
from pipeline.predict.store import load, save
from pipeline.sweeps.gemm_configs import pick_configs
from pipeline.core.errors import MissingModelError

SLOTS = 132
# config id -> (tile_m, tile_n, split_k, peak padded FLOP/us)
CONFIGS = {"lt-small": (64, 128, 1, 3e8), "lt-big": (128, 256, 1, 6e8), "lt-splitk": (64, 64, 4, 2e8)}


def true_us(config: str, m, n, k, batch=1):
    """The made-up device: a config's throughput rises with K and with waves, saturating."""
    tm, tn, sk, peak = CONFIGS[config]
    w = waves(m, n, batch, tm, tn, SLOTS, sk).astype(float)
    k = np.asarray(k, float)
    padded = 2.0 * SLOTS * tm * tn / sk * w * k
    return padded / (peak * k / (k + 256) * (0.5 + 0.5 * np.minimum(w, 4) / 4))


def heuristic(m, n, k, batch=1):
    """The made-up device's choice: split-K for small outputs with long K, big tiles for big outputs."""
    out = np.asarray(m) * np.asarray(n) * np.asarray(batch)
    return np.where((out < 1 << 14) & (np.asarray(k) >= 2048), "lt-splitk",
                    np.where(out < 1 << 20, "lt-small", "lt-big"))


def training_rows(op="mm", layout="NN", dtype="float16") -> list[dict]:
    rows = []
    for cfg, (tm, tn, sk, _) in CONFIGS.items():
        for w in (1, 2, 4, 8):
            tiles = w * SLOTS // sk
            m, n = tm * 4, tn * (tiles // 4)  # 4 x (tiles/4) tiles: exactly w waves
            for k in (32, 128, 512, 2048, 8192):
                rows.append(dict(op=op, layout=layout, bias=False, dtype=dtype, batch=1, m=m, n=n, k=k, kernel=cfg,
                                 tile_m=tm, tile_n=tn, split_k=sk, slots=SLOTS, waves=int(waves(m, n, 1, tm, tn,
                                                                                                  SLOTS, sk)),
                                 median_us=float(true_us(cfg, m, n, k)), held_out=False, lt_kernel=f"sm90_{cfg}",
                                 torch_kernel=None, selection_match=None))
    return rows


def random_shapes(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [np.exp(rng.uniform(np.log(16), np.log(hi), n)).astype(int) for hi in (8192, 8192, 8192)]


def choice_rows(n=600, seed=1, op="mm", layout="NN", dtype="float16") -> pd.DataFrame:
    m, nn, k = random_shapes(n, seed)
    return pd.DataFrame(dict(op=op, layout=layout, bias=False, dtype=dtype, batch=1, m=m, n=nn, k=k,
                             kernel=heuristic(m, nn, k), swept=True))


def heldout_rows(n=60, seed=2, op="mm", layout="NN", dtype="float16") -> pd.DataFrame:
    m, nn, k = random_shapes(n, seed)
    chosen = heuristic(m, nn, k)
    us = [float(true_us(c, a, b, kk)) for c, a, b, kk in zip(chosen, m, nn, k)]
    return pd.DataFrame(dict(op=op, layout=layout, bias=False, dtype=dtype, batch=1, m=m, n=nn, k=k, kernel=chosen,
                             median_us=us, held_out=True, torch_kernel=[f"sm90_{c}" for c in chosen],
                             selection_match=True))


def test_split_k_counts_blocks_per_output_tile():
    # 8 x 8 output tiles: 64 blocks, or 256 with split-K 4 -> 2 waves on 132 SMs
    assert waves(512, 512, 1, 64, 64, SLOTS) == 1
    assert waves(512, 512, 1, 64, 64, SLOTS, split_k=4) == 2


def test_each_configuration_reproduces_its_own_grid():
    model = GemmConfigModel.fit(pd.DataFrame(training_rows()))
    rows = pd.DataFrame(training_rows())
    for cfg in CONFIGS:
        g = rows[rows["kernel"] == cfg]
        pred = model.predict("mm", "NN", "float16", g["m"], g["n"], g["k"], kernel=cfg)
        np.testing.assert_allclose(pred, g["median_us"], rtol=1e-9)


def test_selector_learns_the_heuristic_and_tables_predict_held_out_shapes():
    model = GemmConfigModel.fit(pd.DataFrame(training_rows()), choice_rows())
    held = heldout_rows()
    ev = model.evaluate(held)
    assert len(ev) == len(held)
    assert ev["selector_agrees"].mean() >= 0.9
    right = ev[ev["selector_agrees"]]
    rel = np.abs(right["predicted_us"] - right["median_us"]) / right["median_us"]
    assert np.median(rel) < 0.15  # between grid points the true curve is not linear in K
    acc = model.selection_accuracy(choice_rows(seed=3))
    assert set(acc) == {"mm:NN_mm_float16"} and acc["mm:NN_mm_float16"] >= 0.9


def test_choices_of_unswept_configurations_do_not_become_classes():
    choices = choice_rows()
    choices.loc[choices.index[:50], "kernel"] = "lt-never-swept"
    model = GemmConfigModel.fit(pd.DataFrame(training_rows()), choices)
    assert set(model.model("mm", "NN").kernels("mm", "float16")) <= set(CONFIGS)
    assert model.selection_accuracy(choices.iloc[:50])["mm:NN_mm_float16"] == 0.0  # a miss, by construction


def test_layouts_are_separate_problems():
    rows = training_rows() + training_rows(layout="NT")
    model = GemmConfigModel.fit(pd.DataFrame(rows), pd.concat([choice_rows(), choice_rows(layout="NT")]))
    assert sorted(model.models) == ["mm:NN", "mm:NT"]
    assert problem_key("linear", "TN", True) == "linear:TN+bias"
    with pytest.raises(MissingModelError, match="linear:TN"):
        model.predict("linear", "TN", "float16", 64, 64, 64)


def test_saved_model_predicts_the_same(tmp_path):
    model = GemmConfigModel.fit(pd.DataFrame(training_rows()), choice_rows())
    save(tmp_path, "cuda-x", "gemm_config_model", model, {}, "v1")
    again = load(tmp_path, "cuda-x", "gemm_config_model")
    m, n, k = random_shapes(200, 5)
    np.testing.assert_array_equal(again.predict("mm", "NN", "float16", m, n, k),
                                  model.predict("mm", "NN", "float16", m, n, k))


def test_gemm_model_without_split_k_column_is_unchanged(synthetic_gemm_model):
    d = synthetic_gemm_model.to_dict()
    for t in d["tables"]:
        t.pop("split_k")  # a model saved before split-K was a table field
    again = GemmModel.from_dict(d)
    np.testing.assert_array_equal(again.predict("mm", "float32", [8, 100], [16, 7], [32, 90]),
                                  synthetic_gemm_model.predict("mm", "float32", [8, 100], [16, 7], [32, 90]))


def test_pick_configs_sweeps_the_most_chosen_first():
    assert pick_configs(["b", "a", "b", "c", "b", "a"], ["d", "a"], 3) == ["b", "a", "c"]
    assert pick_configs([], ["d", "e"], 1) == ["d"]


# -- the assets -------------------------------------------------------------------------------
def _materialize(slug, instance):
    """device_spec and the three gemm_config assets, in process, with the real resources (the tiny profile)."""
    from assets.gemm_configs import gemm_config_model, gemm_config_sweep
    from assets.samples import device_spec
    from pipeline.definitions import defs
    from resources.devices import DeviceRunner

    instance.add_dynamic_partitions("devices", [slug])
    return dg.materialize([device_spec, gemm_config_sweep, gemm_config_model], partition_key=slug, instance=instance,
                          resources={**defs.resources, "device_runner": DeviceRunner(profile="tiny")})


def test_assets_fit_a_reference_gpu_calibration(devchar_home, tmp_path, monkeypatch):
    """A CUDA device that is not local is read from its committed reference calibration."""
    import resources.devices as devices_mod
    from resources.warehouse import DuckDBWarehouse

    slug = "cuda-synthetic-h100"
    ref = tmp_path / "reference"
    (ref / slug).mkdir(parents=True)
    monkeypatch.setattr(devices_mod, "reference_root", lambda: ref)
    pd.DataFrame([{"kind": "cuda", "name": "synthetic", "sm_count": SLOTS}]).to_json(ref / slug / "devices.jsonl",
                                                                                   orient="records", lines=True)
    samples = pd.concat([pd.DataFrame(training_rows()), heldout_rows()], ignore_index=True)
    samples.to_json(ref / slug / "gemm_config_samples.jsonl", orient="records", lines=True)
    choice_rows().to_json(ref / slug / "gemm_config_choices.jsonl", orient="records", lines=True)
    with dg.instance_for_test() as instance:
        result = _materialize(slug, instance)
        assert result.success
        meta = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
                for e in result.get_asset_materialization_events()}
    assert meta["gemm_config_model"]["selector_matches_heuristic"].value >= 0.9
    assert meta["gemm_config_model"]["selector_matches_torch"].value >= 0.9
    assert meta["gemm_config_model"]["heldout_mean_rel_err"].value < 0.2
    wh = DuckDBWarehouse()
    assert len(wh.device_rows("gemm_config_choices", slug)) == len(choice_rows())
    model = load(devchar_home / "models_store", slug, "gemm_config_model")
    assert sorted(model.models) == ["mm:NN"]


def test_assets_are_not_applicable_on_a_cpu(devchar_home):
    from pipeline.device.discover import identify
    from resources.warehouse import DuckDBWarehouse

    slug = identify("cpu").slug
    with dg.instance_for_test() as instance:
        result = _materialize(slug, instance)
        assert result.success
        metas = [e.step_materialization_data.materialization.metadata for e in result.get_asset_materialization_events()
                 if e.asset_key.to_user_string().startswith("gemm_config")]
    assert len(metas) == 3 and all(m["applicable"].value is False for m in metas)
    assert not DuckDBWarehouse().has_table("gemm_config_samples")
    assert not (devchar_home / "models_store" / slug / "gemm_config_model").exists()


def test_torch_kernel_match_looks_the_config_up_in_its_own_problem():
    """One config id names different kernels in different dtypes (and layouts)."""
    from assets.gemm_configs import selected_kernel_matches_torch

    train = pd.DataFrame(training_rows() + training_rows(dtype="bfloat16"))
    train.loc[train["dtype"] == "bfloat16", "lt_kernel"] = "sm90_bf16_" + train["kernel"]
    held = pd.concat([heldout_rows(), heldout_rows(dtype="bfloat16")], ignore_index=True)
    held.loc[held["dtype"] == "bfloat16", "torch_kernel"] = "sm90_bf16_" + held["kernel"]
    model = GemmConfigModel.fit(train, pd.concat([choice_rows(), choice_rows(dtype="bfloat16")]))
    ev = model.evaluate(held)
    match = selected_kernel_matches_torch(ev, train)
    assert match[ev["selector_agrees"]].all() and len(match) == len(held)


def test_nothing_to_evaluate_is_empty_not_an_error():
    from assets.gemm_configs import selected_kernel_matches_torch

    model = GemmConfigModel.fit(pd.DataFrame(training_rows()), choice_rows())
    ev = model.evaluate(heldout_rows(layout="TN", op="linear"))  # a problem the model was not fitted on
    assert len(ev) == 0 and {"selected", "selector_agrees", "predicted_us"} <= set(ev.columns)
    assert len(selected_kernel_matches_torch(ev, pd.DataFrame(training_rows()))) == 0


def test_problem_keys_become_valid_mlflow_metric_names():
    from resources.tracking import metric_name

    assert metric_name("selection_linear:TN+bias_linear_float16") == "selection_linear:TN_bias_linear_float16"
    assert metric_name("mre_mm_float32") == "mre_mm_float32"
