"""What `devchar run` prints when a check fails: named model, (op, dtype), error vs threshold,
noise, load and what to do; and a Table II section even when the evaluation never ran."""
import types

import pytest

from pipeline.analysis.run_report import FailedCheck, FailedStep, explain_failure


def test_a_failed_heldout_check_is_explained():
    text = explain_failure(
        [FailedCheck("gemm_model", "heldout_error", True,
                     {"over_threshold": "mm float32: median 62.0%", "overall_mean": 0.8, "max_median_allowed": 0.5})],
        [FailedStep("opencl_models", "RuntimeError: out of memory\nTraceback ...")],
        {"gemm_samples": (0.31, 0.12), "utility_samples": (0.02, 0.0)}, threads=2)
    assert "blocking check gemm_model.heldout_error failed" in text
    assert "mm float32: median 62.0%" in text and "max_median_allowed 0.5" in text
    assert "step opencl_models failed: RuntimeError: out of memory" in text and "Traceback" not in text
    assert "gemm_samples 31% (stalled 12%)" in text and "above DEVCHAR_MAX_NOISY_SHARE" in text
    assert "idle machine" in text and "DEVCHAR_MAX_HELDOUT_ERR=" in text and "load average" in text


@pytest.mark.parametrize("message", [
    "Blocking check 'heldout_error' for asset 'utility_model' failed",
    "dagster._core.errors.DagsterAssetCheckFailedError: 1 blocking asset check failed with ERROR severity:\n"
    "utility_model: heldout_error"])  # the second is what Dagster 1.13 says
def test_failures_are_read_from_run_events(message):
    from pipeline.analysis.run_report import failures

    check = types.SimpleNamespace(passed=False, metadata={"worst_median": types.SimpleNamespace(value="bmm 70%")},
                                  asset_key=types.SimpleNamespace(to_user_string=lambda: "utility_model"),
                                  check_name="heldout_error", blocking=True)
    events = [
        types.SimpleNamespace(event_type_value="ASSET_CHECK_EVALUATION", event_specific_data=check, step_key="s"),
        types.SimpleNamespace(event_type_value="STEP_FAILURE", step_key="utility_model",
                              event_specific_data=types.SimpleNamespace(error=types.SimpleNamespace(
                                  message=message))),
        types.SimpleNamespace(event_type_value="STEP_FAILURE", step_key="memory_model",
                              event_specific_data=types.SimpleNamespace(error=types.SimpleNamespace(message="boom"))),
    ]
    checks, steps = failures(events)
    assert [(c.asset, c.metadata["worst_median"]) for c in checks] == [("utility_model", "bmm 70%")]
    assert [s.step for s in steps] == ["memory_model"]  # the blocking-check step is told once, as the check


def test_table_ii_section_comes_from_the_fits_when_evaluation_did_not_run(devchar_home):
    from pipeline.core.config import model_store_root
    from pipeline.predict import store
    from pipeline.analysis.report import _fitted_errors

    class Model:
        def to_dict(self):
            return {}

    errors = [{"op": "mm", "dtype": "float32", "n": 40, "median_rel_err": 0.62, "mean_rel_err": 0.7,
               "max_rel_err": 2.0}]
    store.save(model_store_root(), "cpu-test-2c", "gemm_model", Model(),
               {"heldout_check_passed": False, "errors": errors}, "20261123T000000-abcd")
    text = _fitted_errors("cpu-test-2c")
    assert "gemm_model (FAILED its check)" in text and "62.0%" in text
    assert "no model was fitted" in _fitted_errors("cpu-other-2c")


def test_a_drift_warning_is_one_line_with_its_figures():
    from pipeline.analysis.run_report import FailedCheck, describe_checks

    said = describe_checks([FailedCheck("gemm_samples", "drift", False,
                                        {"flagged": "all all: x1.66, 90% of 276 points moved",
                                         "ops_moved_alone": "bmm float32: x1.58", "groups_compared": 6})])
    assert said == ("  check (warning) gemm_samples.drift failed: flagged all all: x1.66, 90% of 276 points moved, "
                    "ops_moved_alone bmm float32: x1.58")


def test_summary_prints_no_empty_table_ii_when_only_baselines_were_scored(devchar_home):
    """make run on the EPYC VM printed 'Empty DataFrame' under the Table II title when
    gemm_model failed its check and only the OpenCL models had written model_errors."""
    import pandas as pd

    from pipeline.analysis.report import render_summary

    class Warehouse:
        def has_table(self, table):
            return table == "model_errors"

        def query(self, sql, params=None):
            return pd.DataFrame([{"model": "opencl_lm", "layer_type": "reduce", "dtype": "-", "n": 3,
                                  "mean_rel_err": 0.5, "max_rel_err": 0.9}])

    text = render_summary(Warehouse(), "cpu-test-2c")
    assert "Empty DataFrame" not in text
    assert "PM2Lat Table II analog" not in text
    assert "from each fit" in text or "no model was fitted" in text


