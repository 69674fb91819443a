"""End-to-end materializations of the code location into a temporary DEVCHAR_HOME, in-process, on the CPU."""
import dagster as dg
import pytest

from pipeline.device.discover import identify
from pipeline.opencl.sweep.execute import opencl_unusable
from resources.warehouse import DuckDBWarehouse

SAMPLE_TABLES = ("devices", "gemm_samples", "utility_samples", "attention_samples", "embedding_samples",
                 "memory_samples", "overhead_samples", "workload_graphs", "workload_runs", "predictions", "model_errors")


def _materialize(slug: str, instance: dg.DagsterInstance, raise_on_error: bool = True, profile: str = "tiny",
                 timing_scale: float = 1.0, selection: list[str] | None = None, mode: str = "subprocess",
                 **gates: str):
    """The characterize_device job (only the assets of `selection` when given), with `profile`,
    `timing_scale` and quality `gates` given as run config, as `devchar run --profile` gives them
    (the environment is read when the code location loads)."""
    from pipeline.definitions import defs

    if not instance.has_dynamic_partition("devices", slug):
        instance.add_dynamic_partitions("devices", [slug])
    runner = {"profile": profile, "timing_scale": str(timing_scale), "mode": mode}
    run_config = {"resources": {"device_runner": {"config": runner},
                                "quality_gates": {"config": gates}}}
    keys = [dg.AssetKey(k) for k in selection] if selection else None
    if OPENCL_UNUSABLE:  # as `devchar run` does there: the rest of the job without the OpenCL sweep
        from pipeline.orchestration.jobs import selection_without

        keys = sorted(selection_without({"opencl"}).resolve(defs.resolve_asset_graph())
                      & set(keys or defs.resolve_asset_graph().materializable_asset_keys), key=lambda k: k.path)
    return defs.resolve_job_def("characterize_device").execute_in_process(
        partition_key=slug, instance=instance, raise_on_error=raise_on_error, run_config=run_config,
        asset_selection=keys)


# this machine's OpenCL device cannot build a kernel (PoCL 3.0 on a CPU its LLVM does not know)
OPENCL_UNUSABLE = opencl_unusable("cpu")

NO_ERROR_GATE = {"max_heldout_err": "1e9", "max_heldout_mean_err": "1e9"}


# what the second materialization need not run: it writes none of SAMPLE_TABLES (the fits go to
# the model store, shape_advice to a table not counted here)
NOT_RERUN = {"gemm_model", "utility_model", "attention_model", "embedding_model", "memory_model",
             "overhead_model", "mlp_baselines", "gemm_config_model", "sweep_quality", "accuracy_report",
             "shape_advice"}


def _asset_names() -> list[str]:
    from pipeline.definitions import defs

    return sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())


def _counts(wh: DuckDBWarehouse, device: str) -> dict:
    return {t: int(wh.query(f"SELECT count(*) AS n FROM {t} WHERE device = ?", [device])["n"].iloc[0])
            for t in SAMPLE_TABLES}


def test_definitions_load():
    from pipeline.definitions import defs

    dg.Definitions.validate_loadable(defs)
    assert {"characterize_device", "recalibrate"} <= {j.name for j in defs.jobs}
    assert defs.resolve_assets_def("gemm_model").check_specs


@pytest.mark.slow
def test_quick_profile_end_to_end(devchar_home):
    """The whole quick profile: every table filled, models saved, predictions beside measurements.
    Its grids, with a twentieth of its time budgets and FLOP caps per point (the fit fills the cells it
    skips, as past any cap): what is tested here is what a calibration fills;
    how well it measures is `devchar run`'s report (the README's figures), not asserted."""
    slug = identify("cpu").slug
    with dg.instance_for_test() as instance:
        result = _materialize(slug, instance, profile="quick", timing_scale=0.05, **NO_ERROR_GATE)
    assert result.success
    wh = DuckDBWarehouse()
    counts = _counts(wh, slug)
    assert all(n > 0 for n in counts.values()), counts
    pred = wh.query("SELECT * FROM predictions WHERE device = ?", [slug])
    runs = wh.query("SELECT * FROM workload_runs WHERE device = ?", [slug])
    # GPT-2: the operator-list kernel sum + 3 graph predictors; DLRM: the 3 graph predictors
    n_gpt2 = int((runs["workload"] == "gpt2").sum())
    assert n_gpt2 and len(pred) == 4 * n_gpt2 + 3 * (len(runs) - n_gpt2)
    assert set(pred.loc[pred["workload"] == "dlrm", "predictor"]) == {"kernel_only", "e2e_individual", "e2e_shared"}
    assert (pred["predicted_ms"] > 0).all() and (pred["measured_ms"] > 0).all()
    held = wh.query("SELECT count(*) AS n FROM gemm_samples WHERE device = ? AND held_out", [slug])["n"].iloc[0]
    assert held > 0
    errors = wh.query("SELECT DISTINCT model, layer_type FROM model_errors")
    assert set(errors["layer_type"]) >= {"MM", "BMM", "Linear", "Softmax", "Vector", "Attention", "EL-F", "EL-B",
                                         "concat", "transpose", "tril-F", "tril-B"}
    assert set(errors["model"]) >= {"devchar", "roofline", "neusight_mlp", "lin_mlp"}
    for model in ("gemm_model", "utility_model", "attention_model", "embedding_model", "memory_model", "roofline",
                  "neusight_mlp", "lin_mlp", "overhead_model"):
        assert (devchar_home / "models_store" / slug / model).is_dir(), model
    assert (devchar_home / "mlflow.db").is_file()
    _what_if_from_the_captured_graphs(slug)


