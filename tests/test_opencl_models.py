"""OpenCL latency models: prompts, AST features, the kernel-disjoint split, fitting the three
models on a small measured table, saving and loading them, and bad input. Behaviour only:
the fixture table is far too small to say anything about accuracy."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import DevcharError, MissingModelError
from pipeline.opencl.models.evaluate import kernel_groups, ok_launches, split
from pipeline.opencl.models.prompts import build_prompt, launch_prompts
from pipeline.opencl.models.settings import sizes
from pipeline.predict import store

FIXTURE = Path(__file__).parent / "fixtures" / "opencl" / "launches.jsonl"  # made by make_launches.py (PoCL)


@pytest.fixture(scope="module")
def launches() -> pd.DataFrame:
    return pd.read_json(FIXTURE, lines=True, dtype={"source_hash": str})


def _events(source: str) -> dict:
    from pipeline.opencl.models.ast_counts import kernel_events
    from pipeline.opencl.sweep.clang_ast import parse_kernel

    return dict(kernel_events(parse_kernel(source)[1]))


def test_prompt_follows_the_paper_template():
    args = [{"name": "x", "type": "float", "kind": "global", "elements": 4096},
            {"name": "n", "type": "int", "kind": "scalar", "value": 4096}]
    src = "__kernel void k(__global float* x, int n) { x[get_global_id(0)] *= 2.0f; }"
    text = build_prompt(src, json.dumps(args), 4096, 64)
    assert text == ("Predict time for the following OpenCL kernel:\n" + src + "\nGiven input:\n"
                    "Argument at position 0 is x, which is global buffer of type float with size 4096\n"
                    "Argument at position 1 is n, which is private scalar of type int with value 4096\n"
                    "Given kernel are executed with global size equals cl::NDRange(4096), "
                    "local work-group size equals cl::NDRange(64)")
    assert build_prompt(src, args, 4096, 64) == text  # decoded list or JSON text: same prompt


def test_truncation_cuts_only_the_code_and_says_so(launches):
    rows = launches[launches["kernel_name"] == "reduce"].head(3)
    words = lambda t: len(t.split())  # noqa: E731 - a stand-in tokenizer
    prompts, cut = launch_prompts(rows, words, 120)
    assert cut == 3
    for p, full in zip(prompts, launch_prompts(rows)[0]):
        assert words(p) <= 120 and "__kernel void reduce" in p and "characters truncated" in p
        assert p.split("Given input:")[1] == full.split("Given input:")[1]  # sizes and NDRange intact
    # too small for even the arguments: the last argument lines go, the NDRange line stays
    tight, _ = launch_prompts(rows, words, 60)
    for p, lsize in zip(tight, rows["lsize"]):
        assert words(p) <= 60 and "more arguments truncated" in p and p.endswith(f"cl::NDRange({lsize})")


def test_static_trip_count_multiplies_the_loop_body():
    ev = _events("__kernel void k(__global float* x) { float a = 0.0f;\n"
                 "  for (int i = 0; i < 16; i += 2) { a += x[i]; }\n  x[get_global_id(0)] = a; }")
    assert ev[("global_load", (("static", 8),))] == 1
    assert ev[("arith_float", (("static", 8),))] == 1
    assert ev[("global_store", ())] == 1


def test_loop_bound_by_a_scalar_argument_resolves_per_launch():
    from pipeline.opencl.models.features import FEATURES, launch_features

    src = "__kernel void k(__global float* x, const int n) { for (int c = 0; c < n; c++) x[c] += 1.0f; }"
    ev = _events(src)
    args = [{"name": "x", "type": "float", "kind": "global", "elements": 1024},
            {"name": "n", "type": "int", "kind": "scalar", "value": 100}]
    f = dict(zip(FEATURES, launch_features(ev, False, args, 64, 16, 4, src)))
    assert f["global_load"] == 100 and f["global_store"] == 100 and f["n_loops_param"] == 1
    assert f["wg_per_cu"] == 1.0  # 64 / 16 work-groups on 4 compute units


def test_barrier_local_memory_and_float4_lanes():
    ev = _events("__kernel void k(__global float4* v, __local float* s) { int l = get_local_id(0);\n"
                 "  s[l] = 1.0f; barrier(CLK_LOCAL_MEM_FENCE);\n"
                 "  v[l] = v[l] * 2.0f + (float4)(s[0]); }")
    assert ev[("barrier", ())] == 1
    assert ev[("local_store", ())] == 1 and ev[("local_load", ())] == 1
    assert ev[("arith_float", ())] == 8  # two float4 operations, four lanes each
    assert ev[("global_load_bytes", ())] == 16


def test_split_keeps_kernels_and_sources_on_one_side(launches):
    df = launches.copy()
    # kernel k99 reuses vadd's source under another id: it must land beside vadd
    twin = df[df["kernel_name"] == "vadd"].assign(kernel_id="k99")
    df = pd.concat([df, twin], ignore_index=True)
    for seed in range(5):
        train, val, bench = split(df, val_frac=0.3, seed=seed)
        assert len(val) and len(train)
        assert not set(train["kernel_id"]) & set(val["kernel_id"])
        assert not set(train["source_hash"]) & set(val["source_hash"])
        assert (bench["suite"] == "benchmark").all() and not (train["suite"] == "benchmark").any()
    groups = kernel_groups(df)
    assert groups[df["kernel_id"] == "k99"].iloc[0] == groups[df["kernel_name"] == "vadd"].iloc[0]


def test_regression_heads_concat_or_mean_pool_the_tokens():
    import torch

    from pipeline.opencl.models.neural import Head

    h, mask = torch.randn(3, 10, 8), torch.ones(3, 10)
    assert Head(10, 8, 4, "concat")(h, mask).shape == (3,) and Head(10, 8, 4, "mean")(h, mask).shape == (3,)
    with pytest.raises(ValueError, match="pooling"):
        Head(10, 8, 4, "max")


def test_empty_table_or_no_ok_rows_is_one_clear_error(launches):
    with pytest.raises(DevcharError, match="no rows"):
        ok_launches(launches.iloc[:0])
    with pytest.raises(DevcharError, match="none with status 'ok'"):
        ok_launches(launches.assign(status="compile_error"))


@pytest.mark.parametrize("name", ["opencl_features", "opencl_scratch", "opencl_lm"])
def test_model_fits_predicts_and_round_trips(launches, name, tmp_path):
    from pipeline.opencl.models.fit import _fit_one

    train, val, bench = split(ok_launches(launches), seed=0)
    model, params = _fit_one(name, train, "tiny", "cpu", 0, None)
    pred = model.predict(val)
    assert pred.shape == (len(val),) and np.isfinite(pred).all() and (pred > 0).all()
    store.save(tmp_path, "cpu-test", name, model, {"heldout_check_passed": True}, "v1")
    loaded = store.load(tmp_path, "cpu-test", name)
    np.testing.assert_allclose(loaded.predict(val), pred, rtol=1e-5)


def test_corrupt_or_missing_saved_model_is_one_clear_error(launches, tmp_path):
    from pipeline.opencl.models.scratch import ScratchModel

    model = ScratchModel.fit(ok_launches(launches), sizes("tiny").scratch)
    path = store.save(tmp_path, "cpu-test", "opencl_scratch", model, {}, "v1")
    (path / "weights.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(MissingModelError, match="corrupt"):
        store.load(tmp_path, "cpu-test", "opencl_scratch")
    (path / "weights.safetensors").unlink()
    with pytest.raises(MissingModelError, match="missing"):
        store.load(tmp_path, "cpu-test", "opencl_scratch")
    (path / "model.json").write_text("{not json")
    with pytest.raises(MissingModelError, match="corrupt"):
        store.load(tmp_path, "cpu-test", "opencl_scratch")
    with pytest.raises(MissingModelError, match="no saved opencl_lm"):
        store.load(tmp_path, "cpu-test", "opencl_lm")


def test_asset_writes_model_errors_and_checks_validation_mape(launches, devchar_home):
    import dagster as dg

    from assets.opencl_models import opencl_models
    from resources.devices import DeviceRunner
    from resources.model_store import ModelStore
    from resources.quality import QualityGates
    from resources.tracking import MLflowTracking
    from resources.warehouse import DuckDBWarehouse

    wh = DuckDBWarehouse()
    wh.replace_partition("opencl_launches", "cpu-fixture", launches)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("devices", ["cpu-fixture"])
    result = dg.materialize([opencl_models], partition_key="cpu-fixture", instance=instance,
                            resources={"warehouse": wh, "tracking": MLflowTracking(), "model_store": ModelStore(),
                                       "device_runner": DeviceRunner(profile="tiny"),
                                       "quality_gates": QualityGates(max_opencl_val_mape=1000)})
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    errors = wh.query("SELECT * FROM model_errors WHERE device = 'cpu-fixture'")
    assert set(errors["model"]) == {"opencl_lm", "opencl_scratch", "opencl_features"}
    assert {"validation", "triad", "reduce"} <= set(errors["layer_type"])
    assert ((errors["mean_rel_err"] >= 0) & (errors["n"] > 0)).all()