def test_summary_shows_only_what_this_run_evaluated_and_predicted(devchar_home):
    """A run whose memory_model failed printed the previous run's Table II and DLRM table as
    if they were its own."""
    import pandas as pd

    from pipeline.analysis.report import render_summary

    errors = pd.DataFrame([{"model": "devchar", "layer_type": "MM", "dtype": "float32", "n": 40,
                            "mean_rel_err": 0.2, "max_rel_err": 0.5, "run_id": "aaaaaaaaaaaa"}])
    preds = pd.DataFrame([{"workload": w, "config": "c", "batch": 1, "seq": 0, "measured_ms": 1.0,
                           "predictor": "e2e_shared", "predicted_ms": 1.1, "rel_err": 0.1, "kernel_only_ms": 1.0,
                           "active_measured_ms": 1.0, "run_id": rid}
                          for w, rid in (("gpt2", "bbbbbbbbbbbb"), ("dlrm", "aaaaaaaaaaaa"))])

    class Warehouse:
        def has_table(self, table):
            return table in ("model_errors", "predictions")

        def query(self, sql, params=None):
            return errors if "model_errors" in sql else preds

    text = render_summary(Warehouse(), "cpu-test-2c", run_id="bbbbbbbbbbbb-rest-of-the-id")
    assert "PM2Lat Table II analog" not in text  # run a's evaluation is not this run's
    assert "DLRM training step: not predicted in this run" in text
    assert "GPT-2 forward: error of each predictor" in text
    assert "PM2Lat Table II analog" in render_summary(Warehouse(), "cpu-test-2c", run_id="aaaaaaaaaaaa")


def test_the_device_drift_warning_names_its_tables():
    from pipeline.analysis.run_report import describe_checks

    text = describe_checks([FailedCheck("sweep_quality", "device_drift", False,
                                        {"tables_flagged": "attention_samples, gemm_samples",
                                         "tables_compared": "attention_samples, gemm_samples, utility_samples"})])
    assert "device_drift failed: tables_flagged attention_samples, gemm_samples" in text
    assert "see its metadata" not in text


def test_the_summary_sets_the_workload_runs_speed_probe_against_the_gemm_sweeps():
    """A VM that slows down while a take runs: the kernels are timed fast, the workloads slow,
    and every prediction falls short by the drift; the summary says how much the probe moved."""
    import pandas as pd

    from pipeline.analysis.report import render_summary

    preds = pd.DataFrame([{"workload": "gpt2", "config": "c", "batch": 1, "seq": 0, "measured_ms": 1.0,
                           "predictor": "e2e_shared", "predicted_ms": 0.9, "rel_err": -0.1, "kernel_only_ms": 1.0,
                           "active_measured_ms": 1.0}])
    tables = {"predictions": preds,
              "gemm_samples": pd.DataFrame({"device": "d", "canary_us": [400.0, 400.0, 410.0]}),
              "workload_runs": pd.DataFrame({"device": "d", "canary_us": [440.0]})}

    text = render_summary(TablesWarehouse(tables), "d")
    assert "the speed probe ran 10.0% slower during the workload runs" in text and "predictions under" in text
    no_probe = {**tables, "workload_runs": pd.DataFrame({"device": "d", "measured_ms": [1.0]})}
    assert "speed probe" not in render_summary(TablesWarehouse(no_probe), "d")
    # the 16-core host's take of 2026-11-26: one probe around its GEMM sweep stalled (3 ms
    # beside 77 us); that is no "97.5% faster", and the summary must not say so
    stalled = {**tables, "gemm_samples": pd.DataFrame({"device": "d", "canary_us": [3063.0]}),
               "workload_runs": pd.DataFrame({"device": "d", "canary_us": [77.0]})}
    text = render_summary(TablesWarehouse(stalled), "d")
    assert "a stalled probe, not the machine drifting" in text and "faster" not in text


def test_the_summary_sets_the_host_probe_of_the_workload_runs_against_the_tables_and_traces():
    import pandas as pd

    from pipeline.analysis.report import render_summary

    preds = pd.DataFrame([{"workload": "dlrm", "config": "c", "batch": 32, "seq": 0, "measured_ms": 1.0,
                           "predictor": "e2e_shared", "predicted_ms": 0.6, "rel_err": -0.4, "kernel_only_ms": 0.3,
                           "active_measured_ms": 0.5}])
    tables = {"predictions": preds,
              "workload_graphs": pd.DataFrame({"device": "d", "host_probe_us": [3.6, 3.7, 9.0]}),
              "workload_runs": pd.DataFrame({"device": "d", "host_probe_us": [7.0, 7.4, 7.4]}),
              "gemm_samples": pd.DataFrame({"device": "d", "host_probe_us": [4.0, 4.2, float("nan")]})}
    text = render_summary(TablesWarehouse(tables), "d")
    assert ("a tiny op took (the host probe's median) 4.10 us during the GEMM sweep, 3.70 us during the traces, "
            "7.40 us during the workload runs:") in text
    older = {**tables, "workload_graphs": pd.DataFrame({"device": "d", "n_ops": [3]}),  # a take before the probe
             "gemm_samples": pd.DataFrame({"device": "d", "probe_us": [80.0]})}
    assert "host probe" not in render_summary(TablesWarehouse(older), "d")
    alike = {**tables, "workload_runs": pd.DataFrame({"device": "d", "host_probe_us": [3.9]})}  # 5-11 % apart
    assert "host probe" in render_summary(TablesWarehouse(alike), "d")
    alike["gemm_samples"] = pd.DataFrame({"device": "d", "host_probe_us": [3.8]})  # all within 10 %
    assert "host probe" not in render_summary(TablesWarehouse(alike), "d")
    no_runs = {k: v for k, v in tables.items() if k != "workload_runs"}
    assert "host probe" not in render_summary(TablesWarehouse(no_runs), "d")