def _what_if_from_the_captured_graphs(slug: str):
    """`devchar what-if` on the run's own graphs: a batch size solved from two captures agrees
    with the capture at that batch; fused lookups predict something different but finite."""
    import contextlib
    import io

    from pipeline.cli import main as cli
    from pipeline.workloads.dlrm import QUICK_CONFIGS
    from pipeline.sweeps.profiles import get_profile

    config, (b1, _, b3) = QUICK_CONFIGS[0].name, get_profile("quick").dlrm_batches
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["what-if", "--device", slug, "--config", config, "--batch", str(b1),
                         "--new-batch", str(b3)]) == 0
        assert cli.main(["what-if", "--device", slug, "--config", config, "--batch", str(b1),
                         "--fuse-embeddings"]) == 0
    lines = out.getvalue().splitlines()
    solved = next(ln for ln in lines if f"batch={b3} (shapes solved" in ln)
    check = next(ln for ln in lines if "check: the graph captured" in ln)
    kernel_ms = [float(ln.split("kernel_only ")[1].split(" ms")[0]) for ln in (solved, check)]
    assert abs(kernel_ms[0] - kernel_ms[1]) <= 0.02 * kernel_ms[1], (solved, check)
    assert any("one batched EmbeddingBag" in ln for ln in lines)


def test_rematerializing_replaces_rows_and_spares_other_devices(devchar_home):
    slug = identify("cpu").slug
    wh = DuckDBWarehouse()
    # the sweeps in this process: what is tested is what the warehouse keeps, and the two runs
    # spare 20 interpreter starts (the slow tier and test_runner run them through Dagster Pipes)
    with dg.instance_for_test() as instance:
        result = _materialize(slug, instance, mode="in_process", **NO_ERROR_GATE)
        assert result.success
        # the held-out GEMMs' bias per band of M, N and K, beside Table II
        evaluation = result.asset_materializations_for_node("model_evaluation")[0].metadata
        assert {"table_ii_mean_rel_err", "heldout_bias_by_dim"} <= set(evaluation)
        # the CPU traces' T1 rows carry the previous op's duration: the overhead model fits its
        # slowdown and the asset draws it
        assert (devchar_home / "plots" / slug / "t1_after_op.png").is_file()
        # another device's rows, as if loaded from a reference calibration
        other = wh.query("SELECT * FROM gemm_samples WHERE device = ?", [slug]).assign(device="cuda-other-gpu")
        wh.replace_partition("gemm_samples", "cuda-other-gpu", other)
        first = _counts(wh, slug)
        # again, every asset but NOT_RERUN (the predictions and the evaluation load the first
        # run's models)
        again = [k for k in _asset_names() if k not in NOT_RERUN]
        assert _materialize(slug, instance, mode="in_process", selection=again, **NO_ERROR_GATE).success
    second = _counts(wh, slug)
    # gemm_samples' training grid follows the tile the probe measures, which a noisy tiny-profile
    # run may find differently: there, no shape twice and one run's rows stand for "replaced"
    assert {t: n for t, n in second.items() if t != "gemm_samples"} == {
        t: n for t, n in first.items() if t != "gemm_samples"}
    assert wh.query("SELECT count(DISTINCT run_id) AS n FROM gemm_samples WHERE device = ?", [slug])["n"].iloc[0] == 1
    # one row per shape and grid (a twin may be the same GEMM as a sub-wave grid shape, timed beside its cell)
    dup = wh.query("SELECT count(*) AS n FROM (SELECT op, dtype, batch, m, n, k, held_out, grid, count(*) AS c "
                   "FROM gemm_samples WHERE device = ? GROUP BY ALL HAVING c > 1)", [slug])["n"].iloc[0]
    assert dup == 0
    left = wh.query("SELECT count(*) AS n FROM gemm_samples WHERE device = 'cuda-other-gpu'")["n"].iloc[0]
    assert left == len(other)


def test_failing_heldout_check_blocks_predictions(devchar_home):
    slug = identify("cpu").slug
    # the GEMM path alone: the predictions' other models are not in the selection, so had the
    # check not blocked them they would have started (and failed); they must never start
    path = ["device_spec", "gemm_samples", "gemm_model", "transformer_predictions"]
    with dg.instance_for_test() as instance:  # no model can pass a held-out error of 0
        result = _materialize(slug, instance, raise_on_error=False, selection=path, max_heldout_err="0")
    assert not result.success
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert "gemm_model" in started and "transformer_predictions" not in started
    wh = DuckDBWarehouse()
    assert not wh.has_table("predictions")
    checks = [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert any(not e.event_specific_data.passed and e.event_specific_data.check_name == "heldout_error"
               for e in checks)
    # a failed (blocking) check fails its step, after the fitted model is materialized and reported
    failed = {e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"}
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert failed and failed <= materialized, failed - materialized
    # the failed fit is kept for its history, but `latest` refuses it: the CLI cannot use it either
    from pipeline.core.errors import MissingModelError
    from resources.model_store import ModelStore

    with pytest.raises(MissingModelError, match="held-out check"):
        ModelStore().load(slug, "gemm_model")


def test_unregistered_device_fails_and_writes_nothing(devchar_home):
    with dg.instance_for_test() as instance:
        result = _materialize("cuda-no-such-gpu", instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "cuda-no-such-gpu" in failure.event_specific_data.error.to_string()
    assert not DuckDBWarehouse().has_table("devices")