def test_a_sweep_keeps_the_quicker_probe_reading_and_warns_only_on_a_stall():
    from pipeline.harness.canary import sweep_speed

    assert sweep_speed(100.0, 110.0) == (100.0, None)  # drift: kept quiet, the quicker reading
    assert sweep_speed(120.0, 100.0) == (100.0, None)
    probe, warning = sweep_speed(78.0, 6000.0)
    assert probe == 78.0 and "6000 us after" in warning and "stalled" in warning


def test_the_workload_sections_show_how_far_each_steps_passes_were_apart():
    import pandas as pd

    from pipeline.analysis.report import render_summary

    preds = pd.DataFrame([{"workload": "dlrm", "config": "c", "batch": b, "seq": 0, "measured_ms": 1.0,
                           "predictor": "e2e_shared", "predicted_ms": 0.9, "rel_err": -0.1, "kernel_only_ms": 1.0,
                           "active_measured_ms": 1.0} for b in (32, 128)])
    runs = pd.DataFrame({"device": "d", "workload": "dlrm", "config": "c", "batch": [32, 128], "seq": 0,
                         "passes": [2, 3], "pass_spread": [0.04, 0.62]})

    text = render_summary(TablesWarehouse({"predictions": preds, "workload_runs": runs}), "d")
    assert "passes_apart" in text and "62.0%" in text and "4.0%" in text
    assert "timed in 2 passes" in text and "at most 62.0% (dlrm c b=128)" in text
    assert "and 1 timed once more where their passes disagreed" in text
    once = runs.assign(passes=1, pass_spread=0.0)  # a GPU's runs, or an older take's
    text = render_summary(TablesWarehouse({"predictions": preds, "workload_runs": once}), "d")
    assert "passes_apart" not in text and "passes, a whole pass apart" not in text
    assert "-10.0%" in text  # the sections are still there


class TablesWarehouse:
    """Each query answers with the one table it names: enough for render_summary's reads."""

    def __init__(self, have):
        self.have = have

    def has_table(self, table):
        return table in self.have

    def query(self, sql, params=None):
        return next(t for name, t in self.have.items() if f"FROM {name}" in sql)


def test_peaks_below_a_tflop_read_in_gflops():
    from pipeline.analysis.report import _fmt_flops

    assert _fmt_flops(1.2e14) == "120.00 TFLOP/s" and _fmt_flops(1.1e11) == "110 GFLOP/s"
    assert _fmt_flops(1.03e9) == "1.03 GFLOP/s" and _fmt_flops(None) == "-"
    assert _fmt_flops(999.7e9) == "1.00 TFLOP/s" and _fmt_flops(999.4e9) == "999 GFLOP/s"


def test_the_summary_says_when_the_spell_probe_read_the_runs_slower_than_the_sweeps():
    """The Zen 5 VM's take of 2026-11-30 16:21: the GEMM probe read 35 us through the workload runs
    against 23-24 us in the sweeps and traces, while the speed probe read 3 % apart: the summary
    sets the spell probe's medians side by side as it does the host probe's."""
    import pandas as pd

    from pipeline.analysis.report import render_summary

    preds = pd.DataFrame([{"workload": "dlrm", "config": "c", "batch": 32, "seq": 0, "measured_ms": 1.0,
                           "predictor": "e2e_shared", "predicted_ms": 0.7, "rel_err": -0.3, "kernel_only_ms": 0.3,
                           "active_measured_ms": 0.5}])
    tables = {"predictions": preds,
              "gemm_samples": pd.DataFrame({"device": "d", "probe_us": [23.0, 23.5, 24.0]}),
              "workload_graphs": pd.DataFrame({"device": "d", "probe_us": [23.8]}),
              "workload_runs": pd.DataFrame({"device": "d", "probe_us": [35.0, 35.5, 36.0]})}
    text = render_summary(TablesWarehouse(tables), "d")
    assert ("machine spells: the spell probe (a 128^3 mm, its median) took 23.5 us during the GEMM sweep, "
            "23.8 us during the traces, 35.5 us during the workload runs:") in text
    assert "host probe" not in text  # no host readings: no host line
    calm = {**tables, "workload_runs": pd.DataFrame({"device": "d", "probe_us": [24.5]})}
    assert "machine spells" not in render_summary(TablesWarehouse(calm), "d")
    # a spell in the embedding sweep alone (the 16:36 take: 31.8 us) says nothing of the steps' prices
    calm["embedding_samples"] = pd.DataFrame({"device": "d", "probe_us": [31.8]})
    assert "machine spells" not in render_summary(TablesWarehouse(calm), "d")
